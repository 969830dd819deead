//! The engine: what the plugin does on each host call. It turns failures into decisions
//! (policy), keeps the decisions true as the pool changes (re-evaluation, spec §3), answers
//! the dispatch gate and the admin calls, and records every step in the chain's history.
//!
//! State is read from and written to the database on every call (nothing is kept in memory).
//! Each event, and each candidate of a re-evaluation pass, is handled in one database
//! transaction; calls into the core (`threads`) cannot join that transaction, so every core
//! refusal that a crash between the two could cause (`already-queued`, `no-such-row`) is
//! handled by adopting what the core has.
//!
//! | module | owns |
//! |---|---|
//! | `events` | `turn-failed` and `turn-succeeded` |
//! | `pass` | the re-evaluation pass (spec §3): signal, start, tick |
//! | `dispatch` | the dispatch gate (`before-dispatch`) |
//! | `admin` | status, explain, cancel, sent by a person |
//! | `steps` | what they share: the pool, freshness, rows, closing, history |

use std::cell::RefCell;

use pooler_plugin_kit::{Db, Metrics, NoMetrics};

mod admin;
mod dispatch;
mod events;
mod pass;
mod steps;

use pass::Chunk;
pub use pass::{PASS_CHUNK, PassSummary};

use crate::policy::Random;
use crate::ports::{AvailabilityQuery, AvailabilitySource, Clock, Log, Threads};
use crate::store::{Chain, ChainState};
use crate::types::{Candidate, CandidateState, PluginError, ThreadInfo, ThreadsError};

/// Whether a chain is still the thread's current failure.
enum Freshness {
    Fresh(ThreadInfo),
    /// Stale, with the cause in stable words (`stale: newer request`).
    Stale(String),
}

/// The engine over its host capabilities. Cheap to build; build one per host call.
pub struct Engine<'a, D: Db> {
    pub db: &'a D,
    pub threads: &'a dyn Threads,
    pub pool: &'a dyn AvailabilitySource,
    pub clock: &'a dyn Clock,
    pub random: &'a dyn Random,
    pub log: &'a dyn Log,
    /// Where each recorded step is counted (`metrics` import; nothing by default).
    pub metrics: &'a dyn Metrics,
    /// The chunk of a pass in progress (empty otherwise).
    chunk: RefCell<Chunk>,
}

fn dependency(e: ThreadsError) -> PluginError {
    match e {
        ThreadsError::Storage(m) => PluginError::Dependency(format!("core storage: {m}")),
        other => PluginError::Dependency(format!("threads: {other}")),
    }
}

fn candidate(chain: &Chain) -> Option<Candidate> {
    let state = match chain.state {
        ChainState::Scheduled => CandidateState::Scheduled,
        ChainState::Watching => CandidateState::Watching,
        ChainState::Dispatched | ChainState::Resolved => return None,
    };
    Some(Candidate {
        thread: chain.thread.clone(),
        original_request: chain.original_request.clone(),
        failed_request: chain.failed_request.clone(),
        state,
        row: chain.row_id,
        send_at: chain.send_at,
        next_attempt: chain.failed_attempt + 1,
        reason: chain.reason.clone(),
        chain_started_at: chain.chain_started_at,
    })
}

/// The pool query about a chain's thread.
fn query_of(chain: &Chain) -> AvailabilityQuery {
    AvailabilityQuery {
        thread: chain.thread.clone(),
        provider: chain.provider,
        request: Some(chain.failed_request.clone()),
        model: chain.model.clone(),
    }
}

fn non_empty(what: &str, value: &str) -> Result<(), PluginError> {
    if value.is_empty() {
        return Err(PluginError::InvalidInput(format!("{what} is empty")));
    }
    Ok(())
}

impl<'a, D: Db> Engine<'a, D> {
    pub fn new(
        db: &'a D,
        threads: &'a dyn Threads,
        pool: &'a dyn AvailabilitySource,
        clock: &'a dyn Clock,
        random: &'a dyn Random,
        log: &'a dyn Log,
    ) -> Self {
        Engine {
            db,
            threads,
            pool,
            clock,
            random,
            log,
            metrics: &NoMetrics,
            chunk: RefCell::default(),
        }
    }

    /// The engine reporting every recorded step to `metrics`
    /// (`pooler_retry_decisions_total`, `pooler_retry_rows_moved_total`, see `steps`).
    pub fn with_metrics(mut self, metrics: &'a dyn Metrics) -> Self {
        self.metrics = metrics;
        self
    }
}
