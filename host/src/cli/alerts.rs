//! `pooler alerts [test]`: the alerts a running server would send, and a test of its
//! deliveries (admin API `/_pooler/alerts…`).

use clap::Subcommand;
use serde_json::{Value, json};

use super::client::ClientArgs;

/// Show the open alerts and where alerts go, or send a test alert (`[alerts]` in the
/// configuration file sets the webhook and the command; the log and /metrics always get
/// them).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler alerts            # the deliveries set, and the episodes open now\n  \
    pooler alerts test       # send a test alert through the webhook and the command now")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: Option<AlertsCommand>,
}

#[derive(Debug, Subcommand)]
enum AlertsCommand {
    /// Send a test alert through every delivery at once (one attempt each); exits 1 when
    /// one failed.
    Test,
}

fn deliveries(config: &Value) {
    let shown = |v: &Value| v.as_str().unwrap_or("(none)").to_string();
    println!(
        "webhook: {} ({})",
        shown(&config["webhook"]),
        shown(&config["format"])
    );
    println!("command: {}", shown(&config["command"]));
}

/// Run `pooler alerts …` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    match args.command {
        None => {
            let answer = out.connect()?.get("alerts").await?;
            out.print(&answer, |answer| {
                deliveries(&answer["config"]);
                let open = answer["open"].as_array().cloned().unwrap_or_default();
                if open.is_empty() {
                    println!("no alert open");
                }
                for alert in open {
                    println!(
                        "open since {}: {}",
                        crate::time::rfc3339(
                            alert["since"].as_u64().unwrap_or(0)
                        ),
                        alert["kind"].as_str().unwrap_or("?")
                    );
                }
                Ok(())
            })
        }
        Some(AlertsCommand::Test) => {
            let answer = out.connect()?.post("alerts/test", &json!({})).await?;
            let outcomes = answer["outcomes"].as_array().cloned().unwrap_or_default();
            let lines: Vec<String> = outcomes
                .iter()
                .map(|o| {
                    let verdict = if o["ok"] == true { "sent" } else { "FAILED" };
                    format!(
                        "{}: {verdict} ({})",
                        o["via"].as_str().unwrap_or("?"),
                        o["detail"].as_str().unwrap_or("")
                    )
                })
                .collect();
            // A failed channel fails the command (exit 1), with every channel's outcome in
            // the error.
            if outcomes.iter().any(|o| o["ok"] != true) {
                anyhow::bail!("a test alert was not delivered: {}", lines.join("; "));
            }
            out.print(&answer, |answer| {
                deliveries(&answer["config"]);
                if lines.is_empty() {
                    println!(
                        "no webhook or command is set: the test alert went to the log and /metrics only"
                    );
                }
                for line in &lines {
                    println!("{line}");
                }
                Ok(())
            })
        }
    }
}
