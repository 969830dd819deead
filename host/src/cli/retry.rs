//! `pooler retry …`: a person's say over a thread's automatic retries (admin API
//! `/_pooler/threads/{id}/send-now` and `/opt-out`). `send-now` is the person's override:
//! it dispatches the thread's queued retry at once, bypassing its send time, the concurrency
//! limit and the retry plugin's gate; the core records it, and the plugin is told.

use clap::Subcommand;
use serde_json::json;

use super::client::ClientArgs;
use crate::admin::percent_encode;

/// Override or switch off a thread's automatic retries.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler retry send-now th_k3v9...        # send the queued retry now\n  \
    pooler retry opt-out th_k3v9...         # no automatic retries for this thread\n  \
    pooler retry opt-out th_k3v9... --off   # automatic retries again")]
pub struct Args {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    command: RetryCommand,
}

#[derive(Debug, Subcommand)]
enum RetryCommand {
    /// Send the thread's queued retry now, bypassing its time, the concurrency limit and
    /// the retry plugin's gate (recorded as sent by a person).
    SendNow { thread: String },
    /// Opt the thread out of automatic retries (with --off: back in).
    OptOut {
        thread: String,
        /// Opt back in.
        #[arg(long)]
        off: bool,
    },
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    let client = out.connect()?;
    match args.command {
        RetryCommand::SendNow { thread } => {
            let answer = client
                .post(
                    &format!("threads/{}/send-now", percent_encode(&thread)),
                    &json!({}),
                )
                .await?;
            out.print(&answer, || {
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
            out.print(&answer, || {
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
