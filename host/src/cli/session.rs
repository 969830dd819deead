//! `pooler session explain`: where a conversation is pinned and why (admin API
//! `/_pooler/sessions…`).

use clap::Subcommand;

use super::client::{ClientArgs, field};
use super::format::{iso, now_ms, relative, table, when};
use crate::wire::{ProviderName, SessionView, percent_encode};

/// Explain where a session (a conversation) is pinned, why, and its latest attempts.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
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
    /// Show a session's pinned account, why it is there, and its last outcomes.
    Explain {
        /// The provider: claude or codex.
        #[arg(long)]
        provider: ProviderName,
        /// The session id or stored key.
        session: String,
    },
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    match args.command {
        SessionCommand::Explain { provider, session } => {
            let answer = out
                .connect()?
                .get(&format!("sessions/{provider}/{}", percent_encode(&session)))
                .await?;
            out.print(&answer, || {
                let s: SessionView = field(&answer, "session")?;
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
                    a.outcome.clone(),
                ]
            })
            .collect();
        out.push_str("\nrecent attempts (newest last):\n");
        out.push_str(&table(&["AT", "", "ACCOUNT", "STATUS", "OUTCOME"], &rows));
        out.push('\n');
    }
    out
}
