//! The guest side of the shared WIT imports (feature `component`, for wasm32-wasip2
//! builds): bindings for `pooler:plugins/sqlite` and `pooler:plugins/log`, [`WitDb`] (the
//! kit's [`Db`] over the sqlite import), the value and error conversions between the WIT
//! and the kit types, and [`WitLog`] (the kit's [`Log`] over the log import).
//!
//! A plugin's own `wit_bindgen::generate!` reuses these interface modules, so there is one
//! set of types:
//!
//! ```text
//! with: {
//!     "pooler:plugins/sqlite@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::sqlite,
//!     "pooler:plugins/log@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::log,
//!     "pooler:plugins/metrics@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::metrics,
//!     "pooler:plugins/types@0.1.0": pooler_plugin_kit::component::wit::pooler::plugins::types,
//! },
//! ```

/// Bindings for the shared imports only: the contract's `sqlite`, `log` and `metrics`
/// interfaces, and its shared `types`.
pub mod wit {
    wit_bindgen::generate!({
        path: "../../wit",
        inline: "
            package pooler:kit;

            world guest-adapters {
                import pooler:plugins/sqlite@0.1.0;
                import pooler:plugins/log@0.1.0;
                import pooler:plugins/metrics@0.1.0;
                import pooler:plugins/types@0.1.0;
            }
        ",
        generate_all,
    });
}

pub use wit::pooler::plugins::{log as wit_log, metrics as wit_metrics, sqlite, types};

use crate::db::{Db, DbError, Rows, Value};
use crate::log::{Level, Log};
use crate::metrics::Metrics;

/// A [`Db`] over the WIT `sqlite.connection`.
pub struct WitDb(pub sqlite::Connection);

impl WitDb {
    /// Open the plugin's database `name` (a file in its data directory).
    pub fn open(name: &str) -> Result<Self, DbError> {
        sqlite::Connection::open(name).map(WitDb).map_err(db_error)
    }
}

/// A WIT sqlite error as the kit's.
pub fn db_error(e: sqlite::Error) -> DbError {
    match e {
        sqlite::Error::InvalidName(n) => DbError::InvalidName(n),
        sqlite::Error::TooManyConnections => DbError::TooManyConnections,
        sqlite::Error::Busy => DbError::Busy,
        sqlite::Error::Constraint(m) => DbError::Constraint(m),
        sqlite::Error::InvalidStatement(m) => DbError::InvalidStatement(m),
        sqlite::Error::Io(m) => DbError::Io(m),
    }
}

/// A kit value as the WIT sqlite's.
pub fn to_wit_value(v: &Value) -> sqlite::Value {
    match v {
        Value::Null => sqlite::Value::Null,
        Value::Integer(i) => sqlite::Value::Integer(*i),
        Value::Real(f) => sqlite::Value::Real(*f),
        Value::Text(s) => sqlite::Value::Text(s.clone()),
        Value::Blob(b) => sqlite::Value::Blob(b.clone()),
    }
}

/// Statement parameters as the WIT sqlite's.
pub fn to_wit_values(params: &[Value]) -> Vec<sqlite::Value> {
    params.iter().map(to_wit_value).collect()
}

/// A WIT sqlite value as the kit's.
pub fn from_wit_value(v: sqlite::Value) -> Value {
    match v {
        sqlite::Value::Null => Value::Null,
        sqlite::Value::Integer(i) => Value::Integer(i),
        sqlite::Value::Real(f) => Value::Real(f),
        sqlite::Value::Text(s) => Value::Text(s),
        sqlite::Value::Blob(b) => Value::Blob(b),
    }
}

/// WIT sqlite rows as the kit's.
pub fn from_wit_rows(rows: sqlite::Rows) -> Rows {
    Rows {
        columns: rows.columns,
        rows: rows
            .rows
            .into_iter()
            .map(|r| r.into_iter().map(from_wit_value).collect())
            .collect(),
    }
}

impl Db for WitDb {
    fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.0
            .execute(sql, &to_wit_values(params))
            .map_err(db_error)
    }
    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        self.0.execute_batch(sql).map_err(db_error)
    }
    fn query(&self, sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        self.0
            .query(sql, &to_wit_values(params))
            .map(from_wit_rows)
            .map_err(db_error)
    }
    fn last_insert_rowid(&self) -> i64 {
        self.0.last_insert_rowid()
    }
}

/// A kit level as the WIT log's.
pub fn to_wit_level(level: Level) -> wit_log::Level {
    match level {
        Level::Debug => wit_log::Level::Debug,
        Level::Info => wit_log::Level::Info,
        Level::Warn => wit_log::Level::Warn,
    }
}

/// The [`Log`] port over the WIT `log` import.
#[derive(Debug, Clone, Copy, Default)]
pub struct WitLog;

impl Log for WitLog {
    fn log(&self, level: Level, message: &str, fields: &[(&str, String)]) {
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        wit_log::log(to_wit_level(level), message, &fields);
    }
}

/// The [`Metrics`] port over the WIT `metrics` import.
#[derive(Debug, Clone, Copy, Default)]
pub struct WitMetrics;

fn to_wit_labels(labels: &[(&str, &str)]) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Metrics for WitMetrics {
    fn counter_add(&self, name: &str, labels: &[(&str, &str)], delta: u64) {
        wit_metrics::counter_add(name, &to_wit_labels(labels), delta);
    }
    fn observe(&self, name: &str, labels: &[(&str, &str)], seconds: f64) {
        wit_metrics::observe(name, &to_wit_labels(labels), seconds);
    }
}

impl From<types::Provider> for crate::Provider {
    fn from(p: types::Provider) -> Self {
        match p {
            types::Provider::Claude => crate::Provider::Claude,
            types::Provider::Codex => crate::Provider::Codex,
        }
    }
}

impl From<crate::Provider> for types::Provider {
    fn from(p: crate::Provider) -> Self {
        match p {
            crate::Provider::Claude => types::Provider::Claude,
            crate::Provider::Codex => types::Provider::Codex,
        }
    }
}

impl From<types::ChangeCause> for crate::cause::ChangeCause {
    fn from(c: types::ChangeCause) -> Self {
        use crate::cause::ChangeCause as C;
        use types::ChangeCause as W;
        match c {
            W::AccountAdded => C::AccountAdded,
            W::AccountEnabled => C::AccountEnabled,
            W::AccountDisabled => C::AccountDisabled,
            W::AccountRemoved => C::AccountRemoved,
            W::ErrorCleared => C::ErrorCleared,
            W::ErrorSet => C::ErrorSet,
            W::HoldEnded => C::HoldEnded,
            W::ConfigChanged => C::ConfigChanged,
            W::RoutingChanged => C::RoutingChanged,
            W::PriorityChanged => C::PriorityChanged,
            W::EarlierResetObserved => C::EarlierResetObserved,
            W::LaterResetObserved => C::LaterResetObserved,
            W::ResetPassed => C::ResetPassed,
        }
    }
}

impl From<crate::cause::ChangeCause> for types::ChangeCause {
    fn from(c: crate::cause::ChangeCause) -> Self {
        use crate::cause::ChangeCause as C;
        use types::ChangeCause as W;
        match c {
            C::AccountAdded => W::AccountAdded,
            C::AccountEnabled => W::AccountEnabled,
            C::AccountDisabled => W::AccountDisabled,
            C::AccountRemoved => W::AccountRemoved,
            C::ErrorCleared => W::ErrorCleared,
            C::ErrorSet => W::ErrorSet,
            C::HoldEnded => W::HoldEnded,
            C::ConfigChanged => W::ConfigChanged,
            C::RoutingChanged => W::RoutingChanged,
            C::PriorityChanged => W::PriorityChanged,
            C::EarlierResetObserved => W::EarlierResetObserved,
            C::LaterResetObserved => W::LaterResetObserved,
            C::ResetPassed => W::ResetPassed,
        }
    }
}
