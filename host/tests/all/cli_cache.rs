//! The compile cache of `pooler serve`: found by `--compile-cache`, `$POOLER_CACHE_DIR` or
//! the platform's cache directory; shared by every data directory, so a second data
//! directory compiles nothing; a damaged entry is compiled again and replaced.
//!
//! What a start did is read from its log: each plugin's `plugin loaded` line says
//! `compile_cache="compiled"`, `"hit"` or `"recompiled"`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

/// Start `pooler serve` on `data` with `args` and `env`, wait until it listens, stop it,
/// and return its log (standard error).
fn start(data: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pooler"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(args)
        .env_remove("POOLER_DATA_DIR")
        .env_remove("POOLER_CACHE_DIR")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(
        first.starts_with("pooler listening on "),
        "pooler serve did not start: {first}\n{log}"
    );
    log
}

/// How each plugin's component was obtained, in load order (`["compiled", "hit"]`).
fn outcomes(log: &str) -> Vec<String> {
    // Standard error is a pipe here: the log is plain text, no colour sequences.
    assert!(
        !log.contains('\u{1b}'),
        "a piped log is not coloured: {log:?}"
    );
    log.lines()
        .filter(|l| l.contains("plugin loaded"))
        .map(|l| {
            let (_, rest) = l
                .split_once("compile_cache=\"")
                .unwrap_or_else(|| panic!("no compile_cache field: {l}"));
            rest.split('"').next().unwrap().to_owned()
        })
        .collect()
}

/// The cache's entries and their modification times.
fn entries(dir: &Path) -> Vec<(PathBuf, SystemTime)> {
    let mut files: Vec<(PathBuf, SystemTime)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path(), e.metadata().unwrap().modified().unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn two_data_directories_share_one_compile_and_a_damaged_entry_is_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let elsewhere = dir.path().join("elsewhere");

    // The first data directory, the cache named by the environment: both embedded
    // components are compiled and stored.
    let log = start(&dir.path().join("a"), &[], &[("POOLER_CACHE_DIR", &cache)]);
    assert_eq!(outcomes(&log), ["compiled", "compiled"], "{log}");
    let stored = entries(&cache);
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(
        stored
            .iter()
            .all(|(p, _)| p.extension().is_some_and(|e| e == "cwasm"))
    );

    // A second, fresh data directory, the cache named by the flag (which wins over the
    // environment): nothing is compiled, nothing is rewritten.
    let flag = cache.to_str().unwrap();
    let log = start(
        &dir.path().join("b"),
        &["--compile-cache", flag],
        &[("POOLER_CACHE_DIR", &elsewhere)],
    );
    assert_eq!(outcomes(&log), ["hit", "hit"], "{log}");
    assert_eq!(entries(&cache), stored);
    assert!(!elsewhere.exists());

    // A damaged entry is not trusted: compiled again, replaced, then found.
    let (damaged, _) = &stored[0];
    std::fs::remove_file(damaged).unwrap();
    std::fs::write(damaged, b"garbage").unwrap();
    let log = start(&dir.path().join("b"), &["--compile-cache", flag], &[]);
    let mut seen = outcomes(&log);
    seen.sort();
    assert_eq!(seen, ["hit", "recompiled"], "{log}");
    assert_ne!(std::fs::read(damaged).unwrap(), b"garbage");
    let log = start(&dir.path().join("c"), &["--compile-cache", flag], &[]);
    assert_eq!(outcomes(&log), ["hit", "hit"], "{log}");
}

/// With neither flag nor variable, the cache is `pooler` in the platform's cache
/// directory: here `$HOME/.cache/pooler` (XDG, no `$XDG_CACHE_HOME`).
#[cfg(all(unix, not(target_os = "macos")))]
#[test]
fn by_default_the_cache_is_in_the_users_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let log = start(&dir.path().join("data"), &[], &[("HOME", &home)]);
    assert_eq!(outcomes(&log), ["compiled", "compiled"], "{log}");
    assert_eq!(entries(&home.join(".cache").join("pooler")).len(), 2);
    assert!(!dir.path().join("data").join("cache").exists());
}
