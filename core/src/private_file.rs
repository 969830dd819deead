//! Files only their owner may read: the databases, which hold route tokens and plugin
//! state, and the host's token and server files. One function, [`create_private_file`],
//! so every such file is created the same way, and one, [`create_private_dir`], for the
//! directories they live in.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// What [`create_private_file`] does when `path` already names a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Open it for writing and cut it to nothing (a file rewritten whole).
    Truncate,
    /// Open it for appending, its contents kept.
    Append,
    /// Leave it untouched and fail with [`io::ErrorKind::AlreadyExists`].
    Fail,
}

/// Opens `path` for writing, creating it with mode 0600 (readable and writable by its owner
/// only) if it does not exist. The mode is given at creation, so the file is never readable
/// by others, not even for an instant; a file already there (with [`Existing::Truncate`]
/// or [`Existing::Append`]) gets mode 0600 through the opened handle before it is
/// returned. The parent directory must exist. Off Unix there are no modes: the file is
/// only created and opened.
pub fn create_private_file(path: &Path, existing: Existing) -> io::Result<File> {
    let mut options = OpenOptions::new();
    match existing {
        Existing::Truncate => options.write(true).create(true).truncate(true),
        Existing::Append => options.append(true).create(true),
        Existing::Fail => options.write(true).create_new(true),
    };
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// Creates `dir` and any missing parents with mode 0700 (the owner only), whatever the
/// umask; a directory already there is left as it is. Off Unix it only creates them.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn temp_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(crate::ids::new_id("pooler-core-private"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
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
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        create_private_file(&path, Existing::Append)
            .unwrap()
            .write_all(b" two")
            .unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        let mut text = String::new();
        File::open(&path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "one two");
        create_private_file(&path, Existing::Truncate)
            .unwrap()
            .write_all(b"three")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "three");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_private_dir_and_its_new_parents_are_the_owners_alone() {
        let base = temp_dir();
        let dir = base.join("a").join("b");
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&base.join("a")), 0o700);
        // An existing directory is left as it is.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o750);
    }
}
