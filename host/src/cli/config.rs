//! `pooler config get|set`: both plugins' settings (admin API `/_pooler/settings…`), keyed
//! with the role's prefix: `pool.…` (Account Pooler), `retry.…` (Provider Retry).

use clap::Subcommand;
use serde_json::json;

use super::client::{ClientArgs, field};
use super::format::table;
use crate::operate::wire::{SettingView, percent_encode};

/// Read and change the plugins' settings (`pool.…` Account Pooler, `retry.…` Provider Retry).
#[derive(Debug, clap::Args)]
#[command(after_help = "Values: durations as 250ms, 20s, 5m, 6h (or milliseconds); fractions \
    as 0.98; switches as on/off; URLs as absolute http(s) URLs. An invalid value is refused \
    with the accepted range and nothing changes.\n\n\
    Examples:\n  \
    pooler config get\n  \
    pooler config get pool.switch-threshold\n  \
    pooler config set pool.switch-threshold 0.9\n  \
    pooler config set pool.claude-routing off\n  \
    pooler config set pool.first-event-wait 0s")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Show every setting (key, value, default, description), or one.
    Get {
        /// A setting's key, e.g. `pool.switch-threshold`.
        key: Option<String>,
    },
    /// Validate and store one setting.
    Set {
        /// A setting's key, e.g. `pool.switch-threshold`.
        key: String,
        /// Its new value.
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
}

/// Run `pooler config …` against the server of `--data-dir`; `--json` prints the JSON answer.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    match args.command {
        ConfigCommand::Get { key: None } => {
            let answer = out.connect()?.get("settings").await?;
            out.print(&answer, |answer| {
                let settings: Vec<SettingView> = field(answer, "settings")?;
                // The default only where the value differs from it.
                let rows: Vec<Vec<String>> = settings
                    .iter()
                    .map(|s| {
                        let default = if s.value == s.default_value {
                            String::new()
                        } else {
                            s.default_value.clone()
                        };
                        vec![s.key.clone(), s.value.clone(), default, s.description.clone()]
                    })
                    .collect();
                println!(
                    "{}",
                    table(&["KEY", "VALUE", "DEFAULT (if changed)", "DESCRIPTION"], &rows)
                );
                Ok(())
            })
        }
        ConfigCommand::Get { key: Some(key) } => {
            let answer = out
                .connect()?
                .get(&format!("settings/{}", percent_encode(&key)))
                .await?;
            out.print(&answer, |answer| {
                let s: SettingView = field(answer, "setting")?;
                println!("{} = {}", s.key, s.value);
                println!("  default: {}", s.default_value);
                println!("  {}", s.description);
                Ok(())
            })
        }
        ConfigCommand::Set { key, value } => {
            let answer = out
                .connect()?
                .put(
                    &format!("settings/{}", percent_encode(&key)),
                    &json!({ "value": value }),
                )
                .await?;
            out.print(&answer, |answer| {
                let s: SettingView = field(answer, "setting")?;
                println!("{} = {}", s.key, s.value);
                Ok(())
            })
        }
    }
}
