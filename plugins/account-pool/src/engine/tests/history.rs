//! The quota timeline the pool keeps from what its requests observe: one entry per change
//! a chart shows, with the hold a long 429 placed.

use super::*;
use crate::history::HistoryEvent;

fn at_utilization(u: &str) -> Reply {
    with_headers(
        200,
        &[
            ("anthropic-ratelimit-unified-5h-utilization", u.into()),
            ("anthropic-ratelimit-unified-5h-status", "allowed".into()),
        ],
    )
}

#[test]
fn served_answers_keep_the_utilization_changes_and_a_long_429_its_hold() {
    let p = Pool::new();
    let a = p.add_key("a");
    let t0 = p.env.now();
    p.up.set("a", at_utilization("0.10"));
    assert_eq!(p.claude(Some("S")).status, 200);
    p.env.advance(1_000);
    // Within the same percent: the chart would not change.
    p.up.set("a", at_utilization("0.104"));
    assert_eq!(p.claude(Some("S")).status, 200);
    p.env.advance(1_000);
    p.up.set("a", at_utilization("0.25"));
    assert_eq!(p.claude(Some("S")).status, 200);
    p.env.advance(1_000);
    p.up.set("a", with_headers(429, &[("retry-after", "3600".into())]));
    p.claude(Some("S"));

    let history = p.store().quota_history(None, 0).unwrap();
    let seen: Vec<(u64, Option<f64>)> = history
        .iter()
        .filter_map(|e| match &e.event {
            HistoryEvent::Window(w) => Some((e.at - t0, w.utilization)),
            _ => None,
        })
        .collect();
    assert_eq!(seen, [(0, Some(0.10)), (2_000, Some(0.25))], "{history:?}");
    let holds: Vec<(u64, u64)> = history
        .iter()
        .filter_map(|e| match e.event {
            HistoryEvent::Hold { until } => Some((e.at - t0, until - e.at)),
            _ => None,
        })
        .collect();
    assert_eq!(holds, [(3_000, 3_600_000)], "{history:?}");
    assert!(history.iter().all(|e| e.account == a));
}
