//! One-to-one conversions between the core's plain-Rust records (`pooler_core`) and the
//! generated WIT types, and [`CoreThreads`]: the `threads` import answered by the core.
//! Both sides spell every case the same (the core stores the WIT case names), so each
//! conversion is a total match: a case added on one side fails to compile here.

use std::sync::Arc;

use pooler_core as pc;
use pooler_core::Core;

use super::Signals;
use crate::runtime::bindings::retry::exports::pooler::plugins::turn_events as events;
use crate::runtime::bindings::types as wit;
use crate::runtime::imports::threads::{
    self as wit_threads, ThreadInfo, ThreadStatus, ThreadsError, ThreadsService,
};

pub(crate) fn provider(p: pc::Provider) -> wit::Provider {
    match p {
        pc::Provider::Claude => wit::Provider::Claude,
        pc::Provider::Codex => wit::Provider::Codex,
    }
}

pub(crate) fn row(r: pc::QueuedRow) -> wit::QueuedRow {
    wit::QueuedRow {
        id: r.id,
        thread: r.thread,
        kind: match r.kind {
            pc::RowKind::Retry => wit::RowKind::Retry,
        },
        failed_request: r.failed_request,
        original_request: r.original_request,
        attempt: r.attempt,
        send_at: r.send_at,
        reason: r.reason,
        created_at: r.created_at,
        waiting_for_slot: r.waiting_for_slot,
    }
}

fn status(s: pc::ThreadStatus) -> ThreadStatus {
    match s {
        pc::ThreadStatus::Idle => ThreadStatus::Idle,
        pc::ThreadStatus::Active => ThreadStatus::Active,
        pc::ThreadStatus::Error => ThreadStatus::Error,
    }
}

pub(crate) fn thread_info(t: pc::ThreadInfo) -> ThreadInfo {
    ThreadInfo {
        id: t.id,
        provider: provider(t.provider),
        model: t.model,
        status: status(t.status),
        archived: t.archived,
        retry_opt_out: t.retry_opt_out,
        latest_request: t.latest_request,
        input_queued: t.input_queued,
        routed_by_pool: t.routed_by_pool,
    }
}

/// The `rule` of the warning for a plugin's call naming a row of another thread than the
/// one it named (the plugin is answered `no-such-row`).
pub const FOREIGN_ROW_RULE: &str = "a plugin moves or cancels only rows of the thread it names";

/// The WIT error for the core's; a row of another thread is `no-such-row` ("no live row of
/// this thread has this id").
pub(crate) fn threads_error(e: pc::ThreadsError) -> ThreadsError {
    match e {
        pc::ThreadsError::NoSuchThread(t) => ThreadsError::NoSuchThread(t),
        pc::ThreadsError::NoFailedTurn => ThreadsError::NoFailedTurn,
        pc::ThreadsError::AlreadyQueued(r) => ThreadsError::AlreadyQueued(r),
        pc::ThreadsError::NoSuchRow(r) | pc::ThreadsError::RowOfOtherThread { row: r, .. } => {
            ThreadsError::NoSuchRow(r)
        }
        pc::ThreadsError::Archived => ThreadsError::Archived,
        pc::ThreadsError::InvalidArgument(m) => ThreadsError::InvalidArgument(m),
        pc::ThreadsError::Storage(m) => ThreadsError::Storage(m),
    }
}

fn category(c: pc::FailureCategory) -> wit::FailureCategory {
    use pc::FailureCategory as C;
    use wit::FailureCategory as W;
    match c {
        C::ActiveTurnNotSteerable => W::ActiveTurnNotSteerable,
        C::BadRequest => W::BadRequest,
        C::Billing => W::Billing,
        C::BudgetExceeded => W::BudgetExceeded,
        C::ConnectionFailed => W::ConnectionFailed,
        C::ContextWindowExceeded => W::ContextWindowExceeded,
        C::Internal => W::Internal,
        C::MaxOutputTokens => W::MaxOutputTokens,
        C::MaxTurns => W::MaxTurns,
        C::Overloaded => W::Overloaded,
        C::Policy => W::Policy,
        C::RateLimit => W::RateLimit,
        C::Sandbox => W::Sandbox,
        C::StreamDisconnected => W::StreamDisconnected,
        C::StructuredOutputRetries => W::StructuredOutputRetries,
        C::ThreadRollbackFailed => W::ThreadRollbackFailed,
        C::TooManyFailedAttempts => W::TooManyFailedAttempts,
        C::Unauthorized => W::Unauthorized,
        C::Unknown => W::Unknown,
    }
}

fn origin(o: pc::FailureOrigin) -> wit::FailureOrigin {
    match o {
        pc::FailureOrigin::Provider => wit::FailureOrigin::Provider,
        pc::FailureOrigin::Pool => wit::FailureOrigin::Pool,
        pc::FailureOrigin::Transport => wit::FailureOrigin::Transport,
    }
}

fn failure(f: pc::Failure) -> wit::Failure {
    wit::Failure {
        category: category(f.category),
        provider_code: f.provider_code,
        http_status: f.http_status,
        origin: origin(f.origin),
        retry_after: f.retry_after,
        message: f.message,
    }
}

fn limit_status(s: pc::LimitStatus) -> wit::LimitStatus {
    match s {
        pc::LimitStatus::Allowed => wit::LimitStatus::Allowed,
        pc::LimitStatus::Warning => wit::LimitStatus::Warning,
        pc::LimitStatus::Blocked => wit::LimitStatus::Blocked,
        pc::LimitStatus::Unknown => wit::LimitStatus::Unknown,
    }
}

fn limit_kind(k: pc::LimitKind) -> wit::LimitKind {
    match k {
        pc::LimitKind::SubscriptionWindow => wit::LimitKind::SubscriptionWindow,
        pc::LimitKind::Credits => wit::LimitKind::Credits,
        pc::LimitKind::SpendControl => wit::LimitKind::SpendControl,
        pc::LimitKind::Unknown => wit::LimitKind::Unknown,
    }
}

fn snapshot(s: pc::RateLimitSnapshot) -> wit::RateLimitSnapshot {
    wit::RateLimitSnapshot {
        provider: provider(s.provider),
        status: limit_status(s.status),
        kind: limit_kind(s.kind),
        windows: s
            .windows
            .into_iter()
            .map(|w| wit::LimitWindow {
                key: w.key,
                label: w.label,
                status: limit_status(w.status),
                resets_at: w.resets_at,
                utilization: w.utilization,
            })
            .collect(),
        reached_reason: s.reached_reason,
        observed_at: s.observed_at,
    }
}

pub(crate) fn turn_failed(e: pc::TurnFailedEvent) -> events::TurnFailedEvent {
    events::TurnFailedEvent {
        thread: e.thread,
        provider: provider(e.provider),
        model: e.model,
        failed_request: e.failed_request,
        original_request: e.original_request,
        attempt: e.attempt,
        failed_at: e.failed_at,
        chain_started_at: e.chain_started_at,
        input_accepted: e.input_accepted,
        routed_by_pool: e.routed_by_pool,
        rate_limits: e.rate_limits.map(snapshot),
        failure: e.failure.map(failure),
    }
}

pub(crate) fn turn_succeeded(e: pc::TurnSucceededEvent) -> events::TurnSucceededEvent {
    events::TurnSucceededEvent {
        thread: e.thread,
        provider: provider(e.provider),
        request: e.request,
        original_request: e.original_request,
        attempt: e.attempt,
        succeeded_at: e.succeeded_at,
    }
}

/// The latest send time the host accepts from a plugin: 9999-12-31T23:59:59.999Z. Later
/// times (a plugin's `now + wait` saturated to `u64::MAX`, say) are moved to it: the core
/// stores times as SQLite's signed 64-bit integers, and every reader (the CLI, the status
/// page) can still show it as a date.
pub const MAX_SEND_AT: wit::Timestamp = 253_402_300_799_999;

/// How far in the past a plugin's send time may be before moving it to now is worth a
/// warning (a slightly late time is ordinary: "as soon as the gates allow").
pub const FAR_PAST_MS: u64 = 24 * 3_600_000;

/// A send time a plugin gave, made one the core can keep: a time more than
/// [`FAR_PAST_MS`] in the past becomes `now` (the contract's "as soon as the gates allow";
/// a nearer past time is kept as given, and means the same), a time past [`MAX_SEND_AT`]
/// becomes it. The second value names the rule when the time was changed.
pub fn bound_send_at(
    send_at: wit::Timestamp,
    now: wit::Timestamp,
) -> (wit::Timestamp, Option<&'static str>) {
    if send_at > MAX_SEND_AT {
        return (
            MAX_SEND_AT,
            Some("send-at after year 9999 is moved to 9999-12-31"),
        );
    }
    if now.saturating_sub(send_at) > FAR_PAST_MS {
        return (now, Some("send-at far in the past is moved to now"));
    }
    (send_at, None)
}

/// The `threads` import answered from the core's database. A change to the queue wakes the
/// due loop, so a row scheduled or moved earlier is seen without waiting for the old
/// deadline.
pub struct CoreThreads {
    core: Arc<Core>,
    signals: Arc<Signals>,
}

impl CoreThreads {
    pub(crate) fn new(core: Arc<Core>, signals: Arc<Signals>) -> Self {
        CoreThreads { core, signals }
    }

    fn answer<T>(
        &self,
        caller: &str,
        call: &str,
        changes_queue: bool,
        result: Result<T, pc::ThreadsError>,
    ) -> Result<T, ThreadsError> {
        match &result {
            Ok(_) if changes_queue => self.signals.due(),
            Ok(_) => {}
            Err(e) => tracing::debug!(plugin = caller, call, error = %e, "threads call refused"),
        }
        result.map_err(threads_error)
    }

    /// `send_at` as the core will keep it ([`bound_send_at`]), with a warning naming the
    /// plugin and the rule when it was absurd.
    fn bounded(
        &self,
        caller: &str,
        call: &str,
        row: Option<wit::RowId>,
        send_at: wit::Timestamp,
    ) -> wit::Timestamp {
        let (bounded, rule) = bound_send_at(send_at, self.core.clock().now_ms());
        if let Some(rule) = rule {
            tracing::warn!(
                plugin = caller,
                call,
                row,
                asked = send_at,
                kept = bounded,
                rule,
                "plugin's send time bounded"
            );
        }
        bounded
    }

    /// Warn about a refusal for naming another thread's row (the plugin sees only
    /// `no-such-row`): the plugin, the row, the thread it named and the thread that owns the
    /// row. `more` is how many further moves of the same call were refused alike (a
    /// `reschedule-many` gets one line, not one per move).
    fn warn_foreign(
        &self,
        caller: &str,
        call: &str,
        thread: &str,
        result: &Result<impl Sized, pc::ThreadsError>,
        more: usize,
    ) {
        if let Err(pc::ThreadsError::RowOfOtherThread { row, owner }) = result {
            tracing::warn!(
                plugin = caller,
                call,
                row,
                thread,
                owner = owner.as_str(),
                more,
                rule = FOREIGN_ROW_RULE,
                "threads call refused: the row is another thread's; nothing changed"
            );
        }
    }

    /// Like [`Self::answer`] for a call that leaves a row at a send time: the due loop is
    /// woken only if that time is earlier than its armed timer.
    fn answer_row(
        &self,
        caller: &str,
        call: &str,
        result: Result<wit::QueuedRow, pc::ThreadsError>,
    ) -> Result<wit::QueuedRow, ThreadsError> {
        if let Ok(row) = &result {
            self.signals.due_at(row.send_at);
        }
        self.answer(caller, call, false, result)
    }
}

impl ThreadsService for CoreThreads {
    fn get_thread(&self, caller: &str, thread: &str) -> Result<ThreadInfo, ThreadsError> {
        let result = self.core.get_thread(thread).map(thread_info);
        self.answer(caller, "get-thread", false, result)
    }

    fn schedule_retry(
        &self,
        caller: &str,
        thread: &str,
        failed_request: &str,
        send_at: wit::Timestamp,
        reason: &str,
    ) -> Result<wit::QueuedRow, ThreadsError> {
        let send_at = self.bounded(caller, "schedule-retry", None, send_at);
        let result = self
            .core
            .schedule_retry(thread, failed_request, send_at, reason)
            .map(row);
        self.answer_row(caller, "schedule-retry", result)
    }

    fn reschedule(
        &self,
        caller: &str,
        thread: &str,
        id: wit::RowId,
        send_at: wit::Timestamp,
        reason: &str,
    ) -> Result<wit::QueuedRow, ThreadsError> {
        let send_at = self.bounded(caller, "reschedule", Some(id), send_at);
        let result = self.core.reschedule(thread, id, send_at, reason).map(row);
        self.warn_foreign(caller, "reschedule", thread, &result, 0);
        self.answer_row(caller, "reschedule", result)
    }

    fn cancel(
        &self,
        caller: &str,
        thread: &str,
        id: wit::RowId,
        reason: &str,
    ) -> Result<(), ThreadsError> {
        let result = self.core.cancel(thread, id, reason);
        self.warn_foreign(caller, "cancel", thread, &result, 0);
        self.answer(caller, "cancel", true, result)
    }

    fn list_rows(
        &self,
        caller: &str,
        thread: Option<&str>,
    ) -> Result<Vec<wit::QueuedRow>, ThreadsError> {
        let result = self
            .core
            .list_rows(thread)
            .map(|rows| rows.into_iter().map(row).collect());
        self.answer(caller, "list-rows", false, result)
    }

    fn get_threads(
        &self,
        caller: &str,
        threads: &[String],
    ) -> Vec<Result<ThreadInfo, ThreadsError>> {
        let ids: Vec<&str> = threads.iter().map(String::as_str).collect();
        self.core
            .get_threads(&ids)
            .into_iter()
            .map(|r| self.answer(caller, "get-threads", false, r.map(thread_info)))
            .collect()
    }

    fn reschedule_many(
        &self,
        caller: &str,
        moves: &[wit_threads::RowMove],
    ) -> Vec<Result<wit::QueuedRow, ThreadsError>> {
        let moves: Vec<pc::RowMove> = moves
            .iter()
            .map(|m| pc::RowMove {
                thread: m.thread.clone(),
                row: m.row,
                send_at: self.bounded(caller, "reschedule-many", Some(m.row), m.send_at),
                reason: m.reason.clone(),
            })
            .collect();
        let answers = self.core.reschedule_many(&moves);
        let foreign = |r: &&Result<_, pc::ThreadsError>| {
            matches!(r, Err(pc::ThreadsError::RowOfOtherThread { .. }))
        };
        let refused = answers.iter().filter(foreign).count();
        if let Some((m, first)) = moves.iter().zip(&answers).find(|(_, r)| foreign(r)) {
            self.warn_foreign(caller, "reschedule-many", &m.thread, first, refused - 1);
        }
        answers
            .into_iter()
            .map(|r| self.answer_row(caller, "reschedule-many", r.map(row)))
            .collect()
    }
}
