//! The quota timeline: which observations of an account's windows are kept as history (the
//! changes a chart of utilization over a day or a week shows), and for how long. Decided
//! against the previous observation the request already read, so keeping history adds no
//! read to the request path and writes only when the chart would change.

use crate::quota::Window;

/// History older than this is dropped by the maintenance tick: a week's chart, and a day
/// of margin.
pub const HISTORY_RETENTION_MS: u64 = 8 * 24 * 3_600_000;
/// At most this many history entries are kept per account (the newest), whatever their
/// age: a utilization flapping across a percent boundary cannot grow the table.
pub const HISTORY_CAP_PER_ACCOUNT: u64 = 10_000;
/// A reset that moved by no more than this is the same reset (Codex states its resets as
/// seconds from now, which jitter from one answer to the next).
pub const RESET_JITTER_MS: u64 = 60_000;

/// What the history records about an account.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryEvent {
    /// A window as observed: first seen, or its whole percent, reset or status changed.
    Window(Window),
    /// The account was held until this time (after a 429 with Retry-After, or a refused
    /// fresh token).
    Hold { until: u64 },
    /// The account went into authentication error.
    Error,
}

/// One history entry of an account.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    pub account: String,
    pub at: u64,
    pub event: HistoryEvent,
}

/// The whole percent a utilization falls in (`None` when unknown).
fn percent(u: Option<f64>) -> Option<i64> {
    u.map(|u| (u * 100.0).floor() as i64)
}

/// The windows of `after` (an account's windows once an observation was merged) a chart
/// would draw differently from `before` (the same account's windows before): first seen,
/// utilization in another whole percent, a reset moved by more than [`RESET_JITTER_MS`],
/// or another status. Comparing whole percents rather than differences keeps a slow
/// climb (a fraction of a percent per answer) in the history, one entry per percent.
pub fn changed_windows(before: &[Window], after: &[Window]) -> Vec<Window> {
    after
        .iter()
        .filter(|w| match before.iter().find(|b| b.name == w.name) {
            None => true,
            Some(b) => {
                let moved = match (b.resets_at, w.resets_at) {
                    (Some(x), Some(y)) => x.abs_diff(y) > RESET_JITTER_MS,
                    (x, y) => x.is_some() != y.is_some(),
                };
                percent(b.utilization) != percent(w.utilization) || moved || b.status != w.status
            }
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(name: &str, u: Option<f64>, resets_at: Option<u64>, status: Option<&str>) -> Window {
        Window {
            name: name.into(),
            family: None,
            utilization: u,
            resets_at,
            status: status.map(str::to_owned),
            observed_at: 0,
        }
    }

    #[test]
    fn a_first_seen_window_is_history() {
        let after = [window("5h", Some(0.1), Some(1_000_000), None)];
        assert_eq!(changed_windows(&[], &after), after.to_vec());
    }

    #[test]
    fn a_climb_within_a_percent_is_not_history_and_crossing_one_is() {
        let before = [window("5h", Some(0.101), Some(1_000_000), None)];
        let within = [window("5h", Some(0.109), Some(1_000_000), None)];
        assert!(changed_windows(&before, &within).is_empty());
        let crossed = [window("5h", Some(0.11), Some(1_000_000), None)];
        assert_eq!(changed_windows(&within, &crossed).len(), 1);
        // Unknown to known is a change too.
        let unknown = [window("5h", None, Some(1_000_000), None)];
        assert_eq!(changed_windows(&unknown, &within).len(), 1);
    }

    #[test]
    fn a_reset_is_history_when_it_moves_past_the_jitter_or_its_status_changes() {
        let before = [window(
            "primary",
            Some(0.5),
            Some(1_000_000),
            Some("allowed"),
        )];
        let jitter = [window(
            "primary",
            Some(0.5),
            Some(1_000_000 + RESET_JITTER_MS),
            Some("allowed"),
        )];
        assert!(changed_windows(&before, &jitter).is_empty());
        let moved = [window(
            "primary",
            Some(0.5),
            Some(1_000_001 + RESET_JITTER_MS),
            Some("allowed"),
        )];
        assert_eq!(changed_windows(&before, &moved).len(), 1);
        let rejected = [window(
            "primary",
            Some(0.5),
            Some(1_000_000),
            Some("rejected"),
        )];
        assert_eq!(changed_windows(&before, &rejected).len(), 1);
    }

    #[test]
    fn only_the_changed_windows_are_history() {
        let before = [
            window("5h", Some(0.2), Some(1_000), None),
            window("7d", Some(0.4), Some(9_000), None),
        ];
        let after = [
            window("5h", Some(0.25), Some(1_000), None),
            window("7d", Some(0.404), Some(9_000), None),
        ];
        let changed = changed_windows(&before, &after);
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].name, "5h");
    }
}
