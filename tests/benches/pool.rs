//! The Account Pooler benchmark (on demand, not in CI): `cargo bench -p pooler-tests --bench
//! pool`. The real pool (embedded) with three API-key accounts in front of a fake upstream on
//! loopback; every client keeps its own session, so after its first request each one is
//! pinned. In the same run, the same requests go to the upstream directly and through the
//! pass-through proxy fixture (`fixture-pool`, a fresh instance per request), so the figures
//! are ratios against baselines of this machine at this moment:
//!
//! - one client, sequential: p50 and p99 latency, the latency the pool adds over the
//!   direct call, and what it adds over the pass-through fixture (the fixture and the pool
//!   alternating over three rounds) — the pool's own share, the fixture's being the host's
//!   (target: p50 added < 0.3 ms, p99 added < 1 ms; both readings are printed);
//! - 16 and 64 clients: requests per second (target at 64: the pool ≥ half the
//!   pass-through fixture), the fixture and the pool alternating over three rounds.
//!
//! Three more one-client rows show where the floor is, for whoever works on the latency:
//! a guest that answers at once without calling out (the fixture's `/time`: a fresh
//! instance and the wasi:http request and response, nothing else), the pool refusing a
//! request whose route token it does not know (401: its body read, settings and route
//! looked up, no upstream), and a proxy in plain Rust, no WebAssembly (the two HTTP hops
//! alone, the least any proxy in this process can add).
//!
//! For profiling, `POOL_BENCH_ONLY=direct|fixture|pool|answer|refusal|plain` runs just that
//! target (one client, or `POOL_BENCH_CLIENTS=n`), e.g. under `perf record`, and prints its
//! line; `POOL_BENCH_SECONDS=n` makes each run last n seconds instead of 3 (a soak run);
//! `POOL_BENCH_BODY_KIB=n` pads each request's conversation to about n KiB (agents send
//! tens to hundreds of KiB) instead of ~200 bytes.
//!
//! `POOL_BENCH_SSE=1` makes the upstream answer a Messages stream (`claude::message`, its
//! events sent at once) and times each request to its first body frame (the first event
//! the agent gets) instead of to its end; `POOL_BENCH_FIRST_EVENT_WAIT=0s` sets the pool's
//! `first-event-wait` (0s: the head goes out before the first event is read, as it did
//! before the pool held it), so the two can be compared in one build.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use pooler_tests::bench::{configure_pool, median, serve_pool};
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::pool::claude_body;
use pooler_tests::upstream::FakeUpstream;

/// How long each run lasts (`POOL_BENCH_SECONDS=n` for a soak run of one part).
const LOAD_DURATION: Duration = Duration::from_secs(3);

fn load_duration() -> Duration {
    std::env::var("POOL_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(LOAD_DURATION, Duration::from_secs)
}
/// The first message's `"content":…` member padded to about n KiB of conversation
/// (`POOL_BENCH_BODY_KIB=n`), with the escapes real conversations have; empty by default.
fn padding() -> String {
    let kib: usize = std::env::var("POOL_BENCH_BODY_KIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if kib == 0 {
        return String::new();
    }
    // Source code, as an agent's conversation mostly is: a quote or a line break every
    // ~25 bytes once in JSON.
    let line = "    let url = format!(\"{base}/v1/messages?beta=true\"); // where requests go\n";
    let text = line.repeat(kib * 1024 / line.len());
    format!(r#""content":{}"#, serde_json::Value::from(text))
}

/// Whether the upstream answers a Messages stream and requests are timed to their first
/// body frame (`POOL_BENCH_SSE=1`).
fn sse() -> bool {
    std::env::var_os("POOL_BENCH_SSE").is_some_and(|v| v != "0")
}

/// Alternating fixture and pool runs per throughput figure.
const ROUNDS: usize = 3;

fn main() -> anyhow::Result<()> {
    pooler_tests::bench::run(run())
}

/// A proxy in plain Rust, no WebAssembly: a hyper server that forwards each request to
/// `upstream` through a keep-alive client and returns its answer. The floor the two HTTP hops
/// set on this machine, whatever a host does. Its URL.
async fn plain_proxy(upstream: std::net::SocketAddr) -> anyhow::Result<String> {
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, hyper::body::Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let client = client.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let client = client.clone();
                async move {
                    let (mut parts, body) = req.into_parts();
                    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                    parts.uri = format!("http://{upstream}{path}")
                        .parse()
                        .expect("a loopback URL");
                    client.request(Request::from_parts(parts, body)).await
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    Ok(url)
}

/// Where a load goes.
#[derive(Clone)]
struct Target {
    url: String,
    /// The pool's route token, when the target is the pool.
    token: Option<String>,
    /// The status every answer must have (a success when `None`).
    expect: Option<u16>,
    /// Conversation text added to every request ([`padding`]).
    padding: Arc<str>,
}

impl Target {
    fn request(&self, session: &str) -> Request<Full<Bytes>> {
        let mut builder = Request::post(&self.url)
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .header("x-claude-code-session-id", session);
        if let Some(token) = &self.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder
            .body(Full::new(Bytes::from(request_body(session, &self.padding))))
            .expect("a request")
    }
}

/// A Claude request body for `session`, its first message's content replaced by `padding`
/// (when not empty).
fn request_body(session: &str, padding: &str) -> String {
    let body = claude_body(session, "claude-sonnet-4-5");
    if padding.is_empty() {
        return body;
    }
    body.replacen(r#""content":"hi""#, padding, 1)
}

struct Load {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    /// CPU time of this whole process (clients, host, upstream) per request, in µs: less
    /// noisy than latency on a shared machine, and what the host adds shows as the
    /// difference to the direct run.
    cpu_us: f64,
}

/// User + system CPU time this process has used so far, in seconds.
fn process_cpu() -> f64 {
    // SAFETY: `rusage` is plain integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

impl Target {
    /// Whether `status` is the answer this target gives.
    fn answered(&self, status: hyper::StatusCode) -> bool {
        match self.expect {
            Some(code) => status.as_u16() == code,
            None => status.is_success(),
        }
    }
}

async fn load(target: &Target, clients: usize) -> anyhow::Result<Load> {
    let client = TestClient::new();
    // Warm up: connections, the guest's code, and each client's session pin.
    for n in 0..clients.max(8) {
        let answer = client
            .send(target.request(&format!("session-{}", n % clients)))
            .await?;
        anyhow::ensure!(
            target.answered(answer.status),
            "{}: {}",
            answer.status,
            answer.body
        );
    }
    let start = Instant::now();
    let cpu_start = process_cpu();
    let deadline = start + load_duration();
    let mut tasks = Vec::new();
    for n in 0..clients {
        let client = client.clone();
        let target = target.clone();
        let session = format!("session-{n}");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let sent = Instant::now();
                if sse() {
                    use http_body_util::BodyExt;
                    let response = client.open(target.request(&session)).await?;
                    anyhow::ensure!(target.answered(response.status()), "{}", response.status());
                    let mut body = response.into_body();
                    let first = body.frame().await;
                    latencies.push(sent.elapsed());
                    anyhow::ensure!(
                        first.is_some_and(|f| f.is_ok()),
                        "a stream without a first frame"
                    );
                    body.collect().await?;
                    continue;
                }
                let answer = client.send(target.request(&session)).await?;
                anyhow::ensure!(
                    target.answered(answer.status),
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
    let cpu = process_cpu() - cpu_start;
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok(Load {
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        cpu_us: cpu * 1e6 / latencies.len() as f64,
    })
}

/// Each figure's median over `runs` (one figure's median need not come from the same run
/// as another's).
fn median_load(runs: &[Load]) -> Load {
    let field = |f: &dyn Fn(&Load) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    Load {
        per_second: field(&|l| l.per_second),
        p50: Duration::from_secs_f64(field(&|l| l.p50.as_secs_f64())),
        p99: Duration::from_secs_f64(field(&|l| l.p99.as_secs_f64())),
        cpu_us: field(&|l| l.cpu_us),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run() -> anyhow::Result<()> {
    let upstream = if sse() {
        FakeUpstream::start_with_default(pooler_tests::provider::claude::message("ok")).await
    } else {
        FakeUpstream::start().await
    };
    upstream.set_recording(false);
    let pool_data = tempfile::tempdir()?;
    let fixture_data = tempfile::tempdir()?;
    let (pool_url, pool_host, stop_pool) = serve_pool("embedded", pool_data.path()).await?;
    let (fixture_url, _fixture_host, stop_fixture) =
        serve_pool(fixtures::POOL, fixture_data.path()).await?;
    let token = configure_pool(&pool_host, &pool_url, &upstream.url()).await?;
    if let Ok(wait) = std::env::var("POOL_BENCH_FIRST_EVENT_WAIT") {
        pooler_tests::exports::set_pool_setting(&pool_host, "first-event-wait", &wait)
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let padding: Arc<str> = padding().into();
    let body_bytes = request_body("session-0", &padding).len();
    println!(
        "machine: {} logical CPUs; tokio: {} workers; {:?} per run; POST /v1/messages ({body_bytes} B), 2-byte answers",
        std::thread::available_parallelism()?,
        pooler_tests::bench::WORKERS,
        load_duration()
    );

    let direct = Target {
        url: format!("{}/v1/messages", upstream.url()),
        token: None,
        expect: None,
        padding: padding.clone(),
    };
    let fixture = Target {
        url: format!("{fixture_url}/proxy/{}/v1/messages", upstream.addr()),
        token: None,
        expect: None,
        padding: padding.clone(),
    };
    let pool = Target {
        url: format!("{pool_url}/v1/messages"),
        token: Some(token),
        expect: None,
        padding: padding.clone(),
    };
    let answer = Target {
        url: format!("{fixture_url}/time"),
        token: None,
        expect: None,
        // It answers without reading the body: a padded one would be cut off mid-send.
        padding: Arc::from(""),
    };
    let plain = Target {
        url: format!("{}/v1/messages", plain_proxy(upstream.addr()).await?),
        token: None,
        expect: None,
        padding: padding.clone(),
    };
    let refusal = Target {
        url: format!("{pool_url}/v1/messages"),
        token: Some("not-a-route-token".into()),
        expect: Some(401),
        padding: padding.clone(),
    };

    if let Ok(only) = std::env::var("POOL_BENCH_ONLY") {
        let target = match only.as_str() {
            "direct" => &direct,
            "fixture" => &fixture,
            "pool" => &pool,
            "answer" => &answer,
            "refusal" => &refusal,
            "plain" => &plain,
            other => anyhow::bail!(
                "POOL_BENCH_ONLY={other}: expected direct, fixture, pool, answer, refusal or plain"
            ),
        };
        let clients: usize = match std::env::var("POOL_BENCH_CLIENTS") {
            Ok(n) => n.parse()?,
            Err(_) => 1,
        };
        let l = load(target, clients).await?;
        println!(
            "{only}, {clients} client(s): {:.0} requests/s, p50 {:.3} ms, p99 {:.3} ms, {:.0} CPU µs/request",
            l.per_second,
            ms(l.p50),
            ms(l.p99),
            l.cpu_us
        );
        return Ok(());
    }

    println!("\n## one client, sequential (ms)");
    println!(
        "{:<22} {:>8} {:>8} {:>12} {:>12} {:>14}",
        "", "p50", "p99", "added p50", "added p99", "CPU µs/request"
    );
    let base = load(&direct, 1).await?;
    println!(
        "{:<22} {:>8.3} {:>8.3} {:>12} {:>12} {:>14.0}",
        "upstream directly",
        ms(base.p50),
        ms(base.p99),
        "",
        "",
        base.cpu_us
    );
    let row = |name: &str, l: &Load| {
        println!(
            "{:<22} {:>8.3} {:>8.3} {:>12.3} {:>12.3} {:>14.0}",
            name,
            ms(l.p50),
            ms(l.p99),
            ms(l.p50) - ms(base.p50),
            ms(l.p99) - ms(base.p99),
            l.cpu_us
        );
    };
    // The fixture and the pool alternate, ROUNDS times each; their rows are the medians,
    // and what the pool adds over the fixture is the median of the rounds' differences.
    let (mut fixture_runs, mut pool_runs) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        fixture_runs.push(load(&fixture, 1).await?);
        pool_runs.push(load(&pool, 1).await?);
    }
    let over_fixture = |f: fn(&Load) -> f64| {
        let mut d: Vec<f64> = pool_runs
            .iter()
            .zip(&fixture_runs)
            .map(|(p, x)| f(p) - f(x))
            .collect();
        median(&mut d)
    };
    let over_p50 = over_fixture(|l| ms(l.p50));
    let over_p99 = over_fixture(|l| ms(l.p99));
    let fixture_one = median_load(&fixture_runs);
    let pool_one = median_load(&pool_runs);
    row("pass-through fixture", &fixture_one);
    row("account pool", &pool_one);
    for (name, target) in [
        ("floor: guest answers", &answer),
        ("floor: pool refuses", &refusal),
        ("floor: plain proxy", &plain),
    ] {
        row(name, &load(target, 1).await?);
    }
    println!(
        "account pool over the pass-through fixture ({ROUNDS} alternating rounds, medians): \
         p50 +{over_p50:.3} ms, p99 +{over_p99:.3} ms"
    );
    let added_p50 = ms(pool_one.p50) - ms(base.p50);
    let added_p99 = ms(pool_one.p99) - ms(base.p99);

    // The fixture's figure swings ±20 % between runs on a shared machine, so the fixture
    // and the pool alternate, each run ROUNDS times, and the ratio is the median of the
    // rounds' ratios (each round's two runs are seconds apart).
    println!("\n## throughput (requests/s; fixture and pool alternate, {ROUNDS} rounds, medians)");
    println!(
        "{:>7} | {:>10} | {:>10} | {:>10} | {:>14} | rounds",
        "clients", "direct", "fixture", "pool", "pool/fixture"
    );
    let mut ratio_64 = 0.0;
    for clients in [16, 64] {
        let d = load(&direct, clients).await?;
        let (mut f, mut p, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let fr = load(&fixture, clients).await?.per_second;
            let pr = load(&pool, clients).await?.per_second;
            f.push(fr);
            p.push(pr);
            ratios.push(pr / fr);
        }
        let rounds: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let ratio = median(&mut ratios);
        println!(
            "{:>7} | {:>10.0} | {:>10.0} | {:>10.0} | {:>13.2}× | {}",
            clients,
            d.per_second,
            median(&mut f),
            median(&mut p),
            ratio,
            rounds.join(" ")
        );
        if clients == 64 {
            ratio_64 = ratio;
        }
    }

    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("\n## targets");
    println!(
        "one client, p50 added < 0.3 ms: over direct {added_p50:.3} ms — {}; over the fixture {over_p50:.3} ms — {}",
        verdict(added_p50 < 0.3),
        verdict(over_p50 < 0.3)
    );
    println!(
        "one client, p99 added < 1 ms:   over direct {added_p99:.3} ms — {}; over the fixture {over_p99:.3} ms — {}",
        verdict(added_p99 < 1.0),
        verdict(over_p99 < 1.0)
    );
    println!(
        "64 clients, pool ≥ ½ fixture:   {ratio_64:.2}× — {}",
        verdict(ratio_64 >= 0.5)
    );

    let _ = stop_pool.send(());
    let _ = stop_fixture.send(());
    Ok(())
}
