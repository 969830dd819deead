//! Support for the core tests: the host playing the core (threads, turns through the pool,
//! the retry queue, the outbox) on the manual clock, with the real Account Pooler in front of
//! a scripted fake upstream (one Claude API-key account) and the fixture retry plugin (or the
//! real Provider Retry) in the provider-retry role.
//!
//! The fixture is scripted and read through its key/value table (see
//! `tests/fixtures/retry/src/lib.rs` for the keys): [`CoreHost::retry_set`] and
//! [`CoreHost::retry_get`]. Nothing here sleeps for a timer: tests move the manual clock and
//! wait for [`CoreHost::settle`].
//!
//! ```no_run
//! # async fn demo() {
//! use pooler_tests::core::{CoreSetup, failure, success};
//! let h = CoreSetup::new().start().await;
//! h.upstream.push(failure(500));
//! let thread = h.new_thread().await;
//! h.send(&thread, "hello");
//! h.settle().await; // the turn failed, the fixture scheduled a retry 1 s later
//! h.upstream.push(success("hi"));
//! h.advance(std::time::Duration::from_secs(1)).await;
//! # }
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pooler_core::clock::{Clock, ManualClock};
use pooler_core::{Core, Provider, QueuedRow, ThreadShow, TurnRecord};
use pooler_host::config::Config;
use pooler_host::mediation::core_link::{CoreLink, CoreOptions};
use pooler_host::operate::server::Server;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, Credential, NewAccount,
};
use pooler_host::runtime::bindings::retry::exports::pooler::plugins::retry_admin::{
    Candidate, ChainHistory,
};
use pooler_host::runtime::bindings::types as wit;
use pooler_host::runtime::roles::Role;
use pooler_host::runtime::{Host, HostOptions};
use tempfile::TempDir;
use tokio::sync::oneshot;

use crate::fixtures::{ALT_RETRY, COMPILE_CACHE, RETRY};
use crate::harness::{START_MS, Setup};
use crate::provider::Contract;
use crate::upstream::{FakeUpstream, Reply};

/// The longest a test waits for real for something that happens at once (a safety net
/// against hangs, never a timer of the behaviour under test).
pub const SOON: Duration = Duration::from_secs(30);

/// The API key of the pool's one account, as the fake upstream sees it.
pub const API_KEY: &str = "sk-ant-api03-key-a";

/// A Claude streaming reply that completes with `text` (the Messages API's full stream).
pub fn success(text: &str) -> Reply {
    crate::provider::claude::message(text)
}

/// A Claude error reply with `status` (no Retry-After).
pub fn failure(status: u16) -> Reply {
    Reply::status(status)
        .header("content-type", "application/json")
        .body(r#"{"type":"error","error":{"type":"api_error","message":"scripted failure"}}"#)
}

/// Which component fills the provider-retry role.
#[derive(Clone, Copy)]
enum RetryRole {
    Fixture,
    Embedded,
    /// The alternative Provider Retry of `fixtures/alt-retry`, loaded by configuration.
    Alternative,
    /// Another component file.
    File(&'static str),
}

/// How to build a [`CoreHost`].
pub struct CoreSetup {
    retry: RetryRole,
    /// The `[plugins.provider-retry]` lines (e.g. `deadline-ms = 300`).
    retry_settings: String,
    core: String,
    agents: String,
    account: bool,
}

impl Default for CoreSetup {
    fn default() -> Self {
        Self::new()
    }
}

impl CoreSetup {
    /// The fixture retry plugin, the real pool, default core settings.
    pub fn new() -> Self {
        CoreSetup {
            retry: RetryRole::Fixture,
            retry_settings: String::new(),
            core: String::new(),
            agents: String::new(),
            account: true,
        }
    }

    /// A line of the `[agents]` table (e.g. `claude-code = "/path"`).
    pub fn agents(mut self, line: &str) -> Self {
        self.agents.push_str(line);
        self.agents.push('\n');
        self
    }

    /// Start with no account in the pool (the test adds its own).
    pub fn without_account(mut self) -> Self {
        self.account = false;
        self
    }

    /// The real Provider Retry instead of the fixture.
    pub fn real_retry(mut self) -> Self {
        self.retry = RetryRole::Embedded;
        self
    }

    /// The alternative Provider Retry (`fixtures/alt-retry`) instead of the fixture.
    pub fn alt_retry(mut self) -> Self {
        self.retry = RetryRole::Alternative;
        self
    }

    /// The component at `path` in the provider-retry role.
    pub fn retry_component(mut self, path: &'static str) -> Self {
        self.retry = RetryRole::File(path);
        self
    }

    /// A line of the `[plugins.provider-retry]` table (e.g. `deadline-ms = 300`).
    pub fn retry_settings(mut self, line: &str) -> Self {
        self.retry_settings.push_str(line);
        self.retry_settings.push('\n');
        self
    }

    /// A line of the `[core]` table (e.g. `concurrency-limit = 1`).
    pub fn core(mut self, line: &str) -> Self {
        self.core.push_str(line);
        self.core.push('\n');
        self
    }

    fn config(&self) -> Config {
        let pool = "allowed-hosts = [\"127.0.0.1\"]";
        let setup = Setup::new().embedded(Role::AccountPool, pool);
        let retry = self.retry_settings.as_str();
        let setup = match self.retry {
            RetryRole::Fixture => setup.role(Role::ProviderRetry, RETRY, retry),
            RetryRole::Embedded => setup.embedded(Role::ProviderRetry, retry),
            RetryRole::Alternative => setup.role(Role::ProviderRetry, ALT_RETRY, retry),
            RetryRole::File(path) => setup.role(Role::ProviderRetry, path, retry),
        };
        let setup = setup.config(&format!("[core]\n{}\n[agents]\n{}", self.core, self.agents));
        Config::parse(&setup.toml()).expect("a valid test configuration")
    }

    /// Start the host, serve on loopback, and set the pool up in front of a fresh fake
    /// upstream with one Claude API-key account.
    pub async fn start(self) -> CoreHost {
        // Before the host exists, so no line it logs is missed by a test that looks later.
        crate::logs::logs();
        let data = tempfile::tempdir().expect("a temporary data directory");
        let clock = ManualClock::new(START_MS);
        let upstream = FakeUpstream::strict(Contract::Api).await;
        let config = self.config();
        let (host, link) = start_host(&config, &data, &clock);
        let mut h = CoreHost {
            host,
            link,
            clock,
            upstream,
            url: String::new(),
            data,
            config,
            server: None,
        };
        h.serve().await;
        h.set_pool("claude-upstream-url", &h.upstream.url()).await;
        // Nothing in the pool waits inline on the manual clock: a 429 or 5xx is answered at
        // once, so the core sees and classifies it.
        h.set_pool("inline-wait", "0s").await;
        h.set_pool("transient-retries", "0").await;
        if self.account {
            let account = NewAccount {
                provider: wit::Provider::Claude,
                credential: Credential::ApiKey(API_KEY.into()),
                label: None,
                priority: None,
                options: None,
            };
            h.add_account(account).await;
        }
        h.settle().await;
        h
    }
}

fn start_host(config: &Config, data: &TempDir, clock: &Arc<ManualClock>) -> (Host, Arc<CoreLink>) {
    let link = CoreLink::open(
        data.path(),
        clock.clone(),
        CoreOptions::from_host_config(config),
    )
    .expect("open the core");
    let host = Host::new(HostOptions {
        config: config.clone(),
        data_dir: data.path().to_path_buf(),
        clock: clock.clone(),
        threads: link.threads_service(),
        cache_dir: Some(PathBuf::from(COMPILE_CACHE)),
        seed: None,
    })
    .expect("start the host");
    let link = link.attach(&host).expect("attach the core");
    (host, link)
}

/// A running host with its core; see the module docs.
pub struct CoreHost {
    pub host: Host,
    pub link: Arc<CoreLink>,
    pub clock: Arc<ManualClock>,
    /// The provider upstream behind the pool.
    pub upstream: FakeUpstream,
    /// `http://127.0.0.1:<port>` of the host's listener.
    pub url: String,
    pub data: TempDir,
    config: Config,
    server: Option<(
        oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

impl CoreHost {
    async fn serve(&mut self) {
        let server = Server::bind(self.host.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("bind")
            .with_core(self.link.clone())
            .expect("wire the core in");
        self.url = format!("http://{}", server.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        self.server = Some((stop, task));
    }

    /// The core database.
    pub fn core(&self) -> &Core {
        self.link.core()
    }

    /// Wait until the core's loops and the availability-change delivery have nothing left
    /// to do at the current host time.
    pub async fn settle(&self) {
        let settle = async {
            loop {
                self.link.settled().await;
                self.host.availability_changes_settled().await;
                if self.link.is_settled() {
                    return;
                }
            }
        };
        tokio::time::timeout(SOON, settle)
            .await
            .expect("the core settles");
    }

    /// Wait until `cond` holds, checking the state every few milliseconds (for states reached
    /// while a turn runs, when [`CoreHost::settle`] cannot resolve).
    pub async fn wait_for(&self, what: &str, cond: impl Fn(&Self) -> bool) {
        let wait = async {
            while !cond(self) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(SOON, wait).await.is_err() {
            panic!("timed out waiting for {what}");
        }
    }

    /// Move the host clock forward, then settle.
    pub async fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.settle().await;
    }

    /// The host clock's time.
    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Set a key of the fixture retry plugin's table.
    pub async fn retry_set(&self, key: &str, value: &str) {
        let (key, value) = (key.to_string(), value.to_string());
        self.host
            .call_retry("settings.set-setting", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_settings()
                        .call_set_setting(store, &key, &value)
                        .await
                })
            })
            .await
            .expect("the retry plugin answers")
            .expect("the fixture stores the key");
    }

    /// Read a key of the fixture retry plugin's table.
    pub async fn retry_get(&self, key: &str) -> Option<String> {
        let key = key.to_string();
        self.host
            .call_retry("settings.get-setting", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_settings()
                        .call_get_setting(store, &key)
                        .await
                })
            })
            .await
            .expect("the retry plugin answers")
            .ok()
            .map(|s| s.value)
    }

    /// The lines of a newline-separated record of the fixture (`events`, `checks`, …).
    pub async fn retry_lines(&self, key: &str) -> Vec<String> {
        self.retry_get(key)
            .await
            .map(|text| text.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Set one of the pool's settings.
    pub async fn set_pool(&self, key: &str, value: &str) {
        crate::exports::set_pool_setting(&self.host, key, value)
            .await
            .expect("the pool takes the setting");
    }

    /// Add an account to the pool through its accounts export (as `pooler account add`).
    pub async fn add_account(&self, account: NewAccount) -> AccountInfo {
        crate::exports::add_account(&self.host, account)
            .await
            .expect("the pool adds the account")
    }

    /// Add a Claude API-key account with `key`.
    pub async fn add_claude_key(&self, key: &str) -> AccountInfo {
        self.add_account(NewAccount {
            provider: wit::Provider::Claude,
            credential: Credential::ApiKey(key.into()),
            label: None,
            priority: None,
            options: None,
        })
        .await
    }

    /// Enable an account through the pool's accounts export (as `pooler account enable`).
    pub async fn enable_account(&self, id: &str) -> AccountInfo {
        crate::exports::enable_account(&self.host, id)
            .await
            .expect("the pool enables the account")
    }

    /// Disable an account through the pool's accounts export (as `pooler account disable`).
    pub async fn disable_account(&self, id: &str) -> AccountInfo {
        crate::exports::disable_account(&self.host, id)
            .await
            .expect("the pool disables the account")
    }

    /// The pool's accounts (all providers).
    pub async fn accounts(&self) -> Vec<AccountInfo> {
        crate::exports::list_accounts(&self.host, None)
            .await
            .expect("the pool lists its accounts")
    }

    /// The pool's maintenance tick at the host clock's time (as `pooler serve` runs every
    /// `maintenance.interval-s`): it delivers the availability changes the pool noted while
    /// serving requests, coalesced. Then settle.
    pub async fn maintenance_tick(&self) {
        self.host
            .maintenance_tick(self.now())
            .await
            .expect("the pool answers")
            .expect("the maintenance tick succeeds");
        self.settle().await;
    }

    /// The retry plugin's `retry-admin.explain` of `thread` (as `pooler retry explain`).
    pub async fn explain(&self, thread: &str) -> Vec<ChainHistory> {
        let thread = thread.to_string();
        self.host
            .call_retry("retry-admin.explain", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_retry_admin()
                        .call_explain(store, &thread)
                        .await
                })
            })
            .await
            .expect("the retry plugin answers")
            .expect("the retry plugin explains the thread")
    }

    /// The retry plugin's open candidates (`retry-admin.status`), of one thread or all.
    pub async fn candidates(&self, thread: Option<&str>) -> Vec<Candidate> {
        let thread = thread.map(str::to_string);
        self.host
            .call_retry("retry-admin.status", move |store, retry| {
                Box::pin(async move {
                    retry
                        .pooler_plugins_retry_admin()
                        .call_status(store, thread.as_ref())
                        .await
                })
            })
            .await
            .expect("the retry plugin answers")
            .expect("the retry plugin lists its candidates")
    }

    /// A new Claude thread with a route through the pool.
    pub async fn new_thread(&self) -> String {
        self.link
            .new_thread(Provider::Claude, Some("claude-test"))
            .await
            .expect("a new thread")
    }

    /// Queue a person's message (it starts as a turn at the next due pass).
    pub fn send(&self, thread: &str, text: &str) -> String {
        self.link.send(thread, text).expect("send a message")
    }

    /// A thread with its turns, rows and history.
    pub fn show(&self, thread: &str) -> ThreadShow {
        self.core().show(thread).expect("show the thread")
    }

    /// The thread's turn requests, in start order.
    pub fn turns(&self, thread: &str) -> Vec<TurnRecord> {
        self.show(thread).turns
    }

    /// The thread's live rows.
    pub fn rows(&self, thread: &str) -> Vec<QueuedRow> {
        self.core().list_rows(Some(thread)).expect("list rows")
    }

    /// The thread's single live row.
    pub fn row(&self, thread: &str) -> QueuedRow {
        let rows = self.rows(thread);
        assert_eq!(rows.len(), 1, "one live row expected: {rows:?}");
        rows.into_iter().next().unwrap()
    }

    /// Requests the upstream received on `/v1/messages`.
    pub fn upstream_turns(&self) -> usize {
        self.upstream
            .received()
            .iter()
            .filter(|r| r.path.starts_with("/v1/messages"))
            .count()
    }

    /// Call the admin API: `method` on `/_pooler/<path>` with a JSON `body`; returns the
    /// status and the JSON answer.
    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let token = std::fs::read_to_string(
            self.data
                .path()
                .join(pooler_host::operate::wire::ADMIN_TOKEN_FILE),
        )
        .expect("the admin token");
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}/_pooler/{path}", self.url))
            .header("authorization", format!("Bearer {}", token.trim()))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .expect("a request");
        let answer = tokio::time::timeout(SOON, crate::client::TestClient::new().send(request))
            .await
            .expect("the admin API answers in time")
            .expect("the admin API answers");
        let json = serde_json::from_str(&answer.body).unwrap_or(serde_json::Value::Null);
        (answer.status.as_u16(), json)
    }

    /// Stop the server and the core's loops, as a shutdown does (nothing is left claimed
    /// or running when called settled). The clock may move while stopped.
    pub async fn stop(&mut self) {
        tokio::time::timeout(SOON, self.link.shutdown())
            .await
            .expect("the core's loops stop");
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Stop, then start again on the same data directory, configuration and clock, as a
    /// restarted `pooler serve` would (the core recovers, `on-start` runs again).
    pub async fn restart(&mut self) {
        self.stop().await;
        let (host, link) = start_host(&self.config, &self.data, &self.clock);
        // The old host and link go now: their loops stop.
        self.host = host;
        self.link = link;
        self.serve().await;
        self.settle().await;
    }
}
