//! An example of a plugin of your own: a minimal alternative **Provider Retry**, built
//! against the contract's `provider-retry` world with `plugins/kit` for the shared imports.
//!
//! Its whole policy: a turn that failed for a temporary reason is retried once per failure,
//! a fixed delay after it failed (setting `delay`, default 45 s), at most until attempt 5.
//! It never re-evaluates: availability changes and ticks are ignored, and a due retry is
//! always sent. Run it with
//!
//! ```toml
//! [plugins.provider-retry]
//! component = "target/guests/examples/wasm32-wasip2/guest/alt_plugin.wasm"
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2 --profile guest -p alt-plugin`. The
//! crate is empty when built natively (the workspace's `cargo build`).
#![cfg(target_arch = "wasm32")]

mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "pooler:plugins/provider-retry",
        // Reuse the kit's bindings of the shared imports, so its `WitDb` and `WitLog`
        // work with this world's types.
        with: {
            "pooler:plugins/sqlite@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::sqlite,
            "pooler:plugins/log@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::log,
        },
        generate_all,
    });
}

use bindings::exports::pooler::plugins::{
    availability_listener, retry_admin, scheduler, settings, turn_events,
};
use bindings::pooler::plugins::threads::{self, ThreadsError};
use bindings::pooler::plugins::types::{
    AvailabilityChange, FailureCategory, PluginError, QueuedRow,
};
use pooler_plugin_kit::component::{WitDb, WitLog};
use pooler_plugin_kit::format::{format_duration_ms, parse_duration_ms};
use pooler_plugin_kit::{Db, DbError, Level, Log, Value};

/// Rust's std imports some WASI interfaces itself (streams, stdio, environment, exit) at the
/// older 0.2 version it was built with. Linking `wasip2`'s description of the same
/// interfaces at 0.2.12 lets the component tooling merge the two, so the component imports
/// WASI at one version, the contract's — as both real plugins do.
#[used]
static WASI_VERSION: fn() -> (u64, u64) = wasip2::random::insecure_seed::insecure_seed;

/// The one setting: how long after a failure its retry is sent.
const DELAY: &str = "delay";
const DEFAULT_DELAY_MS: u64 = 45_000;
/// The last attempt this plugin schedules (1 is the original turn).
const LAST_ATTEMPT: u32 = 5;

struct FixedDelay;

bindings::export!(FixedDelay with_types_in bindings);

/// The plugin's database (`fixed-delay.sqlite3` in its own data directory): only its
/// setting. The host may drop the instance after any call, so nothing lives in memory.
fn db() -> Result<WitDb, DbError> {
    let db = WitDb::open("fixed-delay")?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    )?;
    Ok(db)
}

fn delay_ms(db: &impl Db) -> Result<u64, DbError> {
    let rows = db.query("SELECT value FROM settings WHERE key = ?1", &[DELAY.into()])?;
    let stored = rows.first().map(|r| r.text("value")).transpose()?;
    Ok(stored
        .and_then(|v| parse_duration_ms(&v))
        .unwrap_or(DEFAULT_DELAY_MS))
}

fn storage(e: DbError) -> PluginError {
    PluginError::Storage(e.to_string())
}

impl turn_events::Guest for FixedDelay {
    /// Delivered at least once per failure: `threads.schedule-retry` keeps one live row per
    /// chain, so a redelivery finds `already-queued` and changes nothing.
    fn turn_failed(event: turn_events::TurnFailedEvent) -> Result<(), PluginError> {
        let temporary = event.failure.as_ref().is_some_and(|f| {
            matches!(
                f.category,
                FailureCategory::RateLimit
                    | FailureCategory::Overloaded
                    | FailureCategory::Internal
                    | FailureCategory::ConnectionFailed
                    | FailureCategory::StreamDisconnected
            )
        });
        if !temporary || event.attempt >= LAST_ATTEMPT {
            WitLog.log(Level::Info, "not retried", &[("thread", event.thread)]);
            return Ok(());
        }
        let send_at = event
            .failed_at
            .saturating_add(delay_ms(&db().map_err(storage)?).map_err(storage)?);
        let reason = "fixed-delay retry";
        match threads::schedule_retry(&event.thread, &event.failed_request, send_at, reason) {
            Ok(row) => {
                let fields = [
                    ("thread", event.thread),
                    ("send_at", row.send_at.to_string()),
                ];
                WitLog.log(Level::Info, "retry scheduled", &fields);
                Ok(())
            }
            // Already scheduled (a redelivery), or nothing left to retry: done.
            Err(
                ThreadsError::AlreadyQueued(_)
                | ThreadsError::NoFailedTurn
                | ThreadsError::NoSuchThread(_)
                | ThreadsError::Archived,
            ) => Ok(()),
            // Anything else may pass: an error asks the host to deliver the event again.
            Err(e) => Err(PluginError::Dependency(format!("{e:?}"))),
        }
    }

    fn turn_succeeded(_event: turn_events::TurnSucceededEvent) -> Result<(), PluginError> {
        Ok(())
    }
}

impl availability_listener::Guest for FixedDelay {
    /// A fixed delay does not care when the pool can serve again.
    fn availability_changed(_change: AvailabilityChange) -> Result<(), PluginError> {
        Ok(())
    }
}

impl scheduler::Guest for FixedDelay {
    fn on_start(_now: u64) -> Result<(), PluginError> {
        Ok(())
    }
    fn on_tick(_now: u64) -> Result<(), PluginError> {
        Ok(())
    }
    /// The last word before a due retry is sent: always yes.
    fn before_dispatch(_row: QueuedRow) -> Result<scheduler::DispatchVerdict, PluginError> {
        Ok(scheduler::DispatchVerdict::Proceed)
    }
}

fn admin(e: impl std::fmt::Debug) -> retry_admin::AdminError {
    retry_admin::AdminError::Dependency(format!("{e:?}"))
}

/// `pooler retry status|cancel` read and drop the core's rows; there is no history to explain.
impl retry_admin::Guest for FixedDelay {
    fn status(
        thread: Option<String>,
    ) -> Result<Vec<retry_admin::Candidate>, retry_admin::AdminError> {
        let rows = threads::list_rows(thread.as_deref()).map_err(admin)?;
        Ok(rows.into_iter().map(candidate).collect())
    }
    fn explain(thread: String) -> Result<Vec<retry_admin::ChainHistory>, retry_admin::AdminError> {
        Err(retry_admin::AdminError::UnknownThread(thread))
    }
    fn cancel(
        thread: String,
        _now: u64,
    ) -> Result<retry_admin::Candidate, retry_admin::AdminError> {
        let row = threads::list_rows(Some(&thread))
            .map_err(admin)?
            .into_iter()
            .next();
        let row = row.ok_or(retry_admin::AdminError::NothingPending(thread))?;
        threads::cancel(&row.thread, row.id, "cancelled by a person").map_err(admin)?;
        Ok(candidate(row))
    }
    fn sent_by_person(
        _thread: String,
        _row: u64,
        _now: u64,
    ) -> Result<(), retry_admin::AdminError> {
        Ok(())
    }
}

fn candidate(row: QueuedRow) -> retry_admin::Candidate {
    retry_admin::Candidate {
        state: retry_admin::CandidateState::Scheduled,
        row: Some(row.id),
        send_at: Some(row.send_at),
        next_attempt: row.attempt,
        chain_started_at: row.created_at,
        thread: row.thread,
        original_request: row.original_request,
        failed_request: row.failed_request,
        reason: row.reason,
    }
}

/// `pooler config get|set retry.delay`.
impl settings::Guest for FixedDelay {
    fn list_settings() -> Result<Vec<settings::Setting>, settings::SettingsError> {
        Ok(vec![Self::get_setting(DELAY.into())?])
    }
    fn get_setting(key: String) -> Result<settings::Setting, settings::SettingsError> {
        if key != DELAY {
            return Err(settings::SettingsError::UnknownKey(key));
        }
        let ms = db()
            .and_then(|db| delay_ms(&db))
            .map_err(|e| settings::SettingsError::Storage(e.to_string()))?;
        Ok(settings::Setting {
            key,
            value: format_duration_ms(ms),
            default_value: format_duration_ms(DEFAULT_DELAY_MS),
            description: "How long after a failure its retry is sent.".into(),
        })
    }
    fn set_setting(
        key: String,
        value: String,
    ) -> Result<settings::Setting, settings::SettingsError> {
        if key != DELAY {
            return Err(settings::SettingsError::UnknownKey(key));
        }
        let Some(ms) = parse_duration_ms(&value) else {
            let accepted = "a duration such as 30s, 5m or 1h".into();
            return Err(settings::SettingsError::InvalidValue(
                settings::InvalidValue {
                    key,
                    value,
                    accepted,
                },
            ));
        };
        let stored = Value::Text(format_duration_ms(ms));
        db().and_then(|db| {
            db.execute(
                "INSERT OR REPLACE INTO settings (key, value) VALUES (?1, ?2)",
                &[DELAY.into(), stored],
            )
        })
        .map_err(|e| settings::SettingsError::Storage(e.to_string()))?;
        Self::get_setting(key)
    }
}
