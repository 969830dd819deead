//! One run: a scenario under one variant, on a runtime of its own whose clock is virtual.
//!
//! The host is assembled as `pooler serve` assembles it — the core first, then the host
//! with the embedded Account Pooler and Provider Retry, the listener on loopback, the
//! pool's start-up call and its maintenance tick — with three differences, each the
//! simulation's and none a decision: the clock is a paused tokio runtime's (virtual time
//! jumps to the next timer whenever every task is idle), the agents' turns run in-process
//! ([`crate::agent`]) instead of as CLI processes, and randomness is seeded so the same
//! scenario and seed repeat byte for byte. The provider and the token endpoint are the
//! provider model behind the strict fake's rules on loopback.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use pooler_core::clock::{Clock, SharedClock, TokioClock};
use pooler_core::{AgentSpec, Provider};
use pooler_fake_provider::contract::Contract;
use pooler_fake_provider::server::FakeUpstream;
use pooler_host::config::Config;
use pooler_host::mediation::core_link::{CoreLink, CoreOptions};
use pooler_host::operate::server::Server;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, AccountStatus, Credential, ExtraUsage, NewAccount, OauthCredential, OptionsChange,
};
use pooler_host::runtime::bindings::types::Provider as WitProvider;
use pooler_host::runtime::{Host, HostOptions};
use tokio::sync::watch;

use crate::agent::{Agents, task_message};
use crate::calls;
use crate::ledger::{Action, Finished, Ledger};
use crate::model::{Attempt, Expiry, Model, Sample};
use crate::pins::{Pins, Served};
use crate::scenario::{
    AccountChange, CredentialKind, EventAction, MINUTE, ProviderName, Scenario, Variant,
};
use crate::workload::{ThreadPlan, next_active, plan};

/// What one run recorded, for the figures and the pictures.
pub struct Recorded {
    pub variant: String,
    pub start: u64,
    pub end: u64,
    pub plans: Vec<ThreadPlan>,
    pub ledger: Finished,
    pub attempts: Vec<Attempt>,
    pub expiries: Vec<Expiry>,
    /// Weekly quota unused at the end, in accounts' weeks ([`Model::weekly_left`]).
    pub weekly_left_at_end: f64,
    pub samples: Vec<Vec<Sample>>,
    pub account_names: Vec<String>,
    /// The pool's view of each account over time: (since, status), changes only.
    pub statuses: Vec<Vec<(u64, String)>>,
    pub pins: Vec<(u64, Served, String, usize)>,
    /// Per chain of a failed turn: dispatches after the original.
    pub retries_per_failed_turn: Vec<u32>,
    pub attempt_cap: u32,
    pub requests: u64,
    pub refreshes: (u64, u64),
    pub wall: Duration,
    pub cpu: Duration,
}

/// The strategy a pool nobody configured uses (the Account Pooler's default).
pub const DEFAULT_STRATEGY: &str = "soonest-reset";

/// Every routing behaviour the pool offers, as variants of a comparison: one per routing
/// strategy (for both providers), and, when the scenario's person keeps reserve accounts
/// to enable by hand, each strategy again with those accounts enabled from the start as
/// last-resort accounts (the pool then takes the person's step itself).
pub fn routing_variants(scenario: &Scenario) -> Vec<Variant> {
    let strategy = |name: &str| Variant {
        name: name.to_owned(),
        pool: ["claude-strategy", "codex-strategy"]
            .into_iter()
            .map(|k| (k.to_owned(), name.to_owned()))
            .collect(),
        ..Variant::default()
    };
    let strategies = ["fill-first", "spread", "soonest-reset"];
    let mut variants: Vec<Variant> = strategies.iter().map(|s| strategy(s)).collect();
    let reserves = &scenario.person.enable_when_exhausted;
    if !reserves.is_empty() {
        for s in strategies {
            let mut v = strategy(s);
            v.name = format!("{s}+last-resort");
            v.accounts = reserves
                .iter()
                .map(|r| {
                    let change = AccountChange {
                        enabled: Some(true),
                        last_resort: Some(true),
                        ..AccountChange::default()
                    };
                    (r.clone(), change)
                })
                .collect();
            variants.push(v);
        }
    }
    variants
}

/// Runs `scenario` under `variant`; `cache_dir` is the compile cache.
pub fn run(
    scenario: &Scenario,
    variant: &Variant,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<Recorded> {
    let wall = std::time::Instant::now();
    let cpu = cpu_time();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    // Ids the core makes come from the seed too (the whole run is on this thread).
    pooler_core::ids::seed_this_thread(Some(scenario.seed));
    let result = runtime.block_on(simulate(scenario, variant, cache_dir));
    pooler_core::ids::seed_this_thread(None);
    drop(runtime);
    let mut recorded = result?;
    recorded.wall = wall.elapsed();
    recorded.cpu = cpu_time().saturating_sub(cpu);
    Ok(recorded)
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn wit_provider(p: ProviderName) -> WitProvider {
    match p {
        ProviderName::Claude => WitProvider::Claude,
        ProviderName::Codex => WitProvider::Codex,
    }
}

fn core_provider(p: ProviderName) -> Provider {
    match p {
        ProviderName::Claude => Provider::Claude,
        ProviderName::Codex => Provider::Codex,
    }
}

fn config(scenario: &Scenario) -> anyhow::Result<Config> {
    let mut core = String::new();
    for (key, value) in &scenario.core {
        core.push_str(&format!("{key} = {value}\n"));
    }
    let text = format!(
        "[plugins.account-pool]\nallowed-hosts = [\"127.0.0.1\"]\n\
         [plugins.provider-retry]\n[core]\n{core}"
    );
    Config::parse(&text).context("the scenario's [core] table")
}

async fn simulate(
    scenario: &Scenario,
    variant: &Variant,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<Recorded> {
    let start = scenario.start_ms;
    let end = start + scenario.length_ms();
    let clock = TokioClock::new(start);
    let shared: SharedClock = clock.clone();
    let plans = Arc::new(plan(scenario));
    let enabled: Vec<bool> = scenario
        .accounts
        .iter()
        .flat_map(|g| std::iter::repeat_n(g.enabled, g.count as usize))
        .zip(scenario.account_names())
        .map(|(on, name)| {
            variant
                .accounts
                .get(&name)
                .and_then(|c| c.enabled)
                .unwrap_or(on)
        })
        .collect();
    let ledger = Arc::new(Ledger::new(
        start,
        plans
            .iter()
            .map(|p| (p.provider, p.family.clone()))
            .collect(),
        enabled.clone(),
    ));
    // The oracle's timer wakes at every change of what an account can serve.
    let changed = Arc::new(tokio::sync::Notify::new());
    let model = Arc::new(Model::new(scenario, {
        let ledger = Arc::downgrade(&ledger);
        let changed = changed.clone();
        Box::new(move |now| {
            if let Some(ledger) = ledger.upgrade() {
                ledger.touch(now);
            }
            changed.notify_one();
        })
    })?);
    ledger.set_model(model.clone());

    // Tasks finished, per thread: the person waits on these.
    let (done_tx, done_rx): (Vec<_>, Vec<_>) = plans.iter().map(|_| watch::channel(0usize)).unzip();
    let done_tx = Arc::new(done_tx);
    let agents = Arc::new(Agents::new(
        plans.clone(),
        ledger.clone(),
        model.clone(),
        shared.clone(),
        Arc::new(move |thread, _task| {
            done_tx[thread as usize].send_modify(|n| *n += 1);
        }),
    ));

    // In memory when the machine has a tmpfs: durability is not what a simulation measures,
    // and every commit's fsync would cost real time the virtual clock does not see.
    let shm = std::path::Path::new("/dev/shm");
    let data = if shm.is_dir() {
        tempfile::tempdir_in(shm)?
    } else {
        tempfile::tempdir()?
    };
    let config = config(scenario)?;
    let mut options = CoreOptions::from_host_config(&config);
    options.agents.launcher = Some(crate::agent::launcher(&agents));
    let link = CoreLink::open(data.path(), shared.clone(), options)?;
    let host = Host::new(HostOptions {
        config: config.clone(),
        data_dir: data.path().to_path_buf(),
        clock: shared.clone(),
        threads: link.threads_service(),
        cache_dir,
        seed: Some(scenario.seed),
    })?;
    let link = link.attach(&host)?;
    let server = Server::bind(host.clone(), "127.0.0.1:0".parse()?)
        .await?
        .with_core(link.clone())?;
    tokio::spawn(server.run(std::future::pending()));

    let api = FakeUpstream::strict(Contract::Api).await;
    api.set_recording(false);
    api.set_responder(Some({
        let model = model.clone();
        let clock = shared.clone();
        Arc::new(move |request| model.respond(request, clock.now_ms()))
    }));
    let tokens = FakeUpstream::strict(Contract::TokenEndpoint).await;
    tokens.set_recording(false);
    tokens.set_responder(Some({
        let model = model.clone();
        let clock = shared.clone();
        Arc::new(move |request| Some(model.refresh(request, clock.now_ms())))
    }));

    host.start_pool().await;
    tokio::spawn(
        host.clone()
            .run_maintenance(Duration::from_secs(config.maintenance.interval_s)),
    );
    for (key, value) in [
        ("claude-upstream-url", api.url()),
        (
            "codex-upstream-url",
            format!("{}/backend-api/codex", api.url()),
        ),
        (
            "claude-token-url",
            format!("{}/v1/oauth/token", tokens.url()),
        ),
        ("codex-token-url", format!("{}/oauth/token", tokens.url())),
    ] {
        calls::set_pool(&host, key, &value).await?;
    }
    for (key, value) in scenario.pool.iter().chain(&variant.pool) {
        calls::set_pool(&host, key, value).await?;
    }
    for (key, value) in scenario.retry.iter().chain(&variant.retry) {
        calls::set_retry(&host, key, value).await?;
    }

    // The accounts, as `pooler account login`/`add` would add them.
    let mut ids = Vec::new();
    let mut idx = 0;
    for group in &scenario.accounts {
        let plan = &scenario.plans[&group.plan];
        for _ in 0..group.count {
            let credential = match group.credential {
                CredentialKind::ApiKey => {
                    Credential::ApiKey(model.api_key(idx).context("an API key")?)
                }
                CredentialKind::Oauth => oauth(&model, idx, clock.now_ms()),
            };
            let info = calls::add_account(
                &host,
                NewAccount {
                    provider: wit_provider(plan.provider),
                    credential,
                    label: Some(model.account_name(idx)),
                    priority: group.priority,
                    options: None,
                },
            )
            .await?;
            if !enabled[idx] {
                calls::set_enabled(&host, &info.id, false).await?;
            }
            if let Some(c) = variant.accounts.get(&model.account_name(idx)) {
                let options = OptionsChange {
                    last_resort: c.last_resort,
                    extra_usage: c.extra_usage.as_deref().map(|e| match e {
                        "allow" => ExtraUsage::Allow,
                        _ => ExtraUsage::Deny,
                    }),
                    max_in_flight: c.max_in_flight,
                    preserve: c.preserve,
                };
                calls::update_options(&host, &info.id, options).await?;
            }
            ids.push(info.id);
            idx += 1;
        }
    }
    let pins = Arc::new(Pins::new(ids.clone(), 30 * MINUTE));
    agents.watch_pins(host.clone(), pins.clone());

    let mut threads = Vec::new();
    for p in plans.iter() {
        let spec = AgentSpec {
            agent: match p.provider {
                ProviderName::Claude => pooler_core::Agent::ClaudeCode,
                ProviderName::Codex => pooler_core::Agent::Codex,
            },
            ..AgentSpec::default()
        };
        threads.push(
            link.new_agent_thread(core_provider(p.provider), Some(&p.model), &spec)
                .await?,
        );
    }
    let threads = Arc::new(threads);

    // The person behind each thread.
    for (i, rx) in done_rx.into_iter().enumerate() {
        tokio::spawn(give_tasks(
            plans[i].clone(),
            i,
            threads.clone(),
            link.clone(),
            ledger.clone(),
            shared.clone(),
            rx,
            end,
        ));
    }
    // Scripted events.
    for event in &scenario.events {
        let at = scenario.at(&event.at)?;
        let idx = scenario
            .account_names()
            .iter()
            .position(|n| n == &event.account)
            .context("an event's account")?;
        let (host, model, ledger, clock, id) = (
            host.clone(),
            model.clone(),
            ledger.clone(),
            shared.clone(),
            ids[idx].clone(),
        );
        let action = event.action;
        tokio::spawn(async move {
            clock.sleep_until(at).await;
            let now = clock.now_ms();
            let done = match action {
                EventAction::RevokeRefresh => {
                    model.revoke_refresh(idx);
                    Ok(())
                }
                EventAction::SignIn => {
                    ledger.act(Action::SignIn);
                    calls::update_credential(&host, &id, oauth(&model, idx, now))
                        .await
                        .map(drop)
                }
                EventAction::Enable | EventAction::Disable => {
                    let on = action == EventAction::Enable;
                    ledger.act(Action::Scripted);
                    let r = calls::set_enabled(&host, &id, on).await.map(drop);
                    ledger.set_enabled(idx, on, now);
                    r
                }
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, "a scripted event failed");
            }
            ledger.touch(now);
        });
    }
    // The oracle's timer: capacity also changes when nobody asks (a window resets).
    {
        let (model, ledger, clock, changed) = (
            model.clone(),
            ledger.clone(),
            shared.clone(),
            changed.clone(),
        );
        tokio::spawn(async move {
            loop {
                let now = clock.now_ms();
                model.roll_all(now);
                ledger.touch(now);
                let next = model
                    .next_change(now)
                    .unwrap_or(now + 3_600_000)
                    .min(now + 3_600_000);
                tokio::select! {
                    _ = clock.sleep_until(next) => {}
                    _ = changed.notified() => {}
                }
            }
        });
    }
    // The pool's view of its accounts, every 10 minutes (for the picture).
    let statuses = Arc::new(Mutex::new(vec![Vec::<(u64, String)>::new(); ids.len()]));
    {
        let (host, clock, statuses, ids) =
            (host.clone(), shared.clone(), statuses.clone(), ids.clone());
        tokio::spawn(async move {
            loop {
                let now = clock.now_ms();
                if let Ok(list) = calls::list_accounts(&host).await {
                    let mut s = statuses.lock().unwrap_or_else(|e| e.into_inner());
                    for info in list {
                        if let Some(i) = ids.iter().position(|id| *id == info.id) {
                            let status = status_name(info.status).to_owned();
                            tracing::debug!(account = %info.label, status, now, windows = ?info.windows, held = ?info.held_until, error = ?info.error, "pool's view");
                            if s[i].last().is_none_or(|(_, last)| *last != status) {
                                s[i].push((now, status));
                            }
                        }
                    }
                }
                clock.sleep_until(now + 10 * MINUTE).await;
            }
        });
    }
    if scenario.person.checks_every_min > 0.0 {
        tokio::spawn(look_in(
            scenario.clone(),
            host.clone(),
            link.clone(),
            ledger.clone(),
            shared.clone(),
            ids.clone(),
            threads.clone(),
            plans.clone(),
        ));
    }

    clock.sleep_until(end).await;
    let now = clock.now_ms();
    model.roll_all(now);
    let finished = ledger.finish(now);
    for (i, samples) in model.samples().iter().enumerate() {
        tracing::debug!(account = i, last = ?samples.last(), "utilization at the end");
    }
    let mut retries = Vec::new();
    for thread in threads.iter() {
        let show = link.core().show(thread)?;
        let mut chains: BTreeMap<String, (u32, bool)> = BTreeMap::new();
        for turn in &show.turns {
            let entry = chains
                .entry(turn.original_request.to_string())
                .or_insert((1, false));
            entry.0 = entry.0.max(turn.attempt);
            entry.1 |= turn.failure.is_some();
        }
        retries.extend(
            chains
                .values()
                .filter(|(_, failed)| *failed)
                .map(|(attempts, _)| attempts - 1),
        );
    }
    let attempt_cap = scenario
        .retry
        .get("attempt-cap")
        .or(variant.retry.get("attempt-cap"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let statuses = statuses.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let recorded = Recorded {
        variant: variant.name.clone(),
        start,
        end,
        plans: plans.to_vec(),
        ledger: finished,
        attempts: model.attempts(),
        expiries: model.expiries(),
        weekly_left_at_end: model.weekly_left(end),
        samples: model.samples(),
        account_names: (0..ids.len()).map(|i| model.account_name(i)).collect(),
        statuses,
        pins: pins.events(),
        retries_per_failed_turn: retries,
        attempt_cap,
        requests: agents.requests(),
        refreshes: model.refreshes(),
        wall: Duration::ZERO,
        cpu: Duration::ZERO,
    };
    link.shutdown().await;
    Ok(recorded)
}

fn oauth(model: &Model, idx: usize, now: u64) -> Credential {
    let issued = model.sign_in(idx, now);
    Credential::Oauth(OauthCredential {
        access_token: issued.access,
        refresh_token: issued.refresh,
        expires_at: Some(issued.expires_at),
        chatgpt_account_id: issued.account_id,
    })
}

pub fn status_name(status: AccountStatus) -> &'static str {
    match status {
        AccountStatus::Disabled => "disabled",
        AccountStatus::Error => "error",
        AccountStatus::Held => "held",
        AccountStatus::Exhausted => "exhausted",
        AccountStatus::NearLimit => "near-limit",
        AccountStatus::Ready => "ready",
    }
}

/// A thread's person: sends each task after the previous one finished and the person's
/// think time passed, inside working hours, until the run ends.
#[allow(clippy::too_many_arguments)]
async fn give_tasks(
    plan: ThreadPlan,
    i: usize,
    threads: Arc<Vec<String>>,
    link: Arc<CoreLink>,
    ledger: Arc<Ledger>,
    clock: SharedClock,
    mut done: watch::Receiver<usize>,
    end: u64,
) {
    let mut ready_at = plan.first_at;
    for (k, task) in plan.tasks.iter().enumerate() {
        let at = next_active(ready_at + task.gap_ms, plan.active_hours);
        if at >= end {
            return;
        }
        clock.sleep_until(at).await;
        if let Err(e) = link.send(&threads[i], &task_message(plan.index, k)) {
            tracing::warn!(thread = i, error = %e, "the person's message was refused");
            return;
        }
        ledger.task_sent(i, clock.now_ms());
        if done.wait_for(|n| *n > k).await.is_err() {
            return;
        }
        ready_at = clock.now_ms();
    }
}

/// The person looking at `pooler status` now and then while awake: enables the reserve
/// when threads wait and everything else is spent (disables it again once another account
/// is ready), and sends a stuck thread's message again.
#[allow(clippy::too_many_arguments)]
async fn look_in(
    scenario: Scenario,
    host: Host,
    link: Arc<CoreLink>,
    ledger: Arc<Ledger>,
    clock: SharedClock,
    ids: Vec<String>,
    threads: Arc<Vec<String>>,
    plans: Arc<Vec<ThreadPlan>>,
) {
    let person = &scenario.person;
    let every = (person.checks_every_min * MINUTE as f64) as u64;
    let names = scenario.account_names();
    let reserve: Vec<usize> = person
        .enable_when_exhausted
        .iter()
        .filter_map(|n| names.iter().position(|m| m == n))
        .collect();
    let mut enabled_by_person = false;
    let mut next = scenario.start_ms;
    loop {
        next = next_active(next + every, person.awake_hours);
        clock.sleep_until(next).await;
        let now = clock.now_ms();
        let Ok(accounts) = calls::list_accounts(&host).await else {
            continue;
        };
        // What `pooler account list` tells the person: which accounts could serve a thread
        // of `family` (serving, and that family's own window not spent).
        let serves = |a: &AccountInfo, family: &str| {
            a.enabled
                && matches!(a.status, AccountStatus::Ready | AccountStatus::NearLimit)
                && !a
                    .windows
                    .iter()
                    .any(|w| w.blocking && w.family.as_deref() == Some(family))
        };
        let others_serve = |family: &str| {
            accounts
                .iter()
                .enumerate()
                .any(|(i, a)| !reserve.contains(&i) && serves(a, family))
        };
        let waiting: Vec<usize> = (0..threads.len()).filter(|i| ledger.waiting(*i)).collect();
        if !reserve.is_empty() {
            // A reserve already enabled (a last-resort account the pool uses by itself)
            // needs nothing of the person.
            let disabled = |r: usize| accounts.iter().any(|a| a.id == ids[r] && !a.enabled);
            if !enabled_by_person && waiting.iter().any(|i| !others_serve(&plans[*i].family)) {
                for &r in &reserve {
                    if disabled(r) && calls::set_enabled(&host, &ids[r], true).await.is_ok() {
                        ledger.set_enabled(r, true, now);
                        ledger.act(Action::EnableReserve);
                        enabled_by_person = true;
                    }
                }
            } else if enabled_by_person && plans.iter().all(|p| others_serve(&p.family)) {
                for &r in &reserve {
                    if calls::set_enabled(&host, &ids[r], false).await.is_ok() {
                        ledger.set_enabled(r, false, now);
                        ledger.act(Action::DisableReserve);
                    }
                }
                enabled_by_person = false;
            }
        }
        if person.resend_when_stuck {
            for &i in &waiting {
                let thread = &threads[i];
                let family = &plans[i].family;
                let idle = link
                    .core()
                    .list_rows(Some(thread))
                    .is_ok_and(|rows| rows.is_empty())
                    && link
                        .core()
                        .show(thread)
                        .is_ok_and(|s| s.turns.iter().all(|t| t.finished_at.is_some()));
                if idle && accounts.iter().any(|a| serves(a, family)) {
                    let task = ledger_task(&ledger, i);
                    if link
                        .send(thread, &task_message(plans[i].index, task))
                        .is_ok()
                    {
                        ledger.act(Action::Resend);
                    }
                }
            }
        }
    }
}

/// The task a thread is on: tasks sent so far, less one.
fn ledger_task(ledger: &Ledger, i: usize) -> usize {
    ledger.tasks_sent(i).saturating_sub(1) as usize
}
