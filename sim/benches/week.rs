//! How long the simulator takes: a week of `seed-6172` and two days of `scale-10x`, each
//! variant once, with the wall and CPU time of each run against its target (a week of
//! seed-6172 under 2 minutes on the project's 2-core machines, scale-10x under 10) and the
//! requests per second through the real pool. A figure, not a pass or fail: run it with
//! `cargo bench -p pooler-sim --bench week` on a quiet machine.
//!
//! `POOLER_SIM_BENCH=seed-6172` runs one scenario only.

use std::path::{Path, PathBuf};

use pooler_sim::report;
use pooler_sim::run::{DEFAULT_STRATEGY, routing_variants, run};
use pooler_sim::scenario::Scenario;

fn main() {
    let only = std::env::var("POOLER_SIM_BENCH").ok();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sim-compile-cache");
    println!(
        "| scenario | variant | simulated h | wall s | CPU s | target wall s | requests | requests/s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (name, target_s) in [("seed-6172", 120.0), ("scale-10x", 600.0)] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let scenario = Scenario::load(&root.join("scenarios").join(format!("{name}.toml")))
            .expect("a committed scenario");
        let variants = if scenario.variants.is_empty() {
            // Speed, not routing: one variant (the pool's default strategy) is enough.
            routing_variants(&scenario)
                .into_iter()
                .filter(|v| v.name == DEFAULT_STRATEGY)
                .collect()
        } else {
            scenario.variants.clone()
        };
        for variant in &variants {
            let recorded = run(&scenario, variant, Some(cache.clone())).expect("the run");
            let s = report::speed(&recorded);
            println!(
                "| {name} | {} | {:.0} | {:.1} | {:.1} | {target_s:.0} ({:.2}x) | {} | {:.0} |",
                s.variant,
                s.simulated_hours,
                s.wall_s,
                s.cpu_s,
                s.wall_s / target_s,
                s.requests,
                s.requests_per_s
            );
        }
    }
}
