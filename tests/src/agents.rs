//! Support for the tests that drive the real agent CLIs (Claude Code 2.1.328, Codex CLI
//! 0.169.0, pinned in `tests/agents/package.json` and installed by `npm ci --prefix
//! tests/agents`): where their binaries are, and a wrapper per test that gives the CLI a
//! home of its own (its sessions and settings stay in the test's temporary directory, and
//! nothing of the machine's own login is used).
//!
//! A missing CLI fails the test with what to run: these tests are part of the suite, never
//! skipped.

use std::path::{Path, PathBuf};

use pooler_core::agent::Cli;

/// The real binary of `cli`: `POOLER_CLAUDE_CODE_BIN` / `POOLER_CODEX_BIN`, else the one
/// `npm ci --prefix tests/agents` installed.
pub fn real_binary(cli: Cli) -> PathBuf {
    let (var, name) = match cli {
        Cli::ClaudeCode => ("POOLER_CLAUDE_CODE_BIN", "claude"),
        Cli::Codex => ("POOLER_CODEX_BIN", "codex"),
    };
    let path = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("agents/node_modules/.bin")
                .join(name)
        });
    assert!(
        path.is_file(),
        "the {name} CLI is not installed at {}: run `npm ci --prefix tests/agents` (or set {var})",
        path.display()
    );
    path
}

/// A wrapper script in `dir` that runs the real `cli` with `HOME` (and Codex's
/// `CODEX_HOME`) in `dir/home`, so each test's agent sessions are its own. Returns the
/// wrapper's path, for the `[agents]` table.
pub fn isolated_binary(cli: Cli, dir: &Path) -> PathBuf {
    let real = real_binary(cli);
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".codex")).expect("the agent's home");
    let name = match cli {
        Cli::ClaudeCode => "claude",
        Cli::Codex => "codex",
    };
    let wrapper = dir.join(name);
    let script = format!(
        "#!/bin/sh\nHOME='{home}' CODEX_HOME='{home}/.codex' exec '{real}' \"$@\"\n",
        home = home.display(),
        real = real.display()
    );
    std::fs::write(&wrapper, script).expect("write the wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .expect("make the wrapper executable");
    wrapper
}

/// How often `needle` occurs in `haystack`.
pub fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}
