//! The agent-turn benchmark (on demand, not in CI): `cargo bench -p pooler-tests --bench
//! agent`. The wall time of one real Claude Code turn (`claude -p`, started as the host's
//! agent runner starts it) sent through the pool — the host's listener, the real Account
//! Pooler, one API-key account — against the same turn sent to the fake provider directly,
//! alternating, with the medians and the pool's share. Needs the CLI installed (`npm ci
//! --prefix tests/agents`). `AGENT_BENCH_ROUNDS=n` (default 7).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pooler_core::agent::{self, AgentLimits, Cli};
use pooler_core::clock::SystemClock;
use pooler_core::{Agent, AgentSpec, Provider, Route, TurnPlan, TurnTrigger};
use pooler_host::config::Config;
use pooler_host::operate::server::Server;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    Credential, NewAccount,
};
use pooler_host::runtime::bindings::types as wit;
use pooler_host::runtime::imports::threads::NoCore;
use pooler_host::runtime::roles::Role;
use pooler_host::runtime::{Host, HostOptions};
use pooler_tests::agents::isolated_binary;
use pooler_tests::fixtures;
use pooler_tests::provider::claude;
use pooler_tests::upstream::FakeUpstream;

fn main() -> anyhow::Result<()> {
    pooler_tests::bench::run(run())
}

fn plan(session: &str) -> TurnPlan {
    TurnPlan {
        request: "rq_bench".into(),
        thread: "th_bench".into(),
        provider: Provider::Claude,
        model: None,
        session_id: session.into(),
        input: "say pong".into(),
        attempt: 1,
        original_request: "rq_bench".into(),
        trigger: TurnTrigger::User,
        route: None,
        history: Vec::new(),
        agent: AgentSpec {
            agent: Agent::ClaudeCode,
            cwd: None,
            args: Vec::new(),
        },
        agent_session: None,
    }
}

async fn turn(
    program: &std::path::Path,
    cwd: &std::path::Path,
    route: &Route,
) -> anyhow::Result<Duration> {
    let session = pooler_core::ids::new_session_id();
    let invocation = agent::invocation(
        Cli::ClaudeCode,
        &plan(&session),
        route,
        program,
        cwd,
        Some(&session),
    );
    let started = Instant::now();
    let run = agent::run(&invocation, Cli::ClaudeCode, &AgentLimits::default()).await?;
    let took = started.elapsed();
    anyhow::ensure!(
        run.report.ok && run.report.text.as_deref() == Some("pong"),
        "the turn failed: {run:?}"
    );
    Ok(took)
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

async fn run() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("AGENT_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let dir = tempfile::tempdir()?;
    let program = isolated_binary(Cli::ClaudeCode, &dir.path().join("agent"));
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    // The same answer for every request, on a fake that takes any credential: the baseline
    // calls it with the route token, the pool with the account's key.
    let upstream = FakeUpstream::start_with_default(claude::message("pong")).await;
    upstream.set_recording(false);

    let data = tempfile::tempdir()?;
    let config = Config::parse(
        "[plugins.account-pool]\ncomponent = \"embedded\"\nallowed-hosts = [\"127.0.0.1\"]\n\
         [plugins.provider-retry]\ncomponent = \"none\"\n[maintenance]\ninterval-s = 0\n",
    )?;
    let host = Host::new(HostOptions {
        config,
        data_dir: data.path().to_path_buf(),
        clock: Arc::new(SystemClock::new()),
        threads: Arc::new(NoCore),
        cache_dir: Some(PathBuf::from(fixtures::COMPILE_CACHE)),
        seed: None,
    })?;
    assert!(host.has_role(Role::AccountPool));
    let server = Server::bind(host.clone(), "127.0.0.1:0".parse()?).await?;
    let endpoint = format!("http://{}", server.local_addr()?);
    tokio::spawn(server.run(std::future::pending()));
    pooler_tests::exports::set_pool_setting(&host, "claude-upstream-url", &upstream.url())
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    pooler_tests::exports::add_account(
        &host,
        NewAccount {
            provider: wit::Provider::Claude,
            credential: Credential::ApiKey("sk-ant-api03-bench".into()),
            label: None,
            priority: None,
            options: None,
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (thread, endpoint_for_route) = ("th_bench".to_owned(), endpoint.clone());
    let token = host
        .call_pool("routing.open-route", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_open_route(store, &thread, wit::Provider::Claude, &endpoint_for_route)
                    .await
            })
        })
        .await?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?
        .token;
    let direct = Route {
        base_url: upstream.url(),
        token: "sk-ant-api03-direct".into(),
    };
    let pooled = Route {
        base_url: endpoint,
        token,
    };

    // One of each first: the CLI's first start in a fresh home is slower.
    turn(&program, &cwd, &direct).await?;
    turn(&program, &cwd, &pooled).await?;
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        d.push(turn(&program, &cwd, &direct).await?);
        p.push(turn(&program, &cwd, &pooled).await?);
    }
    let (d, p) = (median(d), median(p));
    println!(
        "one real Claude Code 2.1.328 turn (`claude -p`), {rounds} alternating rounds, medians:"
    );
    println!(
        "  to the fake provider directly: {:>8.1} ms",
        d.as_secs_f64() * 1e3
    );
    println!(
        "  through the pool:              {:>8.1} ms",
        p.as_secs_f64() * 1e3
    );
    println!(
        "  the pool's share:              {:>8.1} ms ({:.2}x the direct turn)",
        (p.as_secs_f64() - d.as_secs_f64()) * 1e3,
        p.as_secs_f64() / d.as_secs_f64()
    );
    Ok(())
}
