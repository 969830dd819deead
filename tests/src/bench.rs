//! What the benchmarks share: the runtime they run on, the pool served on loopback and
//! configured for a load, the start-up measurement of `pooler serve`, and the re-evaluation
//! of N pending rows. The `pool`, `host`, `reevaluate` and `table` benches call these, so the
//! one table (`cargo bench -p pooler-tests --bench table`) measures exactly what the
//! separate benches measure.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pooler_core::clock::SystemClock;
use pooler_host::config::Config;
use pooler_host::operate::server::Server;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    Credential, NewAccount,
};
use pooler_host::runtime::bindings::types::Provider;
use pooler_host::runtime::imports::threads::NoCore;
use pooler_host::runtime::{Host, HostOptions};

use crate::client::TestClient;
use crate::fixtures;

/// Worker threads of a benchmark's runtime: the load generator, the host and the fake
/// upstream share them, as on the 2-core machines the figures are measured on.
pub const WORKERS: usize = 2;

/// Run a benchmark's `main` body on a multi-threaded runtime of [`WORKERS`] threads.
pub fn run(body: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    // As `pooler`'s main does: the pool child is this binary, not `pooler`.
    pooler_host::runtime::allocator::limit_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()?
        .block_on(body)
}

/// The median of `values` (the upper one of an even count).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A host serving `component` (a path, or `embedded`) as the Account Pooler on an ephemeral
/// loopback port, with no core; its URL, the host, and the sender that stops the server.
pub async fn serve_pool(
    component: &str,
    data: &Path,
) -> anyhow::Result<(String, Host, tokio::sync::oneshot::Sender<()>)> {
    let config = Config::parse(&format!(
        "[plugins.account-pool]\ncomponent = {component:?}\nallowed-hosts = [\"127.0.0.1\"]\n"
    ))?;
    let host = Host::new(HostOptions {
        config,
        data_dir: data.to_path_buf(),
        clock: Arc::new(SystemClock::new()),
        threads: Arc::new(NoCore),
        cache_dir: Some(PathBuf::from(fixtures::COMPILE_CACHE)),
        seed: None,
    })?;
    let server = Server::bind(host.clone(), "127.0.0.1:0".parse()?).await?;
    let url = format!("http://{}", server.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Ok((url, host, stop))
}

/// A host as `pooler serve` runs it: the core (`CoreLink`, its database in `data`), both
/// plugins (the Account Pooler from `pool_component`, a path or `embedded`), the Account
/// Pooler allowed to reach loopback, the default maintenance tick, on an ephemeral loopback
/// port with the tests' compile cache. Its URL, the host, the core, and the sender that
/// stops the server.
pub async fn serve_like_pooler(
    data: &Path,
    pool_component: &str,
) -> anyhow::Result<(
    String,
    Host,
    Arc<pooler_host::mediation::core_link::CoreLink>,
    tokio::sync::oneshot::Sender<()>,
)> {
    use pooler_host::mediation::core_link::{CoreLink, CoreOptions};
    let config = Config::parse(&format!(
        "[plugins.account-pool]\ncomponent = {pool_component:?}\nallowed-hosts = [\"127.0.0.1\"]\n",
    ))?;
    let clock: pooler_core::clock::SharedClock = Arc::new(SystemClock::new());
    let core = CoreLink::open(data, clock.clone(), CoreOptions::from_host_config(&config))?;
    let host = Host::new(HostOptions {
        config,
        data_dir: data.to_path_buf(),
        clock,
        threads: core.threads_service(),
        cache_dir: Some(PathBuf::from(fixtures::COMPILE_CACHE)),
        seed: None,
    })?;
    let core = core.attach(&host)?;
    let server = Server::bind(host.clone(), "127.0.0.1:0".parse()?)
        .await?
        .with_core(core.clone())?;
    let url = format!("http://{}", server.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Ok((url, host, core, stop))
}

/// Point the pool at `upstream`, add API-key accounts A, B, C and open a route for a thread
/// of the pool at `url`; the route token.
pub async fn configure_pool(host: &Host, url: &str, upstream: &str) -> anyhow::Result<String> {
    let set = |key: &'static str, value: String| {
        host.call_pool("settings.set-setting", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_settings()
                    .call_set_setting(store, key, &value)
                    .await
            })
        })
    };
    set("claude-upstream-url", upstream.to_owned())
        .await?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for key in ["key-a", "key-b", "key-c"] {
        let account = NewAccount {
            provider: Provider::Claude,
            credential: Credential::ApiKey(key.into()),
            label: None,
            priority: None,
            options: None,
        };
        host.call_pool("accounts.add", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_accounts()
                    .call_add(store, &account)
                    .await
            })
        })
        .await?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let (thread, endpoint) = ("bench".to_owned(), url.to_owned());
    let route = host
        .call_pool("routing.open-route", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_open_route(store, &thread, Provider::Claude, &endpoint)
                    .await
            })
        })
        .await?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(route.token)
}

/// One start as `pooler serve` makes it, on `data` with the compile cache `cache`: open the
/// core, load and pre-instantiate both embedded components, attach the core, bind — the time
/// until the pool answered a first request (a route token it does not know: 401 from the
/// pool itself).
pub async fn start_once(data: &Path, cache: &Path) -> anyhow::Result<Duration> {
    use pooler_host::mediation::core_link::{CoreLink, CoreOptions};
    let config = Config::parse("[maintenance]\ninterval-s = 0\n")?;
    let started = Instant::now();
    let clock: pooler_core::clock::SharedClock = Arc::new(SystemClock::new());
    let core = CoreLink::open(data, clock.clone(), CoreOptions::from_host_config(&config))?;
    let host = Host::new(HostOptions {
        config,
        data_dir: data.to_path_buf(),
        clock,
        threads: core.threads_service(),
        cache_dir: Some(cache.to_path_buf()),
        seed: None,
    })?;
    let core = core.attach(&host)?;
    let server = Server::bind(host.clone(), "127.0.0.1:0".parse()?)
        .await?
        .with_core(core.clone())?;
    let addr = server.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let request = hyper::Request::post(format!("http://{addr}/v1/messages"))
        .header("authorization", "Bearer not-a-route-token")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))?;
    let answer = TestClient::new().send(request).await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        answer.status == hyper::StatusCode::UNAUTHORIZED,
        "the pool did not refuse the unknown token: {} {}",
        answer.status,
        answer.body
    );
    let _ = stop.send(());
    serving.await??;
    core.shutdown().await;
    Ok(elapsed)
}

/// Start-up times of `runs` rounds, each: a fresh data directory on an empty compile cache
/// (`cold`), another fresh data directory on the cache the first filled (`fresh`), and the
/// first data directory again (`warm`).
pub struct StartUps {
    pub cold: Vec<Duration>,
    pub fresh: Vec<Duration>,
    pub warm: Vec<Duration>,
}

/// Measure [`StartUps`] over `runs` rounds in temporary directories.
pub async fn start_ups(runs: usize) -> anyhow::Result<StartUps> {
    let root = tempfile::tempdir()?;
    let mut out = StartUps {
        cold: Vec::new(),
        fresh: Vec::new(),
        warm: Vec::new(),
    };
    for run in 0..runs.max(1) {
        let cache = root.path().join(format!("cache-{run}"));
        let dir = |name: &str| root.path().join(format!("{name}-{run}"));
        out.cold.push(start_once(&dir("cold"), &cache).await?);
        out.fresh.push(start_once(&dir("shared"), &cache).await?);
        out.warm.push(start_once(&dir("cold"), &cache).await?);
    }
    Ok(out)
}

/// Re-evaluating N pending rows on one availability change (see `benches/reevaluate.rs`).
pub mod reevaluate {
    use super::*;
    use crate::core::{CoreHost, CoreSetup};
    use crate::pool::{five_hour_rejected, reply};

    const SECOND: u64 = 1_000;
    const HOUR: u64 = 3_600 * SECOND;
    /// Provider Retry's default reset buffer and jitter bound.
    const BUFFER: u64 = 15 * SECOND;
    const JITTER: u64 = 30 * SECOND;
    /// Threads created and sent concurrently while seeding.
    const SEED_BATCH: usize = 250;

    /// One measurement.
    pub struct Measured {
        pub rows: usize,
        /// `accounts.enable-account` through the pool.
        pub enable: Duration,
        /// The host's delivery of the change to Provider Retry, until it returned.
        pub delivery: Duration,
        /// Rows moved to now + buffer + jitter, same ids.
        pub moved: usize,
    }

    impl Measured {
        pub fn total(&self) -> Duration {
            self.enable + self.delivery
        }
    }

    /// Seed `n` pending rows (not timed), enable account B, time the re-evaluation.
    pub async fn measure(n: usize) -> anyhow::Result<Measured> {
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
        drop(h);
        Ok(Measured {
            rows: n,
            enable,
            delivery,
            moved,
        })
    }

    /// N threads in `error` with one live row each, waiting on A's reset.
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
                        .new_thread(pooler_core::Provider::Claude, Some("claude-test"))
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
}
