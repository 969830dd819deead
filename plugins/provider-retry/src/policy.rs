//! The retry policy of spec §2: a pure function from a failed turn, the pool's answer, the
//! settings, the time and a random source to a decision — plus the send-time formulas that
//! re-evaluation (`engine`) shares with it, so a first decision and a later move of the same
//! row always compute times the same way.
//!
//! The rows of the table are checked strictly in order; the first that matches decides.

use std::fmt;

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
            ScheduleReason::Temporary(c) => write!(f, "temporary: {}", c.name()),
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
            WatchReason::PoolUnavailable(r) => write!(f, "pool-unavailable({})", r.name()),
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
    reset
        .max(now)
        .saturating_add(s.reset_buffer_ms)
        .saturating_add(draw(random, s.reset_jitter_ms))
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
    now.saturating_add(d).saturating_add(draw(random, d))
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
pub(crate) mod tests {
    use super::*;
    use crate::types::{BlockCause, LimitKind, LimitWindow, Provider};
    use FailureCategory as C;

    /// A random source that always yields the same value.
    pub struct Fixed(pub u64);
    impl Random for Fixed {
        fn next_u64(&self) -> u64 {
            self.0
        }
    }
    /// r = 0.
    pub const ZERO: Fixed = Fixed(0);
    /// r → 1 (the largest draw).
    pub const MAX: Fixed = Fixed(u64::MAX);
    /// r = 0.5.
    pub const HALF: Fixed = Fixed(1 << 63);

    pub const NOW: u64 = 1_792_756_800_000; // 2026-10-23T12:00:00Z
    const S: u64 = 1_000;
    const H: u64 = 3_600_000;

    pub fn failure(category: FailureCategory, status: Option<u16>) -> Failure {
        Failure {
            category,
            provider_code: None,
            http_status: status,
            origin: FailureOrigin::Provider,
            retry_after: None,
            message: None,
        }
    }

    pub fn event(failure: Option<Failure>) -> TurnFailedEvent {
        TurnFailedEvent {
            thread: "thr_1".into(),
            provider: Provider::Claude,
            model: Some("claude-opus-4-1".into()),
            failed_request: "req_1".into(),
            original_request: "req_1".into(),
            attempt: 1,
            failed_at: NOW,
            chain_started_at: NOW,
            input_accepted: false,
            routed_by_pool: false,
            rate_limits: None,
            failure,
        }
    }

    fn pooled(f: Failure) -> TurnFailedEvent {
        TurnFailedEvent {
            routed_by_pool: true,
            ..event(Some(f))
        }
    }

    fn blocked(at: u64) -> PoolAnswer {
        PoolAnswer::Answered(Availability::Blocked {
            retry_at: at,
            cause: BlockCause::QuotaExhausted,
        })
    }

    fn snapshot(windows: Vec<(LimitStatus, Option<u64>)>) -> RateLimitSnapshot {
        RateLimitSnapshot {
            provider: Provider::Claude,
            status: LimitStatus::Blocked,
            kind: LimitKind::SubscriptionWindow,
            windows: windows
                .into_iter()
                .map(|(status, resets_at)| LimitWindow {
                    key: None,
                    label: None,
                    status,
                    resets_at,
                    utilization: None,
                })
                .collect(),
            reached_reason: None,
            observed_at: NOW,
        }
    }

    fn run(e: &TurnFailedEvent, pool: PoolAnswer, random: &Fixed) -> Decision {
        decide(e, false, pool, &Settings::default(), NOW, random)
    }

    fn at(send_at: u64, reason: ScheduleReason) -> Decision {
        Decision::Schedule { send_at, reason }
    }

    #[test]
    fn row_1_opted_out_threads_are_declined_before_anything_else() {
        let e = pooled(failure(C::RateLimit, Some(429)));
        let d = decide(&e, true, blocked(NOW + H), &Settings::default(), NOW, &ZERO);
        assert_eq!(d, Decision::Decline(DeclineReason::OptedOut));
        assert!(!wants_availability(&e, &Settings::default(), true));
    }

    #[test]
    fn row_2_attempt_cap_declines_every_category_at_the_cap_only() {
        for (category, status) in [
            (C::RateLimit, Some(429)),
            (C::Overloaded, Some(529)),
            (C::ConnectionFailed, None),
            (C::Unauthorized, Some(401)),
        ] {
            let mut e = event(Some(failure(category, status)));
            e.attempt = 5;
            assert_eq!(
                run(&e, PoolAnswer::NotAsked, &ZERO),
                Decision::Decline(DeclineReason::AttemptsExhausted),
                "{category:?}"
            );
        }
        // Attempt 4 (the fourth dispatch) still retries.
        let mut e = event(Some(failure(C::Overloaded, Some(529))));
        e.attempt = 4;
        assert!(matches!(
            run(&e, PoolAnswer::NotAsked, &ZERO),
            Decision::Schedule { .. }
        ));
        // The cap is a setting.
        let s = Settings {
            attempt_cap: 2,
            ..Settings::default()
        };
        e.attempt = 2;
        assert_eq!(
            decide(&e, false, PoolAnswer::NotAsked, &s, NOW, &ZERO),
            Decision::Decline(DeclineReason::AttemptsExhausted)
        );
    }

    #[test]
    fn row_3_never_retry_categories_and_401_403_are_not_retryable() {
        let never = [
            C::Unauthorized,
            C::Billing,
            C::BadRequest,
            C::Policy,
            C::ContextWindowExceeded,
            C::MaxOutputTokens,
            C::MaxTurns,
            C::BudgetExceeded,
            C::Sandbox,
            C::StructuredOutputRetries,
            C::ThreadRollbackFailed,
            C::ActiveTurnNotSteerable,
        ];
        for category in never {
            let d = run(&pooled(failure(category, None)), blocked(NOW), &ZERO);
            assert_eq!(
                d,
                Decision::Decline(DeclineReason::NotRetryable),
                "{category:?}"
            );
        }
        // 401/403 under a category that would otherwise retry, even a rate limit.
        for (category, status) in [(C::RateLimit, 403), (C::Internal, 401), (C::Unknown, 403)] {
            let d = run(
                &pooled(failure(category, Some(status))),
                PoolAnswer::Answered(Availability::Ready),
                &ZERO,
            );
            assert_eq!(
                d,
                Decision::Decline(DeclineReason::NotRetryable),
                "{category:?} {status}"
            );
        }
        assert_eq!(
            run(&event(None), PoolAnswer::NotAsked, &ZERO),
            Decision::Decline(DeclineReason::NotRetryable)
        );
    }

    #[test]
    fn row_4_pooled_rate_limit_follows_the_pool_answer() {
        let e = pooled(failure(C::RateLimit, Some(429)));
        assert!(wants_availability(&e, &Settings::default(), false));
        let table = [
            (
                PoolAnswer::Answered(Availability::Ready),
                ZERO,
                at(NOW + 15 * S, ScheduleReason::PoolReady),
            ),
            (
                blocked(NOW + 2 * H),
                ZERO,
                at(NOW + 2 * H + 15 * S, ScheduleReason::PoolBlocked),
            ),
            (
                blocked(NOW + 2 * H),
                HALF,
                at(NOW + 2 * H + 30 * S, ScheduleReason::PoolBlocked),
            ),
            (
                blocked(NOW + 6 * H),
                ZERO,
                at(NOW + 6 * H + 15 * S, ScheduleReason::PoolBlocked),
            ),
            (
                blocked(NOW + 7 * H),
                ZERO,
                Decision::Watch(WatchReason::BeyondMaximumWait),
            ),
            (
                PoolAnswer::Answered(Availability::Unavailable(UnavailableReason::Authentication)),
                ZERO,
                Decision::Watch(WatchReason::PoolUnavailable(
                    UnavailableReason::Authentication,
                )),
            ),
            (
                PoolAnswer::Answered(Availability::Unavailable(
                    UnavailableReason::NoEnabledAccount,
                )),
                ZERO,
                Decision::Watch(WatchReason::PoolUnavailable(
                    UnavailableReason::NoEnabledAccount,
                )),
            ),
            (
                PoolAnswer::Answered(Availability::Unavailable(UnavailableReason::ResetUnknown)),
                ZERO,
                Decision::Watch(WatchReason::PoolUnavailable(
                    UnavailableReason::ResetUnknown,
                )),
            ),
            (
                PoolAnswer::Answered(Availability::Unavailable(
                    UnavailableReason::SourceUnavailable,
                )),
                ZERO,
                Decision::Watch(WatchReason::SourceUnavailable),
            ),
            (
                PoolAnswer::Failed,
                ZERO,
                Decision::Watch(WatchReason::SourceUnavailable),
            ),
            // The pool says it does not route the thread: fall back to what the failure says
            // (nothing here), i.e. backoff 5–10 s.
            (
                PoolAnswer::Answered(Availability::NotRouted),
                ZERO,
                at(NOW + 5 * S, ScheduleReason::RateLimitBackoff),
            ),
        ];
        for (answer, random, expected) in table {
            assert_eq!(run(&e, answer, &random), expected, "{answer:?}");
        }
    }

    #[test]
    fn row_4_jitter_stays_strictly_inside_buffer_plus_range() {
        let e = pooled(failure(C::RateLimit, Some(429)));
        let Decision::Schedule { send_at, .. } = run(&e, blocked(NOW + H), &MAX) else {
            panic!("expected a schedule");
        };
        assert!(
            send_at > NOW + H + 15 * S && send_at < NOW + H + 45 * S,
            "{send_at}"
        );
    }

    #[test]
    fn row_4_maximum_wait_is_measured_from_the_chain_start_not_from_now() {
        // Third attempt of a chain that started 5 h ago; the pool resets in 2 h, which is
        // 7 h after T0: beyond a 6 h maximum wait although only 2 h from now.
        let mut e = pooled(failure(C::RateLimit, Some(429)));
        e.attempt = 3;
        e.chain_started_at = NOW - 5 * H;
        assert_eq!(
            run(&e, blocked(NOW + 2 * H), &ZERO),
            Decision::Watch(WatchReason::BeyondMaximumWait)
        );
        // With 24 h or no limit it schedules.
        for wait in [Some(24 * H), None] {
            let s = Settings {
                maximum_wait_ms: wait,
                ..Settings::default()
            };
            assert!(matches!(
                decide(&e, false, blocked(NOW + 2 * H), &s, NOW, &ZERO),
                Decision::Schedule { .. }
            ));
        }
    }

    #[test]
    fn row_4_codex_too_many_failed_attempts_with_429_is_a_rate_limit() {
        let mut f = failure(C::TooManyFailedAttempts, Some(429));
        f.provider_code = Some("responseTooManyFailedAttempts".into());
        let mut e = pooled(f);
        e.provider = Provider::Codex;
        assert!(wants_availability(&e, &Settings::default(), false));
        assert_eq!(
            run(&e, blocked(NOW + H), &ZERO),
            at(NOW + H + 15 * S, ScheduleReason::PoolBlocked)
        );
    }

    #[test]
    fn row_4_not_routed_prefers_retry_after_then_snapshot_then_backoff() {
        // Retry-after.
        let mut f = failure(C::RateLimit, Some(429));
        f.retry_after = Some(NOW + 120 * S);
        let mut e = event(Some(f));
        e.rate_limits = Some(snapshot(vec![(LimitStatus::Blocked, Some(NOW + H))]));
        assert_eq!(
            run(&e, PoolAnswer::NotAsked, &ZERO),
            at(NOW + 135 * S, ScheduleReason::RetryAfter)
        );
        // Snapshot: two blocked windows (session, weekly) → the later one.
        let mut e = event(Some(failure(C::RateLimit, Some(429))));
        e.rate_limits = Some(snapshot(vec![
            (LimitStatus::Blocked, Some(NOW + H)),
            (LimitStatus::Blocked, Some(NOW + 3 * H)),
            (LimitStatus::Allowed, Some(NOW + 5 * H)),
        ]));
        assert_eq!(
            run(&e, PoolAnswer::NotAsked, &ZERO),
            at(NOW + 3 * H + 15 * S, ScheduleReason::SnapshotReset)
        );
        // A reset already past sends at now + buffer, never in the past.
        e.rate_limits = Some(snapshot(vec![(LimitStatus::Blocked, Some(NOW - H))]));
        assert_eq!(
            run(&e, PoolAnswer::NotAsked, &ZERO),
            at(NOW + 15 * S, ScheduleReason::SnapshotReset)
        );
        // A snapshot that is not blocked says nothing about a reset → backoff.
        let mut allowed = snapshot(vec![(LimitStatus::Allowed, Some(NOW + H))]);
        allowed.status = LimitStatus::Allowed;
        e.rate_limits = Some(allowed);
        assert_eq!(
            run(&e, PoolAnswer::NotAsked, &ZERO),
            at(NOW + 5 * S, ScheduleReason::RateLimitBackoff)
        );
        // A snapshot of another provider is ignored.
        let mut other = snapshot(vec![(LimitStatus::Blocked, Some(NOW + H))]);
        other.provider = Provider::Codex;
        e.rate_limits = Some(other);
        assert_eq!(
            run(&e, PoolAnswer::NotAsked, &ZERO),
            at(NOW + 5 * S, ScheduleReason::RateLimitBackoff)
        );
    }

    #[test]
    fn row_4_not_routed_reset_beyond_maximum_wait_is_declined() {
        let mut e = event(Some(failure(C::RateLimit, Some(429))));
        e.rate_limits = Some(snapshot(vec![(LimitStatus::Blocked, Some(NOW + 5 * H))]));
        let one_hour = Settings {
            maximum_wait_ms: Some(H),
            ..Settings::default()
        };
        assert_eq!(
            decide(&e, false, PoolAnswer::NotAsked, &one_hour, NOW, &ZERO),
            Decision::Decline(DeclineReason::BeyondMaximumWait)
        );
        let day = Settings {
            maximum_wait_ms: Some(24 * H),
            ..Settings::default()
        };
        assert_eq!(
            decide(&e, false, PoolAnswer::NotAsked, &day, NOW, &ZERO),
            at(NOW + 5 * H + 15 * S, ScheduleReason::SnapshotReset)
        );
    }

    #[test]
    fn row_5_temporary_failures_back_off_exponentially() {
        let temporary = [
            (C::Overloaded, Some(529)),
            (C::Internal, Some(500)),
            (C::ConnectionFailed, None),
            (C::StreamDisconnected, Some(502)),
            (C::TooManyFailedAttempts, None),
            (C::Unknown, Some(503)),
        ];
        for (category, status) in temporary {
            let e = event(Some(failure(category, status)));
            assert_eq!(
                run(&e, PoolAnswer::NotAsked, &ZERO),
                at(NOW + 5 * S, ScheduleReason::Temporary(category)),
                "{category:?}"
            );
        }
        // Attempt n waits d = 5 s × 2^(n−1) plus random(0..d).
        for (attempt, d) in [(1, 5 * S), (2, 10 * S), (3, 20 * S), (4, 40 * S)] {
            let mut e = event(Some(failure(C::Overloaded, Some(529))));
            e.attempt = attempt;
            let Decision::Schedule { send_at, .. } = run(&e, PoolAnswer::NotAsked, &MAX) else {
                panic!("attempt {attempt}");
            };
            assert!(
                send_at > NOW + d && send_at < NOW + 2 * d,
                "attempt {attempt}: {send_at}"
            );
            assert_eq!(
                run(&e, PoolAnswer::NotAsked, &HALF),
                at(NOW + d + d / 2, ScheduleReason::Temporary(C::Overloaded))
            );
        }
    }

    #[test]
    fn row_5_a_later_retry_after_wins_over_backoff_and_an_earlier_one_does_not() {
        let mut f = failure(C::Internal, Some(503));
        f.retry_after = Some(NOW + 120 * S);
        assert_eq!(
            run(&event(Some(f.clone())), PoolAnswer::NotAsked, &ZERO),
            at(NOW + 120 * S, ScheduleReason::Temporary(C::Internal))
        );
        f.retry_after = Some(NOW + S);
        assert_eq!(
            run(&event(Some(f.clone())), PoolAnswer::NotAsked, &ZERO),
            at(NOW + 5 * S, ScheduleReason::Temporary(C::Internal))
        );
        f.retry_after = Some(NOW + 7 * H);
        assert_eq!(
            run(&event(Some(f)), PoolAnswer::NotAsked, &ZERO),
            Decision::Decline(DeclineReason::BeyondMaximumWait)
        );
    }

    #[test]
    fn row_5_pool_origin_5xx_is_temporary_under_any_retryable_category() {
        let mut f = failure(C::Unknown, Some(502));
        f.origin = FailureOrigin::Pool;
        assert_eq!(
            run(&event(Some(f)), PoolAnswer::NotAsked, &ZERO),
            at(NOW + 5 * S, ScheduleReason::Temporary(C::Unknown))
        );
    }

    #[test]
    fn row_6_anything_else_is_not_retryable() {
        for (category, status) in [
            (C::Unknown, None),
            (C::Unknown, Some(418)),
            (C::Unknown, Some(200)),
        ] {
            assert_eq!(
                run(
                    &event(Some(failure(category, status))),
                    PoolAnswer::NotAsked,
                    &ZERO
                ),
                Decision::Decline(DeclineReason::NotRetryable),
                "{status:?}"
            );
        }
    }

    /// PR-13: each #4839 shape, not pooled, with no snapshot.
    #[test]
    fn issue_4839_gateway_failures_each_get_one_retry_and_401_none() {
        let mut codex_attempts = failure(C::TooManyFailedAttempts, Some(429));
        codex_attempts.provider_code = Some("responseTooManyFailedAttempts".into());
        let mut codex_disconnect = failure(C::StreamDisconnected, Some(502));
        codex_disconnect.provider_code = Some("responseStreamDisconnected".into());
        let table = [
            (
                "Claude 429 without snapshot",
                failure(C::RateLimit, Some(429)),
                at(NOW + 5 * S, ScheduleReason::RateLimitBackoff),
            ),
            (
                "Claude 502",
                failure(C::Internal, Some(502)),
                at(NOW + 5 * S, ScheduleReason::Temporary(C::Internal)),
            ),
            (
                "Claude 503",
                failure(C::Internal, Some(503)),
                at(NOW + 5 * S, ScheduleReason::Temporary(C::Internal)),
            ),
            (
                "Codex too-many-failed-attempts 429",
                codex_attempts,
                at(NOW + 5 * S, ScheduleReason::RateLimitBackoff),
            ),
            (
                "Codex stream-disconnected 502",
                codex_disconnect,
                at(
                    NOW + 5 * S,
                    ScheduleReason::Temporary(C::StreamDisconnected),
                ),
            ),
            (
                "Claude 401",
                failure(C::Unauthorized, Some(401)),
                Decision::Decline(DeclineReason::NotRetryable),
            ),
            (
                "Claude 529",
                failure(C::Overloaded, Some(529)),
                at(NOW + 5 * S, ScheduleReason::Temporary(C::Overloaded)),
            ),
        ];
        for (name, f, expected) in table {
            assert_eq!(
                run(&event(Some(f)), PoolAnswer::NotAsked, &ZERO),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn draw_spans_zero_to_just_below_the_bound() {
        assert_eq!(draw(&ZERO, 30_000), 0);
        assert_eq!(draw(&MAX, 30_000), 29_999);
        assert_eq!(draw(&HALF, 30_000), 15_000);
        assert_eq!(draw(&MAX, 0), 0);
    }

    #[test]
    fn reasons_read_in_stable_words() {
        assert_eq!(
            WatchReason::PoolUnavailable(UnavailableReason::Authentication).to_string(),
            "pool-unavailable(authentication)"
        );
        assert_eq!(
            DeclineReason::AttemptsExhausted.to_string(),
            "attempts-exhausted"
        );
        assert_eq!(
            ScheduleReason::Temporary(C::Overloaded).to_string(),
            "temporary: overloaded"
        );
    }
}
