//! The `threads` import: the core's threads and retry queue as Provider Retry sees them.
//! The host only carries the calls; what answers them is a [`ThreadsService`] — the core,
//! in the real host, or a fake in tests. Every call names the calling plugin.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::runtime::bindings::retry::pooler::plugins::threads::{self, Host};
pub use crate::runtime::bindings::retry::pooler::plugins::threads::{
    RowMove, ThreadInfo, ThreadStatus, ThreadsError,
};
use crate::runtime::bindings::types::{QueuedRow, RowId, Timestamp};

/// What answers the `threads` import (implemented by the core). Calls are short database
/// operations, made synchronously from the plugin's call.
pub trait ThreadsService: Send + Sync + 'static {
    /// `get-thread`: read `thread` for the plugin `caller`.
    fn get_thread(&self, caller: &str, thread: &str) -> Result<ThreadInfo, ThreadsError>;
    /// `schedule-retry`: queue a retry of `failed_request` at `send_at`; refused unless it is the
    /// latest request of a thread in `error` whose chain has no live row.
    fn schedule_retry(
        &self,
        caller: &str,
        thread: &str,
        failed_request: &str,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    /// `reschedule`: refused with `no-such-row` unless `row` is a live row of `thread`.
    fn reschedule(
        &self,
        caller: &str,
        thread: &str,
        row: RowId,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    /// `cancel`: refused with `no-such-row` unless `row` is a live row of `thread`.
    fn cancel(
        &self,
        caller: &str,
        thread: &str,
        row: RowId,
        reason: &str,
    ) -> Result<(), ThreadsError>;
    /// `list-rows`: the live rows of `thread`, or of every thread, ordered by send time.
    fn list_rows(&self, caller: &str, thread: Option<&str>)
    -> Result<Vec<QueuedRow>, ThreadsError>;

    /// `get-threads`; by default one `get_thread` per id.
    fn get_threads(
        &self,
        caller: &str,
        threads: &[String],
    ) -> Vec<Result<ThreadInfo, ThreadsError>> {
        threads.iter().map(|t| self.get_thread(caller, t)).collect()
    }

    /// `reschedule-many`; by default one `reschedule` per move (a service whose moves can
    /// share a commit should override it).
    fn reschedule_many(
        &self,
        caller: &str,
        moves: &[RowMove],
    ) -> Vec<Result<QueuedRow, ThreadsError>> {
        moves
            .iter()
            .map(|m| self.reschedule(caller, &m.thread, m.row, m.send_at, &m.reason))
            .collect()
    }
}

/// The service of a host built without a core: every call is refused with a storage error
/// (transient, per the contract), so a plugin keeps its work for later.
pub struct NoCore;

impl NoCore {
    fn refuse<T>() -> Result<T, ThreadsError> {
        Err(ThreadsError::Storage(
            "this host runs without a core; threads are unavailable".into(),
        ))
    }
}

impl ThreadsService for NoCore {
    fn get_thread(&self, _: &str, _: &str) -> Result<ThreadInfo, ThreadsError> {
        Self::refuse()
    }
    fn schedule_retry(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Timestamp,
        _: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        Self::refuse()
    }
    fn reschedule(
        &self,
        _: &str,
        _: &str,
        _: RowId,
        _: Timestamp,
        _: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        Self::refuse()
    }
    fn cancel(&self, _: &str, _: &str, _: RowId, _: &str) -> Result<(), ThreadsError> {
        Self::refuse()
    }
    fn list_rows(&self, _: &str, _: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError> {
        Self::refuse()
    }
}

/// Per-instance state: the caller, the service, and the refusals already reported.
pub struct ThreadsCtx {
    plugin: Arc<str>,
    service: Arc<dyn ThreadsService>,
    reported: Vec<(&'static str, &'static str)>,
}

/// The rule a refused call broke, for the refusals that are the plugin's doing (an id the
/// core does not know, an invalid argument); `None` for the ordinary races of a live queue
/// (the turn is no longer the failed one, the chain is already queued, the thread was
/// archived) and for storage failures, which the core logs.
pub fn broken_rule(e: &ThreadsError) -> Option<&'static str> {
    match e {
        ThreadsError::NoSuchThread(_) => Some("a thread id must name one of the core's threads"),
        ThreadsError::NoSuchRow(_) => Some("a row id must name a live row of the thread named"),
        ThreadsError::InvalidArgument(_) => Some("threads arguments within the contract's bounds"),
        ThreadsError::NoFailedTurn
        | ThreadsError::AlreadyQueued(_)
        | ThreadsError::Archived
        | ThreadsError::Storage(_) => None,
    }
}

impl ThreadsCtx {
    /// The state of one instance of `plugin`, whose `threads` calls `service` answers.
    pub fn new(plugin: Arc<str>, service: Arc<dyn ThreadsService>) -> Self {
        ThreadsCtx {
            plugin,
            service,
            reported: Vec::new(),
        }
    }

    /// Warn about a refusal that is the plugin's doing, once per call name and rule in this
    /// instance (a plugin looping over unknown ids gets one line, not thousands).
    fn report<T>(&mut self, call: &'static str, result: &Result<T, ThreadsError>) {
        let Err(e) = result else { return };
        let Some(rule) = broken_rule(e) else { return };
        if self.reported.contains(&(call, rule)) {
            return;
        }
        self.reported.push((call, rule));
        tracing::warn!(plugin = &*self.plugin, call, rule, error = ?e, "threads call refused (said once per call and rule)");
    }

    fn answer<T>(
        &mut self,
        call: &'static str,
        result: Result<T, ThreadsError>,
    ) -> Result<T, ThreadsError> {
        self.report(call, &result);
        result
    }
}

struct ThreadsImport;
impl HasData for ThreadsImport {
    type Data<'a> = &'a mut ThreadsCtx;
}

/// Add the `threads` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> &mut ThreadsCtx,
) -> wasmtime::Result<()> {
    threads::add_to_linker::<T, ThreadsImport>(linker, view)
}

impl Host for &mut ThreadsCtx {
    fn get_thread(&mut self, thread: String) -> wasmtime::Result<Result<ThreadInfo, ThreadsError>> {
        let result = self.service.get_thread(&self.plugin, &thread);
        Ok(self.answer("get-thread", result))
    }

    fn schedule_retry(
        &mut self,
        thread: String,
        failed_request: String,
        send_at: Timestamp,
        reason: String,
    ) -> wasmtime::Result<Result<QueuedRow, ThreadsError>> {
        let result =
            self.service
                .schedule_retry(&self.plugin, &thread, &failed_request, send_at, &reason);
        Ok(self.answer("schedule-retry", result))
    }

    fn reschedule(
        &mut self,
        thread: String,
        row: RowId,
        send_at: Timestamp,
        reason: String,
    ) -> wasmtime::Result<Result<QueuedRow, ThreadsError>> {
        let result = self
            .service
            .reschedule(&self.plugin, &thread, row, send_at, &reason);
        Ok(self.answer("reschedule", result))
    }

    fn cancel(
        &mut self,
        thread: String,
        row: RowId,
        reason: String,
    ) -> wasmtime::Result<Result<(), ThreadsError>> {
        let result = self.service.cancel(&self.plugin, &thread, row, &reason);
        Ok(self.answer("cancel", result))
    }

    fn list_rows(
        &mut self,
        thread: Option<String>,
    ) -> wasmtime::Result<Result<Vec<QueuedRow>, ThreadsError>> {
        let result = self.service.list_rows(&self.plugin, thread.as_deref());
        Ok(self.answer("list-rows", result))
    }

    fn get_threads(
        &mut self,
        threads: Vec<String>,
    ) -> wasmtime::Result<Vec<Result<ThreadInfo, ThreadsError>>> {
        let answers = self.service.get_threads(&self.plugin, &threads);
        answers.iter().for_each(|a| self.report("get-threads", a));
        Ok(answers)
    }

    fn reschedule_many(
        &mut self,
        moves: Vec<RowMove>,
    ) -> wasmtime::Result<Vec<Result<QueuedRow, ThreadsError>>> {
        let answers = self.service.reschedule_many(&self.plugin, &moves);
        answers
            .iter()
            .for_each(|a| self.report("reschedule-many", a));
        Ok(answers)
    }
}
