//! `pooler route open|close|list`: a thread's route through the pool (admin API
//! `/_pooler/routes…`). `list` shows the open routes, never a token. `open` prints the environment an agent needs as `KEY=VALUE` lines
//! (Codex CLI's flags and `config.toml` lines follow as `#` comments), so a shell can `eval`
//! it. The token is shown once, by `open`; opening again replaces it.

use clap::Subcommand;
use serde_json::json;

use super::client::{ClientArgs, field};
use super::format::{iso, now_ms, relative, shell_quote, table};
use crate::operate::wire::{ProviderName, RouteSummaryView, RouteView, percent_encode};

/// Open, list and close the routes threads' agents reach the pool through.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    eval \"$(pooler route open --thread my-thread --provider claude --export)\" && claude\n  \
    pooler route open --thread t1 --provider codex > t1.env\n  \
    pooler route close --thread my-thread --provider claude\n  \
    pooler route list --provider codex\n\n\
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
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: ProviderName,
        /// Prefix each line with `export ` (for `eval` in a POSIX shell).
        #[arg(long)]
        export: bool,
    },
    /// List the open routes: thread, provider, when opened (never a token: it was shown
    /// once, by `open`).
    List {
        /// Only this provider's routes.
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: Option<ProviderName>,
    },
    /// Close a thread's route: its token stops working at once.
    Close {
        /// The thread id.
        #[arg(long)]
        thread: String,
        /// The provider: claude or codex.
        #[arg(long, value_parser = crate::operate::wire::provider_arg())]
        provider: ProviderName,
    },
}

/// Run `pooler route …` against the server of `--data-dir`; `--json` prints the JSON answer.
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
            out.print(&answer, |answer| {
                let route: RouteView = field(answer, "route")?;
                print!("{}", env_lines(&route, export));
                Ok(())
            })
        }
        RouteCommand::List { provider } => {
            let path = match provider {
                Some(p) => format!("routes?provider={p}"),
                None => "routes".to_owned(),
            };
            let answer = out.connect()?.get(&path).await?;
            out.print(&answer, |answer| {
                let routes: Vec<RouteSummaryView> = field(answer, "routes")?;
                print!("{}", route_table(&routes, now_ms()));
                Ok(())
            })
        }
        RouteCommand::Close { thread, provider } => {
            let answer = out
                .connect()?
                .delete(&format!("routes/{provider}/{}", percent_encode(&thread)))
                .await?;
            out.print(&answer, |_| {
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

/// The open routes as a table (or a line saying there are none).
fn route_table(routes: &[RouteSummaryView], now: u64) -> String {
    if routes.is_empty() {
        return "no open routes (open one with `pooler route open`)\n".to_owned();
    }
    let rows: Vec<Vec<String>> = routes
        .iter()
        .map(|r| {
            vec![
                r.thread.clone(),
                r.provider.to_string(),
                iso(r.opened_at),
                relative(r.opened_at, now),
            ]
        })
        .collect();
    format!("{}\n", table(&["THREAD", "PROVIDER", "OPENED", ""], &rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operate::wire::EnvVar;

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
