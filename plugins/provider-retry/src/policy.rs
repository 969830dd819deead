//! The retry policy of spec §2: a pure function from a failed turn, the pool's answer, the
//! settings, the time and a random source to a decision — plus the send-time formulas that
//! re-evaluation (`engine`) shares with it, so a first decision and a later move of the same
//! row always compute times the same way.
//!
//! The rows of the table are checked strictly in order; the first that matches decides.

use std::fmt;

use pooler_plugin_kit::time::after;

use crate::settings::Settings;
use crate::types::{
    Availability, Failure, FailureCategory, FailureOrigin, LimitStatus, RateLimitSnapshot,
    Timestamp, TurnFailedEvent, UnavailableReason,
};

/// A source of randomness: uniformly distributed 64-bit values.
///
/// `&self` because the WASI source is stateless; fakes use interior mutability.
pub trait Random {
    fn next_u64(&self) -> u64;
}

/// A uniform draw in `0..bound` (0 when `bound` is 0).
///
/// The 64-bit value is read as a fraction r ∈ [0, 1) and scaled, `floor(r × bound)`, which
/// is the original plugin's `floor(random × range)`: r = 0 gives 0, the largest value gives
/// `bound − 1`.
pub fn draw(random: &dyn Random, bound: u64) -> u64 {
    ((u128::from(random.next_u64()) * u128::from(bound)) >> 64) as u64
}

/// What the pool said when asked, as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAnswer {
    /// The pool was not asked (the failure is not rate limited, or not routed by the pool).
    NotAsked,
    /// The pool answered.
    Answered(Availability),
    /// The query failed or took longer than the availability timeout.
    Failed,
}

impl PoolAnswer {
    /// The availability to record in the history (a failed query reads as
    /// `unavailable(source-unavailable)`, as the host would have answered).
    pub fn seen(self) -> Option<Availability> {
        match self {
            PoolAnswer::NotAsked => None,
            PoolAnswer::Answered(a) => Some(a),
            PoolAnswer::Failed => Some(Availability::Unavailable(
                UnavailableReason::SourceUnavailable,
            )),
        }
    }
}

/// Why a retry was scheduled, in stable words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleReason {
    /// Rate limited; the pool is ready now.
    PoolReady,
    /// Rate limited; the pool is blocked until a known time.
    PoolBlocked,
    /// Rate limited, not routed by the pool; the failure stated a retry-after.
    RetryAfter,
    /// Rate limited, not routed; the provider snapshot's latest blocked window resets.
    SnapshotReset,
    /// Rate limited with nothing known about the reset: exponential backoff.
    RateLimitBackoff,
    /// A temporary failure of this category: exponential backoff (or its retry-after).
    Temporary(FailureCategory),
}

impl fmt::Display for ScheduleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleReason::PoolReady => f.write_str("rate-limited: pool ready"),
            ScheduleReason::PoolBlocked => f.write_str("rate-limited: pool reset"),
            ScheduleReason::RetryAfter => f.write_str("rate-limited: retry-after"),
            ScheduleReason::SnapshotReset => f.write_str("rate-limited: window reset"),
            ScheduleReason::RateLimitBackoff => f.write_str("rate-limited: backoff"),
            ScheduleReason::Temporary(c) => write!(f, "temporary: {}", c.as_str()),
        }
    }
}

/// Why a candidate is kept open without a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchReason {
    BeyondMaximumWait,
    PoolUnavailable(UnavailableReason),
    SourceUnavailable,
}

impl fmt::Display for WatchReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchReason::BeyondMaximumWait => f.write_str("beyond-maximum-wait"),
            WatchReason::PoolUnavailable(r) => write!(f, "pool-unavailable({})", r.as_str()),
            WatchReason::SourceUnavailable => f.write_str("source-unavailable"),
        }
    }
}

/// Why a failure gets no retry, for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclineReason {
    OptedOut,
    AttemptsExhausted,
    NotRetryable,
    BeyondMaximumWait,
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeclineReason::OptedOut => "opted-out",
            DeclineReason::AttemptsExhausted => "attempts-exhausted",
            DeclineReason::NotRetryable => "not-retryable",
            DeclineReason::BeyondMaximumWait => "beyond-maximum-wait",
        })
    }
}

/// The policy's verdict on one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Schedule one retry row at `send_at`.
    Schedule {
        send_at: Timestamp,
        reason: ScheduleReason,
    },
    /// Declined for now; re-evaluation revisits it until T0 + maximum wait.
    Watch(WatchReason),
    /// Declined for good.
    Decline(DeclineReason),
}

/// Rate limited in the sense of spec §2 row 4: category `rate-limit`, or HTTP 429 under any
/// category (Codex `too-many-failed-attempts` that gave up on 429s).
pub fn is_rate_limited(failure: &Failure) -> bool {
    failure.category == FailureCategory::RateLimit || failure.http_status == Some(429)
}

/// Categories (and statuses) that no wait can fix: spec §2 row 3.
fn never_retry(failure: &Failure) -> bool {
    use FailureCategory::*;
    matches!(failure.http_status, Some(401 | 403))
        || matches!(
            failure.category,
            Unauthorized
                | Billing
                | BadRequest
                | Policy
                | ContextWindowExceeded
                | MaxOutputTokens
                | MaxTurns
                | BudgetExceeded
                | Sandbox
                | StructuredOutputRetries
                | ThreadRollbackFailed
                | ActiveTurnNotSteerable
        )
}

/// Temporary failures of spec §2 row 5. A pool-origin 5xx means the pool could not reach
/// upstream, which is as temporary as the upstream's own 5xx.
fn is_temporary(failure: &Failure) -> bool {
    use FailureCategory::*;
    let server_error = failure.http_status.is_some_and(|s| (500..600).contains(&s));
    matches!(
        failure.category,
        Overloaded | Internal | ConnectionFailed | StreamDisconnected | TooManyFailedAttempts
    ) || (failure.category == Unknown && server_error)
        || (failure.origin == FailureOrigin::Pool && server_error)
}

/// Whether `decide` needs the pool's answer for this event: a rate-limited failure that
/// went through the pool and is not settled by an earlier row of the table.
pub fn wants_availability(event: &TurnFailedEvent, settings: &Settings, opted_out: bool) -> bool {
    match &event.failure {
        Some(f) => {
            !opted_out
                && event.attempt < settings.attempt_cap
                && !never_retry(f)
                && is_rate_limited(f)
                && event.routed_by_pool
        }
        None => false,
    }
}

/// Reset-based send time: a reset already past counts as now (never send in the past), then
/// the buffer and a fresh jitter draw.
pub fn reset_send_at(
    reset: Timestamp,
    now: Timestamp,
    s: &Settings,
    random: &dyn Random,
) -> Timestamp {
    after(
        after(reset.max(now), s.reset_buffer_ms),
        draw(random, s.reset_jitter_ms),
    )
}

/// Backoff send time for the retry after failed attempt `attempt`:
/// d = base × 2^(attempt−1), send at now + d + random(0..d).
pub fn backoff_send_at(
    attempt: u32,
    now: Timestamp,
    s: &Settings,
    random: &dyn Random,
) -> Timestamp {
    let exponent = attempt.saturating_sub(1).min(32);
    let d = s.backoff_base_ms.saturating_mul(1u64 << exponent);
    after(after(now, d), draw(random, d))
}

/// Whether a reset (or deadline) lies beyond the chain's maximum wait.
pub fn beyond_maximum_wait(reset: Timestamp, chain_started_at: Timestamp, s: &Settings) -> bool {
    s.expiry(chain_started_at).is_some_and(|e| reset > e)
}

/// The latest reset among the snapshot's blocked windows (all windows when the snapshot is
/// blocked but no single window says so), if the snapshot is blocked at all.
pub fn snapshot_reset(snapshot: &RateLimitSnapshot) -> Option<Timestamp> {
    if snapshot.status != LimitStatus::Blocked {
        return None;
    }
    let blocked = snapshot
        .windows
        .iter()
        .filter(|w| w.status == LimitStatus::Blocked)
        .filter_map(|w| w.resets_at)
        .max();
    blocked.or_else(|| snapshot.windows.iter().filter_map(|w| w.resets_at).max())
}

/// The decision for a rate-limited failure that the pool does not route (or says it does
/// not): the failure's retry-after, else the snapshot's latest blocked reset, else backoff.
fn not_routed(
    event: &TurnFailedEvent,
    failure: &Failure,
    s: &Settings,
    now: Timestamp,
    random: &dyn Random,
) -> Decision {
    let snapshot_reset = event
        .rate_limits
        .as_ref()
        .filter(|snap| snap.provider == event.provider)
        .and_then(snapshot_reset);
    let (reset, reason) = match (failure.retry_after, snapshot_reset) {
        (Some(at), _) => (at, ScheduleReason::RetryAfter),
        (None, Some(at)) => (at, ScheduleReason::SnapshotReset),
        (None, None) => {
            return Decision::Schedule {
                send_at: backoff_send_at(event.attempt, now, s, random),
                reason: ScheduleReason::RateLimitBackoff,
            };
        }
    };
    if beyond_maximum_wait(reset, event.chain_started_at, s) {
        return Decision::Decline(DeclineReason::BeyondMaximumWait);
    }
    Decision::Schedule {
        send_at: reset_send_at(reset, now, s, random),
        reason,
    }
}

/// The policy: spec §2, rows 1–6 in order.
///
/// `opted_out` is the thread's per-thread opt-out (read from the core, it is not part of the
/// event). `pool` is the pool's answer when [`wants_availability`] asked for one.
pub fn decide(
    event: &TurnFailedEvent,
    opted_out: bool,
    pool: PoolAnswer,
    s: &Settings,
    now: Timestamp,
    random: &dyn Random,
) -> Decision {
    // 1. Opt-out.
    if opted_out {
        return Decision::Decline(DeclineReason::OptedOut);
    }
    // 2. Attempt cap.
    if event.attempt >= s.attempt_cap {
        return Decision::Decline(DeclineReason::AttemptsExhausted);
    }
    // 3. Never retry.
    let Some(failure) = &event.failure else {
        return Decision::Decline(DeclineReason::NotRetryable);
    };
    if never_retry(failure) {
        return Decision::Decline(DeclineReason::NotRetryable);
    }
    // 4. Rate limited.
    if is_rate_limited(failure) {
        if !event.routed_by_pool {
            return not_routed(event, failure, s, now, random);
        }
        return match pool {
            PoolAnswer::Answered(Availability::Ready) => Decision::Schedule {
                send_at: reset_send_at(now, now, s, random),
                reason: ScheduleReason::PoolReady,
            },
            PoolAnswer::Answered(Availability::Blocked { retry_at, .. }) => {
                if beyond_maximum_wait(retry_at, event.chain_started_at, s) {
                    Decision::Watch(WatchReason::BeyondMaximumWait)
                } else {
                    Decision::Schedule {
                        send_at: reset_send_at(retry_at, now, s, random),
                        reason: ScheduleReason::PoolBlocked,
                    }
                }
            }
            PoolAnswer::Answered(Availability::Unavailable(
                UnavailableReason::SourceUnavailable,
            ))
            | PoolAnswer::Failed
            | PoolAnswer::NotAsked => Decision::Watch(WatchReason::SourceUnavailable),
            PoolAnswer::Answered(Availability::Unavailable(reason)) => {
                Decision::Watch(WatchReason::PoolUnavailable(reason))
            }
            PoolAnswer::Answered(Availability::NotRouted) => {
                not_routed(event, failure, s, now, random)
            }
        };
    }
    // 5. Temporary: backoff; a later retry-after wins.
    if is_temporary(failure) {
        if let Some(at) = failure.retry_after
            && beyond_maximum_wait(at, event.chain_started_at, s)
        {
            return Decision::Decline(DeclineReason::BeyondMaximumWait);
        }
        let backoff = backoff_send_at(event.attempt, now, s, random);
        return Decision::Schedule {
            send_at: failure.retry_after.map_or(backoff, |at| at.max(backoff)),
            reason: ScheduleReason::Temporary(failure.category),
        };
    }
    // 6. Anything else.
    Decision::Decline(DeclineReason::NotRetryable)
}

#[cfg(test)]
pub(crate) mod tests;
