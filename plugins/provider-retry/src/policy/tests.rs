//! Tests of the decision table (row by row) and the send-time formulas, with the fixed
//! random sources and event builders they share.

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
