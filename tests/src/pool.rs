//! Support for the Account Pooler scenario tests (spec `account-pool.md` §11): the real
//! pool (embedded in the host) serving HTTP on loopback in front of a scripted fake upstream,
//! accounts A, B, C with credentials the upstream can tell apart, a route for thread `t1`,
//! and one-line helpers for the pool's admin exports (accounts, settings, routes, session
//! explanations, availability) called through the host as the CLI would.
//!
//! ```no_run
//! # async fn demo() {
//! use pooler_tests::pool::Pool;
//! let pool = Pool::claude().await;
//! let answer = pool.send(pool.messages("S")).await;
//! assert_eq!(answer.status, 200);
//! assert_eq!(pool.seen(), ["A"]);
//! # }
//! ```

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use pooler_host::operate::wire::{SessionView, TokenTotalView};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    AccountInfo, AccountsError, Credential, NewAccount, OauthCredential, OptionsChange,
};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::availability::AvailabilityQuery;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::routing::{
    Route, RoutingError,
};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::settings::{
    Setting, SettingsError,
};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::tokens::TokenGrouping;
use pooler_host::runtime::bindings::types::{Availability, Provider};
use pooler_host::runtime::roles::Role;

use crate::client::{Answer, TestClient};
use crate::harness::{Setup, TestHost};
use crate::provider::Contract;
use crate::upstream::{FakeUpstream, Received};

/// The thread whose route the pool opens at start.
pub const THREAD: &str = "t1";
/// The longest a test waits for real for something that should happen at once (a safety
/// net against hangs, never a timer of the behaviour under test).
pub const SOON: Duration = Duration::from_secs(20);

/// The letters of the accounts, in the order added.
pub const LETTERS: [&str; 3] = ["A", "B", "C"];

/// The lower-case letter that marks account `letter`'s secrets (`a` in `sk-ant-api03-key-a`).
pub fn secret_of(letter: &str) -> String {
    letter.to_ascii_lowercase()
}

/// Account `letter`'s Claude API key, in the shape the Messages API accepts
/// (`sk-ant-api03-key-a`).
pub fn api_key(letter: &str) -> String {
    format!("sk-ant-api03-key-{}", secret_of(letter))
}

/// Account `letter`'s OAuth access token: a Claude subscription token
/// (`sk-ant-oat01-tok-a`), or a ChatGPT one (`tok-a`).
pub fn access_token(provider: Provider, letter: &str) -> String {
    match provider {
        Provider::Claude => format!("sk-ant-oat01-tok-{}", secret_of(letter)),
        Provider::Codex => format!("tok-{}", secret_of(letter)),
    }
}

/// Account `letter`'s OAuth refresh token (`sk-ant-ort01-refresh-a`, or `refresh-a`).
pub fn refresh_token(provider: Provider, letter: &str) -> String {
    match provider {
        Provider::Claude => format!("sk-ant-ort01-refresh-{}", secret_of(letter)),
        Provider::Codex => format!("refresh-{}", secret_of(letter)),
    }
}

/// The real pool in the real host, in front of a fake upstream.
pub struct Pool {
    pub host: TestHost,
    /// `http://127.0.0.1:<port>` of the host's server.
    pub url: String,
    /// The provider upstream (messages, responses; usage endpoints).
    pub upstream: FakeUpstream,
    /// The OAuth token endpoint.
    pub tokens: FakeUpstream,
    /// The provider of the accounts and of [`THREAD`]'s route.
    pub provider: Provider,
    /// Account ids, in the order added (A, B, C).
    pub ids: Vec<String>,
    /// [`THREAD`]'s route token.
    pub token: String,
    pub client: TestClient,
}

/// How to build a [`Pool`].
pub struct PoolSetup {
    provider: Provider,
    accounts: Vec<Credential>,
    setup: Setup,
    /// More of the pool plugin's configuration table.
    plugin: String,
}

impl PoolSetup {
    /// A pool of `provider` with no account yet.
    pub fn new(provider: Provider) -> Self {
        PoolSetup {
            provider,
            accounts: Vec::new(),
            setup: Setup::new(),
            plugin: String::new(),
        }
    }

    /// Claude with API keys `sk-ant-api03-key-a`, `…-key-b`, `…-key-c`.
    pub fn claude_keys(n: usize) -> Self {
        let mut setup = Self::new(Provider::Claude);
        for letter in &LETTERS[..n] {
            setup = setup.account(Credential::ApiKey(api_key(letter)));
        }
        setup
    }

    /// Add an account (the next letter).
    pub fn account(mut self, credential: Credential) -> Self {
        self.accounts.push(credential);
        self
    }

    /// More lines for the pool plugin's configuration table (`memory-mib = 8`, say).
    pub fn plugin(mut self, toml: &str) -> Self {
        self.plugin.push_str(toml);
        self.plugin.push('\n');
        self
    }

    /// More of the host's configuration (other tables: `[server]\nmax-body-bytes = …`, say).
    pub fn config(mut self, toml: &str) -> Self {
        self.setup = self.setup.config(toml);
        self
    }

    /// Load the fixture retry plugin as the availability listener.
    pub fn with_listener(mut self) -> Self {
        self.setup = self
            .setup
            .role(Role::ProviderRetry, crate::fixtures::RETRY, "");
        self
    }

    pub async fn start(self) -> Pool {
        // Before the host exists, so no line it logs is missed by a test that looks later.
        crate::logs::logs();
        let upstream = FakeUpstream::strict(Contract::Api).await;
        let tokens = FakeUpstream::strict(Contract::TokenEndpoint).await;
        let mut host = self
            .setup
            .embedded(
                Role::AccountPool,
                &format!("allowed-hosts = [\"127.0.0.1\"]\n{}", self.plugin),
            )
            .start()
            .expect("start the host");
        let url = host.serve().await.expect("serve");
        let provider = self.provider;
        let mut pool = Pool {
            host,
            url,
            upstream,
            tokens,
            provider,
            ids: Vec::new(),
            token: String::new(),
            client: TestClient::new(),
        };
        let (upstream_key, token_key, upstream_url) = match provider {
            Provider::Claude => (
                "claude-upstream-url",
                "claude-token-url",
                pool.upstream.url(),
            ),
            Provider::Codex => (
                "codex-upstream-url",
                "codex-token-url",
                format!("{}/backend-api/codex", pool.upstream.url()),
            ),
        };
        pool.set(upstream_key, &upstream_url).await.unwrap();
        let token_url = format!("{}/oauth/token", pool.tokens.url());
        pool.set(token_key, &token_url).await.unwrap();
        // The spec's routing scenarios are written against the cursor (fill-first); the
        // strategy tests set their own, and the default's own test sets none.
        for key in ["claude-strategy", "codex-strategy"] {
            pool.set(key, "fill-first").await.unwrap();
        }
        for credential in self.accounts {
            let info = pool.add(credential).await.expect("add an account");
            pool.ids.push(info.id);
        }
        pool.token = pool.open_route(THREAD).await.unwrap().token;
        pool
    }
}

/// OAuth credentials [`access_token`] / [`refresh_token`] of `letter` (Codex: account id
/// `acct-<x>`).
pub fn oauth(provider: Provider, letter: &str, expires_at: Option<u64>) -> Credential {
    Credential::Oauth(OauthCredential {
        access_token: access_token(provider, letter),
        refresh_token: refresh_token(provider, letter),
        expires_at,
        chatgpt_account_id: (provider == Provider::Codex)
            .then(|| format!("acct-{}", secret_of(letter))),
    })
}

/// A Claude `POST /v1/messages` body of session `session` (Claude Code's JSON `user_id`).
pub fn claude_body(session: &str, model: &str) -> String {
    let user_id = serde_json::json!({ "device_id": "d1", "session_id": session }).to_string();
    serde_json::json!({
        "model": model,
        "max_tokens": 16,
        "metadata": { "user_id": user_id },
        "messages": [{ "role": "user", "content": "hi" }],
    })
    .to_string()
}

/// The model most scenario requests ask for.
pub const SONNET: &str = "claude-sonnet-4-5";
pub const OPUS: &str = "claude-opus-4-1";

impl Pool {
    /// Claude, three API-key accounts A, B, C.
    pub async fn claude() -> Pool {
        PoolSetup::claude_keys(3).start().await
    }

    // ---- requests ---------------------------------------------------------------------

    /// A request to the pool with [`THREAD`]'s token.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Request<Full<Bytes>> {
        self.request_with(method, path, Some(&self.token), body)
    }

    /// A request with `token` as the bearer (none: no authorization at all).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Request<Full<Bytes>> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01");
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder.body(Full::new(body.into())).unwrap()
    }

    /// A Claude Code request of `session` for Sonnet.
    pub fn messages(&self, session: &str) -> Request<Full<Bytes>> {
        self.messages_for(session, SONNET)
    }

    /// A Claude Code request of `session` for `model`.
    pub fn messages_for(&self, session: &str, model: &str) -> Request<Full<Bytes>> {
        let mut request = self.request(
            "POST",
            "/v1/messages?beta=true",
            claude_body(session, model),
        );
        request.headers_mut().insert(
            "x-claude-code-session-id",
            session.parse().expect("a header value"),
        );
        request
    }

    /// Send a request whose answer needs no clock movement.
    pub async fn send(&self, request: Request<Full<Bytes>>) -> Answer {
        tokio::time::timeout(SOON, self.client.send(request))
            .await
            .expect("the pool answered in time")
            .expect("the request went through")
    }

    /// Send a request while playing time forward: whenever something sleeps on the host
    /// clock (backoff, an inline wait, a refresh poll), the clock moves to exactly when it
    /// wakes. Returns the answer and each clock move, in order.
    pub async fn drive(&self, request: Request<Full<Bytes>>) -> (Answer, Vec<Duration>) {
        self.drive_within(request, Duration::MAX).await
    }

    /// Like [`Pool::drive`], moving the clock only for sleeps of at most `longest` (a
    /// backoff, say), never for a longer one (the wait for a stream's first event, say):
    /// that one ends on its own account or not at all.
    pub async fn drive_within(
        &self,
        request: Request<Full<Bytes>>,
        longest: Duration,
    ) -> (Answer, Vec<Duration>) {
        let client = self.client.clone();
        let mut task = tokio::spawn(async move { client.send(request).await });
        let mut moves = Vec::new();
        let deadline = tokio::time::Instant::now() + SOON;
        loop {
            tokio::select! {
                answer = &mut task => {
                    let answer = answer.expect("the request task").expect("the request went through");
                    return (answer, moves);
                }
                wake = self.host.next_wake_within(longest, Duration::from_secs(3600)) => {
                    if let Some(wake) = wake {
                        self.host.clock.advance(wake);
                        moves.push(wake);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => panic!("the request did not finish"),
            }
        }
    }

    /// Move the host clock forward.
    pub fn advance(&self, by: Duration) {
        self.host.clock.advance(by);
    }

    /// The host clock now (epoch ms).
    pub fn now(&self) -> u64 {
        use pooler_core::clock::Clock;
        self.host.clock.now_ms()
    }

    // ---- what the upstream saw ----------------------------------------------------------

    /// The letter of the account a received request used (`x-api-key: …key-b` or
    /// `Authorization: Bearer …tok-b…` → `B`); `?` when none.
    pub fn letter(&self, received: &Received) -> String {
        let marked = |secret: &str, mark: &str| -> Option<String> {
            let at = secret.rfind(mark)? + mark.len();
            secret.get(at..at + 1).map(str::to_owned)
        };
        let credential = received
            .header("x-api-key")
            .and_then(|k| marked(k, "key-"))
            .or_else(|| {
                received
                    .header("authorization")
                    .and_then(|a| marked(a, "tok-"))
            });
        credential
            .and_then(|c| LETTERS.iter().find(|l| secret_of(l) == c.as_str()))
            .map_or_else(|| "?".to_owned(), |l| (*l).to_owned())
    }

    /// The accounts the upstream saw, in order, since the start.
    pub fn seen(&self) -> Vec<String> {
        self.upstream
            .received()
            .iter()
            .map(|r| self.letter(r))
            .collect()
    }

    /// The accounts the upstream saw after its first `n` requests.
    pub fn seen_after(&self, n: usize) -> Vec<String> {
        self.seen().split_off(n)
    }

    /// How many requests the upstream has received.
    pub fn hits(&self) -> usize {
        self.upstream.received().len()
    }

    /// The letter of an account id.
    pub fn letter_of(&self, id: &str) -> String {
        self.ids
            .iter()
            .position(|i| i == id)
            .map_or_else(|| format!("?{id}"), |n| LETTERS[n].to_owned())
    }

    /// The id of account `letter`.
    pub fn id(&self, letter: &str) -> String {
        let n = LETTERS
            .iter()
            .position(|l| *l == letter)
            .expect("A, B or C");
        self.ids[n].clone()
    }

    // ---- admin exports ------------------------------------------------------------------

    pub async fn add(&self, credential: Credential) -> Result<AccountInfo, AccountsError> {
        let account = NewAccount {
            provider: self.provider,
            credential,
            label: None,
            priority: None,
            options: None,
        };
        crate::exports::add_account(&self.host.host, account).await
    }

    pub async fn remove(&self, id: &str) -> Result<(), AccountsError> {
        let id = id.to_owned();
        self.host
            .host
            .call_pool("accounts.remove", move |store, pool| {
                Box::pin(
                    async move { pool.pooler_plugins_accounts().call_remove(store, &id).await },
                )
            })
            .await
            .expect("accounts.remove")
    }

    pub async fn enable(&self, letter: &str) -> AccountInfo {
        crate::exports::enable_account(&self.host.host, &self.id(letter))
            .await
            .expect("enabled")
    }

    pub async fn disable(&self, letter: &str) -> AccountInfo {
        crate::exports::disable_account(&self.host.host, &self.id(letter))
            .await
            .expect("disabled")
    }

    pub async fn reorder(&self, ids: Vec<String>) -> Result<Vec<AccountInfo>, AccountsError> {
        let provider = self.provider;
        self.host
            .host
            .call_pool("accounts.reorder", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_accounts()
                        .call_reorder(store, provider, &ids)
                        .await
                })
            })
            .await
            .expect("accounts.reorder")
    }

    pub async fn refresh(&self, letter: &str) -> Result<AccountInfo, AccountsError> {
        let id = self.id(letter);
        self.host
            .host
            .call_pool("accounts.refresh", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_accounts()
                        .call_refresh(store, &id)
                        .await
                })
            })
            .await
            .expect("accounts.refresh")
    }

    /// Change account `letter`'s options (`pooler account update --last-resort …`).
    pub async fn update_options(
        &self,
        letter: &str,
        change: OptionsChange,
    ) -> Result<AccountInfo, AccountsError> {
        let id = self.id(letter);
        self.host
            .host
            .call_pool("accounts.update-options", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_accounts()
                        .call_update_options(store, &id, change)
                        .await
                })
            })
            .await
            .expect("accounts.update-options")
    }

    /// Every account of the pool's provider, in selection order.
    pub async fn list(&self) -> Vec<AccountInfo> {
        crate::exports::list_accounts(&self.host.host, Some(self.provider))
            .await
            .expect("listed")
    }

    /// Account `letter` as listed.
    pub async fn account(&self, letter: &str) -> AccountInfo {
        let id = self.id(letter);
        self.list()
            .await
            .into_iter()
            .find(|a| a.id == id)
            .expect("the account is listed")
    }

    /// Set one of the pool's settings.
    pub async fn set(&self, key: &str, value: &str) -> Result<Setting, SettingsError> {
        crate::exports::set_pool_setting(&self.host.host, key, value).await
    }

    /// One of the pool's settings, as stored.
    pub async fn get(&self, key: &str) -> String {
        let key = key.to_owned();
        self.host
            .host
            .call_pool("settings.get-setting", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_settings()
                        .call_get_setting(store, &key)
                        .await
                })
            })
            .await
            .expect("settings.get-setting")
            .expect("a known setting")
            .value
    }

    /// Open (or re-open) `thread`'s route for the pool's provider at the server's URL.
    pub async fn open_route(&self, thread: &str) -> Result<Route, RoutingError> {
        let (thread, provider, endpoint) = (thread.to_owned(), self.provider, self.url.clone());
        self.host
            .host
            .call_pool("routing.open-route", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_routing()
                        .call_open_route(store, &thread, provider, &endpoint)
                        .await
                })
            })
            .await
            .expect("routing.open-route")
    }

    pub async fn close_route(&self, thread: &str) -> Result<(), RoutingError> {
        let (thread, provider) = (thread.to_owned(), self.provider);
        self.host
            .host
            .call_pool("routing.close-route", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_routing()
                        .call_close_route(store, &thread, provider)
                        .await
                })
            })
            .await
            .expect("routing.close-route")
    }

    /// Where `session` is pinned and why, as the admin API shows it (the host's view of the
    /// pool's answer: outcomes in their stable words).
    pub async fn explain(&self, session: &str) -> Result<SessionView, RoutingError> {
        let (session, provider) = (session.to_owned(), self.provider);
        self.host
            .host
            .call_pool("routing.explain-session", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_routing()
                        .call_explain_session(store, provider, &session)
                        .await
                })
            })
            .await
            .expect("routing.explain-session")
            .map(SessionView::from)
    }

    /// The letter of the account `session` is pinned to (None: no pin).
    pub async fn pinned(&self, session: &str) -> Option<String> {
        self.explain(session)
            .await
            .expect("a valid session")
            .account
            .map(|id| self.letter_of(&id))
    }

    /// The availability answer for `thread`'s next request (of `model`, when given), in
    /// words: `not-routed`, `ready`, `blocked(<retry-at>, <Cause>)`, `unavailable(<Reason>)`.
    pub async fn availability(&self, thread: &str, model: Option<&str>) -> String {
        show(&self.availability_answer(thread, model).await)
    }

    /// The availability answer for `thread`'s next request (of `model`, when given).
    pub async fn availability_answer(&self, thread: &str, model: Option<&str>) -> Availability {
        let query = AvailabilityQuery {
            thread: thread.to_owned(),
            provider: self.provider,
            request: None,
            model: model.map(str::to_owned),
        };
        self.host
            .host
            .call_pool("availability.query", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_availability()
                        .call_query(store, &query)
                        .await
                })
            })
            .await
            .expect("availability.query")
    }

    /// The pool's token totals since the start (`tokens.totals`), per account, or per
    /// thread, account and model when `by_thread`.
    pub async fn tokens(&self, by_thread: bool) -> Vec<TokenTotalView> {
        let grouping = if by_thread {
            TokenGrouping::ByThread
        } else {
            TokenGrouping::ByAccount
        };
        self.host
            .host
            .call_pool("tokens.totals", move |store, pool| {
                Box::pin(async move {
                    pool.pooler_plugins_tokens()
                        .call_totals(store, 0, None, grouping)
                        .await
                })
            })
            .await
            .expect("tokens.totals")
            .expect("the pool's totals")
            .into_iter()
            .map(TokenTotalView::from)
            .collect()
    }

    /// The pool's maintenance tick at the host clock's time.
    pub async fn tick(&self) {
        self.host
            .host
            .maintenance_tick(self.now())
            .await
            .expect("maintenance.on-tick")
            .expect("the tick succeeded");
    }

    /// Restart the host on the same data directory; the server comes back on a new port.
    pub async fn restart(&mut self) {
        self.url = self
            .host
            .restart()
            .await
            .expect("restart")
            .expect("the server was running");
    }
}

/// An availability answer in words (see [`Pool::availability`]).
pub fn show(answer: &Availability) -> String {
    match answer {
        Availability::NotRouted => "not-routed".into(),
        Availability::Ready => "ready".into(),
        Availability::Blocked(b) => format!("blocked({}, {})", b.retry_at, bare(&b.cause)),
        Availability::Unavailable(reason) => format!("unavailable({})", bare(reason)),
    }
}

/// An enum case's name without its type (`QuotaExhausted`, not `BlockCause::QuotaExhausted`).
fn bare(value: &impl std::fmt::Debug) -> String {
    let text = format!("{value:?}");
    text.rsplit("::").next().unwrap_or_default().to_owned()
}

/// Claude's unified rate-limit headers of a shared-window rejection: `5h` rejected,
/// resetting at `reset_ms` (sent in epoch seconds), or with no reset when `None`.
pub fn five_hour_rejected(reset_ms: Option<u64>) -> Vec<(String, String)> {
    let mut headers = vec![
        (
            "anthropic-ratelimit-unified-status".to_owned(),
            "rejected".to_owned(),
        ),
        (
            "anthropic-ratelimit-unified-5h-status".to_owned(),
            "rejected".to_owned(),
        ),
        (
            "anthropic-ratelimit-unified-5h-utilization".to_owned(),
            "1.0".to_owned(),
        ),
    ];
    if let Some(reset) = reset_ms {
        headers.push((
            "anthropic-ratelimit-unified-5h-reset".to_owned(),
            (reset / 1000).to_string(),
        ));
    }
    headers
}

/// A scripted reply with `status` and `headers`.
pub fn reply(status: u16, headers: &[(String, String)]) -> crate::upstream::Reply {
    let mut reply =
        crate::upstream::Reply::status(status).header("content-type", "application/json");
    for (name, value) in headers {
        reply = reply.header(name, value);
    }
    reply.body(format!(
        "{{\"type\":\"error\",\"error\":{{\"type\":\"scripted\",\"message\":\"scripted {status}\"}}}}"
    ))
}
