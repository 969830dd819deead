//! What a person sees of Provider Retry's decisions: one log line per recorded step and the
//! counters `pooler_retry_decisions_total{kind,trigger}` and
//! `pooler_retry_rows_moved_total{direction}`.

use crate::common;

use common::*;
use provider_retry::ports::Level;
use provider_retry::types::{Availability, AvailabilityChange, ChangeCause, Provider};

#[test]
fn a_scheduled_row_moved_earlier_is_counted_and_logged() {
    let w = World::new();
    w.pool.set(blocked(T + 2 * H));
    let e = w.first_failure("thr_a", "thr_a_req", Some(pool_429()), true);
    w.engine().turn_failed(&e).expect("turn-failed handled");
    assert_eq!(
        w.metrics.counter(
            "pooler_retry_decisions_total",
            &[("kind", "scheduled"), ("trigger", "failure")]
        ),
        1
    );
    assert_eq!(w.metrics.counter_sum("pooler_retry_rows_moved_total"), 0);

    w.clock.advance(10 * M);
    w.pool.set(Availability::Ready);
    w.engine()
        .availability_changed(&AvailabilityChange {
            provider: Provider::Claude,
            causes: vec![ChangeCause::AccountEnabled],
            earliest: Availability::Ready,
            detected_at: w.clock.0.get(),
        })
        .expect("signal handled");
    assert_eq!(
        w.metrics.counter(
            "pooler_retry_decisions_total",
            &[("kind", "rescheduled"), ("trigger", "signal")]
        ),
        1
    );
    assert_eq!(
        w.metrics
            .counter("pooler_retry_rows_moved_total", &[("direction", "earlier")]),
        1
    );
    assert_eq!(
        w.metrics
            .counter("pooler_retry_rows_moved_total", &[("direction", "later")]),
        0
    );
    let lines = w.log.0.borrow();
    let steps: Vec<&String> = lines
        .iter()
        .filter(|(level, l)| *level == Level::Info && l.starts_with("retry step "))
        .map(|(_, l)| l)
        .collect();
    assert_eq!(steps.len(), 2, "{lines:?}");
    assert!(
        steps[0].contains("thread=thr_a") && steps[0].contains("kind=scheduled"),
        "{}",
        steps[0]
    );
    assert!(
        steps[1].contains("kind=rescheduled") && steps[1].contains("direction=earlier"),
        "{}",
        steps[1]
    );
}

#[test]
fn a_declined_failure_is_counted_by_its_kind() {
    let w = World::new();
    // A failure of a kind that is never retried: a bad request.
    let e = w.first_failure(
        "thr_b",
        "thr_b_req",
        Some(failure(
            provider_retry::types::FailureCategory::BadRequest,
            Some(400),
        )),
        true,
    );
    w.engine().turn_failed(&e).expect("turn-failed handled");
    let kinds: Vec<String> = w
        .metrics
        .counters()
        .into_iter()
        .filter(|((name, _), _)| name == "pooler_retry_decisions_total")
        .map(|((_, labels), _)| labels[0].1.clone())
        .collect();
    assert_eq!(kinds, ["declined"], "{kinds:?}");
}
