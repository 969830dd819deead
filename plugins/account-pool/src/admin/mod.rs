//! The pool's non-HTTP operations, as plain Rust over the store: accounts (add, import,
//! remove, enable, disable, priority, reorder, refresh, list), settings, routes and
//! session explanations, the availability answer, the maintenance tick, and taking the
//! coalesced availability-changed signals for delivery.
//!
//! One file per exported WIT interface:
//!
//! | part | interface |
//! |---|---|
//! | [`accounts`] | `accounts` |
//! | [`settings`] | `settings` |
//! | [`routing`] | `routing` |
//! | [`availability`] | `availability` |
//! | [`maintenance`] | `maintenance` |

mod accounts;
mod availability;
mod maintenance;
mod routing;
mod settings;

pub use accounts::{AccountInfo, AccountsError, NewAccount, WindowInfo};
pub use availability::Change;
pub use routing::{
    AttemptRecord, CODEX_TOKEN_VAR, Route, RouteSummary, RoutingError, SessionExplanation,
    SessionSummary,
};
pub use settings::{Setting, SettingsError};

use crate::engine::{Cancel, Clock, Engine, Log, Random, Upstream};
use crate::model::{ChangeCause, Provider};
use crate::store::Store;
use pooler_plugin_kit::{Db, DbError};

/// The pool's operations, borrowing its capabilities for one call.
pub struct Admin<
    'a,
    D: Db,
    U: Upstream,
    E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics,
> {
    store: Store<'a, D>,
    engine: Engine<'a, D, U, E>,
    env: &'a E,
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Admin<'a, D, U, E>
{
    /// Open the operations (migrating the schema if needed).
    pub fn new(db: &'a D, upstream: &'a U, env: &'a E) -> Result<Self, DbError> {
        let store = Store::new(db);
        store.ensure_schema()?;
        Ok(Admin {
            store,
            engine: Engine::new(db, upstream, env),
            env,
        })
    }

    /// Queue an availability-changed cause now: accounts and settings operations both
    /// change what the pool can serve.
    fn signal(&self, provider: Provider, cause: ChangeCause) -> Result<(), DbError> {
        self.store.push_signal(provider, cause, self.env.now())
    }
}
