//! A fake `threads` service: an in-memory table of threads and queued rows, with a record of
//! every call (caller included), standing in for the core.

use std::sync::Mutex;

use pooler_host::runtime::bindings::types::{Provider, QueuedRow, RowKind};
use pooler_host::runtime::imports::threads::{
    ThreadInfo, ThreadStatus, ThreadsError, ThreadsService,
};

#[derive(Default)]
pub struct FakeThreads {
    threads: Mutex<Vec<ThreadInfo>>,
    rows: Mutex<Vec<QueuedRow>>,
    /// Every call, as "caller: method(args)".
    pub calls: Mutex<Vec<String>>,
}

impl FakeThreads {
    /// Add a thread in `status` whose latest request is `latest`.
    pub fn add_thread(&self, id: &str, status: ThreadStatus, latest: &str) {
        self.threads.lock().unwrap().push(ThreadInfo {
            id: id.into(),
            provider: Provider::Claude,
            model: None,
            status,
            archived: false,
            retry_opt_out: false,
            latest_request: Some(latest.into()),
            input_queued: false,
            routed_by_pool: true,
        });
    }

    pub fn rows(&self) -> Vec<QueuedRow> {
        self.rows.lock().unwrap().clone()
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn thread(&self, id: &str) -> Result<ThreadInfo, ThreadsError> {
        self.threads
            .lock()
            .unwrap()
            .iter()
            .find(|t| t.id == id)
            .cloned()
            .ok_or_else(|| ThreadsError::NoSuchThread(id.into()))
    }
}

impl ThreadsService for FakeThreads {
    fn get_thread(&self, caller: &str, thread: &str) -> Result<ThreadInfo, ThreadsError> {
        self.record(format!("{caller}: get-thread({thread})"));
        self.thread(thread)
    }

    fn schedule_retry(
        &self,
        caller: &str,
        thread: &str,
        failed_request: &str,
        send_at: u64,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        self.record(format!(
            "{caller}: schedule-retry({thread}, {failed_request}, {send_at})"
        ));
        let info = self.thread(thread)?;
        if info.status != ThreadStatus::Error
            || info.latest_request.as_deref() != Some(failed_request)
        {
            return Err(ThreadsError::NoFailedTurn);
        }
        let mut rows = self.rows.lock().unwrap();
        if let Some(live) = rows.iter().find(|r| r.thread == thread) {
            return Err(ThreadsError::AlreadyQueued(live.id));
        }
        let row = QueuedRow {
            id: rows.len() as u64 + 1,
            thread: thread.into(),
            kind: RowKind::Retry,
            failed_request: failed_request.into(),
            original_request: failed_request.into(),
            attempt: 2,
            send_at,
            reason: reason.into(),
            created_at: send_at,
            waiting_for_slot: false,
        };
        rows.push(row.clone());
        Ok(row)
    }

    fn reschedule(
        &self,
        caller: &str,
        thread: &str,
        row: u64,
        send_at: u64,
        reason: &str,
    ) -> Result<QueuedRow, ThreadsError> {
        self.record(format!("{caller}: reschedule({thread}, {row}, {send_at})"));
        let mut rows = self.rows.lock().unwrap();
        // As the core: only a live row of the thread named.
        let live = rows
            .iter_mut()
            .find(|r| r.id == row && r.thread == thread)
            .ok_or(ThreadsError::NoSuchRow(row))?;
        live.send_at = send_at;
        live.reason = reason.into();
        Ok(live.clone())
    }

    fn cancel(
        &self,
        caller: &str,
        thread: &str,
        row: u64,
        _reason: &str,
    ) -> Result<(), ThreadsError> {
        self.record(format!("{caller}: cancel({thread}, {row})"));
        let mut rows = self.rows.lock().unwrap();
        let before = rows.len();
        rows.retain(|r| r.id != row || r.thread != thread);
        if rows.len() == before {
            Err(ThreadsError::NoSuchRow(row))
        } else {
            Ok(())
        }
    }

    fn list_rows(
        &self,
        caller: &str,
        thread: Option<&str>,
    ) -> Result<Vec<QueuedRow>, ThreadsError> {
        self.record(format!("{caller}: list-rows({thread:?})"));
        let mut rows: Vec<QueuedRow> = self
            .rows
            .lock()
            .unwrap()
            .iter()
            .filter(|r| thread.is_none_or(|t| r.thread == t))
            .cloned()
            .collect();
        rows.sort_by_key(|r| r.send_at);
        Ok(rows)
    }
}
