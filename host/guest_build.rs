//! Builds WebAssembly guest components from a build script: a nested
//! `cargo build --target wasm32-wasip2 --profile guest` with its own target directory (so it
//! does not wait on the outer build's lock) and a clean environment (a build script inherits
//! the outer cargo's `CARGO_*`, `RUSTFLAGS` and wrapper variables, which describe the host
//! build, not this one — `cargo clippy` would otherwise lint the guests as well).
//!
//! Shared by `host/build.rs` (the embedded components) and `tests/build.rs` (the test
//! fixtures) through `#[path]`, so there is one way to build a guest.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target guests are built for.
pub const GUEST_TARGET: &str = "wasm32-wasip2";
/// The profile guests are built with (defined in each guest workspace's root manifest).
pub const GUEST_PROFILE: &str = "guest";

/// One guest package to build.
pub struct Guest<'a> {
    /// The cargo package name (`fixture-pool`).
    pub package: &'a str,
    /// The package's directory, watched for changes.
    pub dir: PathBuf,
}

/// Build `guests` (packages of the workspace whose root manifest is `manifest`) into
/// `<target>/guests/<set>/`, and return each package's component path, in order.
/// `watch` lists further paths whose change must rebuild them (the WIT directory).
pub fn build_guests(
    set: &str,
    manifest: &Path,
    guests: &[Guest<'_>],
    watch: &[PathBuf],
) -> Vec<PathBuf> {
    println!("cargo::rerun-if-changed={}", manifest.display());
    if let Some(lock) = manifest.parent().map(|dir| dir.join("Cargo.lock")) {
        println!("cargo::rerun-if-changed={}", lock.display());
    }
    for path in watch {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    for guest in guests {
        println!(
            "cargo::rerun-if-changed={}",
            guest.dir.join("Cargo.toml").display()
        );
        println!(
            "cargo::rerun-if-changed={}",
            guest.dir.join("src").display()
        );
        // A guest's own build script (link settings); watched only where there is one, as
        // cargo reruns on every build for a path that does not exist.
        let script = guest.dir.join("build.rs");
        if script.exists() {
            println!("cargo::rerun-if-changed={}", script.display());
        }
    }
    if guests.is_empty() {
        return Vec::new();
    }

    let target_dir = target_root().join("guests").join(set);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target")
        .arg(GUEST_TARGET)
        .arg("--profile")
        .arg(GUEST_PROFILE)
        .arg("--target-dir")
        .arg(&target_dir);
    for guest in guests {
        command.arg("--package").arg(guest.package);
    }
    clean_env(&mut command);
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build the {set} guests: {e}"));
    if !status.success() {
        panic!(
            "building the {set} guests for {GUEST_TARGET} failed ({status}); \
             is the target installed? `rustup target add {GUEST_TARGET}`"
        );
    }

    let out = target_dir.join(GUEST_TARGET).join(GUEST_PROFILE);
    guests
        .iter()
        .map(|guest| {
            let path = out.join(format!("{}.wasm", guest.package.replace('-', "_")));
            assert!(
                path.is_file(),
                "the {set} guest build did not produce {}",
                path.display()
            );
            path
        })
        .collect()
}

/// Remove what describes the outer build; keep what locates the toolchain and registries.
fn clean_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let keep = key == "CARGO_HOME"
            || key.starts_with("CARGO_NET_")
            || key.starts_with("CARGO_HTTP_")
            || key.starts_with("CARGO_REGISTRIES_")
            || key.starts_with("CARGO_REGISTRY_");
        let outer = (key.starts_with("CARGO_") && !keep)
            || matches!(
                key,
                "RUSTFLAGS"
                    | "RUSTDOCFLAGS"
                    | "RUSTC"
                    | "RUSTDOC"
                    | "RUSTC_WRAPPER"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "RUSTC_LINKER"
                    | "TARGET"
                    | "HOST"
                    | "OUT_DIR"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "NUM_JOBS"
                    | "MAKEFLAGS"
                    | "MFLAGS"
            );
        if outer {
            command.env_remove(key);
        }
    }
}

/// The outer build's target directory: the ancestor of `OUT_DIR` that cargo tagged with
/// `CACHEDIR.TAG` (works with `--target`, custom profiles and `CARGO_TARGET_DIR`).
fn target_root() -> PathBuf {
    let out_dir =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts"));
    out_dir
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .unwrap_or(out_dir)
}

/// A Rust string literal for `path`, for generated `include_bytes!` and consts.
pub fn literal(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}
