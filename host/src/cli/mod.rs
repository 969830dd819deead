//! The `pooler` command line: `serve` runs the host (`cli/serve.rs`); every other command group
//! talks to a running server through its admin API ([`client`]), one module per group.
//!
//! Exit codes: 0 success; 1 failure (refused by the server, no server, I/O); 2 usage (bad
//! flags or arguments, and local input that cannot be used: an empty key, an OAuth file that
//! is not a JSON object). With `--json`, a failure prints [`json_error`]'s object on stdout
//! instead of a line on stderr, with the same exit code (clap's own usage errors, found
//! before the command is known, stay text).
//!
//! # Adding a command group
//!
//! Write `cli/<group>.rs` with a `pub struct Args` (`#[derive(clap::Args)]`; its doc comment
//! is the group's help; flatten [`client::ClientArgs`] for `--data-dir` and `--json`) and
//! `pub async fn run(args: Args) -> anyhow::Result<()>`, then add one line
//! `<Variant> => <group>,` to the `groups!` list below, and the file to the test that keeps
//! the client commands to the wire (`the_client_commands_speak_only_the_wire`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

pub mod client;
mod components;
pub mod explain;
mod format;
pub mod login;
mod serve;

pub use serve::ServeArgs;

/// Pooler keeps AI coding-agent threads working across a pool of provider accounts and
/// through provider outages.
#[derive(Debug, Parser)]
#[command(
    name = "pooler",
    version,
    propagate_version = true,
    after_help = "Start the server with `pooler serve`; the other commands talk to it through \
                  the admin API (they find it from the data directory).\n\n\
                  Examples:\n  \
                  pooler serve\n  \
                  pooler account add --provider claude --api-key -   # reads the key from stdin\n  \
                  pooler account list\n  \
                  pooler components export ./pooler-components   # for another host\n  \
                  eval \"$(pooler route open --thread my-thread --provider claude --export)\""
)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Declares the command groups that talk to a running server: their modules, their
/// [`Command`] variants and the dispatch to each module's `run`.
macro_rules! groups {
    ($($variant:ident => $module:ident,)*) => {
        $(pub mod $module;)*

        /// A `pooler` command: `serve`, `components`, or one of the groups that talk to a
        /// running server.
        #[derive(Debug, Subcommand)]
        pub enum Command {
            /// Run the host: load the plugins and serve the pool's HTTP endpoint.
            Serve(ServeArgs),
            // The docs of these variants are `concat!` expressions, which clap does not read:
            // a subcommand's help is its `Args` doc comment, and a plain doc comment here
            // would replace it.
            #[doc = concat!("`pooler components`: the components built into this binary.")]
            Components(components::Args),
            $(
                #[doc = concat!(
                    "`pooler ", stringify!($module), "`: see [`", stringify!($module), "::Args`]."
                )]
                $variant($module::Args),
            )*
        }

        impl Command {
            /// Whether `--json` was given.
            fn json(&self) -> bool {
                match self {
                    Command::Serve(_) => false,
                    Command::Components(args) => args.json(),
                    $(Command::$variant(args) => args.client.json,)*
                }
            }

            async fn run(self) -> anyhow::Result<()> {
                match self {
                    Command::Serve(args) => serve::serve(args).await,
                    Command::Components(args) => components::run(args).await,
                    $(Command::$variant(args) => $module::run(args).await,)*
                }
            }
        }
    };
}

// One line per group: `pooler <variant in kebab-case> …` → `cli/<module>.rs`.
groups! {
    Account => account,
    Config => config,
    Route => route,
    Session => session,
    Thread => thread,
    Retry => retry,
    Status => status,
    Page => page,
    Alerts => alerts,
}

/// Local input that cannot be used (an unreadable file, an empty key): exit 2, like clap's
/// usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Parse the command line and run it.
pub fn main() -> ExitCode {
    // Before any thread starts (the runtime's, the compiler's).
    crate::runtime::allocator::limit_arenas();
    // Usage errors exit 2, --help and --version 0 (clap's convention).
    let cli = Cli::parse();
    // `serve` logs at info; a client command only says what went wrong.
    let (format, level, default_filter) = match &cli.command {
        Command::Serve(args) => (args.log_format, args.log_level.as_deref(), "info"),
        _ => (crate::operate::logging::LogFormat::Text, None, "warn"),
    };
    match crate::operate::logging::filter(level, default_filter) {
        Ok(filter) => crate::operate::logging::init(format, filter),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = cli.command.json();
    match runtime.block_on(cli.command.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The message may quote the server, which may quote an upstream.
            if json {
                println!("{}", format::json_text(&json_error(&e), false));
            } else {
                eprintln!("error: {}", format::visible_lines(&format!("{e:#}")));
            }
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// A failed command's error as `--json` prints it: `{"error": {"kind": …, "message": …}}`.
/// `kind` is `usage` (exit 2), `no-server` (none answers for the data directory), the admin
/// API's own code for a refusal (`not-found`, `invalid-input`, …; the object then also has
/// the HTTP `status`), or `failed` for anything else (a file that cannot be read, a cut-off
/// answer).
pub fn json_error(e: &anyhow::Error) -> serde_json::Value {
    let message = format!("{e:#}");
    if let Some(api) = e.downcast_ref::<client::ApiFailure>() {
        return serde_json::json!({"error": {
            "kind": api.code,
            "message": message,
            "status": api.status.as_u16(),
        }});
    }
    let kind = if e.downcast_ref::<UsageError>().is_some() {
        "usage"
    } else if e.downcast_ref::<client::NoServer>().is_some() {
        "no-server"
    } else {
        "failed"
    };
    serde_json::json!({"error": {"kind": kind, "message": message}})
}

/// The data directory: the flag, else `$POOLER_DATA_DIR`, else the platform's.
pub fn data_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir);
    }
    if let Some(dir) = std::env::var_os("POOLER_DATA_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    platform_data_dir()
        .map(|dir| dir.join("pooler"))
        .context("no data directory: pass --data-dir or set POOLER_DATA_DIR")
}

fn platform_data_dir() -> Option<PathBuf> {
    let home = home_dir();
    if cfg!(target_os = "macos") {
        return home.map(|h| h.join("Library").join("Application Support"));
    }
    if cfg!(windows) {
        return std::env::var_os("APPDATA").map(PathBuf::from);
    }
    // XDG base directories.
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home.map(|h| h.join(".local").join("share")))
}

/// The compile cache `pooler serve` uses (precompiled components, shared by every data
/// directory; see [`crate::runtime::engine`]): `--compile-cache`, else `$POOLER_CACHE_DIR`, else
/// `[server] compile-cache`, else `pooler` in the platform's cache directory
/// (`$XDG_CACHE_HOME`, `~/.cache`; `~/Library/Caches` on macOS; `%LOCALAPPDATA%` on
/// Windows), else — with no home directory — `DATA_DIR/cache`.
pub fn compile_cache_dir(
    flag: Option<PathBuf>,
    config: Option<&std::path::Path>,
    data_dir: &std::path::Path,
) -> PathBuf {
    resolve_compile_cache(
        flag,
        std::env::var_os("POOLER_CACHE_DIR"),
        config,
        platform_cache_dir(),
        data_dir,
    )
}

/// [`compile_cache_dir`]'s rules over given inputs.
fn resolve_compile_cache(
    flag: Option<PathBuf>,
    env: Option<std::ffi::OsString>,
    config: Option<&std::path::Path>,
    platform: Option<PathBuf>,
    data_dir: &std::path::Path,
) -> PathBuf {
    flag.or_else(|| env.filter(|v| !v.is_empty()).map(PathBuf::from))
        .or_else(|| config.map(std::path::Path::to_path_buf))
        .or_else(|| platform.map(|dir| dir.join("pooler")))
        .unwrap_or_else(|| data_dir.join("cache"))
}

fn platform_cache_dir() -> Option<PathBuf> {
    let home = home_dir();
    if cfg!(target_os = "macos") {
        return home.map(|h| h.join("Library").join("Caches"));
    }
    if cfg!(windows) {
        return std::env::var_os("LOCALAPPDATA").map(PathBuf::from);
    }
    // XDG base directories.
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home.map(|h| h.join(".cache")))
}

/// The user's home directory (`$HOME`, or `%USERPROFILE%` on Windows).
pub(crate) fn home_dir() -> Option<PathBuf> {
    let var = if cfg!(windows) { "USERPROFILE" } else { "HOME" };
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every command but `serve` and `components` is a client of a running server: it
    /// reaches the rest of the host only through the wire (`operate::wire`) and the shared
    /// civil time, never the runtime, the mediation or the server's own modules.
    #[test]
    fn the_client_commands_speak_only_the_wire() {
        let sources = [
            ("account.rs", include_str!("account.rs")),
            ("alerts.rs", include_str!("alerts.rs")),
            ("client.rs", include_str!("client.rs")),
            ("config.rs", include_str!("config.rs")),
            ("explain.rs", include_str!("explain.rs")),
            ("format.rs", include_str!("format.rs")),
            ("login.rs", include_str!("login.rs")),
            ("page.rs", include_str!("page.rs")),
            ("retry.rs", include_str!("retry.rs")),
            ("route.rs", include_str!("route.rs")),
            ("session.rs", include_str!("session.rs")),
            ("status.rs", include_str!("status.rs")),
            ("thread.rs", include_str!("thread.rs")),
        ];
        let allowed = ["crate::cli", "crate::operate::wire", "crate::time"];
        for (file, text) in sources {
            for (at, _) in text.match_indices("crate::") {
                let path: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                assert!(
                    allowed.iter().any(|a| path.starts_with(a)),
                    "cli/{file} reaches {path}, outside the wire"
                );
            }
        }
    }

    /// The compile cache's location: the flag, then the environment, then the file, then
    /// the platform's cache directory, then the data directory.
    #[test]
    fn the_compile_cache_is_found_by_flag_then_env_then_config_then_platform() {
        let data = std::path::Path::new("/data");
        let resolve = |flag: Option<&str>,
                       env: Option<&str>,
                       config: Option<&str>,
                       platform: Option<&str>| {
            resolve_compile_cache(
                flag.map(PathBuf::from),
                env.map(std::ffi::OsString::from),
                config.map(std::path::Path::new),
                platform.map(PathBuf::from),
                data,
            )
        };
        let all = (
            Some("/flag"),
            Some("/env"),
            Some("/config"),
            Some("/home/u/.cache"),
        );
        assert_eq!(resolve(all.0, all.1, all.2, all.3), PathBuf::from("/flag"));
        assert_eq!(resolve(None, all.1, all.2, all.3), PathBuf::from("/env"));
        // An empty variable is unset.
        assert_eq!(
            resolve(None, Some(""), all.2, all.3),
            PathBuf::from("/config")
        );
        assert_eq!(resolve(None, None, all.2, all.3), PathBuf::from("/config"));
        assert_eq!(
            resolve(None, None, None, all.3),
            PathBuf::from("/home/u/.cache/pooler")
        );
        assert_eq!(
            resolve(None, None, None, None),
            PathBuf::from("/data/cache")
        );
    }
}
