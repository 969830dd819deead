//! One server per data directory: a second `pooler serve` on a directory
//! a running server holds is refused before it touches anything — no start-up recovery, no
//! new admin token — with the holder's pid and address; a SIGKILLed server's lock blocks
//! nobody.
//!
//! Real processes on the real clock: the waits poll them with a limit.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn serve(config: &Path, data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pooler"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .env_remove("POOLER_DATA_DIR")
        // The tests' shared compile cache, not the user's.
        .env("POOLER_CACHE_DIR", pooler_tests::fixtures::COMPILE_CACHE)
        .env("RUST_LOG", "warn");
    command
}

/// A running `pooler serve` and where it listens.
fn start(config: &Path, data: &Path) -> (Child, String) {
    let mut child = serve(config, data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pooler serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").expect("stdout");
    let url = first
        .strip_prefix("pooler listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_owned();
    // Keep reading so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

fn kill(mut child: Child) {
    child.kill().expect("SIGKILL pooler");
    child.wait().expect("reap pooler");
}

#[test]
fn a_second_server_on_a_served_data_directory_is_refused_and_a_killed_ones_lock_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("pooler.toml");
    std::fs::write(
        &config,
        "[plugins.account-pool]\ncomponent = \"embedded\"\n",
    )
    .unwrap();

    let (first, url) = start(&config, &data);
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let server_json = std::fs::read_to_string(data.join("server.json")).unwrap();

    // The second one must end by itself, with an error naming the first.
    let mut second = serve(&config, &data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = second.kill();
            panic!("a second pooler serve on the same data directory kept running");
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    let out = second.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(status.code(), Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains(&format!("pid {}, listening on {url}", first.id())),
        "the refusal names the running server: {stderr}"
    );
    assert!(!stdout.contains("listening"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(data.join("admin-token")).unwrap(),
        token,
        "the running server's admin token was replaced"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("server.json")).unwrap(),
        server_json
    );

    // The first one still answers with its token.
    let status = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["status", "--json"])
        .env("POOLER_DATA_DIR", &data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the first server stopped answering");

    // SIGKILL runs no exit code; the kernel drops the lock with the process.
    kill(first);
    assert!(data.join("lock").exists(), "the lock file stays on disk");
    let (third, third_url) = start(&config, &data);
    assert_ne!(
        std::fs::read_to_string(data.join("admin-token")).unwrap(),
        token,
        "the new server writes its own token"
    );
    let lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("lock")).unwrap()).unwrap();
    assert_eq!(lock["pid"], third.id());
    assert_eq!(lock["url"], third_url.as_str());
    kill(third);
}
