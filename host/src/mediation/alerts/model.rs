//! What an alert is, and the episode rule: a condition that needs a person is announced once
//! when it starts and once when it ends, however often it is observed in between. Plain
//! data and functions, so the rule is tested without a host.

use std::collections::BTreeMap;

use crate::time::rfc3339;
use serde::Serialize;

/// The kinds of alert. The names are the `kind` field of the JSON document and the `kind`
/// label of `pooler_alerts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AlertKind {
    /// An OAuth account's proactive refresh was refused: it serves, but needs a new sign-in.
    SignIn,
    /// An account is in authentication error and serves nothing until a person acts.
    AccountError,
    /// Every enabled account of a provider is refused; `until` says when one serves again.
    ProviderUnavailable,
    /// A thread's failed turn will not be retried (declined for good, or retries spent).
    RetriesEnded,
    /// An account served on paid extra usage (overage or credits).
    ExtraUsage,
    /// An account marked last resort served, because no other account could.
    LastResort,
    /// `pooler alerts test`.
    Test,
}

impl AlertKind {
    /// Every kind, in declaration order.
    pub const ALL: [AlertKind; 7] = [
        AlertKind::SignIn,
        AlertKind::AccountError,
        AlertKind::ProviderUnavailable,
        AlertKind::RetriesEnded,
        AlertKind::ExtraUsage,
        AlertKind::LastResort,
        AlertKind::Test,
    ];

    /// The kind's name as the log, the metrics and every delivery spell it (`sign-in`).
    pub fn name(self) -> &'static str {
        match self {
            AlertKind::SignIn => "sign-in",
            AlertKind::AccountError => "account-error",
            AlertKind::ProviderUnavailable => "provider-unavailable",
            AlertKind::RetriesEnded => "retries-ended",
            AlertKind::ExtraUsage => "extra-usage",
            AlertKind::LastResort => "last-resort",
            AlertKind::Test => "test",
        }
    }
}

/// Whether an alert opens an episode or closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AlertState {
    /// The condition started: a person may need to act.
    Firing,
    /// The condition ended (the recovery message).
    Resolved,
}

/// A condition observed now. Its `subject` (an account id, a provider, a thread id) with its
/// kind identifies the episode. Holds no secret: only ids, labels and the pool's redacted
/// texts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Condition {
    /// What kind of condition it is.
    pub kind: AlertKind,
    /// What the condition is about (an account id, a provider, a thread id): with `kind`, it
    /// identifies the episode.
    pub subject: String,
    /// `claude` or `codex`, when the condition has one.
    pub provider: Option<String>,
    /// The account concerned, when there is one.
    pub account: Option<String>,
    /// The account's label, for people.
    pub label: Option<String>,
    /// The thread concerned, when there is one.
    pub thread: Option<String>,
    /// When the subject serves again, when known (epoch ms).
    pub until: Option<u64>,
    /// Why, in the pool's or the retry plugin's words.
    pub reason: Option<String>,
}

impl Condition {
    /// A condition of `kind` about `subject`, with every optional detail unset.
    pub fn new(kind: AlertKind, subject: impl Into<String>) -> Self {
        Condition {
            kind,
            subject: subject.into(),
            provider: None,
            account: None,
            label: None,
            thread: None,
            until: None,
            reason: None,
        }
    }
}

/// One alert: a condition's start or end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    /// The condition that started or ended.
    #[serde(flatten)]
    pub condition: Condition,
    /// Whether the condition started or ended.
    pub state: AlertState,
    /// When the host saw it (epoch ms).
    pub at: u64,
    /// When the episode started (epoch ms); equals `at` for a firing alert.
    pub since: u64,
}

impl Alert {
    /// A one-line title a person reads first.
    pub fn title(&self) -> String {
        let c = &self.condition;
        let who = c
            .label
            .as_deref()
            .or(c.account.as_deref())
            .or(c.thread.as_deref())
            .unwrap_or(&c.subject);
        let provider = c.provider.as_deref().unwrap_or("pool");
        match (c.kind, self.state) {
            (AlertKind::SignIn, AlertState::Firing) => {
                format!("{provider} account {who} needs a new sign-in")
            }
            (AlertKind::SignIn, AlertState::Resolved) => {
                format!("{provider} account {who} is signed in again")
            }
            (AlertKind::AccountError, AlertState::Firing) => {
                format!("{provider} account {who} is in error")
            }
            (AlertKind::AccountError, AlertState::Resolved) => {
                format!("{provider} account {who} is out of error")
            }
            (AlertKind::ProviderUnavailable, AlertState::Firing) => {
                format!("{provider}: no account can serve")
            }
            (AlertKind::ProviderUnavailable, AlertState::Resolved) => {
                format!("{provider}: an account serves again")
            }
            (AlertKind::RetriesEnded, AlertState::Firing) => {
                format!("thread {who}: its failed turn will not be retried")
            }
            (AlertKind::RetriesEnded, AlertState::Resolved) => {
                format!("thread {who} runs again")
            }
            (AlertKind::ExtraUsage, AlertState::Firing) => {
                format!("{provider} account {who} serves on paid extra usage")
            }
            (AlertKind::ExtraUsage, AlertState::Resolved) => {
                format!("{provider} account {who} no longer serves on extra usage")
            }
            (AlertKind::LastResort, AlertState::Firing) => {
                format!("{provider}: last-resort account {who} is serving")
            }
            (AlertKind::LastResort, AlertState::Resolved) => {
                format!("{provider}: accounts other than the last resort serve again")
            }
            (AlertKind::Test, _) => "pooler test alert".to_string(),
        }
    }

    /// The title plus what a person needs to act: when it serves again, why.
    pub fn line(&self) -> String {
        let mut line = self.title();
        let c = &self.condition;
        if self.state == AlertState::Firing {
            if let Some(until) = c.until {
                line.push_str(&format!(" until {}", rfc3339(until)));
            }
            if let Some(reason) = &c.reason {
                line.push_str(&format!(" ({reason})"));
            }
        }
        line
    }
}

/// The open episodes, by kind and subject.
#[derive(Debug, Default)]
pub struct Episodes {
    open: BTreeMap<(AlertKind, String), Alert>,
}

impl Episodes {
    /// One observation of every condition of `scope`'s kinds: each present condition with no
    /// open episode opens one (a firing alert); each open episode of those kinds whose
    /// condition is absent closes (a resolved alert). Repeated observations of a lasting
    /// condition say nothing.
    pub fn observe(
        &mut self,
        scope: &[AlertKind],
        present: Vec<Condition>,
        now: u64,
    ) -> Vec<Alert> {
        let mut alerts = self.close_absent(scope, &present, now);
        for condition in present {
            if let Some(alert) = self.open(condition, now) {
                alerts.push(alert);
            }
        }
        alerts
    }

    /// Open an episode for `condition` unless one is open: the firing alert, once.
    pub fn open(&mut self, condition: Condition, now: u64) -> Option<Alert> {
        let key = (condition.kind, condition.subject.clone());
        if self.open.contains_key(&key) {
            return None;
        }
        let alert = Alert {
            condition,
            state: AlertState::Firing,
            at: now,
            since: now,
        };
        self.open.insert(key, alert.clone());
        Some(alert)
    }

    /// Close every open episode of `scope`'s kinds whose subject is not among `still`.
    pub fn close_absent(
        &mut self,
        scope: &[AlertKind],
        still: &[Condition],
        now: u64,
    ) -> Vec<Alert> {
        let ended: Vec<_> = self
            .open
            .keys()
            .filter(|(kind, subject)| {
                scope.contains(kind)
                    && !still
                        .iter()
                        .any(|c| c.kind == *kind && &c.subject == subject)
            })
            .cloned()
            .collect();
        ended
            .into_iter()
            .filter_map(|key| self.open.remove(&key))
            .map(|opened| Alert {
                state: AlertState::Resolved,
                at: now,
                since: opened.since,
                condition: opened.condition,
            })
            .collect()
    }

    /// Close `kind`'s episode of `subject`, if open.
    pub fn close(&mut self, kind: AlertKind, subject: &str, now: u64) -> Option<Alert> {
        let opened = self.open.remove(&(kind, subject.to_string()))?;
        Some(Alert {
            state: AlertState::Resolved,
            at: now,
            since: opened.since,
            condition: opened.condition,
        })
    }

    /// The open episodes' firing alerts.
    pub fn open_alerts(&self) -> Vec<Alert> {
        self.open.values().cloned().collect()
    }

    /// Whether `kind`'s episode of `subject` is open.
    pub fn is_open(&self, kind: AlertKind, subject: &str) -> bool {
        self.open.contains_key(&(kind, subject.to_string()))
    }
}

/// The alerts of one coalescing window, as one delivery: an episode that opened and closed
/// within the window is dropped altogether (a blip no person must act on), and an alert
/// repeated for the same episode and state is kept once.
pub fn coalesce(batch: Vec<Alert>) -> Vec<Alert> {
    let mut out: Vec<Alert> = Vec::new();
    for alert in batch {
        let same_episode = |a: &Alert| {
            a.condition.kind == alert.condition.kind
                && a.condition.subject == alert.condition.subject
        };
        if alert.state == AlertState::Resolved
            && let Some(i) = out
                .iter()
                .position(|a| same_episode(a) && a.state == AlertState::Firing)
        {
            out.remove(i);
            continue;
        }
        if out
            .iter()
            .any(|a| same_episode(a) && a.state == alert.state)
        {
            continue;
        }
        out.push(alert);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(account: &str) -> Condition {
        let mut c = Condition::new(AlertKind::AccountError, account);
        c.account = Some(account.into());
        c.provider = Some("claude".into());
        c
    }

    #[test]
    fn a_lasting_condition_fires_once_and_resolves_once() {
        let mut e = Episodes::default();
        let scope = [AlertKind::AccountError];
        let first = e.observe(&scope, vec![error("a")], 1);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].state, AlertState::Firing);
        for now in 2..10 {
            assert!(e.observe(&scope, vec![error("a")], now).is_empty());
        }
        let end = e.observe(&scope, vec![], 10);
        assert_eq!(end.len(), 1);
        assert_eq!(
            (end[0].state, end[0].since, end[0].at),
            (AlertState::Resolved, 1, 10)
        );
        assert!(e.observe(&scope, vec![], 11).is_empty());
        // A new episode of the same subject fires again.
        assert_eq!(e.observe(&scope, vec![error("a")], 12).len(), 1);
    }

    #[test]
    fn an_observation_closes_only_its_own_kinds() {
        let mut e = Episodes::default();
        let mut other = Condition::new(AlertKind::RetriesEnded, "t1");
        other.thread = Some("t1".into());
        assert_eq!(
            e.observe(&[AlertKind::RetriesEnded], vec![other], 1).len(),
            1
        );
        assert_eq!(e.observe(&[AlertKind::AccountError], vec![], 2).len(), 0);
        assert!(e.is_open(AlertKind::RetriesEnded, "t1"));
    }

    #[test]
    fn a_blip_within_the_window_is_dropped_and_repeats_are_kept_once() {
        let mut e = Episodes::default();
        let scope = [AlertKind::AccountError];
        let mut batch = e.observe(&scope, vec![error("a"), error("b")], 1);
        batch.extend(e.observe(&scope, vec![error("b")], 2));
        assert_eq!(batch.len(), 3, "a fired, b fired, a resolved");
        let out = coalesce(batch);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].condition.subject, "b");
    }

    #[test]
    fn titles_name_the_subject_and_lines_the_time() {
        let mut c = Condition::new(AlertKind::ProviderUnavailable, "claude");
        c.provider = Some("claude".into());
        c.until = Some(1_767_225_600_000 + 3_600_000);
        let alert = Alert {
            condition: c,
            state: AlertState::Firing,
            at: 0,
            since: 0,
        };
        assert_eq!(
            alert.line(),
            "claude: no account can serve until 2026-01-01T01:00:00Z"
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
