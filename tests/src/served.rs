//! A real `pooler serve` process for the command-line tests: its own data directory, a free
//! loopback port, the embedded plugins and no extra allowed hosts (a test reaches its fake
//! upstream only by setting the upstream URL through the CLI, as a user would), helpers that
//! run `pooler` commands against it, and checks of the databases it leaves. The `pooler`
//! binary is named by the tests that can name it (the host's, through
//! `CARGO_BIN_EXE_pooler`), as a [`Binary`].

use std::io::{BufRead, BufReader, Write};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Bytes as text, for messages and assertions.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `pooler` executable to run (only the host package's own tests can name it).
pub trait Binary {
    /// Its path.
    const PATH: &'static str;
}

/// A running `pooler serve`; killed when dropped.
pub struct Served<B: Binary> {
    child: Child,
    /// Its directory (the configuration, the data directory, `serve.log`); `None` once
    /// [`Served::kill`] handed it to a [`Stopped`].
    dir: Option<tempfile::TempDir>,
    config: PathBuf,
    /// Its data directory.
    pub data: PathBuf,
    /// Where it listens (`http://127.0.0.1:PORT`).
    pub url: String,
    /// Strings no command may ever print (secrets).
    secrets: Vec<String>,
    /// Its arguments after `serve`'s own (`--log-format json`, …), kept for a restart.
    args: Vec<String>,
    /// What it printed on standard output, kept as it comes.
    stdout: Arc<Mutex<String>>,
    binary: PhantomData<B>,
}

/// A `pooler serve` killed by [`Served::kill`]: its directory, kept for a restart.
pub struct Stopped<B: Binary> {
    dir: tempfile::TempDir,
    config: PathBuf,
    /// Its data directory.
    pub data: PathBuf,
    secrets: Vec<String>,
    args: Vec<String>,
    stdout: Arc<Mutex<String>>,
    binary: PhantomData<B>,
}

impl<B: Binary> Stopped<B> {
    /// Start `pooler serve` again on the same configuration, data directory and arguments.
    pub fn restart(self) -> Served<B> {
        let mut served = Served::launch_with(self.dir, self.config, None, self.args);
        served.secrets = self.secrets;
        served
    }

    /// The directory the configuration and the data directory are in.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// What the server wrote to standard error (all its runs in this directory).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// What the server printed on standard output (this run).
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl<B: Binary> Served<B> {
    pub fn start() -> Served<B> {
        Served::start_with("")
    }

    /// [`Served::start`] with more configuration text (other tables).
    pub fn start_with(config_extra: &str) -> Served<B> {
        Served::start_in(
            tempfile::tempdir().unwrap(),
            &format!("[plugins.account-pool]\ncomponent = \"embedded\"\n{config_extra}\n"),
        )
    }

    /// `pooler serve` with exactly `config` as its configuration file, in `dir`: the data
    /// directory is `dir/data` (a test may have prepared it), standard error goes to
    /// `dir/serve.log`.
    pub fn start_in(dir: tempfile::TempDir, config: &str) -> Served<B> {
        Served::start_in_with_args(dir, config, &[])
    }

    /// [`Served::start_in`] with more arguments to `pooler serve` (e.g. its log format and
    /// level).
    pub fn start_in_with_args(dir: tempfile::TempDir, config: &str, args: &[&str]) -> Served<B> {
        let path = dir.path().join("pooler.toml");
        std::fs::write(&path, config).unwrap();
        let args = args.iter().map(|a| a.to_string()).collect();
        Served::launch_with(dir, path, None, args)
    }

    /// [`Served::start_with`] under `umask` (octal, as the shell's `umask` takes it): the
    /// server is started by `sh -c 'umask …; exec pooler serve …'`.
    pub fn start_with_umask(umask: &str, config_extra: &str) -> Served<B> {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pooler.toml");
        std::fs::write(
            &config,
            format!("[plugins.account-pool]\ncomponent = \"embedded\"\n{config_extra}\n"),
        )
        .unwrap();
        Served::launch_with(dir, config, Some(umask), Vec::new())
    }

    fn launch_with(
        dir: tempfile::TempDir,
        config: PathBuf,
        umask: Option<&str>,
        args: Vec<String>,
    ) -> Served<B> {
        let data = dir.path().join("data");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("serve.log"))
            .unwrap();
        let mut command = match umask {
            None => Command::new(B::PATH),
            Some(umask) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
                    .arg(B::PATH);
                sh
            }
        };
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .args(&args)
            .env_remove("POOLER_DATA_DIR")
            .env_remove("RUST_LOG")
            // The tests' shared compile cache, not the user's.
            .env("POOLER_CACHE_DIR", crate::fixtures::COMPILE_CACHE)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = match lines.next() {
            Some(Ok(line)) => line,
            _ => panic!(
                "pooler serve printed nothing; its log:\n{}",
                std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
            ),
        };
        let url = first
            .strip_prefix("pooler listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        // `server.json` is written before the first line.
        assert!(data.join("server.json").exists());
        // Keep reading so the server never blocks on a full pipe.
        let stdout = Arc::new(Mutex::new(format!("{first}\n")));
        let keep = stdout.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut kept = keep.lock().unwrap_or_else(|e| e.into_inner());
                kept.push_str(&line);
                kept.push('\n');
            }
        });
        Served {
            child,
            dir: Some(dir),
            config,
            data,
            url,
            secrets: Vec::new(),
            args,
            stdout,
            binary: PhantomData,
        }
    }

    /// The directory the configuration and the data directory are in.
    pub fn dir(&self) -> &std::path::Path {
        self.dir
            .as_ref()
            .expect("a running server has its directory")
            .path()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server wrote to standard error so far (all its runs in this directory).
    pub fn log(&self) -> String {
        let dir = self
            .dir
            .as_ref()
            .expect("a running server has its directory");
        std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
    }

    /// SIGKILL: no shutdown code runs, nothing is flushed; the process is reaped. The
    /// directory stays, for [`Stopped::restart`].
    pub fn kill(mut self) -> Stopped<B> {
        self.child.kill().expect("kill pooler serve");
        self.child.wait().expect("reap pooler serve");
        self.stopped()
    }

    /// SIGTERM: the server shuts down as it does for a person (it must exit 0); the
    /// directory stays, for [`Stopped::restart`].
    pub fn terminate(mut self) -> Stopped<B> {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = self.child.wait().expect("reap pooler serve");
        assert_eq!(status.code(), Some(0), "pooler serve on SIGTERM");
        self.stopped()
    }

    /// What is kept of a server whose process has ended.
    fn stopped(&mut self) -> Stopped<B> {
        Stopped {
            dir: self.dir.take().expect("not killed before"),
            config: self.config.clone(),
            data: self.data.clone(),
            secrets: std::mem::take(&mut self.secrets),
            args: std::mem::take(&mut self.args),
            stdout: self.stdout.clone(),
            binary: PhantomData,
        }
    }

    /// Fail any command that prints `secret`, on standard output or error.
    pub fn never_prints(mut self, secret: &str) -> Self {
        self.secrets.push(secret.to_string());
        self
    }

    /// Run `pooler ARGS` against this server (its data directory from the environment).
    pub fn pooler(&self, args: &[&str]) -> Output {
        self.pooler_with(args, &[], None)
    }

    /// `pooler ARGS` with more environment and, optionally, standard input.
    pub fn pooler_with(&self, args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
        let mut command = Command::new(B::PATH);
        command
            .args(args)
            .env("POOLER_DATA_DIR", &self.data)
            .env_remove("POOLER_API_KEY")
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        for secret in &self.secrets {
            for stream in [&out.stdout, &out.stderr] {
                assert!(
                    !text(stream).contains(secret.as_str()),
                    "pooler {args:?} printed a secret"
                );
            }
        }
        out
    }

    /// `pooler ARGS` must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.pooler(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "pooler {args:?}\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// `pooler ARGS --json` must succeed; its JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let out = self.ok(&args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("pooler {args:?}: {e}: {out}"))
    }

    /// `pooler ARGS` must fail with `code` and print nothing on stdout; its stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.pooler(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "pooler {args:?}\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "", "pooler {args:?} printed on stdout");
        text(&out.stderr)
    }

    /// `pooler ARGS` (with `--json` among them) must fail with `code`, printing its JSON
    /// error object on stdout and no error line on stderr; the object's `error`.
    pub fn fails_json(&self, args: &[&str], code: i32) -> Value {
        let out = self.pooler(args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(
            out.status.code(),
            Some(code),
            "pooler {args:?}\nstdout: {stdout}\nstderr: {stderr}"
        );
        assert!(!stderr.contains("error:"), "pooler {args:?}: {stderr}");
        let value: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("pooler {args:?}: {e}: {stdout}"));
        let error = value["error"].clone();
        assert!(
            error["kind"].is_string() && error["message"].is_string(),
            "pooler {args:?}: {value}"
        );
        error
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        self.url.strip_prefix("http://").unwrap()
    }

    /// The admin token the server wrote.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data.join("admin-token")).unwrap()
    }

    /// SIGTERM, and the exit code.
    pub fn stop(mut self) -> Option<i32> {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "pooler did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl<B: Binary> Drop for Served<B> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every SQLite database under `data` (the core's `core.sqlite3` and each plugin's, under
/// `plugins/ROLE/`), each checked with `PRAGMA integrity_check` (which must answer `ok`)
/// and `PRAGMA foreign_key_check` (which must find nothing). Opening a database replays its
/// write-ahead log, as the next start would. The files checked, sorted.
pub fn integrity_check(data: &std::path::Path) -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "sqlite3") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(data, &mut files);
    files.sort();
    for file in &files {
        let conn = rusqlite::Connection::open(file).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        let verdict: Vec<String> = conn
            .prepare("PRAGMA integrity_check")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(verdict, ["ok"], "integrity_check of {}", file.display());
        let dangling: usize = conn
            .prepare("PRAGMA foreign_key_check")
            .unwrap()
            .query_map([], |_| Ok(()))
            .unwrap()
            .count();
        assert_eq!(dangling, 0, "foreign_key_check of {}", file.display());
    }
    files
}

/// The file names (relative to `data`) of [`integrity_check`]'s answer, for assertions.
pub fn relative(data: &std::path::Path, files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| f.strip_prefix(data).unwrap().display().to_string())
        .collect()
}

/// Poll `check` until it returns `Some`, at most `limit` (the server runs on the real
/// clock; this waits for a real process, never for a timer).
pub fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A read-only connection to a database of a (running or killed) server.
pub fn read_only(path: &std::path::Path) -> rusqlite::Connection {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// The one database file of plugin `role` under the data directory.
pub fn plugin_db(data: &std::path::Path, role: &str) -> std::path::PathBuf {
    let dir = data.join("plugins").join(role);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sqlite3"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

/// A read-only connection to the core's database under the data directory.
pub fn core_db(data: &std::path::Path) -> rusqlite::Connection {
    read_only(&data.join(pooler_core::db::FILE_NAME))
}

/// Every database under the data directory passes the checks, and the core's and both
/// plugins' databases are among them.
pub fn databases_intact(data: &std::path::Path) {
    let files = relative(data, &integrity_check(data));
    assert!(files.iter().any(|f| f == "core.sqlite3"), "{files:?}");
    for role in ["account-pool", "provider-retry"] {
        let prefix = format!("plugins/{role}/");
        assert!(files.iter().any(|f| f.starts_with(&prefix)), "{files:?}");
    }
}

/// Add a Claude API-key account labelled `label` through `pooler account add` (the key on
/// standard input); its id.
pub fn add_api_key<B: Binary>(served: &Served<B>, key: &str, label: &str) -> String {
    add_api_key_with(served, key, label, &[])
}

/// [`add_api_key`] with more arguments to `pooler account add` (`--priority 3`, say).
pub fn add_api_key_with<B: Binary>(
    served: &Served<B>,
    key: &str,
    label: &str,
    more: &[&str],
) -> String {
    let mut args = vec![
        "account",
        "add",
        "--provider",
        "claude",
        "--api-key",
        "-",
        "--label",
        label,
        "--json",
    ];
    args.extend_from_slice(more);
    let out = served.pooler_with(&args, &[], Some(key));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["account"]["id"].as_str().unwrap().to_owned()
}
