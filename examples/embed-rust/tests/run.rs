//! Runs the example on the account-pool component the reference host embeds (the one its
//! build produced under `target/guests/embedded/`), and on the one `pooler components export`
//! writes, and checks what the pool answered.

use std::path::{Path, PathBuf};
use std::process::Command;

use pooler_host::runtime::roles::Role;

/// Run the example host on `pool` and check its five answers.
fn assert_the_example_runs(pool: &Path, data: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_embed-rust")).arg(pool).arg(data).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    // No route for the thread: the pool does not serve it.
    assert_eq!(lines[0], "availability (no route): Availability::NotRouted");
    // A route but no account: nothing can serve it.
    assert_eq!(
        lines[1],
        "availability (no accounts): Availability::Unavailable(UnavailableReason::NoEnabledAccount)"
    );
    // The account is added, and the pool signalled the change.
    assert_eq!(lines[2], "availability-changed: Provider::Claude [ChangeCause::AccountAdded]");
    assert!(
        lines[3].starts_with("added account ") && lines[3].ends_with("(ex): AccountStatus::Ready"),
        "{stdout}"
    );
    // Now the pool can serve it.
    assert_eq!(lines[4], "availability (one account): Availability::Ready");
    // Its state is in its own database, in the data directory.
    assert!(data.join("pool.sqlite3").is_file());
    // The key never appears in what the host printed (the pool's logs included).
    assert!(!stdout.contains("sk-ant-example-key") && !stderr.contains("sk-ant-example-key"));
}

#[test]
fn the_example_host_asks_the_pool_for_availability_before_and_after_adding_an_account() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("account-pool.wasm");
    let bytes = pooler_host::runtime::embedded::component(Role::AccountPool).unwrap();
    std::fs::write(&pool, bytes).unwrap();
    assert_the_example_runs(&pool, &dir.path().join("data"));
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// What `pooler components export` writes is what another host needs: the pool loads and
/// answers in this host, and the WIT beside it is the build's `wit/` byte for byte and
/// parses, with both worlds in it.
#[test]
fn the_exported_pool_loads_in_the_example_host_and_the_exported_wit_is_the_builds() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    pooler_host::operate::components::export(&export, false).unwrap();

    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit");
    let exported = export.join("wit");
    let files = tree(&source);
    assert!(files.len() > 10, "{files:?}");
    assert_eq!(tree(&exported), files);
    for file in &files {
        let (ours, theirs) = (std::fs::read(source.join(file)), std::fs::read(exported.join(file)));
        assert_eq!(ours.unwrap(), theirs.unwrap(), "{} differs", file.display());
    }
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(&exported).expect("the exported WIT parses");
    for world in ["account-pool", "account-pool-core", "provider-retry", "imports"] {
        resolve.select_world(&[package], Some(world)).unwrap_or_else(|e| panic!("{world}: {e}"));
    }
    assert_eq!(resolve.packages[package].name.to_string(), "pooler:plugins@0.1.0");

    assert_the_example_runs(&export.join("account-pool.wasm"), &dir.path().join("data"));
}
