//! `pooler thread …`: the core's threads (admin API `/_pooler/threads…`). A thread is one
//! agent conversation whose turns the host sends through the pool; `show` lists its turns
//! with their attempt numbers and outcomes and its queued retry rows with their send times.

use clap::Subcommand;
use serde_json::{Value, json};

use super::client::ClientArgs;
use super::format::{iso, now_ms, table, when};
use crate::operate::wire::{ProviderName, percent_encode};

/// Create threads, send them messages, and see their turns and queued retries.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    T=$(pooler thread new --provider claude \"Summarise README.md\")\n  \
    T=$(pooler thread new --agent claude-code --cwd ~/src/app \"Fix the failing test\")\n  \
    pooler thread send \"$T\" \"Now the CHANGELOG\"\n  \
    pooler thread show \"$T\"\n  \
    pooler thread cancel \"$T\"\n  \
    pooler thread list --json\n  \
    pooler thread archive \"$T\"")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: ThreadCommand,
}

#[derive(Debug, Subcommand)]
enum ThreadCommand {
    /// Create a thread (with a route through the pool), send TEXT as its first turn, and
    /// print the thread id. With `--agent claude-code` or `--agent codex` every turn runs
    /// the real CLI in the thread's directory, resuming the same agent session; ARGS after
    /// `--` go to the CLI on every turn.
    New {
        /// What runs the turns: `http` (the host sends one request itself), `claude-code`
        /// or `codex` (the real CLI; its binary comes from [agents] in the configuration,
        /// else $POOLER_CLAUDE_CODE_BIN / $POOLER_CODEX_BIN, else `claude` / `codex` on PATH).
        #[arg(long, default_value = "http", value_parser = ["http", "claude-code", "codex"])]
        agent: String,
        /// The provider: claude or codex (default: the agent's, else claude).
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: Option<ProviderName>,
        /// The model its turns ask for (default: the agent's or the driver's default).
        #[arg(long)]
        model: Option<String>,
        /// The directory the agent runs in (default: one under the data directory).
        #[arg(long)]
        cwd: Option<std::path::PathBuf>,
        /// The first message.
        text: String,
        /// Extra arguments for the agent CLI, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Queue a message; it runs as a turn when the thread is free. Prints the request id.
    Send { thread: String, text: String },
    /// A thread's status, its turns (attempts, outcomes) and its queued retry rows.
    Show { thread: String },
    /// Every thread, oldest first.
    List,
    /// Stop the turn the thread is running now (an agent CLI's process is killed); it is
    /// recorded as failed and not retried. The thread takes the next message.
    Cancel { thread: String },
    /// Archive a thread: no further turn, its queued rows removed, its route closed, a
    /// running turn stopped.
    Archive { thread: String },
}

/// Run `pooler thread …` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    let client = out.connect()?;
    match args.command {
        ThreadCommand::New {
            agent,
            provider,
            model,
            cwd,
            text,
            args,
        } => {
            if agent == "http" && !args.is_empty() {
                return Err(super::UsageError(
                    "arguments after `--` are for an agent CLI; name one with --agent".into(),
                )
                .into());
            }
            // The server may run elsewhere: send the directory as an absolute path.
            let cwd = cwd
                .map(std::path::absolute)
                .transpose()?
                .map(|p| p.display().to_string());
            let answer = client
                .post(
                    "threads",
                    &json!({ "provider": provider, "model": model, "text": text,
                             "agent": agent, "cwd": cwd, "args": args }),
                )
                .await?;
            out.print(&answer, |answer| {
                println!("{}", str_of(&answer["thread"]["id"]));
                Ok(())
            })
        }
        ThreadCommand::Send { thread, text } => {
            let answer = client
                .post(
                    &format!("threads/{}/messages", percent_encode(&thread)),
                    &json!({ "text": text }),
                )
                .await?;
            out.print(&answer, |answer| {
                println!("{}", str_of(&answer["request"]));
                Ok(())
            })
        }
        ThreadCommand::Show { thread } => {
            let answer = client
                .get(&format!("threads/{}", percent_encode(&thread)))
                .await?;
            out.print(&answer, |answer| {
                print!("{}", show_text(answer, now_ms()));
                Ok(())
            })
        }
        ThreadCommand::List => {
            let answer = client.get("threads").await?;
            out.print(&answer, |answer| {
                let threads = answer["threads"].as_array().cloned().unwrap_or_default();
                if threads.is_empty() {
                    println!("no threads (create one with `pooler thread new TEXT`)");
                } else {
                    println!("{}", list_text(&threads));
                }
                Ok(())
            })
        }
        ThreadCommand::Cancel { thread } => {
            let answer = client
                .post(
                    &format!("threads/{}/cancel", percent_encode(&thread)),
                    &json!({}),
                )
                .await?;
            out.print(&answer, |_| {
                println!("cancelled the running turn of thread {thread}");
                Ok(())
            })
        }
        ThreadCommand::Archive { thread } => {
            let answer = client
                .post(
                    &format!("threads/{}/archive", percent_encode(&thread)),
                    &json!({}),
                )
                .await?;
            out.print(&answer, |_| {
                println!("archived thread {thread}");
                Ok(())
            })
        }
    }
}

fn str_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `error`, `error, archived, opted out`.
fn status_of(thread: &Value) -> String {
    let mut status = str_of(&thread["status"]);
    if thread["archived"] == true {
        status.push_str(", archived");
    }
    if thread["retry_opt_out"] == true {
        status.push_str(", opted out of retries");
    }
    status
}

fn list_text(threads: &[Value]) -> String {
    let rows: Vec<Vec<String>> = threads
        .iter()
        .map(|t| {
            vec![
                str_of(&t["id"]),
                str_of(&t["provider"]),
                str_of(&t["model"]),
                status_of(t),
                t["created_at"].as_u64().map(iso).unwrap_or_default(),
            ]
        })
        .collect();
    table(&["THREAD", "PROVIDER", "MODEL", "STATUS", "CREATED"], &rows)
}

/// A turn's outcome in a few words: `ok`, `running`, `queued`,
/// `failed: rate-limit 429 (provider), retry after …`.
fn outcome_of(turn: &Value, now: u64) -> String {
    match turn["outcome"].as_str() {
        Some("ok") => "ok".into(),
        Some(_) => {
            let f = &turn["failure"];
            let mut text = format!("failed: {}", str_of(&f["category"]));
            if let Some(status) = f["http_status"].as_u64() {
                text.push_str(&format!(" {status}"));
            }
            if let Some(origin) = f["origin"].as_str() {
                text.push_str(&format!(" ({origin})"));
            }
            if let Some(at) = f["retry_after"].as_u64() {
                text.push_str(&format!(", retry after {}", when(at, now)));
            }
            text
        }
        None if turn["started_at"].is_u64() => "running".into(),
        None => "queued".into(),
    }
}

/// The first line of a reply, at most 60 characters (`--json` has it whole).
fn excerpt(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or_default();
    if line.chars().count() > 60 || text.trim().lines().nth(1).is_some() {
        let cut: String = line.chars().take(59).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

fn show_text(answer: &Value, now: u64) -> String {
    let thread = &answer["thread"];
    let mut out = format!(
        "thread   {}\nprovider {}\nmodel    {}\nagent    {}\nstatus   {}\n",
        str_of(&thread["id"]),
        str_of(&thread["provider"]),
        str_of(&thread["model"]),
        str_of(&thread["agent"]),
        status_of(thread),
    );
    if thread["agent"].as_str().is_some_and(|a| a != "http") {
        out.push_str(&format!(
            "session  {}\ndir      {}\n",
            str_of(&thread["agent_session"]),
            thread["cwd"].as_str().unwrap_or("(under the data directory)"),
        ));
    }
    let turns = answer["turns"].as_array().cloned().unwrap_or_default();
    out.push_str("\nturns:\n");
    if turns.is_empty() {
        out.push_str("  none\n");
    } else {
        let rows: Vec<Vec<String>> = turns
            .iter()
            .map(|t| {
                vec![
                    str_of(&t["id"]),
                    str_of(&t["attempt"]),
                    str_of(&t["trigger"]),
                    t["started_at"].as_u64().map(iso).unwrap_or_default(),
                    outcome_of(t, now),
                    excerpt(t["reply"].as_str().unwrap_or_default()),
                ]
            })
            .collect();
        let head = ["REQUEST", "ATTEMPT", "BY", "STARTED", "OUTCOME", "REPLY"];
        for line in table(&head, &rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    if let Some(totals) = answer["tokens"].as_array() {
        out.push_str("\ntokens:\n");
        if totals.is_empty() {
            out.push_str("  none recorded\n");
        }
        for t in totals {
            let counts: crate::operate::wire::TokenCountsView =
                serde_json::from_value(t["counts"].clone()).unwrap_or_default();
            out.push_str(&format!(
                "  {} {}  {}\n",
                str_of(&t["account"]),
                t["model"].as_str().unwrap_or("(model not named)"),
                super::status::tokens(&counts)
            ));
        }
    }
    let queued = answer["rows"].as_array().cloned().unwrap_or_default();
    out.push_str("\nqueued retries:\n");
    if queued.is_empty() {
        out.push_str("  none\n");
    } else {
        let rows: Vec<Vec<String>> = queued
            .iter()
            .map(|r| {
                let mut send_at = r["send_at"]
                    .as_u64()
                    .map(|t| when(t, now))
                    .unwrap_or_default();
                if r["waiting_for_slot"] == true {
                    send_at.push_str(", waiting for a slot");
                }
                vec![
                    str_of(&r["id"]),
                    str_of(&r["attempt"]),
                    send_at,
                    str_of(&r["reason"]),
                ]
            })
            .collect();
        for line in table(&["ROW", "ATTEMPT", "SEND AT", "REASON"], &rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_lists_attempts_outcomes_and_queued_rows() {
        let answer = json!({
            "thread": {"id": "th_1", "provider": "claude", "model": null, "status": "error",
                       "archived": false, "retry_opt_out": false, "agent": "claude-code",
                       "agent_session": "5f0c…", "cwd": "/work/repo"},
            "turns": [
                {"id": "rq_1", "attempt": 1, "trigger": "user", "started_at": 0,
                 "outcome": "failed",
                 "failure": {"category": "rate-limit", "http_status": 429, "origin": "provider",
                             "retry_after": 120_000}},
                {"id": "rq_2", "attempt": 2, "trigger": "retry", "started_at": 60_000,
                 "outcome": null},
                {"id": "rq_3", "attempt": 1, "trigger": "user", "started_at": 70_000,
                 "outcome": "ok", "reply": "Done: the parser handles quoted keys now.\nDetails…"},
            ],
            "rows": [{"id": 7, "attempt": 3, "send_at": 180_000, "reason": "rate limited",
                      "waiting_for_slot": true}],
            "tokens": [{"provider": "claude", "account": "acc_a", "thread": "th_1",
                        "model": "claude-sonnet-4-5",
                        "counts": {"answers": 2, "input": 20, "output": 10,
                                   "cache_read": 4_000, "cache_write": 500}}],
        });
        let text = show_text(&answer, 60_000);
        assert!(
            text.contains("\ntokens:\n  acc_a claude-sonnet-4-5  in 20  out 10  cache read 4.0k  write 500  (cache hit 88 %, 2 answers)\n"),
            "{text}"
        );
        assert!(text.contains("status   error\n"), "{text}");
        assert!(text.contains("agent    claude-code\n"), "{text}");
        assert!(text.contains("session  5f0c…\ndir      /work/repo\n"), "{text}");
        let done = text.lines().find(|l| l.contains("rq_3")).unwrap();
        assert!(
            done.contains(" ok ") && done.ends_with("Done: the parser handles quoted keys now.…"),
            "the first line of the reply: {done}"
        );
        assert!(
            text.contains(
                "failed: rate-limit 429 (provider), retry after 1970-01-01T00:02:00Z (in 1m)"
            ),
            "{text}"
        );
        assert!(text.contains("rq_2     2        retry"), "{text}");
        assert!(text.contains("running"), "{text}");
        assert!(
            text.contains(
                "7    3        1970-01-01T00:03:00Z (in 2m), waiting for a slot  rate limited"
            ),
            "{text}"
        );
    }
}
