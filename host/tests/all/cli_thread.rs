//! `pooler thread new --agent …` as a user meets it: a real `pooler serve` process whose
//! `[agents]` table names binaries. What cannot run is refused when the thread is made, with
//! a message that says what to fix, and no thread is left behind; `--help` explains the
//! agents. (Turns of real agent CLIs are driven in `tests/tests/all/agents.rs`.)

#![cfg(unix)]

use crate::support;

use std::process::Command;

use support::{Served, text};

#[test]
fn an_agent_thread_that_cannot_run_is_refused_when_it_is_made() {
    let served = Served::start_with("[agents]\nclaude-code = \"/nonexistent/claude\"\n");
    let missing = served.fails(&["thread", "new", "--agent", "claude-code", "fix it"], 1);
    assert!(
        missing.contains("/nonexistent/claude") && missing.contains("claude-code"),
        "{missing}"
    );
    let no_dir = served.fails(
        &[
            "thread",
            "new",
            "--agent",
            "http",
            "--cwd",
            "/nonexistent/dir",
            "x",
        ],
        1,
    );
    assert!(no_dir.contains("/nonexistent/dir"), "{no_dir}");
    let args = served.fails(&["thread", "new", "hello", "--", "--verbose"], 2);
    assert!(args.contains("--agent"), "{args}");
    let unknown = served.fails(&["thread", "new", "--agent", "gemini", "x"], 2);
    assert!(unknown.contains("claude-code"), "{unknown}");
    let listed = served.json(&["thread", "list"]);
    assert_eq!(
        listed["threads"],
        serde_json::json!([]),
        "no thread was made"
    );
}

#[test]
fn thread_new_help_explains_the_agents() {
    let out = Command::new(env!("CARGO_BIN_EXE_pooler"))
        .args(["thread", "new", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for word in [
        "--agent",
        "claude-code",
        "codex",
        "--cwd",
        "POOLER_CLAUDE_CODE_BIN",
        "[ARGS]...",
    ] {
        assert!(help.contains(word), "missing {word}:\n{help}");
    }
}

/// `thread new --agent codex` through a real server: the agent (here a stand-in script that
/// prints what Codex prints) runs in the named directory with the user's extra arguments
/// and the route token in its environment (never in its arguments), and `thread show`
/// prints the agent, its session id and the turn's reply.
#[test]
fn an_agent_thread_runs_its_agent_and_shows_its_session_and_reply() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let agent = dir.path().join("codex");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n\
             {{ pwd; for a in \"$@\"; do echo \"arg:$a\"; done; \
                [ -n \"$POOLER_CODEX_TOKEN\" ] && echo token-set; }} > '{seen}'\n\
             echo '{{\"type\":\"thread.started\",\"thread_id\":\"t-cli-1\"}}'\n\
             echo '{{\"type\":\"item.completed\",\"item\":{{\"type\":\"agent_message\",\"text\":\"pong\"}}}}'\n\
             echo '{{\"type\":\"turn.completed\"}}'\n",
            seen = seen.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = dir.path().join("repo");
    std::fs::create_dir(&work).unwrap();
    let served = Served::start_with(&format!(
        "[agents]\ncodex = {:?}\n",
        agent.display().to_string()
    ));
    let thread = served
        .ok(&[
            "thread",
            "new",
            "--agent",
            "codex",
            "--cwd",
            work.to_str().unwrap(),
            "say pong",
            "--",
            "--search",
        ])
        .trim()
        .to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let show = loop {
        let show = served.json(&["thread", "show", &thread]);
        if show["turns"][0]["outcome"] == "ok" {
            break show;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the turn did not end: {show}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(show["thread"]["agent"], "codex");
    assert_eq!(show["thread"]["agent_session"], "t-cli-1");
    assert_eq!(show["turns"][0]["reply"], "pong");
    let text = served.ok(&["thread", "show", &thread]);
    assert!(text.contains("agent    codex\n"), "{text}");
    assert!(text.contains("session  t-cli-1\n"), "{text}");
    assert!(text.contains("pong"), "{text}");
    let idle = served.fails(&["thread", "cancel", &thread], 1);
    assert!(idle.contains("running no turn"), "{idle}");
    let seen = std::fs::read_to_string(&seen).unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], work.to_str().unwrap(), "it ran in --cwd");
    assert!(lines.contains(&"arg:--search"), "{seen}");
    assert!(
        lines.ends_with(&["arg:--", "arg:say pong", "token-set"]),
        "{seen}"
    );
}
