//! `pooler-sim`: runs a scenario of days of agent work through the real pool, core and
//! Provider Retry on a virtual clock, once per variant, and prints the figures side by
//! side; writes them as JSON and an HTML report.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use pooler_sim::report;
use pooler_sim::run::run;
use pooler_sim::scenario::{Scenario, Variant};

/// Measure how a pool of accounts is spent over days of agent work.
///
/// Runs SCENARIO (a TOML file, see `scenarios/`) through the real `pooler` host with its
/// embedded Account Pooler and Provider Retry and the real core, on a virtual clock, once
/// per variant (the scenario's `[[variants]]`, else every routing behaviour the pool
/// offers: each routing strategy, and each again with the person's reserve accounts as
/// last-resort accounts), with the same seed for each. Prints the figures as a table, and writes
/// OUT/<scenario>.json and OUT/<scenario>.html.
#[derive(Parser, Debug)]
#[command(name = "pooler-sim", version)]
struct Args {
    /// The scenario file.
    scenario: PathBuf,
    /// Only these variants (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Run this many days instead of the scenario's.
    #[arg(long)]
    days: Option<f64>,
    /// Use this seed instead of the scenario's.
    #[arg(long)]
    seed: Option<u64>,
    /// Where the JSON and HTML go.
    #[arg(long, default_value = "target/sim")]
    out: PathBuf,
    /// The compile cache for the components (default: pooler's own, ~/.cache/pooler).
    #[arg(long, value_name = "DIR")]
    compile_cache: Option<PathBuf>,
    /// Print the host's log (RUST_LOG filters it; default warn).
    #[arg(long)]
    log: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.log {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .init();
    }
    match simulate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pooler-sim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(args: Args) -> anyhow::Result<()> {
    let mut scenario = Scenario::load(&args.scenario)?;
    if let Some(days) = args.days {
        scenario.days = days;
    }
    if let Some(seed) = args.seed {
        scenario.seed = seed;
    }
    let mut variants = if scenario.variants.is_empty() {
        pooler_sim::run::routing_variants(&scenario)
    } else {
        scenario.variants.clone()
    };
    if !args.variants.is_empty() {
        let known: Vec<String> = variants.iter().map(|v| v.name.clone()).collect();
        for name in &args.variants {
            if !known.contains(name) {
                anyhow::bail!(
                    "no variant named {name:?} (the scenario has: {})",
                    known.join(", ")
                );
            }
        }
        variants.retain(|v: &Variant| args.variants.contains(&v.name));
    }
    let cache = args
        .compile_cache
        .unwrap_or_else(|| pooler_host::cli::compile_cache_dir(None, None, &std::env::temp_dir()));
    let mut runs = Vec::new();
    for variant in &variants {
        eprintln!(
            "running {} / {} ({} days)…",
            scenario.name, variant.name, scenario.days
        );
        runs.push(run(&scenario, variant, Some(cache.clone()))?);
    }
    let figures: Vec<_> = runs.iter().map(report::figures).collect();
    let speeds: Vec<_> = runs.iter().map(report::speed).collect();
    print!("{}", report::table(&scenario, &figures, &speeds));
    std::fs::create_dir_all(&args.out)?;
    let json = args.out.join(format!("{}.json", scenario.name));
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&report::json(&scenario, &figures, &speeds))? + "\n",
    )?;
    let html = args.out.join(format!("{}.html", scenario.name));
    std::fs::write(&html, report::html(&scenario, &figures, &runs))?;
    eprintln!("wrote {} and {}", json.display(), html.display());
    Ok(())
}
