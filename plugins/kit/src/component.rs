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

/// `From` both ways between a WIT enum and the kit's, whose cases have the same names.
macro_rules! same_cases {
    ($wit:ty, $kit:ty { $($case:ident),+ $(,)? }) => {
        impl From<$wit> for $kit {
            fn from(c: $wit) -> Self {
                match c { $(<$wit>::$case => <$kit>::$case,)+ }
            }
        }
        impl From<$kit> for $wit {
            fn from(c: $kit) -> Self {
                match c { $(<$kit>::$case => <$wit>::$case,)+ }
            }
        }
    };
}

use crate::availability::{Availability, AvailabilityChange, BlockCause, UnavailableReason};
use crate::turns::{
    Failure, FailureCategory, FailureOrigin, LimitKind, LimitStatus, LimitWindow, QueuedRow,
    RateLimitSnapshot, RowKind,
};

same_cases!(types::Provider, crate::Provider { Claude, Codex });
same_cases!(
    types::ChangeCause,
    crate::cause::ChangeCause {
        AccountAdded,
        AccountEnabled,
        AccountDisabled,
        AccountRemoved,
        ErrorCleared,
        ErrorSet,
        HoldEnded,
        ConfigChanged,
        RoutingChanged,
        PriorityChanged,
        EarlierResetObserved,
        LaterResetObserved,
        ResetPassed,
    }
);
same_cases!(
    types::UnavailableReason,
    UnavailableReason {
        NoEnabledAccount,
        Authentication,
        ResetUnknown,
        SourceUnavailable,
    }
);
same_cases!(
    types::BlockCause,
    BlockCause {
        QuotaExhausted,
        FamilyQuotaExhausted,
        Held,
        UsageRestricted,
    }
);
same_cases!(
    types::FailureCategory,
    FailureCategory {
        ActiveTurnNotSteerable,
        BadRequest,
        Billing,
        BudgetExceeded,
        ConnectionFailed,
        ContextWindowExceeded,
        Internal,
        MaxOutputTokens,
        MaxTurns,
        Overloaded,
        Policy,
        RateLimit,
        Sandbox,
        StreamDisconnected,
        StructuredOutputRetries,
        ThreadRollbackFailed,
        TooManyFailedAttempts,
        Unauthorized,
        Unknown,
    }
);
same_cases!(
    types::FailureOrigin,
    FailureOrigin {
        Provider,
        Pool,
        Transport
    }
);
same_cases!(
    types::LimitStatus,
    LimitStatus {
        Allowed,
        Warning,
        Blocked,
        Unknown
    }
);
same_cases!(
    types::LimitKind,
    LimitKind {
        SubscriptionWindow,
        Credits,
        SpendControl,
        Unknown
    }
);
same_cases!(types::RowKind, RowKind { Retry });

impl From<types::Availability> for Availability {
    fn from(a: types::Availability) -> Self {
        match a {
            types::Availability::NotRouted => Availability::NotRouted,
            types::Availability::Ready => Availability::Ready,
            types::Availability::Blocked(b) => Availability::Blocked {
                retry_at: b.retry_at,
                cause: b.cause.into(),
            },
            types::Availability::Unavailable(r) => Availability::Unavailable(r.into()),
        }
    }
}

impl From<Availability> for types::Availability {
    fn from(a: Availability) -> Self {
        match a {
            Availability::NotRouted => types::Availability::NotRouted,
            Availability::Ready => types::Availability::Ready,
            Availability::Blocked { retry_at, cause } => {
                types::Availability::Blocked(types::Blocked {
                    retry_at,
                    cause: cause.into(),
                })
            }
            Availability::Unavailable(r) => types::Availability::Unavailable(r.into()),
        }
    }
}

impl From<types::AvailabilityChange> for AvailabilityChange {
    fn from(c: types::AvailabilityChange) -> Self {
        AvailabilityChange {
            provider: c.provider.into(),
            causes: c.causes.into_iter().map(Into::into).collect(),
            earliest: c.earliest.into(),
            detected_at: c.detected_at,
        }
    }
}

impl From<&AvailabilityChange> for types::AvailabilityChange {
    fn from(c: &AvailabilityChange) -> Self {
        types::AvailabilityChange {
            provider: c.provider.into(),
            causes: c.causes.iter().map(|&c| c.into()).collect(),
            earliest: c.earliest.into(),
            detected_at: c.detected_at,
        }
    }
}

impl From<types::Failure> for Failure {
    fn from(f: types::Failure) -> Self {
        Failure {
            category: f.category.into(),
            provider_code: f.provider_code,
            http_status: f.http_status,
            origin: f.origin.into(),
            retry_after: f.retry_after,
            message: f.message,
        }
    }
}

impl From<types::RateLimitSnapshot> for RateLimitSnapshot {
    fn from(s: types::RateLimitSnapshot) -> Self {
        RateLimitSnapshot {
            provider: s.provider.into(),
            status: s.status.into(),
            kind: s.kind.into(),
            windows: s
                .windows
                .into_iter()
                .map(|w| LimitWindow {
                    key: w.key,
                    label: w.label,
                    status: w.status.into(),
                    resets_at: w.resets_at,
                    utilization: w.utilization,
                })
                .collect(),
            reached_reason: s.reached_reason,
            observed_at: s.observed_at,
        }
    }
}

impl From<types::QueuedRow> for QueuedRow {
    fn from(r: types::QueuedRow) -> Self {
        QueuedRow {
            id: r.id,
            thread: r.thread,
            kind: r.kind.into(),
            failed_request: r.failed_request,
            original_request: r.original_request,
            attempt: r.attempt,
            send_at: r.send_at,
            reason: r.reason,
            created_at: r.created_at,
            waiting_for_slot: r.waiting_for_slot,
        }
    }
}
