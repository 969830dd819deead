//! `pooler retry …`: what the retry plugin plans for threads whose turns failed, and a
//! person's say over it.
//!
//! - `status`, `explain` and `cancel` ask Provider Retry (admin API `/_pooler/retry/…`, its
//!   `retry-admin` export): the open candidates, a thread's history in words, and cancelling
//!   a thread's pending retry.
//! - `send-now` and `opt-out` are the core's (`/_pooler/threads/{id}/send-now` and
//!   `/opt-out`). `send-now` is the person's override: it dispatches the thread's queued
//!   retry at once, bypassing its send time, the concurrency limit and the retry plugin's
//!   gate; the core records it, and the plugin is told.
//!
//! A thread with nothing pending is an error (exit 1) for `status THREAD` and `cancel`, and
//! for `explain` of a thread the plugin has no history of.

use clap::Subcommand;
use serde_json::json;

use super::explain::render;
use super::client::{ClientArgs, field};
use super::format::{now_ms, table, when};
use crate::operate::wire::{CandidateView, ChainView, percent_encode};

/// See, explain, cancel, override or switch off a thread's automatic retries.
#[derive(Debug, clap::Args)]
#[command(after_help = "Times are UTC. Examples:\n  \
    pooler retry status                     # every thread with a retry pending\n  \
    pooler retry status th_k3v9... --json   # one thread, as JSON\n  \
    pooler retry explain th_k3v9...         # what was decided for it, and why\n  \
    pooler retry cancel th_k3v9...          # no retry of the failed turn after all\n  \
    pooler retry send-now th_k3v9...        # send the queued retry now\n  \
    pooler retry opt-out th_k3v9...         # no automatic retries for this thread\n  \
    pooler retry opt-out th_k3v9... --off   # automatic retries again\n\n\
    The retry plugin's settings are `pooler config get|set retry.<key>`.")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: RetryCommand,
}

#[derive(Debug, Subcommand)]
enum RetryCommand {
    /// List the threads with a retry pending: state, next send time, reason.
    ///
    /// Each thread whose failed turn has a retry scheduled (a queued row) or is watched
    /// until the pool can serve. With THREAD, only that thread; exit 1 when it has nothing
    /// pending.
    Status {
        /// Only this thread.
        thread: Option<String>,
    },
    /// Explain in words what was decided for a thread's retries, and why.
    ///
    /// One line per decision, oldest first, times UTC HH:MM:SS, e.g. "rescheduled
    /// 03:00:23 → 00:50:31 after pool availability changed (account enabled)". Exit 1 when
    /// the retry plugin has no history of the thread.
    Explain {
        /// The thread (`pooler thread list` shows them).
        thread: String,
    },
    /// Cancel a thread's pending retry.
    ///
    /// Removes its queued row (or ends its watch) on your behalf. The failed turn stays
    /// failed; a new message starts afresh. Exit 1 when it has nothing pending.
    Cancel {
        /// The thread.
        thread: String,
    },
    /// Send a thread's queued retry now.
    ///
    /// Bypasses its send time, the concurrency limit and the retry plugin's gate; recorded
    /// as sent by a person.
    SendNow { thread: String },
    /// Opt the thread out of automatic retries (with --off: back in).
    OptOut {
        thread: String,
        /// Opt back in.
        #[arg(long)]
        off: bool,
    },
}

/// Run `pooler retry …` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    let client = out.connect()?;
    match args.command {
        RetryCommand::Status { thread } => {
            let path = match &thread {
                Some(t) => format!("retry/status?thread={}", percent_encode(t)),
                None => "retry/status".to_owned(),
            };
            let answer = client.get(&path).await?;
            let candidates: Vec<CandidateView> = field(&answer, "candidates")?;
            if let Some(t) = &thread
                && candidates.is_empty()
            {
                anyhow::bail!("thread {t} has nothing pending");
            }
            out.print(&answer, |answer| {
                let candidates: Vec<CandidateView> = field(answer, "candidates")?;
                if candidates.is_empty() {
                    println!("no thread has a retry pending");
                } else {
                    println!("{}", status_table(&candidates, now_ms()));
                }
                Ok(())
            })
        }
        RetryCommand::Explain { thread } => {
            let answer = client
                .get(&format!("retry/explain/{}", percent_encode(&thread)))
                .await?;
            let chains: Vec<ChainView> = field(&answer, "chains")?;
            if chains.is_empty() {
                anyhow::bail!("thread {thread} has nothing pending");
            }
            out.print(&answer, |answer| {
                let chains: Vec<ChainView> = field(answer, "chains")?;
                let text: Vec<String> = chains.iter().map(render).collect();
                print!("{}", text.join("\n"));
                Ok(())
            })
        }
        RetryCommand::Cancel { thread } => {
            let answer = client
                .post(
                    &format!("retry/cancel/{}", percent_encode(&thread)),
                    &json!({}),
                )
                .await?;
            out.print(&answer, |answer| {
                let cancelled: CandidateView = field(answer, "cancelled")?;
                println!("{}", cancelled_words(&cancelled, now_ms()));
                Ok(())
            })
        }
        RetryCommand::SendNow { thread } => {
            let answer = client
                .post(
                    &format!("threads/{}/send-now", percent_encode(&thread)),
                    &json!({}),
                )
                .await?;
            out.print(&answer, |answer| {
                let sent = &answer["sent"];
                println!(
                    "sent row {} of thread {thread} now as attempt {} (request {})",
                    sent["row"],
                    sent["attempt"],
                    sent["request"].as_str().unwrap_or("-")
                );
                if sent["plugin_told"] != true {
                    println!(
                        "note: the retry plugin could not be told; it sees the turn's outcome"
                    );
                }
                Ok(())
            })
        }
        RetryCommand::OptOut { thread, off } => {
            let path = format!("threads/{}/opt-out", percent_encode(&thread));
            let answer = if off {
                client.delete(&path).await?
            } else {
                client.put(&path, &json!({})).await?
            };
            out.print(&answer, |_| {
                if off {
                    println!("thread {thread} gets automatic retries again");
                } else {
                    println!("thread {thread} is opted out of automatic retries");
                }
                Ok(())
            })
        }
    }
}

/// When a candidate is next sent: its row's time, or what a watch waits for.
fn next_send(c: &CandidateView, now: u64) -> String {
    match c.send_at {
        Some(at) => when(at, now),
        None => "- (when the pool can serve)".to_owned(),
    }
}

/// The open candidates as a table: thread, state, next send time, attempt, reason.
fn status_table(candidates: &[CandidateView], now: u64) -> String {
    let rows: Vec<Vec<String>> = candidates
        .iter()
        .map(|c| {
            vec![
                c.thread.clone(),
                c.state.to_string(),
                next_send(c, now),
                c.next_attempt.to_string(),
                c.reason.clone(),
            ]
        })
        .collect();
    table(
        &["THREAD", "STATE", "NEXT SEND", "ATTEMPT", "REASON"],
        &rows,
    )
}

/// What `cancel` did, in words.
fn cancelled_words(c: &CandidateView, now: u64) -> String {
    match c.send_at {
        Some(at) => format!(
            "cancelled the retry of thread {} (attempt {} was {} for {})",
            c.thread,
            c.next_attempt,
            c.state,
            when(at, now)
        ),
        None => format!(
            "cancelled the retry of thread {} (it was {}: {})",
            c.thread, c.state, c.reason
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::operate::wire::CandidateState;

    const NOW: u64 = 1_792_716_616_000; // 2026-10-23T00:50:16Z

    fn candidate(thread: &str, send_at: Option<u64>) -> CandidateView {
        CandidateView {
            thread: thread.into(),
            original_request: "rq_1".into(),
            failed_request: "rq_1".into(),
            state: if send_at.is_some() {
                CandidateState::Scheduled
            } else {
                CandidateState::Watching
            },
            row: send_at.map(|_| 4),
            send_at,
            next_attempt: 2,
            reason: if send_at.is_some() {
                "rate-limited"
            } else {
                "pool-unavailable(authentication)"
            }
            .into(),
            chain_started_at: NOW - 1_000,
        }
    }

    #[test]
    fn status_is_a_table_of_thread_state_send_time_and_reason() {
        let text = status_table(
            &[
                candidate("th_a", Some(NOW + 3_600_000)),
                candidate("th_bb", None),
            ],
            NOW,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "THREAD  STATE      NEXT SEND                     ATTEMPT  REASON",
                "th_a    scheduled  2026-10-23T01:50:16Z (in 1h)  2        rate-limited",
                "th_bb   watching   - (when the pool can serve)   2        pool-unavailable(authentication)",
            ]
        );
    }

    #[test]
    fn cancel_says_what_was_cancelled() {
        assert_eq!(
            cancelled_words(&candidate("th_a", Some(NOW + 60_000)), NOW),
            "cancelled the retry of thread th_a (attempt 2 was scheduled for 2026-10-23T00:51:16Z (in 1m))"
        );
        assert_eq!(
            cancelled_words(&candidate("th_a", None), NOW),
            "cancelled the retry of thread th_a (it was watching: pool-unavailable(authentication))"
        );
    }

    #[test]
    fn the_commands_parse_with_json_anywhere() {
        for args in [
            &["pooler", "retry", "status"][..],
            &["pooler", "retry", "status", "th_1", "--json"],
            &["pooler", "retry", "--json", "explain", "th_1"],
            &["pooler", "retry", "cancel", "th_1"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert!(matches!(cli.command, Command::Retry(_)), "{args:?}");
        }
        assert!(Cli::try_parse_from(["pooler", "retry", "explain"]).is_err());
        assert!(Cli::try_parse_from(["pooler", "retry", "cancel"]).is_err());
    }
}
