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
            "pooler:plugins/metrics@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::metrics,
            "pooler:plugins/types@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::types,
        },
        generate_all,
    });
}

// The `accounts` export and its conversions.
mod accounts;
// wasi:http: the incoming handler (the proxy) and the upstream client.
mod wasi_http;

use crate::admin::{self, Admin};
use crate::engine::{Cancel, Clock, Level, Log, Random};
use crate::model::{self, Provider};
use crate::policy::AttemptOutcome;
use bindings::exports::pooler::plugins::{availability, maintenance, routing, settings, tokens};
use bindings::pooler::plugins::{availability_listener, incoming_client};
use pooler_plugin_kit::component::types;
use pooler_plugin_kit::component::{WitDb, WitLog, WitMetrics};
use wasi_http::WasiUpstream;

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

/// The engine's log port: the kit's WIT log adapter.
impl pooler_plugin_kit::Metrics for WasiEnv {
    fn counter_add(&self, name: &str, labels: &[(&str, &str)], delta: u64) {
        WitMetrics.counter_add(name, labels, delta);
    }
    fn observe(&self, name: &str, labels: &[(&str, &str)], seconds: f64) {
        WitMetrics.observe(name, labels, seconds);
    }
}

impl Log for WasiEnv {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]) {
        WitLog.log(level, message, fields);
    }
}

// ---- type adapters ----------------------------------------------------------------------

impl From<admin::AttemptRecord> for routing::AttemptRecord {
    fn from(r: admin::AttemptRecord) -> Self {
        use routing::AttemptOutcome as W;
        routing::AttemptRecord {
            at: r.at,
            account: r.account,
            status: r.status,
            outcome: match r.outcome {
                AttemptOutcome::Served => W::Served,
                AttemptOutcome::Detour => W::Detour,
                AttemptOutcome::PassedThrough => W::PassedThrough,
                AttemptOutcome::Transient => W::Transient,
                AttemptOutcome::Hold => W::Hold,
                AttemptOutcome::Quota => W::Quota,
                AttemptOutcome::Family => W::Family,
                AttemptOutcome::Auth => W::Auth,
                AttemptOutcome::Cancelled => W::Cancelled,
            },
        }
    }
}

impl From<admin::Route> for routing::Route {
    fn from(r: admin::Route) -> Self {
        routing::Route {
            thread: r.thread,
            provider: r.provider.into(),
            base_url: r.base_url,
            token: r.token,
            env: r.env.into_iter().map(|v| (v.name, v.value)).collect(),
            args: r.args,
            config_lines: r.config_lines,
            opened_at: r.opened_at,
        }
    }
}

impl From<admin::RouteSummary> for routing::RouteSummary {
    fn from(r: admin::RouteSummary) -> Self {
        routing::RouteSummary {
            thread: r.thread,
            provider: r.provider.into(),
            opened_at: r.opened_at,
        }
    }
}

impl From<admin::SessionSummary> for routing::SessionSummary {
    fn from(s: admin::SessionSummary) -> Self {
        routing::SessionSummary {
            provider: s.provider.into(),
            key: s.key,
            account: s.account,
            thread: s.thread,
            last_used_at: s.last_used_at,
            expires_at: s.expires_at,
            provisional: s.provisional,
        }
    }
}

impl From<admin::SessionExplanation> for routing::SessionExplanation {
    fn from(e: admin::SessionExplanation) -> Self {
        routing::SessionExplanation {
            provider: e.provider.into(),
            key: e.key,
            account: e.account,
            thread: e.thread,
            last_used_at: e.last_used_at,
            expires_at: e.expires_at,
            why: e.why,
            recent: e.recent.into_iter().map(Into::into).collect(),
        }
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

fn setting_out(s: admin::Setting) -> settings::Setting {
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
                let queued = availability_listener::availability_changed(
                    &types::AvailabilityChange::from(&c),
                );
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
                    Provider::from(q.provider),
                    q.model.as_deref(),
                )
            })
            .collect();
        let answers = WitDb::open(DATABASE)
            .and_then(|db| Admin::new(&db, &WasiUpstream, &WasiEnv)?.availability_many(&asked));
        match answers {
            Ok(answers) => answers.into_iter().map(types::Availability::from).collect(),
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
            a.open_route(&thread, Provider::from(provider), &endpoint)
                .map(Into::into)
                .map_err(routing_error)
        })
    }

    fn close_route(thread: String, provider: types::Provider) -> Result<(), routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            a.close_route(&thread, Provider::from(provider))
                .map_err(routing_error)
        })
    }

    fn has_route(thread: String, provider: types::Provider) -> bool {
        with_admin(
            |_| (),
            |a| {
                a.has_route(&thread, Provider::from(provider))
                    .map_err(|_| ())
            },
        )
        .unwrap_or(false)
    }

    fn list_routes(
        provider: Option<types::Provider>,
    ) -> Result<Vec<routing::RouteSummary>, routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            let routes = a
                .list_routes(provider.map(Provider::from))
                .map_err(routing_error)?;
            Ok(routes.into_iter().map(Into::into).collect())
        })
    }

    fn list_sessions(
        thread: Option<String>,
        provider: Option<types::Provider>,
    ) -> Result<Vec<routing::SessionSummary>, routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            let sessions = a
                .list_sessions(thread.as_deref(), provider.map(Provider::from))
                .map_err(routing_error)?;
            Ok(sessions.into_iter().map(Into::into).collect())
        })
    }

    fn explain_session(
        provider: types::Provider,
        session: String,
    ) -> Result<routing::SessionExplanation, routing::RoutingError> {
        with_admin(routing::RoutingError::Storage, |a| {
            a.explain_session(Provider::from(provider), &session)
                .map(Into::into)
                .map_err(routing_error)
        })
    }
}

impl tokens::Guest for Component {
    fn totals(
        since: types::Timestamp,
        thread: Option<String>,
        grouping: tokens::TokenGrouping,
    ) -> Result<Vec<tokens::TokenTotal>, tokens::TokensError> {
        let by_thread = grouping == tokens::TokenGrouping::ByThread;
        with_admin(tokens::TokensError::Storage, |a| {
            let rows = a
                .token_totals(since, thread.as_deref(), by_thread)
                .map_err(|e| match e {
                    admin::RoutingError::InvalidThread(m) => tokens::TokensError::InvalidThread(m),
                    admin::RoutingError::Storage(m) => tokens::TokensError::Storage(m),
                    // `token_totals` refuses nothing else.
                    other => tokens::TokensError::Storage(format!("{other:?}")),
                })?;
            Ok(rows
                .into_iter()
                .map(|r| tokens::TokenTotal {
                    provider: types::Provider::from(r.provider),
                    account: r.account,
                    thread: r.thread,
                    model: r.model,
                    counts: tokens::TokenCounts {
                        answers: r.answers,
                        input: r.counts.input,
                        output: r.counts.output,
                        cache_read: r.counts.cache_read,
                        cache_write: r.counts.cache_write,
                    },
                })
                .collect())
        })
    }
}

impl maintenance::Guest for Component {
    fn on_start(now: types::Timestamp) -> Result<(), types::PluginError> {
        with_admin(types::PluginError::Storage, |a| {
            a.start(now)
                .map_err(|e| types::PluginError::Storage(e.to_string()))
        })
    }

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
