//! `pooler components export DIR`: the real binary writes the components it embeds and the
//! WIT it was built with, refuses a directory in use without `--force` (exit 2, nothing
//! written), and says what it does in `--help`. (What the files are worth in another host:
//! `examples/embed-rust/tests/run.rs`.)

use std::path::Path;
use std::process::{Command, Output};

use pooler_host::runtime::roles::Role;

fn pooler(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(args)
        .arg(dir)
        .env_remove("POOLER_DATA_DIR")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn export_writes_the_embedded_components_and_refuses_a_used_directory_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("components");
    let out = pooler(&["components", "export"], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("account-pool.wasm"), "{stdout}");
    assert!(
        stdout.contains("README.md names each component's world"),
        "{stdout}"
    );
    for role in Role::ALL {
        let file = std::fs::read(dir.join(format!("{role}.wasm"))).unwrap();
        assert!(
            file == pooler_host::runtime::embedded::component(role).unwrap(),
            "{role}"
        );
    }
    let worlds = std::fs::read(dir.join("wit/worlds.wit")).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/worlds.wit");
    assert_eq!(worlds, std::fs::read(source).unwrap());

    // Again: the directory is no longer empty.
    std::fs::write(dir.join("account-pool.wasm"), "mine").unwrap();
    let out = pooler(&["components", "export"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("is not empty") && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(dir.join("account-pool.wasm")).unwrap(),
        b"mine"
    );
    let out = pooler(&["components", "export", "--json"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["error"]["kind"], "usage", "{error}");

    let out = pooler(&["components", "export", "--force", "--json"], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = answer["files"].as_array().unwrap();
    assert!(
        files.iter().any(|f| f["path"] == "wit/deps/http/http.wit"),
        "{answer}"
    );
    let pool = std::fs::read(dir.join("account-pool.wasm")).unwrap();
    assert!(pool == pooler_host::runtime::embedded::component(Role::AccountPool).unwrap());

    // A path under a file cannot be created: exit 1, naming the path.
    let below = dir.join("README.md").join("sub");
    let out = pooler(&["components", "export"], &below);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot write {}", below.display())),
        "{stderr}"
    );
}

#[test]
fn export_help_says_what_is_written_and_what_force_does() {
    let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["components", "export", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for needle in [
        "account-pool.wasm",
        "wit/",
        "README.md",
        "--force",
        "Exit codes",
        "DIR",
    ] {
        assert!(help.contains(needle), "{needle} missing:\n{help}");
    }
}
