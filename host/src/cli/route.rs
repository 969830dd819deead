//! `pooler route open|close`: a thread's route through the pool (admin API
//! `/_pooler/routes…`). `open` prints the environment an agent needs as `KEY=VALUE` lines
//! (Codex CLI's flags and `config.toml` lines follow as `#` comments), so a shell can `eval`
//! it. The token is shown once, by `open`; opening again replaces it.

use clap::Subcommand;
use serde_json::json;

use super::client::{ClientArgs, field};
use super::format::shell_quote;
use crate::wire::{ProviderName, RouteView, percent_encode};

/// Open and close the route a thread's agent reaches the pool through.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    eval \"$(pooler route open --thread my-thread --provider claude --export)\" && claude\n  \
    pooler route open --thread t1 --provider codex > t1.env\n  \
    pooler route close --thread my-thread --provider claude\n\n\
    The printed token is a secret: anyone holding it can spend the pool's accounts until the \
    route is closed.")]
pub struct Args {
    #[command(flatten)]
    pub(super) client: ClientArgs,
    #[command(subcommand)]
    command: RouteCommand,
}

#[derive(Debug, Subcommand)]
enum RouteCommand {
    /// Open (or re-open, replacing its token) a thread's route and print its environment.
    Open {
        /// The thread id.
        #[arg(long)]
        thread: String,
        /// The provider: claude or codex.
        #[arg(long)]
        provider: ProviderName,
        /// Prefix each line with `export ` (for `eval` in a POSIX shell).
        #[arg(long)]
        export: bool,
    },
    /// Close a thread's route: its token stops working at once.
    Close {
        /// The thread id.
        #[arg(long)]
        thread: String,
        /// The provider: claude or codex.
        #[arg(long)]
        provider: ProviderName,
    },
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = &args.client;
    match args.command {
        RouteCommand::Open {
            thread,
            provider,
            export,
        } => {
            let answer = out
                .connect()?
                .post("routes", &json!({ "thread": thread, "provider": provider }))
                .await?;
            out.print(&answer, || {
                let route: RouteView = field(&answer, "route")?;
                print!("{}", env_lines(&route, export));
                Ok(())
            })
        }
        RouteCommand::Close { thread, provider } => {
            let answer = out
                .connect()?
                .delete(&format!("routes/{provider}/{}", percent_encode(&thread)))
                .await?;
            out.print(&answer, || {
                println!("closed the {provider} route of thread {thread}");
                Ok(())
            })
        }
    }
}

/// The route as lines a shell can `eval`: variables, then comments for the rest.
fn env_lines(route: &RouteView, export: bool) -> String {
    let prefix = if export { "export " } else { "" };
    let mut out = String::new();
    for var in &route.env {
        out.push_str(&format!("{prefix}{}={}\n", var.name, shell_quote(&var.value)));
    }
    if !route.args.is_empty() {
        let flags: Vec<String> = route.args.iter().map(|a| shell_quote(a)).collect();
        out.push_str(&format!("# codex flags: {}\n", flags.join(" ")));
    }
    if !route.config_lines.is_empty() {
        out.push_str("# or in ~/.codex/config.toml:\n");
        for line in &route.config_lines {
            out.push_str(&format!("#   {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EnvVar;

    #[test]
    fn codex_routes_print_variables_then_comments() {
        let route = RouteView {
            thread: "t".into(),
            provider: ProviderName::Codex,
            base_url: "http://127.0.0.1:1/v1".into(),
            token: "tok".into(),
            env: vec![EnvVar {
                name: "POOLER_CODEX_TOKEN".into(),
                value: "tok".into(),
            }],
            args: vec!["-c".into(), "model_provider=\"pooler\"".into()],
            config_lines: vec!["model_provider = \"pooler\"".into()],
            opened_at: 0,
        };
        assert_eq!(
            env_lines(&route, true),
            "export POOLER_CODEX_TOKEN=tok\n\
             # codex flags: -c 'model_provider=\"pooler\"'\n\
             # or in ~/.codex/config.toml:\n\
             #   model_provider = \"pooler\"\n"
        );
    }
}
