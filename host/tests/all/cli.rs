//! The `pooler` binary as a user meets it: help, exit codes, configuration errors, and a
//! `serve` that starts, answers its admin API and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn pooler(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(args)
        .env_remove("POOLER_DATA_DIR")
        .output()
        .expect("run pooler")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_is_available_on_every_command_and_exits_0() {
    let top = pooler(&["--help"]);
    assert_eq!(top.status.code(), Some(0));
    assert!(text(&top.stdout).contains("serve"), "{}", text(&top.stdout));
    let serve = pooler(&["serve", "--help"]);
    assert_eq!(serve.status.code(), Some(0));
    let help = text(&serve.stdout);
    for flag in ["--config", "--listen", "--data-dir"] {
        assert!(help.contains(flag), "{help}");
    }
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(pooler(&["no-such-command"]).status.code(), Some(2));
    assert_eq!(
        pooler(&["serve", "--listen", "not-an-address"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(pooler(&[]).status.code(), Some(2));
}

#[test]
fn a_missing_config_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let out = pooler(&[
        "serve",
        "--config",
        missing.to_str().unwrap(),
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot read the configuration file") && err.contains("nope.toml"),
        "{err}"
    );
}

#[test]
fn an_unknown_config_key_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pooler.toml");
    std::fs::write(&config, "[server]\nlisen = \"127.0.0.1:0\"\n").unwrap();
    let out = pooler(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("unknown field `lisen`"), "{err}");
}

/// One HTTP/1.1 GET over a plain socket; returns the whole response text.
fn get(addr: &str, path: &str, token: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Start `pooler serve --listen LISTEN` on `data` (the tests' shared compile cache, not the
/// user's) and read its first line: the child, the address it listens on and its further
/// standard output.
fn serve(
    listen: &str,
    data: &std::path::Path,
    stderr: Stdio,
) -> (
    std::process::Child,
    String,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["serve", "--listen", listen])
        .env("POOLER_DATA_DIR", data)
        .env("POOLER_CACHE_DIR", pooler_tests::fixtures::COMPILE_CACHE)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first
        .strip_prefix("pooler listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    (child, addr, lines)
}

#[cfg(unix)]
#[test]
fn serve_prints_where_it_listens_answers_and_stops_with_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut child, addr, mut lines) = serve("127.0.0.1:0", &data, Stdio::null());
    let second = lines.next().unwrap().unwrap();
    assert_eq!(second, format!("data directory: {}", data.display()));

    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let status = get(&addr, "/_pooler/status", &token);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(status.contains("\"status\":\"ok\""), "{status}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "pooler did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));
}

/// Bound to every address, the server warns that it is reachable beyond loopback, and its
/// admin API still answers on loopback (a peer elsewhere gets 403 `loopback-only`: the
/// server's unit tests decide which peers are local, since tests reach only 127.0.0.1).
#[cfg(unix)]
#[test]
fn serve_on_every_address_warns_and_keeps_the_admin_api_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut child, addr, _lines) = serve("0.0.0.0:0", &data, Stdio::piped());
    let port = addr.rsplit(':').next().unwrap();
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let status = get(&format!("127.0.0.1:{port}"), "/_pooler/status", &token);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let _ = child.kill();
    let _ = child.wait();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("listening beyond loopback"), "{log}");
    assert!(
        !log.contains(token.trim()),
        "the admin token is never logged"
    );
}
