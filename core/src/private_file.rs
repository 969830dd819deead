//! Files and directories only their owner may use: the data directory and its `plugins/`
//! tree, the databases (route tokens, plugin state), the host's token, server and lock
//! files, the compile cache. Every such file is opened by [`create_private_file`] or
//! [`read_private_file`], every such directory made by [`create_private_dir`], and all of
//! them judged by one rule, [`owned_and_private`]: this user's, and writable by no one else.
//!
//! Another local user must not be able to read these files nor put words in pooler's mouth:
//! a database's `-wal` file SQLite would replay, a `server.json` naming their own listener
//! (the CLI would send it the admin token), a symbolic link that turns a write of ours into
//! a write to a file of their choosing. So a file is never opened through a symbolic link
//! (`O_NOFOLLOW`), must be a regular file of this user's with a single link, and a directory
//! another user owns or can write is refused: tightening it could not undo what they may
//! already have put there. One they could only read is made 0700 (nothing in it can have
//! been changed by them), with a warning.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// What [`create_private_file`] does when `path` already names a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Open it for writing and cut it to nothing (a file rewritten whole).
    Truncate,
    /// Open it for appending, its contents kept.
    Append,
    /// Open it for reading and writing, its contents kept (a lock file).
    Keep,
    /// Leave it untouched and fail with [`io::ErrorKind::AlreadyExists`].
    Fail,
}

/// Whether `meta` (of a file or a directory) is this user's and writable by no one else:
/// `Err` says why not, in words that follow its path ("owned by uid 65534, not by this
/// user (1000)"). Off Unix there are no owners nor modes: always `Ok`.
pub fn owned_and_private(meta: &Metadata) -> Result<(), String> {
    if let Some(why) = not_owned(meta) {
        return Err(why);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "writable by others (mode {:o})",
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// Why `meta` is not this user's, if it is not.
#[cfg(unix)]
fn not_owned(meta: &Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    (meta.uid() != me).then(|| format!("owned by uid {}, not by this user ({me})", meta.uid()))
}

#[cfg(not(unix))]
fn not_owned(_meta: &Metadata) -> Option<String> {
    None
}

/// A refusal, [`io::ErrorKind::PermissionDenied`]: `why` in words that follow the path.
fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// Opens `path` for writing, creating it with mode 0600 (readable and writable by its owner
/// only) if it does not exist. The mode is given at creation and set again through the
/// handle, so the file is 0600 whatever the umask and never readable by others, not even
/// for an instant. A symbolic link at `path` is refused, not followed; a file already there
/// must be a regular file of this user's with one link (else `PermissionDenied`, saying
/// why), and is made 0600 through the opened handle before anything is written. The parent
/// directory must exist. Off Unix there are no modes nor owners: the file is only opened.
pub fn create_private_file(path: &Path, existing: Existing) -> io::Result<File> {
    let mut options = OpenOptions::new();
    match existing {
        // Cut only once the file is known to be ours.
        Existing::Truncate => options.write(true).create(true).truncate(false),
        Existing::Append => options.append(true).create(true),
        Existing::Keep => options.read(true).write(true).create(true).truncate(false),
        Existing::Fail => options.write(true).create_new(true),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits());
    }
    let file = options.open(path).map_err(|e| link_refused(path, e))?;
    check_opened(&file.metadata()?, false)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    if existing == Existing::Truncate {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Makes the file at `path`, which exists, 0600, by [`create_private_file`]'s rules (no
/// link followed; a regular file of this user's with one link), without writing to it.
pub fn make_private(path: &Path) -> io::Result<()> {
    let file = open_no_follow(path)?;
    check_opened(&file.metadata()?, false)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Reads the file at `path` whole, trusting it only when no one else can have written it:
/// not through a symbolic link, a regular file with one link, this user's, and writable by
/// no one else ([`owned_and_private`]); otherwise `PermissionDenied`, saying why. A missing
/// file is [`io::ErrorKind::NotFound`], as with [`std::fs::read_to_string`].
pub fn read_private_file(path: &Path) -> io::Result<String> {
    let mut file = open_no_follow(path)?;
    check_opened(&file.metadata()?, true)?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

fn open_no_follow(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut options,
        nix::fcntl::OFlag::O_NOFOLLOW.bits(),
    );
    options.open(path).map_err(|e| link_refused(path, e))
}

/// `e`, or the refusal of a symbolic link when that is why `O_NOFOLLOW` failed (`ELOOP` on
/// Linux, `EMLINK` on FreeBSD: asking the path says it plainly).
fn link_refused(path: &Path, e: io::Error) -> io::Error {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return refused(
            "a symbolic link, which pooler does not follow for its private files (remove it)"
                .into(),
        );
    }
    e
}

/// The checks on an opened file: a regular file, one link, this user's; `for_reading`, also
/// writable by no one else (a file about to be made 0600 and written need not be).
fn check_opened(meta: &Metadata, for_reading: bool) -> io::Result<()> {
    if !meta.file_type().is_file() {
        return Err(refused("not a regular file".into()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // A second name would be a way to the file from outside the private directory.
        if meta.nlink() != 1 {
            return Err(refused(format!(
                "a file with {} hard links; a private file has one",
                meta.nlink()
            )));
        }
    }
    if let Some(why) = not_owned(meta) {
        return Err(refused(why));
    }
    if for_reading {
        owned_and_private(meta).map_err(refused)?;
    }
    Ok(())
}

/// Makes `dir` this user's private directory. Missing, it is created with its missing
/// parents, each 0700 whatever the umask. Present (a symbolic link to a directory is
/// followed: a person may keep their data elsewhere), it must be a directory of this user's
/// that no one else can write ([`owned_and_private`]), else `PermissionDenied` saying why;
/// one others can only read or enter is made 0700, with a warning. Off Unix it is only
/// created.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    create_missing(dir)?;
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        ));
    }
    owned_and_private(&meta).map_err(|why| {
        // What to do differs: another user's is never ours to change.
        let advice = if why.starts_with("owned by") {
            "use a directory of your own"
        } else {
            "another user may have put files in it: check what it holds, then make it yours \
             alone (chmod 700), or use another directory"
        };
        refused(format!("{why}; {advice}"))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            tracing::warn!(
                dir = %dir.display(),
                was = %format!("{mode:o}"),
                "made private (0700): others could read or enter it"
            );
        }
    }
    Ok(())
}

/// Creates `dir` and its missing parents, each 0700: the mode is given at creation (so no
/// other user can enter one even for an instant) and set again, since the umask may have
/// taken bits away.
fn create_missing(dir: &Path) -> io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_missing(parent)?;
    }
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match builder.create(dir) {
        Ok(()) => {}
        // Made by another process meanwhile: judged as an existing one.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(crate::ids::new_id("pooler-core-private"));
        create_private_dir(&dir).unwrap();
        dir
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[cfg(unix)]
    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[cfg(unix)]
    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A file of another user's, as `(path, whether this test may write to it)`: as root
    /// (CI), one made here and given to uid 65534; otherwise a file root owns.
    #[cfg(unix)]
    fn someone_elses_file(dir: &Path) -> (std::path::PathBuf, bool) {
        if is_root() {
            let path = dir.join("theirs");
            std::fs::write(&path, "theirs").unwrap();
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            (path, true)
        } else {
            ("/etc/passwd".into(), false)
        }
    }

    #[test]
    fn files_are_created_and_made_private_and_kept_or_emptied() {
        let dir = temp_dir();
        let path = dir.join("f");
        create_private_file(&path, Existing::Fail)
            .unwrap()
            .write_all(b"one")
            .unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        let again = create_private_file(&path, Existing::Fail).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        #[cfg(unix)]
        set_mode(&path, 0o644);
        create_private_file(&path, Existing::Append)
            .unwrap()
            .write_all(b" two")
            .unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        assert_eq!(read_private_file(&path).unwrap(), "one two");
        let mut kept = create_private_file(&path, Existing::Keep).unwrap();
        let mut text = String::new();
        kept.read_to_string(&mut text).unwrap();
        assert_eq!(text, "one two");
        create_private_file(&path, Existing::Truncate)
            .unwrap()
            .write_all(b"three")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "three");
        #[cfg(unix)]
        {
            set_mode(&path, 0o640);
            make_private(&path).unwrap();
            assert_eq!(mode(&path), 0o600);
        }
        let missing = read_private_file(&dir.join("none")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_is_refused_and_its_target_left_alone() {
        let dir = temp_dir();
        let target = dir.join("target");
        std::fs::write(&target, "precious").unwrap();
        set_mode(&target, 0o644);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
        for path in [&link, &dangling] {
            let mut errors = Vec::new();
            for existing in [
                Existing::Truncate,
                Existing::Append,
                Existing::Keep,
                Existing::Fail,
            ] {
                errors.push(create_private_file(path, existing).unwrap_err());
            }
            errors.push(make_private(path).unwrap_err());
            errors.push(read_private_file(path).unwrap_err());
            for e in errors {
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
                assert!(e.to_string().contains("symbolic link"), "{e}");
            }
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert_eq!(mode(&target), 0o644);
        assert!(
            !dir.join("nowhere").exists(),
            "nothing made through the link"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn another_users_file_a_second_link_or_an_open_mode_is_not_trusted() {
        let dir = temp_dir();
        let (theirs, writable) = someone_elses_file(&dir);
        let before = std::fs::read(&theirs).unwrap();
        let mode_before = mode(&theirs);
        let mut errors = vec![
            read_private_file(&theirs).unwrap_err(),
            make_private(&theirs).unwrap_err(),
        ];
        if writable {
            for existing in [Existing::Truncate, Existing::Append, Existing::Keep] {
                errors.push(create_private_file(&theirs, existing).unwrap_err());
            }
        }
        for e in errors {
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            assert!(e.to_string().starts_with("owned by uid "), "{e}");
        }
        assert_eq!(std::fs::read(&theirs).unwrap(), before);
        assert_eq!(mode(&theirs), mode_before);

        // A second name: the file is reachable from somewhere else.
        let ours = dir.join("ours");
        create_private_file(&ours, Existing::Fail).unwrap();
        std::fs::hard_link(&ours, dir.join("alias")).unwrap();
        let e = read_private_file(&ours).unwrap_err();
        assert!(e.to_string().contains("2 hard links"), "{e}");
        let e = create_private_file(&ours, Existing::Truncate).unwrap_err();
        assert!(e.to_string().contains("2 hard links"), "{e}");
        std::fs::remove_file(dir.join("alias")).unwrap();

        // Ours but writable by others: not trusted as it is; rewritten, it is made private.
        set_mode(&ours, 0o666);
        let e = read_private_file(&ours).unwrap_err();
        assert!(
            e.to_string().contains("writable by others (mode 666)"),
            "{e}"
        );
        create_private_file(&ours, Existing::Truncate).unwrap();
        assert_eq!(mode(&ours), 0o600);
        assert_eq!(read_private_file(&ours).unwrap(), "");

        let e = read_private_file(&dir).unwrap_err();
        assert!(
            e.kind() == io::ErrorKind::PermissionDenied
                || e.raw_os_error() == Some(nix::errno::Errno::EISDIR as i32),
            "{e}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_private_dir_and_its_new_parents_are_0700_and_an_existing_one_is_checked() {
        let base = temp_dir();
        let dir = base.join("a").join("b");
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&base.join("a")), 0o700);

        // One others could only read or enter is made private.
        set_mode(&dir, 0o755);
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);

        // One others can write is refused, and left as it is.
        for open in [0o777, 0o770, 0o1777] {
            set_mode(&dir, open);
            let e = create_private_dir(&dir).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert!(e.to_string().starts_with("writable by others"), "{e}");
            assert_eq!(mode(&dir), open);
        }
        set_mode(&dir, 0o700);

        // Another user's is refused, however private.
        let theirs = if is_root() {
            let theirs = base.join("theirs");
            create_private_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            theirs
        } else {
            "/".into()
        };
        let e = create_private_dir(&theirs).unwrap_err();
        assert!(e.to_string().starts_with("owned by uid "), "{e}");

        // A symbolic link to a private directory of ours is followed.
        let link = base.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        create_private_dir(&link).unwrap();
        // A file is not a directory.
        let file = base.join("file");
        create_private_file(&file, Existing::Fail).unwrap();
        assert!(create_private_dir(&file).is_err());
        std::fs::remove_dir_all(base).unwrap();
    }
}
