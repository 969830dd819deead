//! The re-evaluation benchmark (on demand, not in CI): `cargo bench -p pooler-tests --bench
//! reevaluate`. Issue 5: how long one availability change takes to re-evaluate N pending
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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pooler_core::Provider;
use pooler_tests::core::{CoreHost, CoreSetup};
use pooler_tests::pool::{five_hour_rejected, reply};

const SECOND: u64 = 1_000;
const HOUR: u64 = 3_600 * SECOND;
/// Provider Retry's default reset buffer and jitter bound.
const BUFFER: u64 = 15 * SECOND;
const JITTER: u64 = 30 * SECOND;
/// Threads created and sent concurrently while seeding.
const SEED_BATCH: usize = 250;
/// The target of issue 5.
const TARGET: Duration = Duration::from_secs(1);

fn main() -> anyhow::Result<()> {
    pooler_tests::bench::run(run())
}

struct Measured {
    rows: usize,
    enable: Duration,
    delivery: Duration,
    moved: usize,
}

impl Measured {
    fn total(&self) -> Duration {
        self.enable + self.delivery
    }
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

async fn measure(n: usize) -> anyhow::Result<Measured> {
    // Turns of the seeding run many at once; nothing is dispatched in the timed part.
    let h = CoreSetup::new()
        .real_retry()
        .core("concurrency-limit = 64")
        .start()
        .await;
    let b = h.add_claude_key("key-b").await;
    h.disable_account(&b.id).await;
    h.settle().await;

    let seeding = Instant::now();
    seed(&h, n).await?;
    let rows = h.core().list_rows(None)?;
    anyhow::ensure!(
        rows.len() == n,
        "seeding left {} rows for {n} threads",
        rows.len()
    );
    let reset = h.now() + 2 * HOUR;
    anyhow::ensure!(
        rows.iter()
            .all(|r| r.attempt == 2 && r.send_at >= reset - HOUR),
        "every row waits on A's reset"
    );
    eprintln!(
        "  seeded {n} pending rows in {:.1} s",
        seeding.elapsed().as_secs_f64()
    );
    let before: HashMap<u64, u64> = rows.iter().map(|r| (r.id, r.send_at)).collect();

    // The timed part: enable B; the pool signals the change, the host delivers it to
    // Provider Retry, which re-evaluates every pending row.
    let enabled_at = h.now();
    let started = Instant::now();
    h.enable_account(&b.id).await;
    let enable = started.elapsed();
    let delivered = Instant::now();
    h.host.availability_changes_settled().await;
    let delivery = delivered.elapsed();

    let after = h.core().list_rows(None)?;
    anyhow::ensure!(after.len() == n, "{} rows after the change", after.len());
    let window = enabled_at + BUFFER..enabled_at + BUFFER + JITTER;
    let mut moved = 0;
    for row in &after {
        let old = before
            .get(&row.id)
            .ok_or_else(|| anyhow::anyhow!("row {} is new", row.id))?;
        if row.send_at != *old && window.contains(&row.send_at) && row.attempt == 2 {
            moved += 1;
        }
    }
    let m = Measured {
        rows: n,
        enable,
        delivery,
        moved,
    };
    drop(h);
    Ok(m)
}

/// N threads in `error` with one live row each, waiting on A's reset (see the module docs).
async fn seed(h: &CoreHost, n: usize) -> anyhow::Result<()> {
    let reset = h.now() + 2 * HOUR;
    h.upstream
        .push(reply(429, &five_hour_rejected(Some(reset))));
    let first = h.new_thread().await;
    h.send(&first, "hello");
    h.settle().await;
    anyhow::ensure!(h.rows(&first).len() == 1, "the first thread has a row");

    let mut made = 1;
    while made < n {
        let batch = SEED_BATCH.min(n - made);
        let mut tasks = Vec::with_capacity(batch);
        for _ in 0..batch {
            let link = h.link.clone();
            tasks.push(tokio::spawn(async move {
                let thread = link
                    .new_thread(Provider::Claude, Some("claude-test"))
                    .await?;
                link.send(&thread, "hello")?;
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        h.settle().await;
        made += batch;
    }
    anyhow::ensure!(
        h.upstream_turns() == 1,
        "the pool answered the others itself"
    );
    Ok(())
}
