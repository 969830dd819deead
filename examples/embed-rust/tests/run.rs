//! Runs the example on the account-pool component the reference host embeds (the one its
//! build produced under `target/guests/embedded/`) and checks what the pool answered.

use std::process::Command;

use pooler_host::roles::Role;

#[test]
fn the_example_host_asks_the_pool_for_availability_before_and_after_adding_an_account() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("account-pool.wasm");
    let bytes = pooler_host::embedded::component(Role::AccountPool).unwrap();
    std::fs::write(&pool, bytes).unwrap();
    let data = dir.path().join("data");
    let out =
        Command::new(env!("CARGO_BIN_EXE_embed-rust")).arg(&pool).arg(&data).output().unwrap();
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
