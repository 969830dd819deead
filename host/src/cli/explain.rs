//! The rendering in words of Provider Retry's diagnostics for `pooler retry explain`, e.g.
//! "00:50:16  rescheduled 03:00:23 → 00:50:31 after pool availability changed (account
//! enabled)". The records themselves are the admin API's ([`crate::operate::wire`], from
//! the plugin's `retry-admin` export under `/_pooler/retry/…`). Timestamps print as UTC
//! `HH:MM:SS`, and a chain's heading carries the full date.
//!
//! This is the only renderer: the plugin records its history as data (`Engine::record` and
//! `store::add_history` in `plugins/provider-retry/src/`; a signal's causes arrive as WIT
//! `change-cause`s, put in words by `host/src/operate/admin/retry.rs`), so a replacement plugin's
//! history reads the same. The tests here pin every trigger and action.

use crate::operate::wire::{ActionView, AvailabilityView, ChainView, EntryView, TriggerView};

/// `HH:MM:SS` (UTC) of a unix-epoch millisecond timestamp.
pub fn clock_time(ms: u64) -> String {
    let day = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", day / 3600, day % 3600 / 60, day % 60)
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a unix-epoch millisecond timestamp.
pub fn date_time(ms: u64) -> String {
    // `iso` is `YYYY-MM-DDTHH:MM:SSZ`.
    let iso = crate::cli::format::iso(ms);
    format!("{} {} UTC", &iso[..10], clock_time(ms))
}

/// The availability in words.
pub fn availability_words(a: &AvailabilityView) -> String {
    match a {
        AvailabilityView::NotRouted => "not routed by the pool".to_owned(),
        AvailabilityView::Ready => "pool ready".to_owned(),
        AvailabilityView::Blocked { retry_at, .. } => {
            format!("pool blocked until {}", clock_time(*retry_at))
        }
        AvailabilityView::Unavailable(reason) => format!("pool unavailable ({reason})"),
    }
}

/// What set the entry off, in words ("after the turn failed").
pub fn trigger_words(t: &TriggerView) -> String {
    match t {
        TriggerView::Failure => "after the turn failed".to_owned(),
        TriggerView::Signal(causes) if causes.is_empty() => {
            "after pool availability changed".to_owned()
        }
        TriggerView::Signal(causes) => {
            let words: Vec<&str> = causes.iter().map(|c| c.words()).collect();
            format!("after pool availability changed ({})", words.join(", "))
        }
        TriggerView::Start => "at start-up".to_owned(),
        TriggerView::Tick => "at the periodic re-evaluation".to_owned(),
        TriggerView::Due => "when the row came due".to_owned(),
        TriggerView::Person => "by a person".to_owned(),
        TriggerView::Dispatch => "after the retried turn ended".to_owned(),
    }
}

/// What was done, in words ("rescheduled 03:00:23 → 00:50:31").
pub fn action_words(a: &ActionView) -> String {
    match a {
        ActionView::Scheduled(at) => format!("scheduled for {}", clock_time(*at)),
        ActionView::Rescheduled(from, to) => {
            format!("rescheduled {} → {}", clock_time(*from), clock_time(*to))
        }
        ActionView::Watching => "watching".to_owned(),
        ActionView::Declined => "declined".to_owned(),
        ActionView::Dropped => "dropped".to_owned(),
        ActionView::Dispatched(attempt) => format!("dispatched as attempt {attempt}"),
        ActionView::Resolved => "resolved".to_owned(),
        ActionView::Unchanged => "unchanged".to_owned(),
    }
}

/// One entry in words, without its time: action, trigger, then reason and availability.
pub fn describe(entry: &EntryView) -> String {
    let mut text = format!(
        "{} {}",
        action_words(&entry.action),
        trigger_words(&entry.trigger)
    );
    let mut details: Vec<String> = Vec::new();
    if !entry.reason.is_empty() {
        details.push(entry.reason.clone());
    }
    if let Some(a) = &entry.availability {
        details.push(availability_words(a));
    }
    if !details.is_empty() {
        text.push_str(": ");
        text.push_str(&details.join("; "));
    }
    text
}

/// A chain's history in words: a heading, then one line per entry, oldest first.
pub fn render(chain: &ChainView) -> String {
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
    use crate::operate::wire::{BlockCause, ChangeCause, UnavailableReason};

    // 2026-10-23T00:50:16Z
    const T: u64 = 1_792_716_616_000;

    fn entry(
        trigger: TriggerView,
        action: ActionView,
        availability: Option<AvailabilityView>,
        reason: &str,
    ) -> EntryView {
        EntryView {
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
        assert_eq!(clock_time(T + 999), "00:50:16");
        assert_eq!(clock_time(86_399_000), "23:59:59");
        assert_eq!(date_time(T), "2026-10-23 00:50:16 UTC");
        assert_eq!(date_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(date_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn a_move_after_a_signal_reads_like_the_issue_asks() {
        let e = entry(
            TriggerView::Signal(vec![ChangeCause::AccountEnabled]),
            ActionView::Rescheduled(T + 7_807_000, T + 15_000),
            None,
            "",
        );
        assert_eq!(
            describe(&e),
            "rescheduled 03:00:23 → 00:50:31 after pool availability changed (account enabled)"
        );
    }

    #[test]
    fn every_trigger_has_its_words() {
        let cases = [
            (TriggerView::Failure, "after the turn failed"),
            (
                TriggerView::Signal(vec![ChangeCause::AccountEnabled, ChangeCause::HoldEnded]),
                "after pool availability changed (account enabled, hold ended)",
            ),
            (
                TriggerView::Signal(vec![]),
                "after pool availability changed",
            ),
            (TriggerView::Start, "at start-up"),
            (TriggerView::Tick, "at the periodic re-evaluation"),
            (TriggerView::Due, "when the row came due"),
            (TriggerView::Person, "by a person"),
            (TriggerView::Dispatch, "after the retried turn ended"),
        ];
        for (trigger, words) in cases {
            assert_eq!(trigger_words(&trigger), words, "{trigger:?}");
            assert_eq!(
                describe(&entry(trigger, ActionView::Unchanged, None, "")),
                format!("unchanged {words}")
            );
        }
    }

    #[test]
    fn every_action_has_its_words() {
        let cases = [
            (ActionView::Scheduled(T + 60_000), "scheduled for 00:51:16"),
            (
                ActionView::Rescheduled(T, T + 3_600_000),
                "rescheduled 00:50:16 → 01:50:16",
            ),
            (ActionView::Watching, "watching"),
            (ActionView::Declined, "declined"),
            (ActionView::Dropped, "dropped"),
            (ActionView::Dispatched(3), "dispatched as attempt 3"),
            (ActionView::Resolved, "resolved"),
            (ActionView::Unchanged, "unchanged"),
        ];
        for (action, words) in cases {
            assert_eq!(action_words(&action), words, "{action:?}");
            assert_eq!(
                describe(&entry(TriggerView::Tick, action, None, "")),
                format!("{words} at the periodic re-evaluation")
            );
        }
    }

    #[test]
    fn every_availability_has_its_words() {
        let cases = [
            (AvailabilityView::NotRouted, "not routed by the pool"),
            (AvailabilityView::Ready, "pool ready"),
            (
                AvailabilityView::Blocked {
                    retry_at: T + 7_783_000,
                    cause: BlockCause::QuotaExhausted,
                },
                "pool blocked until 02:59:59",
            ),
            (
                AvailabilityView::Unavailable(UnavailableReason::Authentication),
                "pool unavailable (authentication)",
            ),
        ];
        for (availability, words) in cases {
            assert_eq!(availability_words(&availability), words);
        }
    }

    #[test]
    fn entries_name_reason_and_availability() {
        let blocked = AvailabilityView::Blocked {
            retry_at: T + 7_783_000,
            cause: BlockCause::QuotaExhausted,
        };
        assert_eq!(
            describe(&entry(
                TriggerView::Failure,
                ActionView::Scheduled(T + 7_807_000),
                Some(blocked),
                "rate-limited: pool reset"
            )),
            "scheduled for 03:00:23 after the turn failed: rate-limited: pool reset; pool blocked until 02:59:59"
        );
        assert_eq!(
            describe(&entry(
                TriggerView::Failure,
                ActionView::Watching,
                Some(AvailabilityView::Unavailable(
                    UnavailableReason::Authentication
                )),
                "pool-unavailable(authentication)"
            )),
            "watching after the turn failed: pool-unavailable(authentication); pool unavailable (authentication)"
        );
        assert_eq!(
            describe(&entry(
                TriggerView::Due,
                ActionView::Dropped,
                None,
                "stale: newer request"
            )),
            "dropped when the row came due: stale: newer request"
        );
        assert_eq!(
            describe(&entry(
                TriggerView::Person,
                ActionView::Dispatched(2),
                None,
                ""
            )),
            "dispatched as attempt 2 by a person"
        );
        assert_eq!(
            describe(&entry(
                TriggerView::Start,
                ActionView::Declined,
                Some(AvailabilityView::NotRouted),
                ""
            )),
            "declined at start-up: not routed by the pool"
        );
    }

    #[test]
    fn render_lists_entries_under_a_dated_heading() {
        let chain = ChainView {
            thread: "thr_1".into(),
            original_request: "req_1".into(),
            entries: vec![
                entry(
                    TriggerView::Failure,
                    ActionView::Scheduled(T + 60_000),
                    Some(AvailabilityView::Ready),
                    "rate-limited: pool ready",
                ),
                entry(
                    TriggerView::Due,
                    ActionView::Dispatched(2),
                    Some(AvailabilityView::Ready),
                    "passed the dispatch gates",
                ),
            ],
        };
        let text = render(&chain);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "thr_1 — retries of request req_1 (first entry 2026-10-23 00:50:16 UTC)",
                "  00:50:16  scheduled for 00:51:16 after the turn failed: rate-limited: pool ready; pool ready",
                "  00:50:16  dispatched as attempt 2 when the row came due: passed the dispatch gates; pool ready",
            ]
        );
    }

    #[test]
    fn an_empty_history_says_so() {
        let chain = ChainView {
            thread: "thr_1".into(),
            original_request: "req_1".into(),
            entries: Vec::new(),
        };
        assert_eq!(
            render(&chain),
            "thr_1 — retries of request req_1\n  (no history recorded)\n"
        );
    }

    #[test]
    fn the_wire_form_names_each_variant_by_its_wit_case() {
        let e = entry(
            TriggerView::Signal(vec![ChangeCause::AccountEnabled]),
            ActionView::Rescheduled(1, 2),
            Some(AvailabilityView::Blocked {
                retry_at: 3,
                cause: BlockCause::Held,
            }),
            "rate-limited",
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "at": T,
                "trigger": {"kind": "signal", "causes": "account enabled"},
                "availability": {"kind": "blocked", "retry_at": 3, "cause": "held"},
                "action": {"kind": "rescheduled", "from": 1, "to": 2},
                "reason": "rate-limited",
            })
        );
        assert_eq!(serde_json::from_value::<EntryView>(json).unwrap(), e);
        let not_routed = serde_json::to_value(AvailabilityView::NotRouted).unwrap();
        assert_eq!(not_routed, serde_json::json!({"kind": "not-routed"}));
    }
}
