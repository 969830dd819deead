//! Errors of the core. [`ThreadsError`] is the plugins' kit's: the WIT `threads-error` case
//! for case, plus [`ThreadsError::RowOfOtherThread`], which a plugin is answered as
//! `no-such-row` (the host logs the owner); [`CoreError`] covers the host- and
//! person-facing operations (turns, due loop, send-now, outbox).

use crate::model::RowId;

/// Why a `threads` call was refused (WIT `threads-error`): the plugins' kit's, one
/// definition for the core and Provider Retry.
pub use pooler_plugin_kit::ThreadsError;

/// Why a host- or person-facing core operation was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error("no thread {0}")]
    NoSuchThread(String),
    #[error("no turn request {0}")]
    NoSuchRequest(String),
    #[error("no live row {0}")]
    NoSuchRow(RowId),
    #[error("the thread is archived")]
    Archived,
    /// A turn is running on the thread; a second one may not start.
    #[error("thread {0} is running a turn")]
    ThreadBusy(String),
    /// Send-now found no live retry row for the thread.
    #[error("no pending retry exists for {0}")]
    NoPendingRetry(String),
    /// The claim is no longer valid: the row was rescheduled, cancelled, sent by a person or
    /// released since it was claimed. The host must not dispatch it.
    #[error("row {0} is no longer claimed by this dispatch")]
    ClaimLost(RowId),
    /// The request is not running (never started, or already finished).
    #[error("turn request {0} is not running")]
    NotRunning(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The core's database or data directory failed.
    #[error("core storage: {0}")]
    Storage(String),
}

impl From<rusqlite::Error> for CoreError {
    fn from(e: rusqlite::Error) -> Self {
        CoreError::Storage(e.to_string())
    }
}

impl From<std::io::Error> for CoreError {
    fn from(e: std::io::Error) -> Self {
        CoreError::Storage(e.to_string())
    }
}

impl From<ThreadsError> for CoreError {
    fn from(e: ThreadsError) -> Self {
        match e {
            ThreadsError::NoSuchThread(t) => CoreError::NoSuchThread(t),
            ThreadsError::NoSuchRow(r) | ThreadsError::RowOfOtherThread { row: r, .. } => {
                CoreError::NoSuchRow(r)
            }
            ThreadsError::Archived => CoreError::Archived,
            ThreadsError::InvalidArgument(m) => CoreError::InvalidArgument(m),
            ThreadsError::Storage(m) => CoreError::Storage(m),
            ThreadsError::NoFailedTurn => {
                CoreError::InvalidArgument("the thread has no failed latest turn".into())
            }
            ThreadsError::AlreadyQueued(r) => {
                CoreError::InvalidArgument(format!("the chain already has live row {r}"))
            }
        }
    }
}
