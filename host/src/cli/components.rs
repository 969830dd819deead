//! `pooler components …`: the components this binary embeds, handed out for other hosts
//! ([`crate::operate::components`]). Needs no server and no data directory.

use std::path::PathBuf;

use super::UsageError;
use crate::operate::components;

/// The plugin components built into this binary, for loading in another host.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    Export(ExportArgs),
}

/// Write the embedded components and the WIT package they were built against to DIR.
///
/// Writes `account-pool.wasm` and `provider-retry.wasm` exactly as this binary embeds them,
/// `wit/` (the package `pooler:plugins@0.1.0` with `deps/`, byte for byte as the components
/// were built against it), and `README.md` naming each component's world, its imports (what
/// a host must provide) and its exports. Load them in any component-model host (wasmtime,
/// jco, …) without a Rust toolchain.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    pooler components export ./pooler-components\n  \
    pooler components export ./pooler-components --force   # refresh an earlier export\n  \
    pooler components export DIR --json                    # {\"dir\": …, \"files\": [{\"path\", \"bytes\"}]}\n\n\
    Exit codes: 0 written; 1 a file could not be written; 2 DIR is a file, or is not empty \
    and --force was not given.")]
struct ExportArgs {
    /// The directory to write to: created if missing; it must be empty unless --force.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Write into a directory that is not empty: replaces account-pool.wasm,
    /// provider-retry.wasm, README.md and the whole wit/ there (so nothing of an older
    /// contract stays behind), and leaves every other file alone.
    #[arg(long)]
    force: bool,
    /// Print {"dir": …, "files": [{"path": …, "bytes": …}]} instead of text; a failure prints
    /// {"error": {"kind": …, "message": …}} on stdout, with the same exit code.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Whether `--json` was given.
    pub(super) fn json(&self) -> bool {
        match &self.action {
            Action::Export(args) => args.json,
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::Export(args) => export(args),
    }
}

fn export(args: ExportArgs) -> anyhow::Result<()> {
    let written = match components::export(&args.dir, args.force) {
        Ok(written) => written,
        Err(e) if e.is_usage() => return Err(UsageError(e.to_string()).into()),
        Err(e) => return Err(e.into()),
    };
    if args.json {
        let value = serde_json::json!({"dir": args.dir, "files": written});
        println!("{}", super::format::json_text(&value, true));
        return Ok(());
    }
    let wit = written
        .iter()
        .filter(|w| w.path.starts_with(&format!("{}/", components::WIT_DIR)))
        .count();
    println!("Wrote to {}:", args.dir.display());
    for file in written.iter().filter(|w| !w.path.contains('/')) {
        println!("  {:<20} {:>9} bytes", file.path, file.bytes);
    }
    println!(
        "  {:<20} {wit:>9} files",
        format!("{}/", components::WIT_DIR)
    );
    println!(
        "{} names each component's world, imports and exports.",
        args.dir.join(components::README).display()
    );
    Ok(())
}
