//! `pooler session list|explain`: the conversations the pool has pinned, and where one is
//! pinned and why (admin API `/_pooler/sessions…`).

use clap::Subcommand;

use super::client::{ClientArgs, field};
use super::format::{iso, now_ms, relative, table, when};
use crate::operate::wire::{ProviderName, SessionSummaryView, SessionView, percent_encode};

/// List the sessions (conversations) the pool has pinned, and explain where one is pinned,
/// why, and its latest attempts.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler session list --thread my-thread\n  \
    pooler session list --provider codex --json\n  \
    pooler session explain --provider claude 9f1c2d3e-...\n  \
    pooler session explain --provider claude session:9f1c2d3e-... --json\n\n\
    The session is the id the agent sends (Claude Code: the session id in \
    metadata.user_id), or a key as the pool stores it (`session:<id>`, `cache:<key>`).")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Debug, Subcommand)]
enum SessionCommand {
    /// List the sessions with a live pin, most recently used first: key, provider,
    /// account, thread, last use, pin expiry.
    List {
        /// Only the sessions pinned through this thread's route.
        #[arg(long)]
        thread: Option<String>,
        /// Only this provider's sessions.
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: Option<ProviderName>,
    },
    /// Show a session's pinned account, why it is there, and its last outcomes.
    Explain {
        /// The provider: claude or codex.
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: ProviderName,
        /// The session id or stored key.
        session: String,
    },
}

/// Run `pooler session …` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    match args.command {
        SessionCommand::List { thread, provider } => {
            let mut query = Vec::new();
            if let Some(t) = &thread {
                query.push(format!("thread={}", percent_encode(t)));
            }
            if let Some(p) = provider {
                query.push(format!("provider={p}"));
            }
            let path = if query.is_empty() {
                "sessions".to_owned()
            } else {
                format!("sessions?{}", query.join("&"))
            };
            let answer = out.connect()?.get(&path).await?;
            out.print(&answer, |answer| {
                let sessions: Vec<SessionSummaryView> = field(answer, "sessions")?;
                print!("{}", session_table(&sessions, now_ms()));
                Ok(())
            })
        }
        SessionCommand::Explain { provider, session } => {
            let answer = out
                .connect()?
                .get(&format!("sessions/{provider}/{}", percent_encode(&session)))
                .await?;
            out.print(&answer, |answer| {
                let s: SessionView = field(answer, "session")?;
                print!("{}", explain(&s, now_ms()));
                Ok(())
            })
        }
    }
}

fn explain(s: &SessionView, now: u64) -> String {
    let mut out = format!("session {} ({})\n", s.key, s.provider);
    match &s.account {
        Some(account) => out.push_str(&format!("  pinned to     {account}\n")),
        None => out.push_str("  pinned to     nothing\n"),
    }
    out.push_str(&format!("  why           {}\n", s.why));
    if let Some(thread) = &s.thread {
        out.push_str(&format!("  thread        {thread}\n"));
    }
    if let Some(t) = s.last_used_at {
        out.push_str(&format!("  last used     {}\n", when(t, now)));
    }
    if let Some(t) = s.expires_at {
        out.push_str(&format!("  pin expires   {}\n", when(t, now)));
    }
    if s.recent.is_empty() {
        out.push_str("  no recent attempts\n");
    } else {
        let rows: Vec<Vec<String>> = s
            .recent
            .iter()
            .map(|a| {
                vec![
                    iso(a.at),
                    relative(a.at, now),
                    a.account.clone(),
                    a.status.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                    a.outcome.to_string(),
                ]
            })
            .collect();
        out.push_str("\nrecent attempts (newest last):\n");
        out.push_str(&table(&["AT", "", "ACCOUNT", "STATUS", "OUTCOME"], &rows));
        out.push('\n');
    }
    out
}

/// The pinned sessions as a table (or a line saying there are none).
fn session_table(sessions: &[SessionSummaryView], now: u64) -> String {
    if sessions.is_empty() {
        return "no pinned sessions\n".to_owned();
    }
    let dash = || "-".to_owned();
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.key.clone(),
                s.provider.to_string(),
                s.account.clone(),
                s.thread.clone().unwrap_or_else(dash),
                relative(s.last_used_at, now),
                if s.provisional {
                    "in flight".to_owned()
                } else {
                    relative(s.expires_at, now)
                },
            ]
        })
        .collect();
    format!(
        "{}\n",
        table(
            &[
                "SESSION",
                "PROVIDER",
                "ACCOUNT",
                "THREAD",
                "LAST USED",
                "PIN EXPIRES"
            ],
            &rows
        )
    )
}
