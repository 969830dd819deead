//! The re-evaluation benchmark (on demand, not in CI): `cargo bench -p pooler-tests --bench
//! reevaluate`: how long one availability change takes to re-evaluate N pending
//! rows through the real component and the host's real core.
//!
//! Setup (not timed), for N = 1,000 and N = 10,000 on a fresh data directory each: the real
//! Account Pooler (embedded) with account A and a disabled account B, the real Provider
//! Retry (embedded) and the host core (`CoreLink`, core database on disk). One pooled turn
//! gets a real 429 that blocks A for 2 h; then N − 1 more threads each send a message, the
//! pool refuses their turns itself (A blocked, B disabled), and Provider Retry schedules a
//! retry row for each at A's reset: N threads in `error`, each with one live row waiting on
//! the pool's availability. All of it goes through the real path (turns through the host's
//! listener, `turn-failed` events through the outbox, `threads.schedule-retry`).
//!
//! Timed: `pooler account enable B` (the pool's `accounts.enable-account`, which signals
//! `availability-changed(account-enabled)`), then the host's delivery of that one change to
//! Provider Retry, until its `availability-changed` call returns. Every row moves to
//! now + buffer + jitter, each through one `threads.reschedule` into the core database.
//! Checked afterwards: every row moved, same row ids.
//!
//! Prints per N: rows, the time of the change, rows moved, the cost per row; then the growth
//! factor 10,000 / 1,000 and whether the target (10,000 rows in under 1 s) is met.
//! `REEVALUATE_ROWS=N` runs just that size (e.g. under `perf record`).

use std::time::Duration;

use pooler_tests::bench::reevaluate::measure;

/// The target: one availability change re-evaluates 10,000 pending rows within a second.
const TARGET: Duration = Duration::from_secs(1);

fn main() -> anyhow::Result<()> {
    pooler_tests::bench::run(run())
}

async fn run() -> anyhow::Result<()> {
    println!(
        "machine: {} logical CPUs; tokio: {} workers",
        std::thread::available_parallelism()?,
        pooler_tests::bench::WORKERS
    );
    let sizes: Vec<usize> = match std::env::var("REEVALUATE_ROWS") {
        Ok(n) => vec![n.parse()?],
        Err(_) => vec![1_000, 10_000],
    };
    println!(
        "\n## one availability change re-evaluating N pending rows (real component, real core)"
    );
    let mut results = Vec::new();
    for n in sizes {
        let m = measure(n).await?;
        println!(
            "rows {:>6} | change {:>9.1} ms (enable {:.1} ms + delivery {:.1} ms) | moved {:>6} | {:>7.1} µs/row",
            m.rows,
            ms(m.total()),
            ms(m.enable),
            ms(m.delivery),
            m.moved,
            m.total().as_secs_f64() * 1e6 / m.rows as f64,
        );
        results.push(m);
    }
    if let (Some(small), Some(large)) = (
        results.iter().find(|m| m.rows == 1_000),
        results.iter().find(|m| m.rows == 10_000),
    ) {
        println!(
            "growth 1000 → 10000: {:.1}× (linear would be 10×)",
            large.total().as_secs_f64() / small.total().as_secs_f64()
        );
    }
    if let Some(large) = results.iter().find(|m| m.rows == 10_000) {
        let met = large.total() < TARGET;
        println!(
            "target: 10000 rows in < {:?}: {} ({:.3} s)",
            TARGET,
            if met { "MET" } else { "NOT MET" },
            large.total().as_secs_f64()
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
