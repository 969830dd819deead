//! The component glue (wasm32 only): WIT bindings for world `account-pool-core`, the
//! wasi:http incoming handler (wstd), and adapters from WIT types and host imports to the
//! plain Rust engine and operations. It holds no state and decides nothing: every call
//! opens the database, runs the plain code, converts the result, and delivers pending
//! availability signals. No host call is unwrapped; every failure becomes a WIT error
//! case or the pool's own HTTP error response.

mod bindings {
    wit_bindgen::generate!({
        world: "account-pool-core",
        path: "../../wit",
        with: {
            // wstd's pollable, so its reactor can wait on `incoming-client.subscribe-gone`.
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            // The shared imports are the kit's, so its adapters take and give these types.
            "pooler:plugins/sqlite@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::sqlite,
            "pooler:plugins/log@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::log,
        },
        generate_all,
    });
}

use crate::admin::{self, Admin, NewAccount};
use crate::engine::{
    self, Cancel, Clock, Engine, IncomingRequest, Level, Log, Random, TransportError, Upstream,
    UpstreamRequest, UpstreamResponse,
};
use crate::http::{Headers, PoolError};
use crate::model::{self, Provider};
use crate::stream::BodyStream;
use bindings::exports::pooler::plugins::{accounts, availability, maintenance, routing, settings};
use bindings::pooler::plugins::{availability_listener, incoming_client, types};
use pooler_plugin_kit::component::{WitDb, WitLog};
use pooler_plugin_kit::log as kit_log;
use wstd::http::body::util::BodyExt as _;
use wstd::http::{Body, Client, Request, Response};

/// The pool's database file name (`pool.sqlite3` in the plugin's directory).
const DATABASE: &str = "pool";

// ---- host capabilities ------------------------------------------------------------------

/// The host clock, sleeping, random bytes, logging, and whether the request's client left.
struct WasiEnv;

impl Clock for WasiEnv {
    fn now(&self) -> u64 {
        let t = bindings::wasi::clocks::wall_clock::now();
        t.seconds
            .saturating_mul(1000)
            .saturating_add(u64::from(t.nanoseconds / 1_000_000))
    }
    async fn sleep(&self, ms: u64) {
        wstd::task::sleep(wstd::time::Duration::from_millis(ms)).await;
    }
}

/// The host's `incoming-client` import: outside the HTTP handler (admin calls) the client
/// never goes, so the same code serves both.
impl Cancel for WasiEnv {
    fn gone(&self) -> bool {
        incoming_client::gone()
    }
    async fn gone_wait(&self) {
        wstd::runtime::AsyncPollable::new(incoming_client::subscribe_gone())
            .wait_for()
            .await;
    }
}

impl Random for WasiEnv {
    fn fill(&self, buf: &mut [u8]) {
        let bytes = bindings::wasi::random::random::get_random_bytes(buf.len() as u64);
        for (b, r) in buf.iter_mut().zip(bytes) {
            *b = r;
        }
    }
}

/// The engine's log port over the kit's WIT log adapter. (The engine still has its own
/// `Level` and `Log`, of the kit's shape; this maps one onto the other.)
impl Log for WasiEnv {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]) {
        let level = match level {
            Level::Debug => kit_log::Level::Debug,
            Level::Info => kit_log::Level::Info,
            Level::Warn => kit_log::Level::Warn,
        };
        kit_log::Log::log(&WitLog, level, message, fields);
    }
}

/// A response body read frame by frame from wasi:http.
struct WasiBody(
    wstd::http::body::util::combinators::UnsyncBoxBody<wstd::http::body::Bytes, wstd::http::Error>,
);

impl BodyStream for WasiBody {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
        loop {
            match self.0.frame().await? {
                Err(e) => return Some(Err(e.to_string())),
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data.to_vec()));
                    }
                }
            }
        }
    }
}

/// Upstream calls over wasi:http (the host applies its allow-list).
struct WasiUpstream;

impl Upstream for WasiUpstream {
    type Body = WasiBody;
    async fn send(
        &self,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse<WasiBody>, TransportError> {
        let mut builder = Request::builder()
            .method(request.method.as_str())
            .uri(request.url.as_str());
        for (n, v) in request.headers.iter() {
            builder = builder.header(n, v);
        }
        let req = builder
            .body(Body::from(request.body))
            .map_err(|e| TransportError(format!("invalid request: {e}")))?;
        let mut client = Client::new();
        client.set_connect_timeout(std::time::Duration::from_secs(15));
        if let Some(ms) = request.deadlines.first_byte_ms {
            client.set_first_byte_timeout(std::time::Duration::from_millis(ms));
        }
        if let Some(ms) = request.deadlines.between_bytes_ms {
            client.set_between_bytes_timeout(std::time::Duration::from_millis(ms));
        }
        let response = client
            .send(req)
            .await
            .map_err(|e| TransportError(e.to_string()))?;
        let status = response.status().as_u16();
        let mut headers = Headers::new();
        for (n, v) in response.headers() {
            if let Ok(v) = v.to_str() {
                headers.push(n.as_str(), v);
            }
        }
        Ok(UpstreamResponse {
            status,
            headers,
            body: WasiBody(response.into_body().into_boxed_body()),
        })
    }
}

// ---- the HTTP handler -------------------------------------------------------------------

#[derive(Debug)]
struct StreamBroke(String);

impl std::fmt::Display for StreamBroke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StreamBroke {}

fn pool_response(e: &PoolError) -> Response<Body> {
    let mut b = Response::builder().status(e.status);
    for (n, v) in e.headers().iter() {
        b = b.header(n, v);
    }
    b.body(Body::from(e.body(Provider::Claude)))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// The default `max-request-body`: how much of a body is read when storage could not say.
const DEFAULT_BODY_LIMIT: u64 = 32 << 20;

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, wstd::http::Error> {
    let Ok(db) = WitDb::open(DATABASE) else {
        return Ok(pool_response(&PoolError::pool(
            503,
            "Account Pooler storage is unavailable; try again.",
        )));
    };
    let (parts, body) = request.into_parts();
    let mut headers = Headers::new();
    for (n, v) in parts.headers.iter() {
        if let Ok(v) = v.to_str() {
            headers.push(n.as_str(), v);
        }
    }
    let mut body = body.into_boxed_body();
    let mut engine = Engine::new(&db, &WasiUpstream, &WasiEnv);
    // The head first: a request the pool refuses anyway (a wrong token, say) has its body
    // read and dropped, never kept, so it cannot make the pool hold `max-request-body`.
    let limit = match engine.screen(parts.method.as_str(), parts.uri.path(), &headers) {
        engine::Screen::Refused(response) => {
            // Read to its end (within the limit) all the same: a server that answers and
            // closes with a body still arriving makes the client's kernel see a reset, and
            // the client may lose the answer.
            let mut left = DEFAULT_BODY_LIMIT;
            while let Some(Ok(frame)) = body.frame().await {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                let Some(rest) = left.checked_sub(n) else {
                    break;
                };
                left = rest;
            }
            return Ok(to_wstd(response));
        }
        engine::Screen::Admitted(admitted) => {
            let limit = admitted.max_body();
            engine = engine.with_admitted(admitted);
            limit
        }
        engine::Screen::Unknown => DEFAULT_BODY_LIMIT,
    };
    // Sized by the declared length up front (up to 8 MiB, so a false length cannot make
    // every request reserve the whole limit), and filled straight from each frame: growing
    // a Vec by doubling, and copying each frame first, tripled the bytes a large agent
    // request cost the guest and grew its memory several times.
    let declared = parts
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(0)
        .min(limit)
        .min(8 << 20);
    let mut bytes = Vec::with_capacity(usize::try_from(declared).unwrap_or(0));
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    // Checked before the copy: a body past the limit is never held.
                    if (bytes.len() + data.len()) as u64 > limit {
                        truncated = true;
                        break;
                    }
                    bytes.extend_from_slice(data);
                }
            }
            Err(_) => {
                return Ok(pool_response(&PoolError::pool(
                    400,
                    "The request body could not be read.",
                )));
            }
        }
    }
    let incoming = IncomingRequest {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers,
        body: bytes.into(),
        body_truncated: truncated,
    };
    Ok(to_wstd(engine.handle(incoming).await))
}

/// The engine's response as wstd's: a body the pool made, or the upstream's relayed.
fn to_wstd(response: engine::Response<WasiBody>) -> Response<Body> {
    let mut b = Response::builder().status(response.status);
    for (n, v) in response.headers.iter() {
        b = b.header(n, v);
    }
    let body = match response.body {
        engine::Body::Full(bytes) => Body::from(bytes),
        engine::Body::Stream(relay) => {
            Body::from_try_stream(futures_lite::stream::unfold(relay, |mut r| async move {
                engine::relay_next(&mut r, &WasiEnv)
                    .await
                    .map(|chunk| (chunk.map_err(StreamBroke), r))
            }))
        }
    };
    b.body(body).unwrap_or_else(|_| {
        pool_response(&PoolError::pool(
            502,
            "Account Pooler could not relay the upstream response.",
        ))
    })
}

// ---- type adapters ----------------------------------------------------------------------

fn provider_in(p: types::Provider) -> Provider {
    match p {
        types::Provider::Claude => Provider::Claude,
        types::Provider::Codex => Provider::Codex,
    }
}

fn provider_out(p: Provider) -> types::Provider {
    match p {
        Provider::Claude => types::Provider::Claude,
        Provider::Codex => types::Provider::Codex,
    }
}

fn availability_out(a: model::Availability) -> types::Availability {
    use model::{BlockCause as B, UnavailableReason as U};
    match a {
        model::Availability::NotRouted => types::Availability::NotRouted,
        model::Availability::Ready => types::Availability::Ready,
        model::Availability::Blocked { retry_at, cause } => {
            types::Availability::Blocked(types::Blocked {
                retry_at,
                cause: match cause {
                    B::QuotaExhausted => types::BlockCause::QuotaExhausted,
                    B::FamilyQuotaExhausted => types::BlockCause::FamilyQuotaExhausted,
                    B::Held => types::BlockCause::Held,
                    B::UsageRestricted => types::BlockCause::UsageRestricted,
                },
            })
        }
        model::Availability::Unavailable(r) => types::Availability::Unavailable(match r {
            U::NoEnabledAccount => types::UnavailableReason::NoEnabledAccount,
            U::Authentication => types::UnavailableReason::Authentication,
            U::ResetUnknown => types::UnavailableReason::ResetUnknown,
        }),
    }
}

fn cause_out(c: model::ChangeCause) -> types::ChangeCause {
    use model::ChangeCause as C;
    match c {
        C::AccountAdded => types::ChangeCause::AccountAdded,
        C::AccountEnabled => types::ChangeCause::AccountEnabled,
        C::AccountDisabled => types::ChangeCause::AccountDisabled,
        C::AccountRemoved => types::ChangeCause::AccountRemoved,
        C::ErrorCleared => types::ChangeCause::ErrorCleared,
        C::ErrorSet => types::ChangeCause::ErrorSet,
        C::HoldEnded => types::ChangeCause::HoldEnded,
        C::ConfigChanged => types::ChangeCause::ConfigChanged,
        C::RoutingChanged => types::ChangeCause::RoutingChanged,
        C::PriorityChanged => types::ChangeCause::PriorityChanged,
        C::EarlierResetObserved => types::ChangeCause::EarlierResetObserved,
        C::LaterResetObserved => types::ChangeCause::LaterResetObserved,
        C::ResetPassed => types::ChangeCause::ResetPassed,
    }
}

fn account_out(a: admin::AccountInfo) -> accounts::AccountInfo {
    accounts::AccountInfo {
        id: a.id,
        provider: provider_out(a.provider),
        kind: match a.kind {
            model::CredentialKind::ApiKey => accounts::CredentialKind::ApiKey,
            model::CredentialKind::OAuth => accounts::CredentialKind::Oauth,
        },
        label: a.label,
        priority: a.priority,
        enabled: a.enabled,
        status: match a.status {
            model::AccountStatus::Disabled => accounts::AccountStatus::Disabled,
            model::AccountStatus::Error => accounts::AccountStatus::Error,
            model::AccountStatus::Held => accounts::AccountStatus::Held,
            model::AccountStatus::Exhausted => accounts::AccountStatus::Exhausted,
            model::AccountStatus::NearLimit => accounts::AccountStatus::NearLimit,
            model::AccountStatus::Ready => accounts::AccountStatus::Ready,
        },
        secret_hint: a.secret_hint,
        created_at: a.created_at,
        last_used_at: a.last_used_at,
        error: a.error,
        held_until: a.held_until,
        needs_sign_in: a.needs_sign_in,
        token_expires_at: a.token_expires_at,
        windows: a
            .windows
            .into_iter()
            .map(|w| accounts::UsageWindow {
                name: w.name,
                family: w.family.map(|f| f.as_str().to_owned()),
                utilization: w.utilization,
                resets_at: w.resets_at,
                status: w.status,
                blocking: w.blocking,
                observed_at: w.observed_at,
            })
            .collect(),
        blocking_reset: a.blocking_reset,
    }
}

fn accounts_error(e: admin::AccountsError) -> accounts::AccountsError {
    use admin::AccountsError as A;
    match e {
        A::NoSuchAccount(id) => accounts::AccountsError::NoSuchAccount(id),
        A::ApiKeyNotSupported(p) => accounts::AccountsError::ApiKeyNotSupported(provider_out(p)),
        A::InvalidCredential(m) => accounts::AccountsError::InvalidCredential(m),
        A::InvalidLoginFile(m) => accounts::AccountsError::InvalidLoginFile(m),
        A::InvalidLabel(m) => accounts::AccountsError::InvalidLabel(m),
        A::InvalidOrder(m) => accounts::AccountsError::InvalidOrder(m),
        A::RefreshRefused(m) => accounts::AccountsError::RefreshRefused(m),
        A::UpstreamUnreachable(m) => accounts::AccountsError::UpstreamUnreachable(m),
        A::Storage(m) => accounts::AccountsError::Storage(m),
    }
}

fn routing_error(e: admin::RoutingError) -> routing::RoutingError {
    use admin::RoutingError as R;
    match e {
        R::InvalidThread(m) => routing::RoutingError::InvalidThread(m),
        R::InvalidEndpoint(m) => routing::RoutingError::InvalidEndpoint(m),
        R::NoSuchRoute => routing::RoutingError::NoSuchRoute,
        R::InvalidSession(m) => routing::RoutingError::InvalidSession(m),
        R::Storage(m) => routing::RoutingError::Storage(m),
    }
}

fn settings_error(e: admin::SettingsError) -> settings::SettingsError {
    use crate::settings::SettingError as S;
    match e {
        admin::SettingsError::Refused(S::UnknownKey(k)) => settings::SettingsError::UnknownKey(k),
        admin::SettingsError::Refused(S::Invalid {
            key,
            value,
            accepted,
        }) => settings::SettingsError::InvalidValue(settings::InvalidValue {
            key,
            value,
            accepted,
        }),
        admin::SettingsError::Storage(m) => settings::SettingsError::Storage(m),
    }
}

fn setting_out(s: admin::SettingInfo) -> settings::Setting {
    settings::Setting {
        key: s.key,
        value: s.value,
        default_value: s.default_value,
        description: s.description,
    }
}

/// Run an operation with the database and the admin surface, then deliver the
/// availability-changed signals it queued.
fn with_admin<T, E>(
    storage: impl Fn(String) -> E,
    f: impl FnOnce(&Admin<'_, WitDb, WasiUpstream, WasiEnv>) -> Result<T, E>,
) -> Result<T, E> {
    let db = WitDb::open(DATABASE).map_err(|e| storage(e.to_string()))?;
    let admin = Admin::new(&db, &WasiUpstream, &WasiEnv).map_err(|e| storage(e.to_string()))?;
    let result = f(&admin);
    deliver(&admin);
    result
}

/// Hand pending signals to the host (which queues and coalesces them). A storage failure
/// leaves them pending for the next call.
fn deliver(admin: &Admin<'_, WitDb, WasiUpstream, WasiEnv>) {
    match admin.take_changes() {
        Ok(changes) => {
            for c in changes {
                let queued =
                    availability_listener::availability_changed(&types::AvailabilityChange {
                        provider: provider_out(c.provider),
                        causes: c.causes.into_iter().map(cause_out).collect(),
                        earliest: availability_out(c.earliest),
                        detected_at: c.detected_at,
                    });
                // The host could not queue it; the listeners' fallback tick covers the loss.
                if let Err(e) = queued {
                    WasiEnv.log(
                        Level::Warn,
                        "the host could not queue an availability change",
                        &[("error", format!("{e:?}"))],
                    );
                }
            }
        }
        Err(e) => WasiEnv.log(
            Level::Warn,
            "Account Pooler could not take pending signals",
            &[("error", e.to_string())],
        ),
    }
}

// ---- exports ----------------------------------------------------------------------------

struct Component;

impl availability::Guest for Component {
    fn query(query: availability::AvailabilityQuery) -> types::Availability {
        Self::query_many(vec![query])
            .pop()
            .unwrap_or(types::Availability::Unavailable(
                types::UnavailableReason::SourceUnavailable,
            ))
    }

    fn query_many(queries: Vec<availability::AvailabilityQuery>) -> Vec<types::Availability> {
        let asked: Vec<(&str, model::Provider, Option<&str>)> = queries
            .iter()
            .map(|q| {
                (
                    q.thread.as_str(),
                    provider_in(q.provider),
                    q.model.as_deref(),
                )
            })
            .collect();
        let answers = WitDb::open(DATABASE)
            .and_then(|db| Admin::new(&db, &WasiUpstream, &WasiEnv)?.availability_many(&asked));
        match answers {
            Ok(answers) => answers.into_iter().map(availability_out).collect(),
            // The pool answered but could not read its state: say so rather than guess.
            Err(e) => {
                WasiEnv.log(
                    Level::Warn,
                    "Account Pooler availability query failed",
                    &[("error", e.to_string())],
                );
                let unavailable =
                    types::Availability::Unavailable(types::UnavailableReason::SourceUnavailable);
                vec![unavailable; queries.len()]
            }
        }
    }
}

impl routing::Guest for Component {
    fn open_route(
        thread: String,
        provider: types::Provider,
        endpoint: String,
    ) -> Result<routing::Route, routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            let r = a
                .open_route(&thread, provider_in(provider), &endpoint)
                .map_err(routing_error)?;
            Ok(routing::Route {
                thread: r.thread,
                provider: provider_out(r.provider),
                base_url: r.base_url,
                token: r.token,
                env: r.env,
                args: r.args,
                config_lines: r.config_lines,
                opened_at: r.opened_at,
            })
        })
    }

    fn close_route(thread: String, provider: types::Provider) -> Result<(), routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            a.close_route(&thread, provider_in(provider))
                .map_err(routing_error)
        })
    }

    fn has_route(thread: String, provider: types::Provider) -> bool {
        with_admin(
            |_| (),
            |a| a.has_route(&thread, provider_in(provider)).map_err(|_| ()),
        )
        .unwrap_or(false)
    }

    fn explain_session(
        provider: types::Provider,
        session: String,
    ) -> Result<routing::SessionExplanation, routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            let e = a
                .explain_session(provider_in(provider), &session)
                .map_err(routing_error)?;
            Ok(routing::SessionExplanation {
                provider: provider_out(e.provider),
                key: e.key,
                account: e.account,
                thread: e.thread,
                last_used_at: e.last_used_at,
                expires_at: e.expires_at,
                why: e.why,
                recent: e
                    .recent
                    .into_iter()
                    .map(|r| routing::AttemptRecord {
                        at: r.at,
                        account: r.account,
                        status: r.status,
                        outcome: r.outcome,
                    })
                    .collect(),
            })
        })
    }
}

impl accounts::Guest for Component {
    fn add(
        account: accounts::NewAccount,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        let credential = match account.credential {
            accounts::Credential::ApiKey(k) => model::Credential::ApiKey(k),
            accounts::Credential::Oauth(o) => model::Credential::OAuth(model::OAuthTokens {
                access_token: o.access_token,
                refresh_token: o.refresh_token,
                expires_at: o.expires_at,
                chatgpt_account_id: o.chatgpt_account_id,
            }),
        };
        let new = NewAccount {
            provider: provider_in(account.provider),
            credential,
            label: account.label,
            priority: account.priority,
        };
        with_admin(accounts::AccountsError::Storage, |a| {
            a.add(new).map(account_out).map_err(accounts_error)
        })
    }

    fn import_login(
        provider: types::Provider,
        contents: String,
        label: Option<String>,
        priority: Option<i32>,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.import_login(provider_in(provider), &contents, label, priority)
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn remove(id: String) -> Result<(), accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.remove(&id).map_err(accounts_error)
        })
    }

    fn enable(id: String) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.enable(&id).map(account_out).map_err(accounts_error)
        })
    }

    fn disable(id: String) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.disable(&id).map(account_out).map_err(accounts_error)
        })
    }

    fn set_priority(
        id: String,
        priority: i32,
    ) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.set_priority(&id, priority)
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn reorder(
        provider: types::Provider,
        ids: Vec<String>,
    ) -> Result<Vec<accounts::AccountInfo>, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.reorder(provider_in(provider), &ids)
                .map(|l| l.into_iter().map(account_out).collect())
                .map_err(accounts_error)
        })
    }

    fn refresh(id: String) -> Result<accounts::AccountInfo, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            wstd::runtime::block_on(a.refresh(&id))
                .map(account_out)
                .map_err(accounts_error)
        })
    }

    fn list_accounts(
        provider: Option<types::Provider>,
    ) -> Result<Vec<accounts::AccountInfo>, accounts::AccountsError> {
        with_admin(accounts::AccountsError::Storage, |a| {
            a.list(provider.map(provider_in))
                .map(|l| l.into_iter().map(account_out).collect())
                .map_err(accounts_error)
        })
    }
}

impl maintenance::Guest for Component {
    fn on_tick(now: types::Timestamp) -> Result<(), types::PluginError> {
        with_admin(types::PluginError::Storage, |a| {
            wstd::runtime::block_on(a.tick(now))
                .map_err(|e| types::PluginError::Storage(e.to_string()))
        })
    }
}

impl settings::Guest for Component {
    fn list_settings() -> Result<Vec<settings::Setting>, settings::SettingsError> {
        with_admin(settings::SettingsError::Storage, |a| {
            a.list_settings()
                .map(|l| l.into_iter().map(setting_out).collect())
                .map_err(settings_error)
        })
    }

    fn get_setting(key: String) -> Result<settings::Setting, settings::SettingsError> {
        with_admin(settings::SettingsError::Storage, |a| {
            a.get_setting(&key).map(setting_out).map_err(settings_error)
        })
    }

    fn set_setting(
        key: String,
        value: String,
    ) -> Result<settings::Setting, settings::SettingsError> {
        with_admin(settings::SettingsError::Storage, |a| {
            a.set_setting(&key, &value)
                .map(setting_out)
                .map_err(settings_error)
        })
    }
}

bindings::export!(Component with_types_in bindings);
