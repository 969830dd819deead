//! Renders a chain's history in words for `pooler retry explain`, e.g.
//! "00:50:16  rescheduled 03:00:23 → 00:50:31 after pool availability changed (account
//! enabled)".
//!
//! Plain types in, text out, no dependencies: the host renders the same words from the WIT
//! `retry-admin.explain` data, so this module is written to be copied or moved there as is.
//! Times are UTC `HH:MM:SS`; the chain's heading carries the full date.

use crate::types::{Action, Availability, ChainHistory, HistoryEntry, Trigger};

/// `HH:MM:SS` (UTC) of a unix-epoch millisecond timestamp.
pub fn clock_time(ms: u64) -> String {
    let secs = ms / 1000;
    let day = secs % 86_400;
    format!("{:02}:{:02}:{:02}", day / 3600, day % 3600 / 60, day % 60)
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a unix-epoch millisecond timestamp.
pub fn date_time(ms: u64) -> String {
    let days = (ms / 1000 / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {} UTC", clock_time(ms))
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The availability in words.
pub fn availability_words(a: &Availability) -> String {
    match a {
        Availability::NotRouted => "not routed by the pool".to_owned(),
        Availability::Ready => "pool ready".to_owned(),
        Availability::Blocked { retry_at, .. } => {
            format!("pool blocked until {}", clock_time(*retry_at))
        }
        Availability::Unavailable(r) => format!("pool unavailable ({})", r.name()),
    }
}

fn trigger_words(t: &Trigger) -> String {
    match t {
        Trigger::Failure => "after the turn failed".to_owned(),
        Trigger::Signal(causes) if causes.is_empty() => {
            "after pool availability changed".to_owned()
        }
        Trigger::Signal(causes) => format!("after pool availability changed ({causes})"),
        Trigger::Start => "at start-up".to_owned(),
        Trigger::Tick => "at the periodic re-evaluation".to_owned(),
        Trigger::Due => "when the row came due".to_owned(),
        Trigger::Person => "by a person".to_owned(),
        Trigger::Dispatch => "after the retried turn ended".to_owned(),
    }
}

/// One entry in words, without its time.
pub fn describe(entry: &HistoryEntry) -> String {
    let action = match entry.action {
        Action::Scheduled(at) => format!("scheduled for {}", clock_time(at)),
        Action::Rescheduled(old, new) => {
            format!("rescheduled {} → {}", clock_time(old), clock_time(new))
        }
        Action::Watching => "watching".to_owned(),
        Action::Declined => "declined".to_owned(),
        Action::Dropped => "dropped".to_owned(),
        Action::Dispatched(n) => format!("dispatched as attempt {n}"),
        Action::Resolved => "resolved".to_owned(),
        Action::Unchanged => "unchanged".to_owned(),
    };
    let mut text = format!("{action} {}", trigger_words(&entry.trigger));
    let mut details: Vec<String> = Vec::new();
    if !entry.reason.is_empty() {
        details.push(entry.reason.clone());
    }
    if let Some(a) = &entry.availability {
        details.push(availability_words(a));
    }
    if !details.is_empty() {
        text.push_str(&format!(": {}", details.join("; ")));
    }
    text
}

/// A chain's history in words: a heading, then one line per entry, oldest first.
pub fn render(chain: &ChainHistory) -> String {
    let mut out = format!(
        "{} — retries of request {}",
        chain.thread, chain.original_request
    );
    if let Some(first) = chain.entries.first() {
        out.push_str(&format!(" (first entry {})", date_time(first.at)));
    }
    out.push('\n');
    if chain.entries.is_empty() {
        out.push_str("  (no history recorded)\n");
    }
    for entry in &chain.entries {
        out.push_str(&format!(
            "  {}  {}\n",
            clock_time(entry.at),
            describe(entry)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{BlockCause, UnavailableReason};

    // 2026-10-23T00:50:16Z
    const T: u64 = 1_792_716_616_000;

    fn entry(
        trigger: Trigger,
        action: Action,
        availability: Option<Availability>,
        reason: &str,
    ) -> HistoryEntry {
        HistoryEntry {
            at: T,
            trigger,
            availability,
            action,
            reason: reason.to_owned(),
        }
    }

    #[test]
    fn times_are_utc_clock_and_calendar() {
        assert_eq!(clock_time(T), "00:50:16");
        assert_eq!(date_time(T), "2026-10-23 00:50:16 UTC");
        assert_eq!(date_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(date_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn a_move_after_a_signal_reads_like_the_issue_asks() {
        let e = entry(
            Trigger::Signal("account enabled".into()),
            Action::Rescheduled(T + 7_807_000, T + 15_000),
            None,
            "",
        );
        assert_eq!(
            describe(&e),
            "rescheduled 03:00:23 → 00:50:31 after pool availability changed (account enabled)"
        );
    }

    #[test]
    fn entries_name_reason_and_availability() {
        let blocked = Availability::Blocked {
            retry_at: T + 7_783_000,
            cause: BlockCause::QuotaExhausted,
        };
        assert_eq!(
            describe(&entry(
                Trigger::Failure,
                Action::Scheduled(T + 7_807_000),
                Some(blocked),
                "rate-limited: pool reset"
            )),
            "scheduled for 03:00:23 after the turn failed: rate-limited: pool reset; pool blocked until 02:59:59"
        );
        assert_eq!(
            describe(&entry(
                Trigger::Failure,
                Action::Watching,
                Some(Availability::Unavailable(UnavailableReason::Authentication)),
                "pool-unavailable(authentication)"
            )),
            "watching after the turn failed: pool-unavailable(authentication); pool unavailable (authentication)"
        );
        assert_eq!(
            describe(&entry(
                Trigger::Due,
                Action::Dropped,
                None,
                "stale: newer request"
            )),
            "dropped when the row came due: stale: newer request"
        );
        assert_eq!(
            describe(&entry(Trigger::Person, Action::Dispatched(2), None, "")),
            "dispatched as attempt 2 by a person"
        );
    }

    #[test]
    fn render_lists_entries_under_a_dated_heading() {
        let chain = ChainHistory {
            thread: "thr_1".into(),
            original_request: "req_1".into(),
            entries: vec![
                entry(
                    Trigger::Failure,
                    Action::Scheduled(T + 60_000),
                    Some(Availability::Ready),
                    "rate-limited: pool ready",
                ),
                entry(
                    Trigger::Due,
                    Action::Dispatched(2),
                    Some(Availability::Ready),
                    "passed the dispatch gates",
                ),
            ],
        };
        let text = render(&chain);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "thr_1 — retries of request req_1 (first entry 2026-10-23 00:50:16 UTC)"
        );
        assert_eq!(
            lines[1],
            "  00:50:16  scheduled for 00:51:16 after the turn failed: rate-limited: pool ready; pool ready"
        );
        assert_eq!(
            lines[2],
            "  00:50:16  dispatched as attempt 2 when the row came due: passed the dispatch gates; pool ready"
        );
        assert_eq!(lines.len(), 3);
    }
}
