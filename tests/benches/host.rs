//! The host benchmark (on demand, not in CI): `cargo bench -p pooler-tests --bench host`.
//! Prints each figure with a baseline measured in the same run and the ratio between them:
//!
//! 1. host→guest call overhead: a whole plugin call (fresh store, instantiate from the cached
//!    pre-instantiation, call `routing.has-route`) against a native dynamic call;
//! 2. guest→sqlite import overhead: inserts made by a guest through the `sqlite` import
//!    against the same inserts made natively with rusqlite;
//! 3. HTTP: requests/s and p50/p99 latency through the pass-through proxy fixture (a fresh
//!    instance per request, keep-alive outgoing client) against the same loopback upstream
//!    called directly, at 1, 16 and 64 concurrent clients;
//! 4. start-up: what `pooler serve` does before it answers (open the core, load and
//!    pre-instantiate both embedded components, attach the core, bind) up to the first
//!    request the pool answered, on a fresh data directory with an empty compile cache (the
//!    baseline: what every fresh data directory paid when the cache lived in it), a fresh
//!    data directory with a warm shared cache, and a warm data directory. Each is repeated
//!    (`HOST_BENCH_STARTS=n`, default 5) and printed as the median with its spread.
//!
//! `HOST_BENCH_ONLY=start` runs part 4 alone.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pooler_core::clock::SystemClock;
use pooler_host::config::Config;
use pooler_host::operate::server::Server;
use pooler_host::runtime::bindings::types::Provider;
use pooler_host::runtime::imports::threads::NoCore;
use pooler_host::runtime::{Host, HostOptions};
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::upstream::FakeUpstream;

const LOAD_DURATION: Duration = Duration::from_secs(3);

fn main() -> anyhow::Result<()> {
    pooler_tests::bench::run(run())
}

fn per_op(total: Duration, n: u32) -> Duration {
    total / n
}

async fn run() -> anyhow::Result<()> {
    println!(
        "machine: {} logical CPUs; tokio: {} workers",
        std::thread::available_parallelism()?,
        pooler_tests::bench::WORKERS
    );
    if std::env::var("HOST_BENCH_ONLY").is_ok_and(|only| only == "start") {
        return start_up().await;
    }
    let data = tempfile::tempdir()?;
    let upstream = FakeUpstream::start().await;
    upstream.set_recording(false);
    let config = Config::parse(&format!(
        "[plugins.account-pool]\ncomponent = {:?}\nallowed-hosts = [\"127.0.0.1\"]\n[maintenance]\ninterval-s = 0\n",
        fixtures::POOL
    ))?;
    let host = Host::new(HostOptions {
        config,
        data_dir: data.path().to_path_buf(),
        clock: Arc::new(SystemClock::new()),
        threads: Arc::new(NoCore),
        cache_dir: Some(PathBuf::from(fixtures::COMPILE_CACHE)),
        seed: None,
    })?;

    call_overhead(&host).await?;

    let server = Server::bind(host.clone(), "127.0.0.1:0".parse()?).await?;
    let addr = server.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    sqlite_overhead(&format!("http://{addr}"), data.path()).await?;
    http_load(&format!("http://{addr}"), &upstream).await?;
    let _ = stop.send(());
    serving.await??;
    drop(host);
    start_up().await
}

async fn start_up() -> anyhow::Result<()> {
    let runs: usize = std::env::var("HOST_BENCH_STARTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5)
        .max(1);
    let pooler_tests::bench::StartUps {
        mut cold,
        fresh: mut shared,
        mut warm,
    } = pooler_tests::bench::start_ups(runs).await?;
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let summary = |times: &mut Vec<Duration>| {
        times.sort();
        (
            ms(&times[times.len() / 2]),
            ms(&times[0]),
            ms(&times[times.len() - 1]),
        )
    };
    let cold = summary(&mut cold);
    println!("\n## start-up: serve start → first answered request (median of {runs}, min–max)");
    println!(
        "fresh data dir, cold cache (baseline): {:>9.1} ms  ({:.1}–{:.1})",
        cold.0, cold.1, cold.2
    );
    for (label, times) in [
        ("fresh data dir, warm shared cache:    ", &mut shared),
        ("warm data dir:                        ", &mut warm),
    ] {
        let (median, low, high) = summary(times);
        println!(
            "{label}{median:>9.1} ms  ({low:.1}–{high:.1})  ratio {:.3}×",
            median / cold.0
        );
    }
    Ok(())
}

/// The shape of `routing.has-route` as a native function.
type HasRoute = dyn Fn(&str, Provider) -> bool;

async fn call_overhead(host: &Host) -> anyhow::Result<()> {
    // Baseline: a native call through a trait object, the cheapest "plugin" boundary.
    let native: Box<HasRoute> = Box::new(|thread, _| thread.is_empty());
    let n = 5_000_000u32;
    let start = Instant::now();
    for _ in 0..n {
        black_box(native(black_box("t1"), Provider::Claude));
    }
    let native_op = per_op(start.elapsed(), n);

    let call = || {
        let thread = String::from("t1");
        host.call_pool("routing.has-route", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_has_route(store, &thread, Provider::Claude)
                    .await
            })
        })
    };
    for _ in 0..500 {
        call().await?;
    }
    let n = 20_000u32;
    let start = Instant::now();
    for _ in 0..n {
        black_box(call().await?);
    }
    let guest_op = per_op(start.elapsed(), n);
    println!("\n## host→guest call (fresh store + instantiate + call `routing.has-route`)");
    println!(
        "native dyn call:  {:>10.3} µs/call",
        native_op.as_secs_f64() * 1e6
    );
    println!(
        "plugin call:      {:>10.3} µs/call",
        guest_op.as_secs_f64() * 1e6
    );
    println!(
        "ratio:            {:>10.0}×",
        guest_op.as_secs_f64() / native_op.as_secs_f64().max(1e-12)
    );
    Ok(())
}

async fn sqlite_overhead(url: &str, data: &std::path::Path) -> anyhow::Result<()> {
    const N: u32 = 20_000;
    let client = TestClient::new();
    let mut guest_best = u64::MAX;
    for _ in 0..5 {
        let answer = client.get(&format!("{url}/sqlite-bench?n={N}")).await?;
        anyhow::ensure!(
            answer.status.is_success(),
            "sqlite-bench failed: {}",
            answer.body
        );
        guest_best = guest_best.min(answer.body.trim().parse()?);
    }
    let guest_op = guest_best as f64 / f64::from(N);

    let dir = data.join("native");
    let conn = pooler_host::runtime::imports::sqlite::open(&dir, "bench")
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS b (k INTEGER, v TEXT)")?;
    let mut native_best = u128::MAX;
    for _ in 0..5 {
        conn.execute_batch("DELETE FROM b")?;
        let start = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        for k in 0..N {
            conn.execute(
                "INSERT INTO b (k, v) VALUES (?, ?)",
                rusqlite::params![i64::from(k), "value"],
            )?;
        }
        conn.execute_batch("COMMIT")?;
        native_best = native_best.min(start.elapsed().as_nanos());
    }
    let native_op = native_best as f64 / f64::from(N);
    println!("\n## guest→sqlite import ({N} INSERTs in one transaction, best of 5)");
    println!("native rusqlite:  {:>10.3} µs/insert", native_op / 1e3);
    println!("through import:   {:>10.3} µs/insert", guest_op / 1e3);
    println!("ratio:            {:>10.2}×", guest_op / native_op);
    Ok(())
}

struct Load {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn load(url: String, clients: usize) -> anyhow::Result<Load> {
    let client = TestClient::new();
    // Warm up connections (and the guest's compiled code).
    for _ in 0..clients.max(8) {
        client.get(&url).await?;
    }
    let start = Instant::now();
    let deadline = start + LOAD_DURATION;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let sent = Instant::now();
                let answer = client.get(&url).await?;
                anyhow::ensure!(
                    answer.status.is_success(),
                    "{}: {}",
                    answer.status,
                    answer.body
                );
                latencies.push(sent.elapsed());
            }
            Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = start.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok(Load {
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    })
}

async fn http_load(url: &str, upstream: &FakeUpstream) -> anyhow::Result<()> {
    println!(
        "\n## HTTP through the pass-through proxy fixture vs the upstream directly ({LOAD_DURATION:?} each)"
    );
    println!(
        "{:>7} | {:>10} {:>9} {:>9} | {:>10} {:>9} {:>9} | {:>8} {:>8} {:>8}",
        "clients",
        "direct/s",
        "p50 µs",
        "p99 µs",
        "proxy/s",
        "p50 µs",
        "p99 µs",
        "thru",
        "p50",
        "p99"
    );
    for clients in [1, 16, 64] {
        let direct = load(format!("{}/bench", upstream.url()), clients).await?;
        let proxied = load(format!("{url}/proxy/{}/bench", upstream.addr()), clients).await?;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{:>7} | {:>10.0} {:>9.0} {:>9.0} | {:>10.0} {:>9.0} {:>9.0} | {:>7.2}× {:>7.2}× {:>7.2}×",
            clients,
            direct.per_second,
            us(direct.p50),
            us(direct.p99),
            proxied.per_second,
            us(proxied.p50),
            us(proxied.p99),
            proxied.per_second / direct.per_second,
            us(proxied.p50) / us(direct.p50),
            us(proxied.p99) / us(direct.p99),
        );
    }
    Ok(())
}
