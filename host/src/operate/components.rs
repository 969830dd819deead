//! `pooler components export`: writes the components this binary embeds and the WIT package
//! they were built against (both fixed at build time, [`crate::runtime::embedded`]) to a directory,
//! with a README naming each component's world, imports and exports, so a person can load
//! them in another host without a Rust toolchain.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::runtime::embedded;
use crate::runtime::roles::{self, Role};

/// The README the export writes beside the components.
pub const README: &str = "README.md";
/// The directory the WIT package is written to.
pub const WIT_DIR: &str = "wit";

/// Why an export did not happen (or stopped part-way).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The target exists and is not a directory.
    #[error("{} exists and is not a directory; name a new or empty directory", .0.display())]
    NotADirectory(PathBuf),
    /// The target directory has entries and `force` was not given.
    #[error(
        "{} is not empty ({entries} entries); name a new or empty directory, or pass --force \
         to replace account-pool.wasm, provider-retry.wasm, README.md and wit/ in it (other \
         files are left alone)",
        dir.display()
    )]
    NotEmpty {
        /// The target directory.
        dir: PathBuf,
        /// How many entries it has.
        entries: usize,
    },
    /// A file or directory could not be created, removed or written.
    #[error("cannot write {}: {error}", path.display())]
    Io {
        /// The file or directory that could not be written.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// The binary was built without a role's component (cannot happen with `build.rs`'s list).
    #[error("this pooler binary embeds no {0} component")]
    Missing(Role),
}

impl ExportError {
    /// Whether the error is about the arguments (exit 2) rather than a failed write (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ExportError::NotADirectory(_) | ExportError::NotEmpty { .. }
        )
    }
}

/// One file the export wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Written {
    /// Relative to the export directory, with `/`.
    pub path: String,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// The file name of a role's component in an export (`account-pool.wasm`).
pub fn file_name(role: Role) -> String {
    format!("{}.wasm", role.name())
}

/// Write the embedded components, `wit/` and the README to `dir` (created if missing).
///
/// `dir` must be missing or empty unless `force`; with `force` the export's own entries
/// (the two components, `README.md`, `wit/` as a whole, so no file of an older contract
/// stays behind) are replaced and anything else in `dir` is left alone. Symbolic links among
/// those entries are replaced, never followed.
pub fn export(dir: &Path, force: bool) -> Result<Vec<Written>, ExportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| ExportError::Io { path, error }
    };
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => return Err(ExportError::NotADirectory(dir.to_path_buf())),
        Ok(_) => {
            let entries = std::fs::read_dir(dir).map_err(io(dir))?.count();
            if entries > 0 && !force {
                return Err(ExportError::NotEmpty {
                    dir: dir.to_path_buf(),
                    entries,
                });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        Err(e) => return Err(io(dir)(e)),
    }

    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for role in Role::ALL {
        let bytes = embedded::component(role).ok_or(ExportError::Missing(role))?;
        files.push((file_name(role), bytes.to_vec()));
    }
    files.push((README.to_owned(), readme().into_bytes()));
    for (path, bytes) in embedded::EMBEDDED_WIT {
        files.push((format!("{WIT_DIR}/{path}"), bytes.to_vec()));
    }

    let top_level: Vec<String> = Role::ALL
        .into_iter()
        .map(file_name)
        .chain([README.to_owned(), WIT_DIR.to_owned()])
        .collect();
    for name in &top_level {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path).map_err(io(&path))?,
            Ok(_) => std::fs::remove_file(&path).map_err(io(&path))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
    }

    let mut written = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        let path = dir.join(&name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // `create_new`: a file that appeared since the entries were cleared is not followed.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(io(&path))?;
        written.push(Written {
            path: name,
            bytes: bytes.len() as u64,
        });
    }
    Ok(written)
}

/// The README of an export: what each file is, each component's world, imports and exports
/// (read from the component itself), and how to load them.
pub fn readme() -> String {
    let package = format!("{}@{}", roles::PACKAGE, roles::VERSION);
    let mut text = format!(
        "# Pooler components\n\n\
         Written by `pooler components export` (pooler {}): the components this `pooler` binary \
         embeds and the WIT package `{package}` they were built against, byte for byte.\n\n\
         - `account-pool.wasm`: the Account Pooler, an HTTP proxy in front of the Anthropic \
         Messages and OpenAI Responses APIs (a `wasi:http` incoming handler).\n\
         - `provider-retry.wasm`: Provider Retry, durable retries of failed agent turns.\n\
         - `wit/`: the contract. `wit/worlds.wit` defines the worlds; the doc comment of every \
         interface, function and field states what a host must do and may rely on. \
         `wit/deps/` holds the WASI 0.2 packages it uses, `wit/CHANGES.md` the contract's \
         changes.\n",
        env!("CARGO_PKG_VERSION")
    );
    for role in Role::ALL {
        let name = file_name(role);
        let _ = write!(text, "\n## {name}\n\nWorld `{}`", role.world());
        let Some(bytes) = embedded::component(role) else {
            text.push_str(" (not embedded in this binary).\n");
            continue;
        };
        let _ = writeln!(
            text,
            "; {} bytes, SHA-256 `{:x}`.\n",
            bytes.len(),
            Sha256::digest(bytes)
        );
        match surface(bytes) {
            Ok((imports, exports)) => {
                text.push_str("Imports (the host provides each one):\n\n");
                for import in imports {
                    let _ = writeln!(text, "- `{import}`");
                }
                text.push_str("\nExports:\n\n");
                for export in exports {
                    let _ = writeln!(text, "- `{export}`");
                }
            }
            Err(e) => {
                let _ = writeln!(text, "(its imports could not be read: {e})");
            }
        }
    }
    text.push_str(
        "\n## Loading them\n\n\
         Any component-model host can load them. It provides the imports listed above: WASI \
         0.2 (for example wasmtime-wasi and wasmtime-wasi-http, or jco's preview2 shim) and \
         the `pooler:plugins` interfaces (`sqlite`, `log`, `metrics`, and each world's own), \
         keeping the contracts their doc comments state: state lives only in `sqlite` (an \
         instance may be dropped after any call), `availability-changed` is queued and \
         delivered after the caller returned, calls into Provider Retry are made one at a \
         time. Rust with wasmtime: `wasmtime::component::bindgen!({ path: \"wit\", world: \
         \"pooler:plugins/account-pool\" })`. JavaScript: `jco transpile account-pool.wasm`. \
         The account pool uses WebAssembly SIMD, on by default in wasmtime, V8 and the other \
         component-model runtimes.\n",
    );
    text
}

/// A component's top-level import and export names, in the order the binary lists them,
/// read from its binary without compiling it.
pub fn surface(bytes: &[u8]) -> Result<(Vec<String>, Vec<String>), wasmparser::BinaryReaderError> {
    use wasmparser::{Parser, Payload};
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    // Nested modules and components are flattened by `parse_all`: only depth 0 is the
    // component's own surface.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    imports.push(import?.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(section) if depth == 0 => {
                for export in section {
                    exports.push(export?.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok((imports, exports))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Every file under `dir`, relative, with `/`, sorted.
    fn tree(dir: &Path) -> Vec<String> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(root, &path, out);
                } else {
                    let rel = path.strip_prefix(root).unwrap();
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    /// A new directory gets both components and the WIT package byte for byte (the
    /// package as `wit/` holds it in the source tree this test is built from).
    #[test]
    fn the_export_writes_the_embedded_components_and_the_wit_they_were_built_with() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out").join("components");
        let written = export(&dir, false).unwrap();
        for role in Role::ALL {
            assert_eq!(
                read(&dir.join(file_name(role))),
                embedded::component(role).unwrap()
            );
        }
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
        let source_files = tree(&source);
        assert!(source_files.contains(&"worlds.wit".to_owned()));
        assert!(source_files.contains(&"deps/http/http.wit".to_owned()));
        assert_eq!(tree(&dir.join(WIT_DIR)), source_files);
        for file in &source_files {
            assert_eq!(
                read(&dir.join(WIT_DIR).join(file)),
                read(&source.join(file)),
                "{file}"
            );
        }
        assert_eq!(written.len(), 3 + source_files.len());
        assert!(written.iter().all(|w| w.bytes > 0));
    }

    /// The README names each world and the imports read from the component itself.
    #[test]
    fn the_readme_names_each_world_and_its_imports() {
        let text = readme();
        assert!(
            text.contains("World `pooler:plugins/account-pool@0.1.0`"),
            "{text}"
        );
        assert!(
            text.contains("World `pooler:plugins/provider-retry@0.1.0`"),
            "{text}"
        );
        for import in [
            "`pooler:plugins/sqlite@0.1.0`",
            "`pooler:plugins/availability-listener@0.1.0`",
            "`pooler:plugins/threads@0.1.0`",
            "`wasi:http/outgoing-handler@0.2.12`",
        ] {
            assert!(text.contains(import), "{import} missing:\n{text}");
        }
        assert!(
            text.contains("- `wasi:http/incoming-handler@0.2.12`"),
            "{text}"
        );
        // The pool's section lists the outgoing handler; Provider Retry's does not.
        let retry = &text[text.find("## provider-retry.wasm").unwrap()..];
        let retry = &retry[..retry.find("## Loading").unwrap()];
        assert!(!retry.contains("wasi:http"), "{retry}");
        assert!(
            retry.contains("`pooler:plugins/availability@0.1.0`"),
            "{retry}"
        );
    }

    /// A directory with anything in it is refused without `force`, and nothing is written;
    /// with `force`, the export's own entries are replaced (a stale WIT file of an older
    /// export is gone) and other files stay.
    #[test]
    fn a_non_empty_directory_needs_force_which_replaces_only_the_exports_own_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        std::fs::create_dir_all(dir.join("wit/deps/old")).unwrap();
        std::fs::write(dir.join("wit/deps/old/old.wit"), "package old:old;").unwrap();
        std::fs::write(dir.join("README.md"), "old").unwrap();

        let err = export(dir, false).unwrap_err();
        assert!(err.is_usage());
        let message = err.to_string();
        assert!(message.contains("is not empty (3 entries)"), "{message}");
        assert!(message.contains("--force"), "{message}");
        assert!(!dir.join("account-pool.wasm").exists());
        assert_eq!(read(&dir.join("README.md")), b"old");

        export(dir, true).unwrap();
        assert!(!dir.join("wit/deps/old").exists());
        assert_eq!(read(&dir.join("notes.txt")), b"mine");
        assert_eq!(read(&dir.join("README.md")), readme().as_bytes());
        assert!(dir.join("wit/worlds.wit").is_file());
    }

    /// A symbolic link in the export's place is replaced, not written through.
    #[cfg(unix)]
    #[test]
    fn force_replaces_a_symbolic_link_without_following_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, elsewhere) = (tmp.path().join("out"), tmp.path().join("elsewhere"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(&elsewhere, "untouched").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("account-pool.wasm")).unwrap();
        export(&dir, true).unwrap();
        assert_eq!(read(&elsewhere), b"untouched");
        assert!(
            !std::fs::symlink_metadata(dir.join("account-pool.wasm"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    /// A target that is a file is a usage error; one that cannot be created (its parent is a
    /// file: refused even for root) is a write error naming the path.
    #[test]
    fn a_file_or_an_uncreatable_directory_is_refused_clearly() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let err = export(&file, true).unwrap_err();
        assert!(err.is_usage());
        assert!(err.to_string().contains("is not a directory"), "{err}");

        let below = file.join("sub");
        let err = export(&below, false).unwrap_err();
        assert!(!err.is_usage());
        assert!(
            err.to_string()
                .starts_with(&format!("cannot write {}", below.display())),
            "{err}"
        );
    }
}
