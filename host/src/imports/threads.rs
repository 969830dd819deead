//! The `threads` import: the core's threads and retry queue as Provider Retry sees them.
//! The host only carries the calls; what answers them is a [`ThreadsService`] — the core,
//! in the real host, or a fake in tests. Every call names the calling plugin.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::bindings::retry::pooler::plugins::threads::{self, Host};
pub use crate::bindings::retry::pooler::plugins::threads::{
    RowMove, ThreadInfo, ThreadStatus, ThreadsError,
};
use crate::bindings::types::{QueuedRow, RowId, Timestamp};

/// What answers the `threads` import (implemented by the core). Calls are short database
/// operations, made synchronously from the plugin's call.
pub trait ThreadsService: Send + Sync + 'static {
    fn get_thread(&self, caller: &str, thread: &str) -> Result<ThreadInfo, ThreadsError>;
    fn schedule_retry(
        &self,
        caller: &str,
        thread: &str,
        failed_request: &str,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    fn reschedule(
        &self,
        caller: &str,
        row: RowId,
        send_at: Timestamp,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError>;
    fn cancel(&self, caller: &str, row: RowId, reason: &str) -> Result<(), ThreadsError>;
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
            .map(|m| self.reschedule(caller, m.row, m.send_at, &m.reason))
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
        _: RowId,
        _: Timestamp,
        _: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        Self::refuse()
    }
    fn cancel(&self, _: &str, _: RowId, _: &str) -> Result<(), ThreadsError> {
        Self::refuse()
    }
    fn list_rows(&self, _: &str, _: Option<&str>) -> Result<Vec<QueuedRow>, ThreadsError> {
        Self::refuse()
    }
}

/// Per-instance state: the caller and the service.
pub struct ThreadsCtx {
    plugin: Arc<str>,
    service: Arc<dyn ThreadsService>,
}

impl ThreadsCtx {
    pub fn new(plugin: Arc<str>, service: Arc<dyn ThreadsService>) -> Self {
        ThreadsCtx { plugin, service }
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
        Ok(self.service.get_thread(&self.plugin, &thread))
    }

    fn schedule_retry(
        &mut self,
        thread: String,
        failed_request: String,
        send_at: Timestamp,
        reason: String,
    ) -> wasmtime::Result<Result<QueuedRow, ThreadsError>> {
        Ok(self
            .service
            .schedule_retry(&self.plugin, &thread, &failed_request, send_at, &reason))
    }

    fn reschedule(
        &mut self,
        row: RowId,
        send_at: Timestamp,
        reason: String,
    ) -> wasmtime::Result<Result<QueuedRow, ThreadsError>> {
        Ok(self.service.reschedule(&self.plugin, row, send_at, &reason))
    }

    fn cancel(&mut self, row: RowId, reason: String) -> wasmtime::Result<Result<(), ThreadsError>> {
        Ok(self.service.cancel(&self.plugin, row, &reason))
    }

    fn list_rows(
        &mut self,
        thread: Option<String>,
    ) -> wasmtime::Result<Result<Vec<QueuedRow>, ThreadsError>> {
        Ok(self.service.list_rows(&self.plugin, thread.as_deref()))
    }

    fn get_threads(
        &mut self,
        threads: Vec<String>,
    ) -> wasmtime::Result<Vec<Result<ThreadInfo, ThreadsError>>> {
        Ok(self.service.get_threads(&self.plugin, &threads))
    }

    fn reschedule_many(
        &mut self,
        moves: Vec<RowMove>,
    ) -> wasmtime::Result<Vec<Result<QueuedRow, ThreadsError>>> {
        Ok(self.service.reschedule_many(&self.plugin, &moves))
    }
}
