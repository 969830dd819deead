//! The data directory among other local users: `pooler serve` keeps it its user's alone
//! whatever the umask (directories 0700, files 0600), refuses one another user owns or can
//! write (what they may have put there cannot be trusted), makes one others can only read
//! private, and never follows a symbolic link to one of its files; the other commands trust
//! `server.json` and `admin-token` only when they are the user's and nobody else can write
//! them, and talk only to a loopback address.
//!
//! Files of another user are planted as root with `chown` (CI runs as root), as uid 65534.
//! Real processes on the real clock: every wait polls a process with a limit.

#![cfg(unix)]

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Served, text};

/// The user the planted files belong to (`nobody` on most systems).
const OTHER_UID: u32 = 65534;
const KEY: &str = "sk-ant-api03-data-dir-test-key-QQQQ";

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Give `path` to [`OTHER_UID`], as if another user had made it.
fn give_away(path: &Path) {
    std::os::unix::fs::lchown(path, Some(OTHER_UID), Some(OTHER_UID)).unwrap_or_else(|e| {
        panic!(
            "chown {} to uid {OTHER_UID}: {e} (this test plants another user's file: run it \
             as root, as CI does)",
            path.display()
        )
    });
}

/// `pooler serve` on `data`, which must refuse to start: exit 1, printing nothing on
/// standard output; its standard error.
fn refused(data: &Path) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .env_remove("POOLER_DATA_DIR")
        .env("POOLER_CACHE_DIR", pooler_tests::fixtures::COMPILE_CACHE)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    if !first.is_empty() {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        first.is_empty(),
        "pooler serve started on {}: {first}{log}",
        data.display()
    );
    assert_eq!(status.code(), Some(1), "{log}");
    log
}

/// A listener on loopback that is not pooler: records every request it gets (the admin
/// token and the API key would be in them) and answers 500.
struct Impostor {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Impostor {
    fn start() -> Impostor {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let Some(r) = support::read_request(&mut reader) else {
                    record.lock().unwrap().push("a connection".into());
                    continue;
                };
                // Recorded before the answer, so the command has ended only after this.
                record.lock().unwrap().push(format!(
                    "{} {} {:?} {}",
                    r.method,
                    r.path,
                    r.headers,
                    String::from_utf8_lossy(&r.body)
                ));
                let _ = stream.write_all(
                    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n\
                      content-length: 2\r\nconnection: close\r\n\r\n{}",
                );
            }
        });
        Impostor { port, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// `pooler account add --api-key -` with [`KEY`] on standard input: what the owner ran when
/// the key went to another user's listener.
fn add_key(served: &Served) -> std::process::Output {
    served.pooler_with(
        &[
            "account",
            "add",
            "--provider",
            "claude",
            "--api-key",
            "-",
            "--label",
            "mine",
        ],
        &[],
        Some(KEY),
    )
}

/// Replace `server.json` by one naming `url` (0600, the user's; the caller may change it).
fn plant_server_json(data: &Path, url: &str) -> PathBuf {
    let path = data.join("server.json");
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, format!(r#"{{"url":"{url}","pid":1}}"#)).unwrap();
    set_mode(&path, 0o600);
    path
}

#[test]
fn a_data_directory_another_user_owns_or_can_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();

    // Open to everyone: what another user put in it cannot be told from ours.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    set_mode(&open, 0o777);
    let log = refused(&open);
    assert!(
        log.contains(&open.display().to_string()) && log.contains("writable by others"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_dir(&open).unwrap().count(),
        0,
        "nothing was written into it"
    );
    assert_eq!(mode(&open), 0o777, "nor was it changed");

    // Another user's, however private.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    set_mode(&theirs, 0o700);
    give_away(&theirs);
    let log = refused(&theirs);
    assert!(
        log.contains(&theirs.display().to_string())
            && log.contains(&format!("owned by uid {OTHER_UID}")),
        "{log}"
    );
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);

    // Ours, but its plugins' directory open to everyone (another user may have put a
    // database's -wal file there).
    let inner = dir.path().join("inner");
    std::fs::create_dir_all(inner.join("plugins")).unwrap();
    set_mode(&inner, 0o700);
    set_mode(&inner.join("plugins"), 0o777);
    let log = refused(&inner);
    assert!(
        log.contains(&inner.join("plugins").display().to_string())
            && log.contains("writable by others"),
        "{log}"
    );
}

#[test]
fn a_data_directory_others_could_only_read_is_made_private_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    set_mode(&data, 0o755);
    let served = Served::start_in(dir, "[plugins.account-pool]\ncomponent = \"embedded\"\n");
    assert_eq!(mode(&served.data), 0o700);
    let log = served.log();
    assert!(
        log.contains("WARN") && log.contains("made private") && log.contains("755"),
        "{log}"
    );
    served.ok(&["account", "list"]);
}

#[test]
fn a_symlinked_admin_token_is_refused_and_its_target_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    set_mode(&data, 0o700);
    let target = dir.path().join("precious");
    std::fs::write(&target, "keep me").unwrap();
    set_mode(&target, 0o644);
    std::os::unix::fs::symlink(&target, data.join("admin-token")).unwrap();
    let log = refused(&data);
    assert!(
        log.contains(&data.join("admin-token").display().to_string())
            && log.contains("symbolic link"),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert_eq!(mode(&target), 0o644);
    assert!(
        !data.join("server.json").exists(),
        "a refused server announces nothing"
    );
}

#[test]
fn the_commands_trust_no_server_file_or_token_another_user_could_have_written() {
    let served = Served::start().never_prints(KEY);
    let data = served.data.clone();
    let token = served.admin_token();
    let ours = std::fs::read_to_string(data.join("server.json")).unwrap();
    let impostor = Impostor::start();
    let elsewhere = format!("http://127.0.0.1:{}", impostor.port);

    // Each planted `server.json` is refused before anything is sent, with what is wrong.
    fn symlinked(p: &Path) {
        let aside = p.with_extension("aside");
        std::fs::rename(p, &aside).unwrap();
        std::os::unix::fs::symlink(&aside, p).unwrap();
    }
    type Spoil = fn(&Path);
    let cases: [(&str, Spoil, &str); 5] = [
        (
            "another user's server.json",
            give_away,
            "owned by uid 65534",
        ),
        (
            "a server.json others can write",
            |p| set_mode(p, 0o666),
            "writable by others",
        ),
        ("a symlinked server.json", symlinked, "symbolic link"),
        (
            "a hard-linked server.json",
            |p| std::fs::hard_link(p, p.with_extension("link")).unwrap(),
            "hard link",
        ),
        ("a server.json of ours", |_| (), ""),
    ];
    for (what, spoil, why) in cases {
        for extra in ["aside", "link"] {
            let _ = std::fs::remove_file(data.join("server").with_extension(extra));
        }
        let path = plant_server_json(&data, &elsewhere);
        spoil(&path);
        let out = add_key(&served);
        let stderr = text(&out.stderr);
        if why.is_empty() {
            // The control: a private server.json is trusted, and the impostor reached.
            assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
            assert_eq!(impostor.seen().len(), 1, "{what}");
            impostor.seen.lock().unwrap().clear();
            continue;
        }
        assert_eq!(impostor.seen(), Vec::<String>::new(), "{what} was trusted");
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert!(
            stderr.contains(&path.display().to_string()) && stderr.contains(why),
            "{what}: {stderr}"
        );
    }

    // Only a loopback address, written as pooler writes it: `0.0.0.0` reaches this
    // machine's listeners too, and a name is resolved by whatever resolves it.
    for url in [
        format!("http://0.0.0.0:{}", impostor.port),
        format!("http://localhost:{}", impostor.port),
        format!("http://me@127.0.0.1:{}", impostor.port),
    ] {
        plant_server_json(&data, &url);
        let out = add_key(&served);
        let stderr = text(&out.stderr);
        assert_eq!(impostor.seen(), Vec::<String>::new(), "{url} was trusted");
        assert_eq!(out.status.code(), Some(1), "{url}: {stderr}");
        assert!(stderr.contains("loopback"), "{url}: {stderr}");
    }

    // The token is checked the same way.
    std::fs::write(data.join("server.json"), &ours).unwrap();
    set_mode(&data.join("server.json"), 0o600);
    let token_path = data.join("admin-token");
    give_away(&token_path);
    let stderr = served.fails(&["account", "list"], 1);
    assert!(
        stderr.contains(&token_path.display().to_string()) && stderr.contains("owned by uid 65534"),
        "{stderr}"
    );
    std::fs::remove_file(&token_path).unwrap();
    let aside = data.join("token-aside");
    std::fs::write(&aside, &token).unwrap();
    set_mode(&aside, 0o600);
    std::os::unix::fs::symlink(&aside, &token_path).unwrap();
    let stderr = served.fails(&["account", "list"], 1);
    assert!(stderr.contains("symbolic link"), "{stderr}");

    // Put back as the server wrote them, the commands work again.
    std::fs::remove_file(&token_path).unwrap();
    std::fs::rename(&aside, &token_path).unwrap();
    served.ok(&["account", "list"]);
    assert_eq!(impostor.seen(), Vec::<String>::new());
}

/// Every directory the server created is 0700 and every file 0600 although it ran under
/// `umask 000`: the databases and their -wal and -shm files, each plugin's directory and the
/// allowed hosts a setting granted, the token, `server.json`, the lock, a thread's
/// directory and the agents' notes.
#[test]
fn under_umask_000_every_directory_is_0700_and_every_file_0600() {
    // An agent turn, run by a stand-in for Codex, in a directory of the server's making.
    let agent_dir = tempfile::tempdir().unwrap();
    let agent = agent_dir.path().join("codex");
    std::fs::write(
        &agent,
        "#!/bin/sh\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-umask\"}'\n\
         echo '{\"type\":\"item.completed\",\"item\":{\"type\":\"agent_message\",\"text\":\"ok\"}}'\n\
         echo '{\"type\":\"turn.completed\"}'\n",
    )
    .unwrap();
    set_mode(&agent, 0o755);
    let served = Served::start_with_umask(
        "000",
        &format!("[agents]\ncodex = {:?}\n", agent.display().to_string()),
    );
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", upstream.local_addr().unwrap());
    support::add_api_key(&served, KEY, "a");
    served.ok(&["config", "set", "pool.claude-upstream-url", &url]);
    assert!(
        served
            .data
            .join("plugins/account-pool/allowed-hosts")
            .exists()
    );
    let thread = served
        .ok(&["thread", "new", "--agent", "codex", "say ok"])
        .trim()
        .to_owned();
    support::eventually("the agent's turn", Duration::from_secs(30), || {
        let show = served.json(&["thread", "show", &thread]);
        (show["turns"][0]["outcome"] == "ok").then_some(())
    });

    let mut seen = Vec::new();
    let mut stack = vec![served.data.clone()];
    while let Some(dir) = stack.pop() {
        seen.push((dir.clone(), mode(&dir)));
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                assert!(meta.is_file(), "{} is not a file", path.display());
                seen.push((path.clone(), mode(&path)));
            }
        }
    }
    let names: Vec<String> = seen
        .iter()
        .map(|(p, _)| p.strip_prefix(&served.data).unwrap().display().to_string())
        .collect();
    for expected in [
        "",
        "admin-token",
        "server.json",
        "lock",
        "core.sqlite3",
        "core.sqlite3-wal",
        "core.sqlite3-shm",
        "plugins",
        "plugins/account-pool",
        "plugins/account-pool/allowed-hosts",
        "plugins/provider-retry",
        "threads",
        "agents",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("plugins/account-pool/") && n.ends_with(".sqlite3-wal")),
        "{names:?}"
    );
    let wrong: Vec<String> = seen
        .iter()
        .filter(|(p, m)| *m != if p.is_dir() { 0o700 } else { 0o600 })
        .map(|(p, m)| format!("{} {m:o}", p.display()))
        .collect();
    assert!(wrong.is_empty(), "not private: {wrong:#?}");
}
