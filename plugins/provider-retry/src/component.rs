//! The component glue (wasm32 only): bindings for the WIT world `provider-retry`, adapters
//! between WIT values and the plain types of [`crate::types`], the host capabilities as the
//! engine's ports, and the exports, each of which opens the database, builds an [`Engine`]
//! and converts its answer back.
//!
//! Nothing here decides anything. No host call is unwrapped and nothing panics on purpose:
//! every failure becomes a WIT error case (`plugin-error`, `admin-error`, `settings-error`).

mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "pooler:plugins/provider-retry",
        // The shared imports are the kit's, so its adapters take and give these types.
        with: {
            "pooler:plugins/sqlite@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::sqlite,
            "pooler:plugins/log@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::log,
            "pooler:plugins/metrics@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::metrics,
            "pooler:plugins/types@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::types,
        },
        generate_all,
    });
}

// The `retry-admin` export and its conversions.
mod retry_admin;

use bindings::exports::pooler::plugins::{
    availability_listener, scheduler, settings as wit_settings, turn_events,
};
use bindings::pooler::plugins::{availability, threads};
use bindings::wasi::clocks::{monotonic_clock, wall_clock};
use bindings::wasi::random::random;
use pooler_plugin_kit::component::types as wit;

use pooler_plugin_kit::DbError;
use pooler_plugin_kit::component::{WitDb, WitLog, WitMetrics};

/// Rust's std imports some WASI interfaces itself (streams, stdio, environment, exit, the
/// insecure seed) at the older 0.2 version it was built with. Linking `wasip2`'s
/// description of the same interfaces at 0.2.12 lets the component tooling merge the two,
/// so the component imports WASI at one version, the contract's (README, `wit/deps`).
#[used]
static WASI_VERSION: fn() -> (u64, u64) = wasip2::random::insecure_seed::insecure_seed;

use crate::engine::Engine;
use crate::policy::Random;
use crate::ports::{AvailabilityQuery, AvailabilitySource, Clock, RowMove, Threads};
use crate::settings::{Setting, Settings, SettingsError};
use crate::store;
use crate::types::*;

/// The plugin's one database, `retry.sqlite3` in its data directory.
const DATABASE: &str = "retry";

struct Component;

bindings::export!(Component with_types_in bindings);

// ----- database -----------------------------------------------------------------------------

fn open_db() -> Result<WitDb, DbError> {
    let db = WitDb::open(DATABASE)?;
    store::migrate(&db)?;
    Ok(db)
}

// ----- host capabilities as ports -----------------------------------------------------------

struct Host;

impl Clock for Host {
    fn now(&self) -> Timestamp {
        let t = wall_clock::now();
        t.seconds
            .saturating_mul(1000)
            .saturating_add(u64::from(t.nanoseconds / 1_000_000))
    }
    fn monotonic_ms(&self) -> u64 {
        monotonic_clock::now() / 1_000_000
    }
}

impl Random for Host {
    fn next_u64(&self) -> u64 {
        random::get_random_u64()
    }
}

fn to_wit_query(q: &AvailabilityQuery) -> availability::AvailabilityQuery {
    availability::AvailabilityQuery {
        thread: q.thread.clone(),
        provider: wit::Provider::from(q.provider),
        request: q.request.clone(),
        model: q.model.clone(),
    }
}

// The host answers `unavailable(source-unavailable)` itself when the pool traps or takes
// over 5 s, so these calls have no error of their own.
impl AvailabilitySource for Host {
    fn query(&self, q: &AvailabilityQuery) -> Result<Availability, String> {
        Ok(availability::query(&to_wit_query(q)).into())
    }

    fn query_many(&self, queries: &[AvailabilityQuery]) -> Result<Vec<Availability>, String> {
        let queries: Vec<_> = queries.iter().map(to_wit_query).collect();
        Ok(availability::query_many(&queries)
            .into_iter()
            .map(Availability::from)
            .collect())
    }
}

fn from_wit_thread(t: threads::ThreadInfo) -> ThreadInfo {
    ThreadInfo {
        id: t.id,
        provider: Provider::from(t.provider),
        model: t.model,
        status: match t.status {
            threads::ThreadStatus::Idle => ThreadStatus::Idle,
            threads::ThreadStatus::Active => ThreadStatus::Active,
            threads::ThreadStatus::Error => ThreadStatus::Error,
        },
        archived: t.archived,
        retry_opt_out: t.retry_opt_out,
        latest_request: t.latest_request,
        input_queued: t.input_queued,
        routed_by_pool: t.routed_by_pool,
    }
}

impl Threads for Host {
    fn get_thread(&self, thread: &str) -> Result<ThreadInfo, ThreadsError> {
        threads::get_thread(thread)
            .map(from_wit_thread)
            .map_err(from_wit_threads_error)
    }
    fn get_threads(&self, ids: &[&str]) -> Vec<Result<ThreadInfo, ThreadsError>> {
        let ids: Vec<String> = ids.iter().map(|t| (*t).to_owned()).collect();
        threads::get_threads(&ids)
            .into_iter()
            .map(|r| r.map(from_wit_thread).map_err(from_wit_threads_error))
            .collect()
    }
    fn reschedule_many(&self, moves: &[RowMove]) -> Vec<Result<QueuedRow, ThreadsError>> {
        let moves: Vec<threads::RowMove> = moves
            .iter()
            .map(|m| threads::RowMove {
                thread: m.thread.clone(),
                row: m.row,
                send_at: m.send_at,
                reason: m.reason.clone(),
            })
            .collect();
        threads::reschedule_many(&moves)
            .into_iter()
            .map(|r| r.map(QueuedRow::from).map_err(from_wit_threads_error))
            .collect()
    }
    fn schedule_retry(
        &self,
        thread: &str,
        failed_request: &str,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        threads::schedule_retry(thread, failed_request, send_at, reason)
            .map(QueuedRow::from)
            .map_err(from_wit_threads_error)
    }
    fn reschedule(
        &self,
        thread: &str,
        row: u64,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        threads::reschedule(thread, row, send_at, reason)
            .map(QueuedRow::from)
            .map_err(from_wit_threads_error)
    }
    fn cancel(&self, thread: &str, row: u64, reason: &str) -> Result<(), ThreadsError> {
        threads::cancel(thread, row, reason).map_err(from_wit_threads_error)
    }
    fn list_rows(&self, thread: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError> {
        threads::list_rows(thread)
            .map(|rows| rows.into_iter().map(QueuedRow::from).collect())
            .map_err(from_wit_threads_error)
    }
}

/// Run `f` with an engine over a freshly opened database and the host.
fn with_engine<T, E: From<DbError>>(
    f: impl FnOnce(&Engine<'_, WitDb>) -> Result<T, E>,
) -> Result<T, E> {
    let db = open_db()?;
    let host = Host;
    let engine = Engine::new(&db, &host, &host, &host, &host, &WitLog).with_metrics(&WitMetrics);
    f(&engine)
}

// ----- WIT ↔ plain conversions --------------------------------------------------------------

fn from_wit_threads_error(e: threads::ThreadsError) -> ThreadsError {
    use threads::ThreadsError as W;
    match e {
        W::NoSuchThread(t) => ThreadsError::NoSuchThread(t),
        W::NoFailedTurn => ThreadsError::NoFailedTurn,
        W::AlreadyQueued(r) => ThreadsError::AlreadyQueued(r),
        W::NoSuchRow(r) => ThreadsError::NoSuchRow(r),
        W::Archived => ThreadsError::Archived,
        W::InvalidArgument(m) => ThreadsError::InvalidArgument(m),
        W::Storage(m) => ThreadsError::Storage(m),
    }
}

fn to_wit_plugin_error(e: PluginError) -> wit::PluginError {
    match e {
        PluginError::Storage(m) => wit::PluginError::Storage(m),
        PluginError::Dependency(m) => wit::PluginError::Dependency(m),
        PluginError::InvalidInput(m) => wit::PluginError::InvalidInput(m),
    }
}

fn to_wit_setting(s: Setting) -> wit_settings::Setting {
    wit_settings::Setting {
        key: s.key,
        value: s.value,
        default_value: s.default_value,
        description: s.description,
    }
}

fn to_wit_settings_error(e: SettingsError) -> wit_settings::SettingsError {
    match e {
        SettingsError::UnknownKey(k) => wit_settings::SettingsError::UnknownKey(k),
        SettingsError::InvalidValue {
            key,
            value,
            accepted,
        } => wit_settings::SettingsError::InvalidValue(wit_settings::InvalidValue {
            key,
            value,
            accepted,
        }),
        SettingsError::Storage(m) => wit_settings::SettingsError::Storage(m),
    }
}

// ----- exports ------------------------------------------------------------------------------

impl availability_listener::Guest for Component {
    fn availability_changed(change: wit::AvailabilityChange) -> Result<(), wit::PluginError> {
        let change = AvailabilityChange::from(change);
        // A failed pass is reported to the host, which delivers the change again; the
        // candidates the pass did finish are committed, and re-evaluating them is idempotent.
        with_engine(|engine| engine.availability_changed(&change))
            .map(|_summary| ())
            .map_err(to_wit_plugin_error)
    }
}

impl turn_events::Guest for Component {
    fn turn_failed(event: turn_events::TurnFailedEvent) -> Result<(), wit::PluginError> {
        let event = TurnFailedEvent {
            thread: event.thread,
            provider: Provider::from(event.provider),
            model: event.model,
            failed_request: event.failed_request,
            original_request: event.original_request,
            attempt: event.attempt,
            failed_at: event.failed_at,
            chain_started_at: event.chain_started_at,
            input_accepted: event.input_accepted,
            routed_by_pool: event.routed_by_pool,
            rate_limits: event.rate_limits.map(Into::into),
            failure: event.failure.map(Into::into),
        };
        with_engine(|engine| engine.turn_failed(&event)).map_err(to_wit_plugin_error)
    }

    fn turn_succeeded(event: turn_events::TurnSucceededEvent) -> Result<(), wit::PluginError> {
        let event = TurnSucceededEvent {
            thread: event.thread,
            provider: Provider::from(event.provider),
            request: event.request,
            original_request: event.original_request,
            attempt: event.attempt,
            succeeded_at: event.succeeded_at,
        };
        with_engine(|engine| engine.turn_succeeded(&event)).map_err(to_wit_plugin_error)
    }
}

impl scheduler::Guest for Component {
    fn on_start(now: wit::Timestamp) -> Result<(), wit::PluginError> {
        with_engine(|engine| engine.on_start(now).map(|_| ())).map_err(to_wit_plugin_error)
    }

    fn on_tick(now: wit::Timestamp) -> Result<(), wit::PluginError> {
        with_engine(|engine| engine.on_tick(now).map(|_| ())).map_err(to_wit_plugin_error)
    }

    fn before_dispatch(
        row: wit::QueuedRow,
    ) -> Result<scheduler::DispatchVerdict, wit::PluginError> {
        let row = QueuedRow::from(row);
        with_engine(|engine| engine.before_dispatch(&row))
            .map(|v| match v {
                DispatchVerdict::Proceed => scheduler::DispatchVerdict::Proceed,
                DispatchVerdict::WaitUntil(t) => scheduler::DispatchVerdict::WaitUntil(t),
                DispatchVerdict::Drop(why) => scheduler::DispatchVerdict::Drop(why),
            })
            .map_err(to_wit_plugin_error)
    }
}

impl wit_settings::Guest for Component {
    fn list_settings() -> Result<Vec<wit_settings::Setting>, wit_settings::SettingsError> {
        let db = open_db().map_err(|e| to_wit_settings_error(e.into()))?;
        Settings::list(&db)
            .map(|all| all.into_iter().map(to_wit_setting).collect())
            .map_err(to_wit_settings_error)
    }

    fn get_setting(key: String) -> Result<wit_settings::Setting, wit_settings::SettingsError> {
        let db = open_db().map_err(|e| to_wit_settings_error(e.into()))?;
        Settings::get(&db, &key)
            .map(to_wit_setting)
            .map_err(to_wit_settings_error)
    }

    fn set_setting(
        key: String,
        value: String,
    ) -> Result<wit_settings::Setting, wit_settings::SettingsError> {
        let db = open_db().map_err(|e| to_wit_settings_error(e.into()))?;
        Settings::set(&db, &key, &value)
            .map(to_wit_setting)
            .map_err(to_wit_settings_error)
    }
}
