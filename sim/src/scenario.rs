//! Scenario files: TOML, one per situation to measure (`scenarios/*.toml`). A scenario names
//! the accounts and their plans, the threads and the work they do, the provider's
//! incidents, what the person does, and the variants to compare (pool and retry settings).
//! Unknown keys are refused with their name; times are `"day N HH:MM"` from the start
//! (day 1 is the first day).
//!
//! Every number about real plans (capacity of a window, what a token costs) is an
//! assumption: the comparison between variants on the same scenario and seed is what a run
//! measures, not the absolute figures.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

pub const MINUTE: u64 = 60_000;
pub const HOUR: u64 = 60 * MINUTE;
pub const DAY: u64 = 24 * HOUR;
pub const WEEK: u64 = 7 * DAY;

/// Monday 2026-01-05 00:00 UTC: the default start, so hours of the day read naturally.
pub const DEFAULT_START_MS: u64 = 1_767_571_200_000;

/// A scenario as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The seed every random draw derives from.
    pub seed: u64,
    /// Length of the run in days (fractions allowed).
    pub days: f64,
    /// Unix epoch milliseconds of the start (default: a Monday, 00:00 UTC).
    #[serde(default = "default_start")]
    pub start_ms: u64,
    /// Lines of the host's `[core]` table (e.g. `concurrency-limit = 8`).
    #[serde(default)]
    pub core: BTreeMap<String, toml::Value>,
    /// The pool's settings (`pooler config set pool.<key> <value>`), before any variant's.
    #[serde(default)]
    pub pool: BTreeMap<String, String>,
    /// Provider Retry's settings (`pooler config set retry.<key> <value>`).
    #[serde(default)]
    pub retry: BTreeMap<String, String>,
    pub plans: BTreeMap<String, Plan>,
    pub accounts: Vec<AccountGroup>,
    pub threads: Vec<ThreadGroup>,
    #[serde(default)]
    pub provider: ProviderParams,
    #[serde(default)]
    pub incidents: Vec<Incident>,
    #[serde(default)]
    pub events: Vec<Event>,
    #[serde(default)]
    pub person: Person,
    /// What to compare; none: every routing behaviour the pool offers.
    #[serde(default)]
    pub variants: Vec<Variant>,
}

fn default_start() -> u64 {
    DEFAULT_START_MS
}

/// Which provider an account or thread belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderName {
    Claude,
    Codex,
}

/// A plan: what an account may spend. Subscriptions have a 5-hour window (Codex: primary)
/// that starts at the first request after the last one ended and a weekly window (Codex:
/// secondary) that resets at the account's own instant; API keys have per-minute limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Plan {
    pub provider: ProviderName,
    /// Units per 5-hour window (none: no such window).
    pub five_hour: Option<f64>,
    /// Units per week.
    pub weekly: Option<f64>,
    /// Model-scoped weekly buckets (Claude `7d_<family>`): family → units per week.
    #[serde(default)]
    pub weekly_by_family: BTreeMap<String, f64>,
    /// Requests per minute (API keys).
    pub requests_per_minute: Option<u32>,
    /// Input tokens per minute (API keys).
    pub input_tokens_per_minute: Option<u64>,
}

/// How an account signs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialKind {
    ApiKey,
    Oauth,
}

/// One account, or `count` alike (named `name-1` … `name-N`, weekly resets staggered).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AccountGroup {
    pub name: String,
    #[serde(default = "one")]
    pub count: u32,
    pub plan: String,
    pub credential: CredentialKind,
    /// The first weekly reset (`day N HH:MM`); default: one week after the start.
    pub weekly_reset: Option<String>,
    /// Hours between the weekly resets of a group's accounts.
    #[serde(default)]
    pub weekly_stagger_h: f64,
    /// Share of the weekly window already spent at the start, for the group's first
    /// account; the others step down by `spent-stagger`.
    #[serde(default)]
    pub spent_at_start: f64,
    #[serde(default)]
    pub spent_stagger: f64,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `pooler account add --priority`.
    pub priority: Option<i32>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// `count` threads alike: their agent, model and the work their person gives them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ThreadGroup {
    #[serde(default = "one")]
    pub count: u32,
    pub provider: ProviderName,
    /// Model name → how many of the group's threads use it (whole numbers, in order).
    pub models: BTreeMap<String, u32>,
    /// The person works (sends new tasks) from the first to the second hour of each day.
    #[serde(default = "all_day")]
    pub active_hours: [u32; 2],
    /// The group's threads start this many minutes apart.
    #[serde(default)]
    pub start_stagger_min: f64,
    /// The person's think time between a finished task and the next (minutes, uniform).
    pub task_gap_min: [f64; 2],
    /// Requests of one turn's main loop.
    pub steps: [u64; 2],
    /// Tool time after each request (seconds, uniform).
    pub tool_s: [f64; 2],
    /// Conversation context at a session's start (tokens).
    pub context_start: u64,
    /// Context added per request (tokens, uniform).
    pub context_growth: [u64; 2],
    /// The context is compacted back to its start once it passes this.
    pub context_max: u64,
    /// Output tokens of a request (uniform).
    pub output_tokens: [u64; 2],
    /// Chance that a step fans out to subagents (parallel requests on the same session).
    #[serde(default)]
    pub fan_out_chance: f64,
    #[serde(default = "fan_out_default")]
    pub fan_out: [u64; 2],
    #[serde(default = "fan_out_default")]
    pub subagent_steps: [u64; 2],
}

fn all_day() -> [u32; 2] {
    [0, 24]
}

fn fan_out_default() -> [u64; 2] {
    [2, 3]
}

/// How the provider model answers: latency, token costs, faults, OAuth lifetimes.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ProviderParams {
    /// Time to the first event (ms, uniform).
    pub ttft_ms: [f64; 2],
    /// Output tokens streamed per second.
    pub tokens_per_s: f64,
    /// Prompt-cache lifetime after its last use.
    pub cache_ttl_min: f64,
    /// Lifetime of an OAuth access token.
    pub access_token_h: f64,
    /// Chance of a 500 `api_error` per attempt.
    pub error_rate: f64,
    /// Chance a connection drops before the response head, per attempt.
    pub drop_rate: f64,
    /// Chance a refresh is refused with `invalid_grant` although the token is good (#6167's
    /// shape; the refresh token stays valid).
    pub refresh_failure_rate: f64,
    /// Units per 1,000 tokens of each kind, before the model's weight.
    pub cost: Cost,
    /// Model family → weight (a family not listed weighs 1).
    pub family_weight: BTreeMap<String, f64>,
}

impl Default for ProviderParams {
    fn default() -> Self {
        ProviderParams {
            ttft_ms: [800.0, 2500.0],
            tokens_per_s: 60.0,
            cache_ttl_min: 5.0,
            access_token_h: 8.0,
            error_rate: 0.0,
            drop_rate: 0.0,
            refresh_failure_rate: 0.0,
            cost: Cost::default(),
            family_weight: BTreeMap::from([
                ("opus".into(), 5.0),
                ("sonnet".into(), 1.0),
                ("haiku".into(), 0.25),
            ]),
        }
    }
}

/// Units per 1,000 tokens of each kind (assumed; the relative prices of the Messages API).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Cost {
    pub input: f64,
    pub cache_write: f64,
    pub cache_read: f64,
    pub output: f64,
}

impl Default for Cost {
    fn default() -> Self {
        Cost {
            input: 1.0,
            cache_write: 1.25,
            cache_read: 0.1,
            output: 5.0,
        }
    }
}

/// A provider-wide incident.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Incident {
    /// `overloaded` (529 `overloaded_error`) or `errors` (500 `api_error`).
    pub kind: IncidentKind,
    pub at: String,
    pub minutes: f64,
    /// Chance that an attempt during the incident fails.
    #[serde(default = "full")]
    pub rate: f64,
}

fn full() -> f64 {
    1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IncidentKind {
    Overloaded,
    Errors,
}

/// Something that happens at a set time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Event {
    pub at: String,
    pub action: EventAction,
    pub account: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventAction {
    /// The provider stops honouring the account's refresh token (another client refreshed
    /// it, #6167): refreshes get `invalid_grant`; the access token works until it expires.
    RevokeRefresh,
    /// The person signs the account in again (`pooler account login --replace`): new
    /// tokens, the account's error cleared. A person's action.
    SignIn,
    /// The person enables or disables the account (`pooler account enable|disable`).
    Enable,
    Disable,
}

/// What the person does besides giving tasks.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Person {
    /// How often the person looks at `pooler status` while awake (minutes; 0: never).
    pub checks_every_min: f64,
    /// Hours of the day the person looks.
    pub awake_hours: [u32; 2],
    /// Accounts the person enables when threads wait and every enabled account is
    /// exhausted, and disables again once another account is ready.
    pub enable_when_exhausted: Vec<String>,
    /// A thread that waits with no retry coming (declined, attempts spent) while an
    /// account is ready gets the person's message again (`pooler thread send`).
    pub resend_when_stuck: bool,
}

impl Default for Person {
    fn default() -> Self {
        Person {
            checks_every_min: 0.0,
            awake_hours: [8, 24],
            enable_when_exhausted: Vec::new(),
            resend_when_stuck: false,
        }
    }
}

/// One side of a comparison: a name and the settings it changes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Variant {
    pub name: String,
    #[serde(default)]
    pub pool: BTreeMap<String, String>,
    #[serde(default)]
    pub retry: BTreeMap<String, String>,
    /// Per-account changes by account name, made as the accounts are added (what
    /// `pooler account update NAME --last-resort …` and `pooler account enable` would do).
    #[serde(default)]
    pub accounts: BTreeMap<String, AccountChange>,
}

/// What a variant changes of one account: fields left out keep the scenario's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AccountChange {
    /// Enabled (or disabled) from the start.
    pub enabled: Option<bool>,
    /// Used only when no other account of its provider is eligible.
    pub last_resort: Option<bool>,
    /// `allow` or `deny`.
    pub extra_usage: Option<String>,
    /// The most requests in flight at once (0: no limit).
    pub max_in_flight: Option<u32>,
    /// No new conversation from this weekly utilization (1: no ceiling).
    pub preserve: Option<f64>,
}

impl Scenario {
    pub fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the scenario {}", path.display()))?;
        Scenario::parse(&text).with_context(|| format!("scenario {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Scenario> {
        let scenario: Scenario = toml::from_str(text)?;
        scenario.check()?;
        Ok(scenario)
    }

    /// Length of the run in milliseconds.
    pub fn length_ms(&self) -> u64 {
        (self.days * DAY as f64).round() as u64
    }

    /// `"day N HH:MM"` as an instant.
    pub fn at(&self, spec: &str) -> anyhow::Result<u64> {
        Ok(self.start_ms + offset(spec)?)
    }

    fn check(&self) -> anyhow::Result<()> {
        if !(self.days > 0.0 && self.days <= 60.0) {
            bail!(
                "days must be more than 0 and at most 60 (got {})",
                self.days
            );
        }
        for group in &self.accounts {
            let Some(plan) = self.plans.get(&group.plan) else {
                bail!(
                    "account {}: no plan named {:?} (plans: {:?})",
                    group.name,
                    group.plan,
                    self.plans.keys().collect::<Vec<_>>()
                );
            };
            if group.credential == CredentialKind::ApiKey && plan.provider == ProviderName::Codex {
                bail!("account {}: Codex accounts sign in with OAuth", group.name);
            }
            if let Some(at) = &group.weekly_reset {
                offset(at).with_context(|| format!("account {}: weekly-reset", group.name))?;
            }
        }
        for group in &self.threads {
            if group.models.values().sum::<u32>() != group.count {
                bail!(
                    "a thread group of {} threads names models for {}",
                    group.count,
                    group.models.values().sum::<u32>()
                );
            }
            let [a, b] = group.active_hours;
            if a >= b || b > 24 {
                bail!("active-hours must be [from, to] with from < to <= 24");
            }
        }
        let names: Vec<String> = self.account_names();
        for event in &self.events {
            offset(&event.at).with_context(|| format!("event at {:?}", event.at))?;
            if !names.contains(&event.account) {
                bail!("event at {}: no account named {}", event.at, event.account);
            }
        }
        for incident in &self.incidents {
            offset(&incident.at).with_context(|| format!("incident at {:?}", incident.at))?;
        }
        for name in &self.person.enable_when_exhausted {
            if !names.contains(name) {
                bail!("person.enable-when-exhausted: no account named {name}");
            }
        }
        for variant in &self.variants {
            self.check_variant(variant)?;
        }
        Ok(())
    }

    /// A variant's account changes name accounts that exist, with values the pool takes.
    pub fn check_variant(&self, variant: &Variant) -> anyhow::Result<()> {
        let names = self.account_names();
        for (name, change) in &variant.accounts {
            if !names.contains(name) {
                bail!("variant {}: no account named {name}", variant.name);
            }
            if let Some(e) = &change.extra_usage
                && e != "allow"
                && e != "deny"
            {
                bail!(
                    "variant {}: account {name}: extra-usage must be allow or deny",
                    variant.name
                );
            }
        }
        Ok(())
    }

    /// Every account's name, groups expanded.
    pub fn account_names(&self) -> Vec<String> {
        self.accounts
            .iter()
            .flat_map(|g| (0..g.count).map(move |i| group_member(&g.name, g.count, i)))
            .collect()
    }
}

/// The name of member `i` of a group of `count` called `name`.
pub fn group_member(name: &str, count: u32, i: u32) -> String {
    if count == 1 {
        name.to_owned()
    } else {
        format!("{name}-{}", i + 1)
    }
}

/// `"day N HH:MM"` as milliseconds after the start.
pub fn offset(spec: &str) -> anyhow::Result<u64> {
    let bad =
        || anyhow::anyhow!("{spec:?} is not a time; write \"day N HH:MM\" (day 1 is the first)");
    let rest = spec.trim().strip_prefix("day ").ok_or_else(bad)?;
    let (day, clock) = rest.trim().split_once(' ').ok_or_else(bad)?;
    let day: u64 = day.parse().map_err(|_| bad())?;
    let (h, m) = clock.trim().split_once(':').ok_or_else(bad)?;
    let (h, m): (u64, u64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if day == 0 || h > 23 || m > 59 {
        return Err(bad());
    }
    Ok((day - 1) * DAY + h * HOUR + m * MINUTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_day_and_clock_from_the_start() {
        assert_eq!(offset("day 1 00:00").unwrap(), 0);
        assert_eq!(offset("day 2 09:30").unwrap(), DAY + 9 * HOUR + 30 * MINUTE);
        for bad in [
            "day 0 10:00",
            "2 10:00",
            "day 1 24:00",
            "day 1 10",
            "day x 1:00",
        ] {
            assert!(offset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_committed_scenario_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Scenario::load(&path).unwrap();
                seen += 1;
            }
        }
        assert!(seen >= 3, "the three scenarios at least");
    }

    #[test]
    fn unknown_keys_and_dangling_names_are_refused_by_name() {
        let base = r#"
            name = "x"
            seed = 1
            days = 1
            [plans.p]
            provider = "claude"
            five-hour = 10.0
            [[accounts]]
            name = "a"
            plan = "p"
            credential = "oauth"
            [[threads]]
            provider = "claude"
            models = { m = 1 }
            task-gap-min = [1.0, 2.0]
            steps = [1, 2]
            tool-s = [1.0, 2.0]
            context-start = 1000
            context-growth = [10, 20]
            context-max = 5000
            output-tokens = [10, 20]
        "#;
        Scenario::parse(base).unwrap();
        let variant = format!(
            "{base}\n[[variants]]\nname = \"v\"\n[variants.accounts.a]\nenabled = true\nlast-resort = true\n"
        );
        let parsed = Scenario::parse(&variant).unwrap();
        assert_eq!(parsed.variants[0].accounts["a"].last_resort, Some(true));
        let dangling_variant = variant.replace("accounts.a]", "accounts.b]");
        let err = format!("{:#}", Scenario::parse(&dangling_variant).unwrap_err());
        assert!(err.contains("no account named b"), "{err}");
        let typo = format!("{base}\n[person]\nchecks-every-mn = 3\n");
        let err = format!("{:#}", Scenario::parse(&typo).unwrap_err());
        assert!(err.contains("checks-every-mn"), "{err}");
        let dangling = base.replace("plan = \"p\"", "plan = \"q\"");
        let err = format!("{:#}", Scenario::parse(&dangling).unwrap_err());
        assert!(err.contains("no plan named \"q\""), "{err}");
    }
}
