//! One server per data directory: `pooler serve` holds an exclusive OS lock on
//! `DATA_DIR/lock` for as long as it runs, taken before anything else touches the directory
//! (the core's start-up recovery, the plugins' databases, `admin-token`, `server.json`).
//!
//! A second server on the same directory would otherwise run recovery against the first
//! one's live state (marking its running turns failed, queueing retries of turns still
//! running) and overwrite its admin token. It is refused instead, with the other server's
//! pid and address, which the holder writes into the lock file.
//!
//! The lock is `flock(2)` (std's [`File::try_lock`]): it belongs to the open file, so the
//! kernel drops it when the process ends however it ends, SIGKILL included; a stale lock
//! file left on disk blocks nobody. Only the lock decides, never the file's contents.
//!
//! The other commands (`pooler account`, `thread`, `retry`, …) never open the databases:
//! they write through the running server's admin API, so they need no lock.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pooler_core::private_file::{Existing, create_private_file};
use serde::{Deserialize, Serialize};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "lock";

/// What the holder writes into the lock file, for a refused second server's message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The holder's process id.
    pub pid: u32,
    /// Where it listens (`http://127.0.0.1:8787`); `None` while it is still starting.
    pub url: Option<String>,
}

/// The data directory is in use by another process.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct InUse {
    /// What the lock file says about the holder, if it could be read.
    pub holder: Option<Holder>,
    message: String,
}

/// The held lock on a data directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
    holder: Holder,
}

impl DataDirLock {
    /// Takes the lock on `data_dir` (which must exist), without waiting: another holder is
    /// an [`InUse`] error naming it. Other failures (the file cannot be opened) are I/O
    /// errors.
    pub fn acquire(data_dir: &Path) -> anyhow::Result<DataDirLock> {
        let path = data_dir.join(LOCK_FILE);
        let mut file = create_private_file(&path, Existing::Keep)
            .map_err(|e| anyhow::anyhow!("cannot open the lock file {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = read_holder(&mut file);
                return Err(in_use(data_dir, holder).into());
            }
            Err(std::fs::TryLockError::Error(e)) => {
                anyhow::bail!("cannot lock {}: {e}", path.display())
            }
        }
        let mut lock = DataDirLock {
            file,
            path,
            holder: Holder {
                pid: std::process::id(),
                url: None,
            },
        };
        lock.write_holder()?;
        Ok(lock)
    }

    /// Records where this server listens, for the message a second server gets.
    pub fn set_url(&mut self, url: &str) -> anyhow::Result<()> {
        self.holder.url = Some(url.to_owned());
        self.write_holder()
    }

    /// What this lock's file says.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    fn write_holder(&mut self) -> anyhow::Result<()> {
        let text = serde_json::to_string(&self.holder)?;
        let write = |file: &mut File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            file.write_all(text.as_bytes())?;
            file.flush()
        };
        write(&mut self.file)
            .map_err(|e| anyhow::anyhow!("cannot write the lock file {}: {e}", self.path.display()))
    }
}

fn read_holder(file: &mut File) -> Option<Holder> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

fn in_use(data_dir: &Path, holder: Option<Holder>) -> InUse {
    let who = match &holder {
        Some(Holder {
            pid,
            url: Some(url),
        }) => {
            format!("pooler serve (pid {pid}, listening on {url})")
        }
        Some(Holder { pid, url: None }) => format!("pooler serve (pid {pid}, still starting)"),
        None => "another process".to_owned(),
    };
    InUse {
        message: format!(
            "the data directory {} is in use by {who}; stop it first, or give this server \
             another --data-dir",
            data_dir.display()
        ),
        holder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // flock belongs to the open file, so a second open in this process contends like a
    // second process would.
    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid_and_address_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = DataDirLock::acquire(dir.path()).unwrap();
        let refused = DataDirLock::acquire(dir.path()).unwrap_err();
        let refused = refused.downcast::<InUse>().unwrap();
        let pid = std::process::id();
        assert_eq!(refused.holder, Some(Holder { pid, url: None }));
        assert!(
            refused
                .to_string()
                .contains(&format!("pid {pid}, still starting")),
            "{refused}"
        );
        first.set_url("http://127.0.0.1:4321").unwrap();
        let refused = DataDirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("pid {pid}, listening on http://127.0.0.1:4321")),
            "{refused}"
        );
        drop(first);
        let second = DataDirLock::acquire(dir.path()).unwrap();
        assert_eq!(second.holder().url, None, "a new holder rewrites the file");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(LOCK_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_stale_lock_file_blocks_nobody() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(LOCK_FILE),
            r#"{"pid":1,"url":"http://127.0.0.1:1"}"#,
        )
        .unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        assert_eq!(lock.holder().pid, std::process::id());
    }
}
