//! The one benchmark table (on demand, not in CI):
//!
//! ```text
//! cargo bench -p pooler-tests --bench table
//! ```
//!
//! prints ONE table, each row a figure measured in this run and its ratio to a baseline
//! measured in the same run:
//!
//! - **load**: requests/s and p50/p99 latency of a Claude `POST /v1/messages` (~200 B, a
//!   2-byte answer) at 1, 16 and 64 clients, through the Account Pooler against the same
//!   fake upstream called directly and against nginx as a reverse proxy to that upstream.
//!   All three are loaded by the same generator, `wrk` (Debian's `wrk`; one thread for one
//!   client, two threads otherwise), and each target runs in its own process: the upstream
//!   in this process, nginx (Debian's `nginx-light`, started here with its own config in a
//!   temporary directory, `worker_processes 2`, keep-alive to the upstream) and the pool in a
//!   child process (this same binary re-executed with `TABLE_BENCH_CHILD=pool`: the host as
//!   `pooler serve` assembles it — the core, the real embedded Account Pooler and Provider
//!   Retry — on 2 tokio workers, three API-key accounts, one route). Every run is checked: no socket error and no non-2xx
//!   answer, or the bench fails. The three targets alternate within each round
//!   (`TABLE_BENCH_ROUNDS`, default 3; each run `TABLE_BENCH_SECONDS`, default 3); the table
//!   prints medians and the pool's spread (min–max) over the rounds; and the pool
//!   process's CPU time per request (user + system, `/proc/PID/stat`, over every load run)
//!   against nginx's (its master and workers), with two floors from a second child serving
//!   the pass-through fixture in the same host: the fixture forwarding the same request
//!   (the host's share of a proxied request) and its `/time` answering at once (a fresh
//!   instance and wasi:http alone); the pool minus the fixture is the pool's own share;
//! - **memory**: the pool process's resident memory (`VmRSS`) idle after start (the
//!   baseline), with 64 streams open through it (Claude-style SSE held mid-answer by the
//!   upstream), and its peak (`VmHWM`) after everything;
//! - **re-evaluation** of 10,000 pending retry rows on one availability change, through the
//!   real components and the real core (as `--bench reevaluate`), against 1,000 rows;
//! - **start-up**: `pooler serve`'s work up to the first answered request (as `--bench host`,
//!   part 4) on a fresh data directory with a warm compile cache and on a warm data
//!   directory, against a fresh data directory with an empty cache (`TABLE_BENCH_STARTS`,
//!   default 5, medians and spread).
//!
//! Needs `wrk` and `nginx` on the PATH or in `/usr/bin`, `/usr/sbin`
//! (`apt-get install wrk nginx-light`). The targets: RSS with 64 streams under
//! 100 MB; at 64 clients at least 0.15× nginx's requests/s; the other figures no worse than
//! before. `TABLE_BENCH_ONLY=load,memory` (any of `load`, `memory`, `reevaluate`, `start`)
//! runs just those parts. `TABLE_BENCH_POOL_COMPONENT=path/account_pool.wasm` serves that
//! component as the pool instead of the embedded one: a guest built from another commit, to
//! compare a change to the guest alone in one build of the host.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use pooler_tests::bench::{self, configure_pool, median, serve_like_pooler, serve_pool};
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::pool::claude_body;
use pooler_tests::upstream::{FakeUpstream, Gate, Received, Reply, Responder};

/// Set in the child process that serves the pool.
const CHILD: &str = "TABLE_BENCH_CHILD";
/// The child serving the real pool.
const POOL: &str = "pool";
/// The child serving the pass-through fixture: the host's share of a request (a fresh
/// instance, wasi:http in and out, one upstream call), without the pool's own work.
const FIXTURE: &str = "fixture";
/// A file to load as the pool instead of the embedded one (a guest built from another
/// commit), so a change to the guest alone is compared in one build of the host.
const POOL_COMPONENT: &str = "TABLE_BENCH_POOL_COMPONENT";
/// The upstream URL handed to the child.
const CHILD_UPSTREAM: &str = "TABLE_BENCH_UPSTREAM";
/// Where the pool and its two floors are in the load targets.
const POOL_AT: usize = 2;
const FIXTURE_AT: usize = 3;
const ANSWER_AT: usize = 4;
/// Client counts of the load rows.
const CLIENTS: [usize; 3] = [1, 16, 64];
/// Streams held open for the memory row.
const STREAMS: usize = 64;
/// How long to wait for a process to come up.
const START_LIMIT: Duration = Duration::from_secs(60);
const SESSION: &str = "session-bench";
/// The sessions of the held streams start with this (the fake upstream holds only those).
const STREAM_SESSION: &str = "stream-";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    if std::env::var_os(CHILD).is_some() {
        return bench::run(child());
    }
    bench::run(run())
}

/// The pool process: serve as `pooler serve` does (core, both embedded plugins), the pool in
/// front of `$TABLE_BENCH_UPSTREAM`, print
/// `ready URL TOKEN`, serve until stdin closes.
async fn child() -> anyhow::Result<()> {
    let upstream = std::env::var(CHILD_UPSTREAM)?;
    let data = tempfile::tempdir()?;
    if std::env::var(CHILD).as_deref() == Ok(FIXTURE) {
        // The floor: the same host serving the pass-through fixture as its pool.
        let (url, host, stop) = serve_pool(fixtures::POOL, data.path()).await?;
        println!("ready {url} -");
        std::io::stdout().flush()?;
        wait_for_stdin_to_close().await?;
        let _ = stop.send(());
        drop(host);
        return Ok(());
    }
    let pool = std::env::var(POOL_COMPONENT).unwrap_or_else(|_| "embedded".to_owned());
    let (url, host, core, stop) = serve_like_pooler(data.path(), &pool).await?;
    let token = configure_pool(&host, &url, &upstream).await?;
    println!("ready {url} {token}");
    std::io::stdout().flush()?;
    wait_for_stdin_to_close().await?;
    let _ = stop.send(());
    core.shutdown().await;
    drop(host);
    Ok(())
}

/// The parent closes a child's stdin (drops it) when it is done with the child.
async fn wait_for_stdin_to_close() -> anyhow::Result<()> {
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    Ok(())
}

/// The pool child process; killed when dropped.
struct PoolProcess {
    child: Child,
    url: String,
    token: String,
}

impl PoolProcess {
    /// A child serving `kind`: [`POOL`] (the real pool, as `pooler serve` runs it) or
    /// [`FIXTURE`] (the pass-through fixture in the same host).
    fn start(upstream: &str, kind: &str) -> anyhow::Result<PoolProcess> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(CHILD, kind)
            .env(CHILD_UPSTREAM, upstream)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .map_err(|e| anyhow::anyhow!("the pool process: {e}"))?;
        let mut words = line.split_whitespace();
        anyhow::ensure!(
            words.next() == Some("ready"),
            "the pool process did not start: {line:?}"
        );
        let (Some(url), Some(token)) = (words.next(), words.next()) else {
            anyhow::bail!("the pool process printed {line:?}");
        };
        Ok(PoolProcess {
            url: url.to_owned(),
            token: token.to_owned(),
            child,
        })
    }

    /// A field of `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`).
    fn memory(&self, field: &str) -> anyhow::Result<u64> {
        status_bytes(self.child.id(), field)
    }
}

impl Drop for PoolProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kB` field of `/proc/PID/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/{pid}/status"))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("{line}"))?
        .parse()?;
    Ok(kib * 1024)
}

/// A program from the PATH or Debian's locations.
fn program(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} not found: apt-get install wrk nginx-light"))
}

/// nginx as a reverse proxy to `upstream` on a loopback port, from a config in `dir`.
struct Nginx {
    child: Child,
    url: String,
}

impl Nginx {
    async fn start(dir: &Path, upstream: std::net::SocketAddr) -> anyhow::Result<Nginx> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let d = dir.display();
        let conf = format!(
            "worker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               upstream fake {{ server {upstream}; keepalive 64; }}\n\
               server {{\n    listen 127.0.0.1:{port};\n\
                 location / {{ proxy_pass http://fake; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf)?;
        let child = Command::new(program("nginx")?)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"))
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let nginx = Nginx {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        let client = TestClient::new();
        loop {
            if let Ok(answer) = client.send(request(&nginx.url, None, SESSION)).await {
                anyhow::ensure!(
                    answer.status.is_success(),
                    "nginx answered {}",
                    answer.status
                );
                return Ok(nginx);
            }
            anyhow::ensure!(
                started.elapsed() < START_LIMIT,
                "nginx did not answer on {}",
                nginx.url
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The request every target gets (the pool's with its route token).
fn request(base: &str, token: Option<&str>, session: &str) -> Request<Full<Bytes>> {
    let mut builder = Request::post(format!("{base}/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("x-claude-code-session-id", session);
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder
        .body(Full::new(Bytes::from(claude_body(
            session,
            "claude-sonnet-4-5",
        ))))
        .expect("a request")
}

/// One wrk run's figures.
#[derive(Clone, Copy)]
struct Load {
    per_second: f64,
    /// Milliseconds.
    p50: f64,
    p99: f64,
    /// Requests answered in the run.
    requests: u64,
    /// CPU time the target's processes spent in the run, in microseconds (None for the
    /// upstream, which runs in this process).
    cpu_us: Option<f64>,
}

/// CPU time (user + system, every thread) process `pid` has used so far, in microseconds,
/// from `/proc/PID/stat`.
fn cpu_us(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("unreadable /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf reads a constant of the running system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    anyhow::ensure!(per_second > 0, "no clock tick rate");
    Ok(ticks as f64 * 1e6 / per_second as f64)
}

/// CPU time of process `pid` and its children (nginx's workers), in microseconds.
fn tree_cpu_us(pid: u32) -> anyhow::Result<f64> {
    let mut total = cpu_us(pid)?;
    for entry in std::fs::read_dir("/proc")? {
        let Some(child) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(pid) {
            total += cpu_us(child).unwrap_or(0.0);
        }
    }
    Ok(total)
}

/// A wrk latency such as `612.00us`, `1.20ms`, `2.00s`, in milliseconds.
fn wrk_ms(text: &str) -> anyhow::Result<f64> {
    let (number, factor) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60e3)
    } else {
        anyhow::bail!("a latency without a unit: {text}")
    };
    Ok(number.parse::<f64>()? * factor)
}

/// Run wrk with `clients` connections against the target of `script` at `url`, served
/// by process `pid` (and its children) when it is not this one.
fn wrk(
    script: &Path,
    url: &str,
    clients: usize,
    seconds: u64,
    pid: Option<u32>,
) -> anyhow::Result<Load> {
    let threads = if clients == 1 { 1 } else { 2 };
    let cpu_before = pid.map(tree_cpu_us).transpose()?;
    let output = Command::new(program("wrk")?)
        .args(["-t", &threads.to_string(), "-c", &clients.to_string()])
        .args([
            "-d",
            &format!("{seconds}s"),
            "--timeout",
            "10s",
            "--latency",
            "-s",
        ])
        .arg(script)
        .arg(url)
        .output()?;
    let cpu_us = match (pid, cpu_before) {
        (Some(pid), Some(before)) => Some(tree_cpu_us(pid)? - before),
        _ => None,
    };
    let text = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(output.status.success(), "wrk failed: {text}");
    anyhow::ensure!(
        !text.contains("Non-2xx") && !text.contains("Socket errors"),
        "wrk against {url} saw failures:\n{text}"
    );
    let field = |prefix: &str| -> anyhow::Result<&str> {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
            .ok_or_else(|| anyhow::anyhow!("no {prefix:?} in wrk's output:\n{text}"))
    };
    // "  12345 requests in 3.00s, 1.23MB read"
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no request count in wrk's output:\n{text}"))?;
    Ok(Load {
        per_second: field("Requests/sec:")?.parse()?,
        p50: wrk_ms(field("50%")?)?,
        p99: wrk_ms(field("99%")?)?,
        requests,
        cpu_us,
    })
}

/// A wrk script that sends [`request`]'s method, headers and body.
fn wrk_script(dir: &Path, name: &str, token: Option<&str>) -> anyhow::Result<PathBuf> {
    let body = claude_body(SESSION, "claude-sonnet-4-5");
    anyhow::ensure!(!body.contains("]==]"), "the body closes the Lua string");
    let mut lua = format!(
        "wrk.method = \"POST\"\nwrk.body = [==[{body}]==]\n\
         wrk.headers[\"content-type\"] = \"application/json\"\n\
         wrk.headers[\"anthropic-version\"] = \"2023-06-01\"\n\
         wrk.headers[\"x-claude-code-session-id\"] = \"{SESSION}\"\n"
    );
    if let Some(token) = token {
        lua.push_str(&format!(
            "wrk.headers[\"authorization\"] = \"Bearer {token}\"\n"
        ));
    }
    let path = dir.join(format!("{name}.lua"));
    std::fs::write(&path, lua)?;
    Ok(path)
}

/// One printed row.
struct Row {
    figure: String,
    value: String,
    baseline: String,
    ratio: f64,
    note: String,
}

fn print_table(rows: &[Row]) {
    let head = ["figure", "value", "baseline (same run)", "ratio"];
    println!(
        "\n| {:<52} | {:>12} | {:>24} | {:>8} | note",
        head[0], head[1], head[2], head[3]
    );
    let rule = |width: usize| "-".repeat(width);
    println!(
        "|{}|{}|{}|{}|{}",
        rule(54),
        rule(14),
        rule(26),
        rule(10),
        rule(30)
    );
    for r in rows {
        println!(
            "| {:<52} | {:>12} | {:>24} | {:>7.3}× | {}",
            r.figure, r.value, r.baseline, r.ratio, r.note
        );
    }
}

fn spread(values: &[f64], digits: usize) -> String {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("pool {low:.digits$}–{high:.digits$}")
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn run() -> anyhow::Result<()> {
    let only = std::env::var("TABLE_BENCH_ONLY").ok();
    let part = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    let rounds: usize = env_or("TABLE_BENCH_ROUNDS", 3usize).max(1);
    let seconds: u64 = env_or("TABLE_BENCH_SECONDS", 3u64).max(1);
    println!(
        "machine: {} logical CPUs; load average at start {}; tokio: {} workers per process; \
         {rounds} rounds of {seconds} s per load figure",
        std::thread::available_parallelism()?,
        load_average(),
        bench::WORKERS,
    );
    let mut rows = Vec::new();
    let dir = tempfile::Builder::new().prefix("table-bench").tempdir()?;

    let upstream = FakeUpstream::start().await;
    upstream.set_recording(false);
    let pool = if part("load") || part("memory") {
        Some(PoolProcess::start(&upstream.url(), POOL)?)
    } else {
        None
    };
    let idle = match &pool {
        Some(p) => p.memory("VmRSS")?,
        None => 0,
    };

    if part("load") {
        let pool = pool.as_ref().expect("started");
        let nginx_dir = dir.path().join("nginx");
        std::fs::create_dir_all(&nginx_dir)?;
        let nginx = Nginx::start(&nginx_dir, upstream.addr()).await?;
        let fixture = PoolProcess::start(&upstream.url(), FIXTURE)?;
        let client = TestClient::new();
        let answer = client
            .send(request(&pool.url, Some(&pool.token), SESSION))
            .await?;
        anyhow::ensure!(
            answer.status.is_success(),
            "the pool: {} {}",
            answer.status,
            answer.body
        );
        // The pool's indices are fixed ([`POOL_AT`] and the floors after it) because the
        // rows below name them.
        let targets = [
            (
                "direct",
                format!("{}/v1/messages", upstream.url()),
                wrk_script(dir.path(), "direct", None)?,
                None,
            ),
            (
                "nginx",
                format!("{}/v1/messages", nginx.url),
                wrk_script(dir.path(), "nginx", None)?,
                Some(nginx.child.id()),
            ),
            (
                "pool",
                format!("{}/v1/messages", pool.url),
                wrk_script(dir.path(), "pool", Some(&pool.token))?,
                Some(pool.child.id()),
            ),
            (
                "fixture",
                format!("{}/proxy/{}/v1/messages", fixture.url, upstream.addr()),
                wrk_script(dir.path(), "fixture", None)?,
                Some(fixture.child.id()),
            ),
            (
                "answer",
                format!("{}/time", fixture.url),
                wrk_script(dir.path(), "answer", None)?,
                Some(fixture.child.id()),
            ),
        ];
        // Warm-up: connections, the guest's code, the session's pin.
        for (_, url, script, pid) in &targets {
            wrk(script, url, 16, 1, *pid)?;
        }
        // runs[target][clients index] = one Load per round
        let mut runs = vec![vec![Vec::new(); CLIENTS.len()]; targets.len()];
        for round in 0..rounds {
            for (c, clients) in CLIENTS.iter().enumerate() {
                for (t, (name, url, script, pid)) in targets.iter().enumerate() {
                    let l = wrk(script, url, *clients, seconds, *pid)?;
                    let cpu = l
                        .cpu_us
                        .map(|us| format!(", {:.0} µs CPU a request", us / l.requests as f64))
                        .unwrap_or_default();
                    eprintln!(
                        "  round {round}: {name:<6} {clients:>2} clients: {:>8.0} req/s, p50 {:.3} ms, p99 {:.3} ms{cpu}",
                        l.per_second, l.p50, l.p99
                    );
                    runs[t][c].push(l);
                }
            }
        }
        let med = |t: usize, c: usize, f: fn(&Load) -> f64| {
            median(&mut runs[t][c].iter().map(f).collect::<Vec<_>>())
        };
        let pool_values =
            |c: usize, f: fn(&Load) -> f64| runs[POOL_AT][c].iter().map(f).collect::<Vec<_>>();
        for (c, clients) in CLIENTS.iter().enumerate() {
            let per_second = |l: &Load| l.per_second;
            let pool_rps = med(POOL_AT, c, per_second);
            for (t, name) in [(0, "direct"), (1, "nginx")] {
                let base = med(t, c, per_second);
                rows.push(Row {
                    figure: format!("{clients:>2} clients: requests/s, pool vs {name}"),
                    value: format!("{pool_rps:.0}"),
                    baseline: format!("{base:.0} ({name})"),
                    ratio: pool_rps / base,
                    note: spread(&pool_values(c, per_second), 0),
                });
            }
            for (label, f) in [
                ("p50", (|l: &Load| l.p50) as fn(&Load) -> f64),
                ("p99", |l: &Load| l.p99),
            ] {
                let value = med(POOL_AT, c, f);
                for (t, name) in [(0, "direct"), (1, "nginx")] {
                    let base = med(t, c, f);
                    rows.push(Row {
                        figure: format!("{clients:>2} clients: {label} ms, pool vs {name}"),
                        value: format!("{value:.3}"),
                        baseline: format!("{base:.3} ({name})"),
                        ratio: value / base,
                        note: format!(
                            "added {:+.3} ms; {}",
                            value - base,
                            spread(&pool_values(c, f), 3)
                        ),
                    });
                }
            }
        }
        // CPU per request over every round and client count: the pool's process against
        // nginx's (master and workers), each over the requests it answered.
        let per_request = |t: usize| {
            let (cpu, requests) = runs[t].iter().flatten().fold((0.0, 0u64), |(c, r), l| {
                (c + l.cpu_us.unwrap_or(0.0), r + l.requests)
            });
            cpu / requests.max(1) as f64
        };
        let (pool_cpu, nginx_cpu) = (per_request(POOL_AT), per_request(1));
        let each = |t: usize| -> Vec<f64> {
            runs[t]
                .iter()
                .flatten()
                .map(|l| l.cpu_us.unwrap_or(0.0) / l.requests.max(1) as f64)
                .collect()
        };
        rows.push(Row {
            figure: "pool CPU µs per request (all load runs)".into(),
            value: format!("{pool_cpu:.0}"),
            baseline: format!("{nginx_cpu:.0} (nginx)"),
            ratio: pool_cpu / nginx_cpu,
            note: format!("runs {}", spread(&each(POOL_AT), 0)),
        });
        // The floors under it, in the same host: what a request costs before the pool
        // does anything of its own, so a cut of the pool's CPU can be judged against the
        // part the pool's code can change.
        let (fixture_cpu, answer_cpu) = (per_request(FIXTURE_AT), per_request(ANSWER_AT));
        rows.push(Row {
            figure: "pass-through fixture CPU µs per request".into(),
            value: format!("{fixture_cpu:.0}"),
            baseline: format!("{pool_cpu:.0} (pool)"),
            ratio: fixture_cpu / pool_cpu,
            note: format!(
                "the host's share; {}",
                spread(&each(FIXTURE_AT), 0).replacen("pool", "fixture", 1)
            ),
        });
        rows.push(Row {
            figure: "answer-at-once guest CPU µs per request".into(),
            value: format!("{answer_cpu:.0}"),
            baseline: format!("{pool_cpu:.0} (pool)"),
            ratio: answer_cpu / pool_cpu,
            note: "a fresh instance and wasi:http in and out, no upstream".into(),
        });
        let own = pool_cpu - fixture_cpu;
        rows.push(Row {
            figure: "pool's own CPU µs per request (pool − fixture)".into(),
            value: format!("{own:.0}"),
            baseline: format!("{pool_cpu:.0} (pool)"),
            ratio: own / pool_cpu,
            note: "what the pool's code can cut".into(),
        });
        drop(fixture);
        drop(nginx);
    }

    if part("memory") {
        let pool = pool.as_ref().expect("started");
        let open = streams_rss(pool, &upstream).await?;
        rows.push(Row {
            figure: format!("pool RSS MiB with {STREAMS} open streams (target < 100)"),
            value: format!("{:.1}", mib(open)),
            baseline: format!("{:.1} (idle after start)", mib(idle)),
            ratio: open as f64 / idle as f64,
            note: if mib(open) < 100.0 {
                "target met".into()
            } else {
                "target NOT met".into()
            },
        });
        let peak = pool.memory("VmHWM")?;
        rows.push(Row {
            figure: "pool peak RSS MiB (VmHWM) after all of the above".into(),
            value: format!("{:.1}", mib(peak)),
            baseline: format!("{:.1} (idle after start)", mib(idle)),
            ratio: peak as f64 / idle as f64,
            note: String::new(),
        });
    }
    drop(pool);

    if part("reevaluate") {
        let mut measured = Vec::new();
        for n in [1_000, 10_000] {
            let m = bench::reevaluate::measure(n).await?;
            anyhow::ensure!(m.moved == n, "{} of {n} rows moved", m.moved);
            measured.push(m);
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        rows.push(Row {
            figure: "re-evaluate 10,000 pending rows, ms (target < 1000)".into(),
            value: format!("{:.1}", ms(measured[1].total())),
            baseline: format!("{:.1} (1,000 rows)", ms(measured[0].total())),
            ratio: measured[1].total().as_secs_f64() / measured[0].total().as_secs_f64(),
            note: "linear would be 10×".into(),
        });
    }

    if part("start") {
        let starts = env_or("TABLE_BENCH_STARTS", 5usize).max(1);
        let s = bench::start_ups(starts).await?;
        let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
        let cold = median(&mut ms(&s.cold));
        for (label, times) in [
            ("serve start → first answer ms, fresh data dir", &s.fresh),
            ("serve start → first answer ms, warm data dir", &s.warm),
        ] {
            let values = ms(times);
            let value = median(&mut values.clone());
            rows.push(Row {
                figure: label.into(),
                value: format!("{value:.1}"),
                baseline: format!("{cold:.1} (empty cache)"),
                ratio: value / cold,
                note: format!(
                    "{starts} starts: {}",
                    spread(&values, 1).replace("pool ", "")
                ),
            });
        }
    }

    print_table(&rows);
    println!("load average at end {}", load_average());
    Ok(())
}

/// Hold [`STREAMS`] Claude-style SSE answers open through the pool (the upstream pauses each
/// after its first events), read the pool process's RSS, then let them finish and check each
/// arrived whole. The RSS with the streams open.
async fn streams_rss(pool: &PoolProcess, upstream: &FakeUpstream) -> anyhow::Result<u64> {
    let gate = Gate::new();
    let start = r#"{"type":"message_start","message":{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#;
    let held = gate.clone();
    let responder: Responder = Arc::new(move |received: &Received| {
        let session = received.header("x-claude-code-session-id")?;
        session.starts_with(STREAM_SESSION).then(|| {
            Reply::sse()
                .event("message_start", start)
                .event("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#)
                .pause(&held)
                .event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}"#)
                .event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#)
                .event("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}"#)
                .event("message_stop", r#"{"type":"message_stop"}"#)
        })
    });
    upstream.set_responder(Some(responder));
    let client = TestClient::new();
    let mut open = Vec::new();
    for n in 0..STREAMS {
        let response = client
            .open(request(
                &pool.url,
                Some(&pool.token),
                &format!("{STREAM_SESSION}{n}"),
            ))
            .await?;
        anyhow::ensure!(response.status().is_success(), "{}", response.status());
        let mut body = response.into_body();
        // The first events arrived: the stream is open end to end.
        let frame = tokio::time::timeout(START_LIMIT, body.frame())
            .await?
            .ok_or_else(|| anyhow::anyhow!("a stream ended before its first event"))??;
        let first = frame.into_data().unwrap_or_default();
        open.push((body, first));
    }
    let rss = pool.memory("VmRSS")?;
    gate.open();
    for (body, first) in open {
        let rest = tokio::time::timeout(START_LIMIT, body.collect())
            .await??
            .to_bytes();
        let whole = [first.as_ref(), rest.as_ref()].concat();
        anyhow::ensure!(
            String::from_utf8_lossy(&whole).contains("message_stop"),
            "a stream did not finish: {}",
            String::from_utf8_lossy(&whole)
        );
    }
    upstream.set_responder(None);
    Ok(rss)
}
