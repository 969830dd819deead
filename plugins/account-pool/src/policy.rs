//! The pool's decisions as pure functions over plain values: eligibility with the soft
//! switch threshold (#6169), derived status, the routing strategies' ranking of accounts
//! for new and moving conversations (with last-resort and preserved accounts kept back and
//! placements spread), the choice of account, the per-attempt outcome table (spec §4), the
//! pin and cursor commit rule (spec §5, #6990) and the one verdict that yields both the
//! pool's 429 `Retry-After` and the availability answer (spec §7, §9).

use crate::http::PoolError;
use crate::model::{
    AccountOptions, AccountStatus, Availability, BlockCause, CredentialKind, Family, HoldKind,
    Provider, UnavailableReason,
};
use crate::quota::{BlockingReset, Observation, QuotaState};

/// Everything the decisions need to know about one account at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountState {
    pub id: String,
    pub provider: Provider,
    pub kind: CredentialKind,
    pub priority: i32,
    /// Insertion order, the tie-breaker of equal priorities.
    pub seq: i64,
    pub enabled: bool,
    pub error: Option<String>,
    pub held_until: Option<u64>,
    pub hold_kind: Option<HoldKind>,
    pub quota: QuotaState,
    pub needs_sign_in: bool,
    pub token_expires_at: Option<u64>,
    /// While a transient refresh failure backs off, an expired token cannot serve before
    /// this time.
    pub refresh_retry_at: Option<u64>,
    /// When it last served, as stored (to a second; see `store::TOUCH_GRANULARITY_MS`).
    pub last_used_at: Option<u64>,
    /// The person's per-account options (last-resort, extra usage, limits).
    pub options: AccountOptions,
}

impl AccountState {
    /// The end of the time this account must be skipped: a hold, or an expired OAuth
    /// token whose refresh is backing off.
    pub fn unusable_until(&self, now: u64) -> Option<u64> {
        let hold = self.held_until.filter(|t| *t > now);
        let token = match (self.kind, self.token_expires_at, self.refresh_retry_at) {
            (CredentialKind::OAuth, Some(exp), Some(retry)) if exp <= now && retry > now => {
                Some(retry)
            }
            _ => None,
        };
        hold.max(token)
    }

    pub fn held(&self, now: u64) -> bool {
        self.unusable_until(now).is_some()
    }
}

/// Why an account cannot serve a request at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Disabled,
    Error,
    Restricted,
    SharedExhausted,
    FamilyExhausted,
}

impl Refusal {
    /// Lasting refusals move a pin and the cursor; a family limit does not.
    pub fn is_lasting(self) -> bool {
        !matches!(self, Refusal::FamilyExhausted)
    }
}

/// Eligibility of an account for a request (#6169: the threshold is a preference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Eligible and under the switch threshold.
    Preferred,
    /// Eligible, at or over the threshold but not refused: used when nothing preferred is.
    Reserve,
    Refused(Refusal),
}

impl Tier {
    pub fn eligible(self) -> bool {
        !matches!(self, Tier::Refused(_))
    }
}

/// How a new conversation (or one that must move) chooses among eligible accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The provider's cursor account until it is refused, then the next in order.
    FillFirst,
    /// The account with the most capacity left (its tightest 5-hour or weekly window),
    /// shared with the conversations already on it.
    Spread,
    /// The account whose weekly quota left per hour until that window resets is highest
    /// (what would expire unused first), sparing accounts whose 5-hour window is nearly
    /// spent.
    SoonestReset,
}

impl Strategy {
    /// The strategy of a provider nobody configured.
    pub const DEFAULT: Strategy = Strategy::SoonestReset;

    /// Every strategy, in the order the settings list them.
    pub const ALL: [Strategy; 3] = [
        Strategy::FillFirst,
        Strategy::Spread,
        Strategy::SoonestReset,
    ];

    /// The setting's word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::FillFirst => "fill-first",
            Strategy::Spread => "spread",
            Strategy::SoonestReset => "soonest-reset",
        }
    }

    pub fn parse(word: &str) -> Option<Strategy> {
        Self::ALL.into_iter().find(|s| s.as_str() == word)
    }

    /// Whether it ranks accounts (and so spreads placements); fill-first follows the
    /// cursor.
    pub fn ranks(self) -> bool {
        self != Strategy::FillFirst
    }
}

/// Below this share left of its 5-hour window, an account's soonest-reset rank shrinks in
/// proportion, to nothing at a spent window: quota about to expire is spent first, but
/// not by driving one account into its 5-hour wall.
pub const SHORT_WINDOW_GUARD: f64 = 0.25;

/// The hours until a weekly reset are counted as at least this (an account resetting in a
/// minute would otherwise outrank everything by orders of magnitude).
const MIN_HOURS_TO_RESET: f64 = 0.25;

/// The hours until the weekly reset of an account whose weekly window was never observed.
const UNKNOWN_HOURS_TO_RESET: f64 = 168.0;

/// How much `strategy` wants `account` for a new conversation of `family` before the
/// conversations already on it are counted (higher first; ties and fill-first: 0).
pub fn capacity(
    strategy: Strategy,
    account: &AccountState,
    family: Option<Family>,
    now: u64,
) -> f64 {
    let q = &account.quota;
    match strategy {
        Strategy::FillFirst => 0.0,
        Strategy::Spread => q.remaining(family, now),
        Strategy::SoonestReset => {
            let (left, reset) = q.weekly_left(family, now);
            let hours = reset.map_or(UNKNOWN_HOURS_TO_RESET, |t| {
                t.saturating_sub(now) as f64 / 3_600_000.0
            });
            let per_hour = left / hours.max(MIN_HOURS_TO_RESET);
            per_hour * (q.short_left(now) / SHORT_WINDOW_GUARD).min(1.0)
        }
    }
}

/// Whether an eligible account is kept back from new conversations (and detours) while a
/// better one can serve, and why. Ordered: the first is the best.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standby {
    /// Takes new conversations.
    No,
    /// At or over its `preserve` ceiling of weekly utilization.
    Preserved,
    /// Flagged last-resort.
    LastResort,
}

/// The standby class of `account` now.
pub fn standby(account: &AccountState, now: u64) -> Standby {
    let o = &account.options;
    if o.last_resort {
        Standby::LastResort
    } else if o.preserve < 1.0 && account.quota.weekly_utilization(now) >= o.preserve {
        Standby::Preserved
    } else {
        Standby::No
    }
}

/// The tier of `account` for a request of `family` (None: any family).
pub fn tier(account: &AccountState, family: Option<Family>, threshold: f64, now: u64) -> Tier {
    let q = &account.quota;
    if !account.enabled {
        Tier::Refused(Refusal::Disabled)
    } else if account.error.is_some() {
        Tier::Refused(Refusal::Error)
    } else if q.restricted(now) {
        Tier::Refused(Refusal::Restricted)
    } else if q.shared_exhausted(now) {
        Tier::Refused(Refusal::SharedExhausted)
    } else if family.is_some_and(|f| q.family_exhausted(f, now)) {
        Tier::Refused(Refusal::FamilyExhausted)
    } else if q.near_limit(family, threshold, now) {
        Tier::Reserve
    } else {
        Tier::Preferred
    }
}

/// The derived status, first match wins: disabled, error, held, exhausted, near-limit,
/// ready. A family-only limit does not change it.
pub fn status(account: &AccountState, threshold: f64, now: u64) -> AccountStatus {
    let q = &account.quota;
    if !account.enabled {
        AccountStatus::Disabled
    } else if account.error.is_some() {
        AccountStatus::Error
    } else if account.held(now) {
        AccountStatus::Held
    } else if q.restricted(now) || q.shared_exhausted(now) {
        AccountStatus::Exhausted
    } else if q.near_limit(None, threshold, now) {
        AccountStatus::NearLimit
    } else {
        AccountStatus::Ready
    }
}

/// When a blocked account will serve again: the later of its hold and its blocking reset.
/// None when the account is ready now; `Some(None)` when the time is unknown.
pub fn blocked_until(
    account: &AccountState,
    family: Option<Family>,
    threshold: f64,
    now: u64,
) -> Option<Option<u64>> {
    let eligible = tier(account, family, threshold, now).eligible();
    let hold = account.unusable_until(now);
    if eligible && hold.is_none() {
        return None;
    }
    let reset = match account.quota.blocking_reset(family, now) {
        BlockingReset::NotBlocked => None,
        BlockingReset::At(t) => Some(t),
        BlockingReset::Unknown => return Some(None),
    };
    Some(hold.max(reset).or(Some(now)))
}

/// The pool's answer for a provider's accounts: the single source of both the 429
/// `Retry-After` and the availability answer.
pub fn verdict(
    accounts: &[AccountState],
    family: Option<Family>,
    threshold: f64,
    now: u64,
) -> Availability {
    let enabled: Vec<&AccountState> = accounts.iter().filter(|a| a.enabled).collect();
    if enabled.is_empty() {
        return Availability::Unavailable(UnavailableReason::NoEnabledAccount);
    }
    let live: Vec<&AccountState> = enabled.into_iter().filter(|a| a.error.is_none()).collect();
    if live.is_empty() {
        return Availability::Unavailable(UnavailableReason::Authentication);
    }
    let mut best: Option<(u64, BlockCause)> = None;
    for a in live {
        match blocked_until(a, family, threshold, now) {
            None => return Availability::Ready,
            Some(None) => {}
            Some(Some(t)) => {
                let cause = block_cause(a, family, now);
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, cause));
                }
            }
        }
    }
    match best {
        Some((retry_at, cause)) => Availability::Blocked { retry_at, cause },
        None => Availability::Unavailable(UnavailableReason::ResetUnknown),
    }
}

fn block_cause(a: &AccountState, family: Option<Family>, now: u64) -> BlockCause {
    let q = &a.quota;
    if q.restricted(now) {
        BlockCause::UsageRestricted
    } else if q.shared_exhausted(now) {
        BlockCause::QuotaExhausted
    } else if family.is_some_and(|f| q.family_exhausted(f, now)) {
        BlockCause::FamilyQuotaExhausted
    } else {
        BlockCause::Held
    }
}

/// `Retry-After` when no reset is known.
pub const UNKNOWN_RETRY_AFTER_SECS: u64 = 60;

/// Seconds until `retry_at`, rounded up, at least 1.
pub fn retry_after_secs(retry_at: u64, now: u64) -> u64 {
    retry_at.saturating_sub(now).div_ceil(1000).max(1)
}

/// The pool's own response when nothing could serve and no upstream failure was recorded.
pub fn no_eligible_response(verdict: Availability, now: u64) -> PoolError {
    match verdict {
        Availability::Unavailable(UnavailableReason::NoEnabledAccount) => {
            PoolError::pool(503, "Account Pooler has no enabled account.")
        }
        Availability::Unavailable(UnavailableReason::Authentication) => PoolError::pool(
            429,
            "Every enabled Account Pooler account is in authentication error; sign in again.",
        )
        .with_retry_after(UNKNOWN_RETRY_AFTER_SECS),
        Availability::Blocked { retry_at, .. } => {
            PoolError::pool(429, "No Account Pooler account is currently eligible.")
                .with_retry_after(retry_after_secs(retry_at, now))
        }
        Availability::Unavailable(_) => PoolError::pool(
            429,
            "No Account Pooler account is currently eligible; no reset time is known.",
        )
        .with_retry_after(UNKNOWN_RETRY_AFTER_SECS),
        // Something became ready while this request was being refused (a hold ended during
        // its attempts): ask for a quick retry.
        Availability::Ready | Availability::NotRouted => {
            PoolError::pool(429, "No Account Pooler account is currently eligible.")
                .with_retry_after(1)
        }
    }
}

/// A candidate account as selection sees it, in priority order.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub tier: Tier,
    pub held: bool,
    /// Kept back from new conversations and detours while a better account can serve.
    pub standby: Standby,
    /// The strategy's [`capacity`] of the account (ranking strategies only).
    pub score: f64,
    /// Conversations pinned to it now (read only when a conversation is placed).
    pub live: u32,
    /// New or moving conversations placed on it within the last minute (likewise).
    pub recent: u32,
}

impl Candidate {
    /// A candidate with no standby, score or load: what fill-first and detours look at.
    pub fn plain(id: &str, tier: Tier, held: bool) -> Self {
        Candidate {
            id: id.to_owned(),
            tier,
            held,
            standby: Standby::No,
            score: 0.0,
            live: 0,
            recent: 0,
        }
    }
}

/// Why an account was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The session's own pin.
    Pinned,
    /// The parent session's account (a child without a pin of its own).
    Inherited,
    /// The provider's cursor (a new conversation, fill-first).
    Cursor,
    /// The next eligible account in priority order.
    Next,
    /// Ranked first by the routing strategy (a new or moving conversation).
    Strategy,
}

/// The inputs of one selection step.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub candidates: &'a [Candidate],
    pub attempted: &'a [String],
    pub pinned: Option<&'a str>,
    pub inherited: Option<&'a str>,
    pub cursor: Option<&'a str>,
    pub previous: Option<&'a str>,
    /// The conversation is being placed: it is new (no pin, or a pin this request claimed)
    /// or its pinned account is gone for a lasting reason. Otherwise a choice other than
    /// the pin is a detour.
    pub placing: bool,
    pub strategy: Strategy,
}

/// Choose the next account to try (spec §3): the pin (returned even when held: the caller
/// waits out a short hold or detours); else the inherited parent account; else, for a
/// conversation being placed, the strategy's choice (fill-first: the cursor, then the next
/// in order); else (a detour, or fill-first past the cursor) the next eligible account
/// after the last one tried, in priority order, wrapping. Everywhere but the pin, accounts
/// a person keeps back (last-resort, over their `preserve` ceiling) come after every other
/// eligible account, and preferred accounts before reserve ones.
pub fn choose(sel: Selection<'_>) -> Option<(String, Role)> {
    let c = sel.candidates;
    let open = |x: &Candidate| x.tier.eligible() && !sel.attempted.contains(&x.id);
    let usable = |x: &Candidate| open(x) && !x.held;
    let find = |id: Option<&str>| id.and_then(|id| c.iter().find(|x| x.id == id));

    if let Some(p) = find(sel.pinned).filter(|x| open(x)) {
        return Some((p.id.clone(), Role::Pinned));
    }
    let best = c.iter().filter(|x| usable(x)).map(|x| x.standby).min()?;
    if sel.pinned.is_none()
        && let Some(i) = find(sel.inherited).filter(|x| usable(x) && x.standby == best)
    {
        return Some((i.id.clone(), Role::Inherited));
    }
    let fresh = sel.pinned.is_none() && sel.previous.is_none();
    let anchor = sel.previous.or(sel.pinned).or(sel.cursor);
    for standby in [Standby::No, Standby::Preserved, Standby::LastResort] {
        for want in [Tier::Preferred, Tier::Reserve] {
            let class = |x: &Candidate| usable(x) && x.standby == standby && x.tier == want;
            if sel.placing && sel.strategy.ranks() {
                if let Some(x) = ranked(c.iter().filter(|x| class(x))) {
                    return Some((x.id.clone(), Role::Strategy));
                }
                continue;
            }
            if fresh && let Some(cur) = find(sel.cursor).filter(|x| class(x)) {
                return Some((cur.id.clone(), Role::Cursor));
            }
            let start = anchor
                .and_then(|a| c.iter().position(|x| x.id == a))
                .map_or(0, |i| i + 1);
            for k in 0..c.len() {
                let x = &c[(start + k) % c.len()];
                if class(x) {
                    return Some((x.id.clone(), Role::Next));
                }
            }
        }
    }
    None
}

/// The strategy's pick among accounts of one class, in priority order. Accounts that took
/// their fair share of the placements of the last minute (the group's placements, plus
/// this one, over the group's size, rounded up) wait while another has not: conversations
/// that start or move together spread instead of herding. Among the rest, the highest
/// capacity shared with the conversations already there (`score / (1 + live)`), then the
/// fewest conversations, then priority order.
pub fn ranked<'c>(group: impl Iterator<Item = &'c Candidate> + Clone) -> Option<&'c Candidate> {
    let n = group.clone().count() as u32;
    if n == 0 {
        return None;
    }
    let placed: u32 = group.clone().map(|x| x.recent).sum();
    let share = (placed + 1).div_ceil(n);
    let key = |x: &Candidate| (x.recent < share, x.score / f64::from(1 + x.live), x.live);
    let mut best: Option<&Candidate> = None;
    for x in group {
        let better = match best {
            None => true,
            Some(b) => {
                let ((xs, xc, xl), (bs, bc, bl)) = (key(x), key(b));
                xs.cmp(&bs)
                    .then(xc.total_cmp(&bc))
                    .then(bl.cmp(&xl))
                    .is_gt()
            }
        };
        if better {
            best = Some(x);
        }
    }
    best
}

/// What one upstream response means (spec §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classified {
    /// 2xx: serve.
    Served,
    /// 429 refusing a shared window (or a hard stop): lasting, try the next account.
    Quota,
    /// 429 refusing the requested family's window: a detour, pin unchanged.
    Family,
    /// Any other 429: hold the account for the Retry-After.
    RateLimited,
    /// 401 or 403.
    AuthRefused,
    /// 408, 500, 502, 503, 504, 529: retry the same account, then detour.
    Transient,
    /// Anything else: returned to the client as is.
    PassThrough,
}

/// Classify an upstream status with the quota it reported.
pub fn classify(status: u16, obs: &Observation, family: Option<Family>, now: u64) -> Classified {
    match status {
        200..=299 => Classified::Served,
        429 if obs.rejects_shared(now) => Classified::Quota,
        429 if family.is_some_and(|f| obs.rejects_family(f, now)) => Classified::Family,
        429 => Classified::RateLimited,
        401 | 403 => Classified::AuthRefused,
        408 | 500 | 502 | 503 | 504 | 529 => Classified::Transient,
        _ => Classified::PassThrough,
    }
}

/// Whether a refused answer (`status`, the start of its `body`) is the provider's billing
/// refusing the account rather than the request: a subscription's extra usage spent, or
/// required and not on ("You're out of extra usage…", "Third-party apps now draw from
/// your extra usage…"), an API organisation's prepaid credits spent ("Your credit balance
/// is too low…"), a `billing_error`, or 402. Such an answer is never passed through: the
/// account is refused for the request's family (`docs/extra-usage.md` says which of these
/// shapes are observed and which assumed).
pub fn billing_refusal(status: u16, body: &[u8]) -> bool {
    const MESSAGES: [&str; 4] = [
        "out of extra usage",
        "draw from your extra usage",
        "credit balance is too low",
        "billing_error",
    ];
    match status {
        402 => true,
        400 => {
            let text = String::from_utf8_lossy(body).to_ascii_lowercase();
            MESSAGES.iter().any(|m| text.contains(m))
        }
        _ => false,
    }
}

/// What happened to one account in one request, for the commit rule and diagnostics: the
/// kit's, which the admin API shows. The `attempts` table stores [`AttemptOutcome::as_str`];
/// [`AttemptOutcome::parse`] reads it back.
pub use pooler_plugin_kit::admin::AttemptOutcome;

/// The pin a request saw when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinSeen {
    pub account: String,
    pub generation: i64,
    /// This request claimed the pin itself (the session had none).
    pub claimed: bool,
    /// The last use stored with a confirmed pin; `None` for a provisional one (which a
    /// success must confirm).
    pub confirmed_use: Option<u64>,
}

impl PinSeen {
    /// Whether a success at `now` must write the pin: to confirm it, or because its stored
    /// last use is at least `granularity` old.
    pub fn touch_due(&self, now: u64, granularity: u64) -> bool {
        use_due(self.confirmed_use, now, granularity)
    }
}

/// Whether a last use read as `last_use` (`None`: none, or not yet confirmed) must be
/// written again at `now`, uses being recorded to `granularity`. The write re-checks in
/// SQL, so a stale read costs at most one write that changes nothing.
pub fn use_due(last_use: Option<u64>, now: u64, granularity: u64) -> bool {
    last_use.is_none_or(|used| used.saturating_add(granularity) <= now)
}

/// What to do with the session's pin after a success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinAction {
    /// Nothing (no session key, or a detour).
    Keep,
    /// The pinned account served: refresh its last use (and confirm a claimed pin).
    Touch,
    /// (Re)bind the session to the serving account.
    Bind,
}

/// The commit rule (spec §5, fixing #6990): a pin is (re)bound only when the session had
/// none, or its account is gone for a lasting reason (removed, disabled, in auth error,
/// shared quota exhausted). A success elsewhere after a transient failure, a hold or a
/// family limit is a detour and changes nothing. `pinned_gone` says whether the pinned
/// account is gone for a lasting reason (its outcome in this request, or its state now).
pub fn pin_action(
    has_key: bool,
    seen: Option<&PinSeen>,
    served: &str,
    pinned_gone: bool,
) -> PinAction {
    match seen {
        _ if !has_key => PinAction::Keep,
        None => PinAction::Bind,
        Some(p) if p.account == served => PinAction::Touch,
        Some(p) if p.claimed || pinned_gone => PinAction::Bind,
        Some(_) => PinAction::Keep,
    }
}

/// The cursor rule: set it when there is none; move it to the serving account only when
/// the cursor's account is gone for a lasting reason.
pub fn cursor_moves(cursor: Option<&str>, served: &str, cursor_gone: bool) -> bool {
    match cursor {
        None => true,
        Some(c) if c == served => false,
        Some(_) => cursor_gone,
    }
}

/// Whether an account is gone for a lasting reason: removed (None), or refused for a
/// lasting reason now, or refused lastingly during this request.
pub fn gone_for_good(
    account: Option<&AccountState>,
    outcome_here: Option<AttemptOutcome>,
    threshold: f64,
    now: u64,
) -> bool {
    if outcome_here.is_some_and(AttemptOutcome::is_lasting) {
        return true;
    }
    match account {
        None => true,
        Some(a) => matches!(tier(a, None, threshold, now), Tier::Refused(r) if r.is_lasting()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Window;

    const NOW: u64 = 1_000_000;
    const T: f64 = 0.98;

    fn acct(id: &str) -> AccountState {
        AccountState {
            id: id.into(),
            provider: Provider::Claude,
            kind: CredentialKind::ApiKey,
            priority: 0,
            seq: 0,
            enabled: true,
            error: None,
            held_until: None,
            hold_kind: None,
            quota: QuotaState::default(),
            needs_sign_in: false,
            token_expires_at: None,
            refresh_retry_at: None,
            last_used_at: None,
            options: AccountOptions::default(),
        }
    }

    fn window(
        name: &str,
        family: Option<Family>,
        util: f64,
        status: &str,
        reset: Option<u64>,
    ) -> Window {
        Window {
            name: name.into(),
            family,
            utilization: Some(util),
            resets_at: reset,
            status: Some(status.into()),
            observed_at: NOW,
        }
    }

    fn with_window(id: &str, w: Window) -> AccountState {
        let mut a = acct(id);
        a.quota.windows.push(w);
        a
    }

    /// AP-11 (#6169): an account at 99 % but not rejected is a reserve, still eligible.
    #[test]
    fn tiers_split_preferred_reserve_and_refused() {
        let mut disabled = acct("d");
        disabled.enabled = false;
        let mut errored = acct("e");
        errored.error = Some("401".into());
        let table = [
            (acct("a"), None, Tier::Preferred),
            (
                with_window("n", window("5h", None, 0.99, "allowed", Some(NOW + 10))),
                None,
                Tier::Reserve,
            ),
            (
                with_window("r", window("5h", None, 0.5, "rejected", Some(NOW + 10))),
                None,
                Tier::Refused(Refusal::SharedExhausted),
            ),
            (
                with_window("p", window("5h", None, 1.0, "rejected", Some(NOW))),
                None,
                Tier::Preferred,
            ),
            (
                with_window(
                    "f",
                    window("7d_opus", Some(Family::Opus), 1.0, "rejected", None),
                ),
                Some(Family::Opus),
                Tier::Refused(Refusal::FamilyExhausted),
            ),
            (
                with_window(
                    "g",
                    window("7d_opus", Some(Family::Opus), 1.0, "rejected", None),
                ),
                Some(Family::Sonnet),
                Tier::Preferred,
            ),
            (disabled, None, Tier::Refused(Refusal::Disabled)),
            (errored, None, Tier::Refused(Refusal::Error)),
        ];
        for (a, family, want) in table {
            assert_eq!(tier(&a, family, T, NOW), want, "{}", a.id);
        }
    }

    #[test]
    fn status_first_match_wins() {
        let mut held = with_window("h", window("5h", None, 1.0, "rejected", None));
        held.held_until = Some(NOW + 1);
        let mut dis_err = acct("x");
        dis_err.enabled = false;
        dis_err.error = Some("e".into());
        let table = [
            (acct("a"), AccountStatus::Ready),
            (dis_err, AccountStatus::Disabled),
            (held, AccountStatus::Held),
            (
                with_window("x", window("7d", None, 1.0, "allowed", None)),
                AccountStatus::Exhausted,
            ),
            (
                with_window("n", window("7d", None, 0.985, "allowed", None)),
                AccountStatus::NearLimit,
            ),
            (
                with_window(
                    "f",
                    window("7d_opus", Some(Family::Opus), 1.0, "rejected", None),
                ),
                AccountStatus::Ready,
            ),
        ];
        for (a, want) in table {
            assert_eq!(status(&a, T, NOW), want, "{}", a.id);
        }
    }

    /// AP-10: the pool's blocking time is the earliest across accounts, each account's the
    /// latest of its blocking windows; Retry-After and availability agree.
    #[test]
    fn verdict_blocks_until_the_earliest_account_and_matches_retry_after() {
        let mut a = with_window("a", window("5h", None, 1.0, "rejected", Some(NOW + 60_000)));
        a.quota
            .windows
            .push(window("7d", None, 0.2, "allowed", Some(NOW + 900_000)));
        let mut b = with_window("b", window("5h", None, 1.0, "rejected", Some(NOW + 60_000)));
        b.quota
            .windows
            .push(window("7d", None, 1.0, "rejected", Some(NOW + 120_000)));
        let v = verdict(&[a.clone(), b.clone()], None, T, NOW);
        assert_eq!(
            v,
            Availability::Blocked {
                retry_at: NOW + 60_000,
                cause: BlockCause::QuotaExhausted
            }
        );
        let resp = no_eligible_response(v, NOW);
        assert_eq!((resp.status, resp.retry_after_secs), (429, Some(60)));
        assert_eq!(
            verdict(&[b.clone()], None, T, NOW),
            Availability::Blocked {
                retry_at: NOW + 120_000,
                cause: BlockCause::QuotaExhausted
            }
        );
        assert_eq!(verdict(&[a, b], None, T, NOW + 60_000), Availability::Ready);
    }

    /// AP-21: the unavailable reasons and reset-unknown.
    #[test]
    fn verdict_reasons() {
        let mut off = acct("off");
        off.enabled = false;
        let mut err = acct("err");
        err.error = Some("refused".into());
        let unknown = with_window("u", window("primary", None, 1.0, "rejected", None));
        let mut held = acct("h");
        held.held_until = Some(NOW + 5_500);
        let table = [
            (
                vec![],
                Availability::Unavailable(UnavailableReason::NoEnabledAccount),
            ),
            (
                vec![off.clone()],
                Availability::Unavailable(UnavailableReason::NoEnabledAccount),
            ),
            (
                vec![off.clone(), err.clone()],
                Availability::Unavailable(UnavailableReason::Authentication),
            ),
            (
                vec![err.clone(), unknown.clone()],
                Availability::Unavailable(UnavailableReason::ResetUnknown),
            ),
            (
                vec![unknown.clone(), held.clone()],
                Availability::Blocked {
                    retry_at: NOW + 5_500,
                    cause: BlockCause::Held,
                },
            ),
            (vec![err, unknown, held, acct("ok")], Availability::Ready),
        ];
        for (accounts, want) in table {
            assert_eq!(
                verdict(&accounts, None, T, NOW),
                want,
                "{:?}",
                accounts.iter().map(|a| &a.id).collect::<Vec<_>>()
            );
        }
        let r = no_eligible_response(
            Availability::Unavailable(UnavailableReason::ResetUnknown),
            NOW,
        );
        assert_eq!(r.retry_after_secs, Some(60));
        assert_eq!(
            no_eligible_response(
                Availability::Unavailable(UnavailableReason::NoEnabledAccount),
                NOW
            )
            .status,
            503
        );
        assert_eq!(retry_after_secs(NOW + 5_500, NOW), 6);
        assert_eq!(retry_after_secs(NOW, NOW), 1);
    }

    #[test]
    fn family_verdict_uses_the_family_window() {
        let a = with_window(
            "a",
            window(
                "7d_opus",
                Some(Family::Opus),
                1.0,
                "rejected",
                Some(NOW + 30_000),
            ),
        );
        assert_eq!(
            verdict(std::slice::from_ref(&a), Some(Family::Opus), T, NOW),
            Availability::Blocked {
                retry_at: NOW + 30_000,
                cause: BlockCause::FamilyQuotaExhausted
            }
        );
        assert_eq!(verdict(&[a], None, T, NOW), Availability::Ready);
    }

    /// AP-11: every account at 99 % still serves (no 429).
    #[test]
    fn all_reserve_accounts_are_still_ready() {
        let a = with_window("a", window("5h", None, 0.99, "allowed", Some(NOW + 1_000)));
        let b = with_window(
            "b",
            window("5h", None, 0.995, "allowed_warning", Some(NOW + 1_000)),
        );
        assert_eq!(verdict(&[a, b], None, T, NOW), Availability::Ready);
    }

    fn cands(spec: &[(&str, Tier, bool)]) -> Vec<Candidate> {
        spec.iter()
            .map(|(id, tier, held)| Candidate::plain(id, *tier, *held))
            .collect()
    }

    #[allow(clippy::type_complexity)] // a table of cases reads better inline
    #[test]
    fn choose_follows_pin_parent_cursor_then_next_wrapping() {
        use Tier::*;
        let abc = cands(&[
            ("a", Preferred, false),
            ("b", Preferred, false),
            ("c", Preferred, false),
        ]);
        let refused = Refused(Refusal::SharedExhausted);
        let s = |attempted: &[&str], pinned, inherited, cursor, previous| {
            let attempted: Vec<String> = attempted.iter().map(|s| s.to_string()).collect();
            (attempted, pinned, inherited, cursor, previous)
        };
        let table: Vec<(
            &str,
            Vec<Candidate>,
            (
                Vec<String>,
                Option<&str>,
                Option<&str>,
                Option<&str>,
                Option<&str>,
            ),
            Option<(&str, Role)>,
        )> = vec![
            (
                "pin first",
                abc.clone(),
                s(&[], Some("b"), Some("c"), Some("a"), None),
                Some(("b", Role::Pinned)),
            ),
            (
                "pin even when held",
                cands(&[("a", Preferred, true)]),
                s(&[], Some("a"), None, None, None),
                Some(("a", Role::Pinned)),
            ),
            (
                "parent when no pin",
                abc.clone(),
                s(&[], None, Some("c"), Some("a"), None),
                Some(("c", Role::Inherited)),
            ),
            (
                "cursor for new",
                abc.clone(),
                s(&[], None, None, Some("b"), None),
                Some(("b", Role::Cursor)),
            ),
            (
                "first when no cursor",
                abc.clone(),
                s(&[], None, None, None, None),
                Some(("a", Role::Next)),
            ),
            (
                "next after previous",
                abc.clone(),
                s(&["b"], Some("b"), None, Some("a"), Some("b")),
                Some(("c", Role::Next)),
            ),
            (
                "wraps",
                abc.clone(),
                s(&["c"], None, None, Some("c"), Some("c")),
                Some(("a", Role::Next)),
            ),
            (
                "skips refused cursor",
                cands(&[
                    ("a", Preferred, false),
                    ("b", refused, false),
                    ("c", Preferred, false),
                ]),
                s(&[], None, None, Some("b"), None),
                Some(("c", Role::Next)),
            ),
            (
                "skips held",
                cands(&[("a", Preferred, true), ("b", Preferred, false)]),
                s(&[], None, None, Some("a"), None),
                Some(("b", Role::Next)),
            ),
            (
                "preferred before reserve for new",
                cands(&[("a", Reserve, false), ("b", Preferred, false)]),
                s(&[], None, None, Some("a"), None),
                Some(("b", Role::Next)),
            ),
            (
                "reserve cursor when nothing preferred",
                cands(&[("a", Reserve, false), ("b", refused, false)]),
                s(&[], None, None, Some("a"), None),
                Some(("a", Role::Cursor)),
            ),
            (
                "pinned reserve stays",
                cands(&[("a", Reserve, false), ("b", Preferred, false)]),
                s(&[], Some("a"), None, Some("b"), None),
                Some(("a", Role::Pinned)),
            ),
            (
                "nothing left",
                abc.clone(),
                s(&["a", "b", "c"], None, None, None, Some("c")),
                None,
            ),
        ];
        for (name, candidates, (attempted, pinned, inherited, cursor, previous), want) in table {
            let got = choose(Selection {
                candidates: &candidates,
                attempted: &attempted,
                pinned,
                inherited,
                cursor,
                previous,
                placing: pinned.is_none(),
                strategy: Strategy::FillFirst,
            });
            assert_eq!(
                got.as_ref().map(|(id, r)| (id.as_str(), *r)),
                want,
                "{name}"
            );
        }
    }

    const H: u64 = 3_600_000;

    /// A candidate as a ranking strategy sees it.
    fn ranked_cand(a: &AccountState, strategy: Strategy, live: u32, recent: u32) -> Candidate {
        Candidate {
            id: a.id.clone(),
            tier: tier(a, None, T, NOW),
            held: a.held(NOW),
            standby: standby(a, NOW),
            score: capacity(strategy, a, None, NOW),
            live,
            recent,
        }
    }

    /// The account a new conversation is placed on.
    fn place(candidates: &[Candidate], strategy: Strategy) -> Option<String> {
        choose(Selection {
            candidates,
            attempted: &[],
            pinned: None,
            inherited: None,
            cursor: candidates.first().map(|c| c.id.as_str()),
            previous: None,
            placing: true,
            strategy,
        })
        .map(|(id, role)| {
            assert_eq!(role, Role::Strategy, "{id}");
            id
        })
    }

    fn windows(id: &str, ws: Vec<Window>) -> AccountState {
        let mut a = acct(id);
        a.quota.windows = ws;
        a
    }

    /// spread: the most capacity left in the tightest window a request draws on (5-hour
    /// or weekly); never-observed accounts count as full; ties go by priority order.
    #[test]
    fn spread_ranks_accounts_by_the_capacity_their_tightest_window_has_left() {
        let s = Strategy::Spread;
        let a = windows(
            "a",
            vec![
                window("5h", None, 0.7, "allowed", Some(NOW + H)),
                window("7d", None, 0.1, "allowed", Some(NOW + 48 * H)),
            ],
        );
        let b = windows(
            "b",
            vec![
                window("5h", None, 0.1, "allowed", Some(NOW + H)),
                window("7d", None, 0.5, "allowed", Some(NOW + 48 * H)),
            ],
        );
        let c = acct("c");
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(close(capacity(s, &a, None, NOW), 0.3));
        assert!(close(capacity(s, &b, None, NOW), 0.5));
        assert_eq!(capacity(s, &c, None, NOW), 1.0);
        let all = [&a, &b, &c].map(|x| ranked_cand(x, s, 0, 0));
        assert_eq!(place(&all, s).as_deref(), Some("c"));
        assert_eq!(place(&all[..2], s).as_deref(), Some("b"));
        let equal = [acct("x"), acct("y")].map(|x| ranked_cand(&x, s, 0, 0));
        assert_eq!(place(&equal, s).as_deref(), Some("x"), "priority order");
        // A reserve account (over the switch threshold) only when nothing is preferred.
        let near = windows(
            "n",
            vec![window("5h", None, 0.99, "allowed", Some(NOW + H))],
        );
        let pair = [ranked_cand(&near, s, 0, 0), ranked_cand(&a, s, 5, 0)];
        assert_eq!(place(&pair, s).as_deref(), Some("a"));
    }

    /// soonest-reset: weekly quota left per hour until that window resets, so what would
    /// expire first is spent first; an account whose 5-hour window is nearly spent ranks
    /// in proportion to what that window has left (none: last).
    #[test]
    fn soonest_reset_spends_first_the_weekly_quota_that_expires_first() {
        let s = Strategy::SoonestReset;
        let week = |id: &str, used: f64, hours: u64, short_used: f64| {
            windows(
                id,
                vec![
                    window("5h", None, short_used, "allowed", Some(NOW + 2 * H)),
                    window("7d", None, used, "allowed", Some(NOW + hours * H)),
                ],
            )
        };
        let soon = week("soon", 0.4, 24, 0.1);
        let late = week("late", 0.1, 120, 0.0);
        let walled = week("walled", 0.4, 24, 0.9);
        let fresh = acct("fresh");
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(close(capacity(s, &soon, None, NOW), 0.6 / 24.0));
        assert!(close(capacity(s, &late, None, NOW), 0.9 / 120.0));
        assert!(close(
            capacity(s, &walled, None, NOW),
            0.6 / 24.0 * (0.1 / SHORT_WINDOW_GUARD)
        ));
        assert!(close(capacity(s, &fresh, None, NOW), 1.0 / 168.0));
        let spent_short = windows(
            "spent",
            vec![
                window("5h", None, 0.999, "allowed", Some(NOW + H)),
                window("7d", None, 0.2, "allowed", Some(NOW + H)),
            ],
        );
        assert!(capacity(s, &spent_short, None, NOW) < 0.01);
        let all = [&late, &walled, &soon, &fresh].map(|x| ranked_cand(x, s, 0, 0));
        assert_eq!(place(&all, s).as_deref(), Some("soon"));
        let no_soon = [&late, &walled, &fresh].map(|x| ranked_cand(x, s, 0, 0));
        assert_eq!(place(&no_soon, s).as_deref(), Some("walled"));
        // An account a minute from its reset counts as a quarter of an hour away.
        let minute = week("minute", 0.5, 0, 0.0);
        let minute = AccountState {
            quota: QuotaState {
                windows: vec![window("7d", None, 0.5, "allowed", Some(NOW + 60_000))],
                ..QuotaState::default()
            },
            ..minute
        };
        assert!(close(capacity(s, &minute, None, NOW), 0.5 / 0.25));
        // The family's own weekly window counts when it is tighter.
        let mut opus = week("opus", 0.2, 24, 0.0);
        opus.quota.windows.push(window(
            "7d_opus",
            Some(Family::Opus),
            0.9,
            "allowed",
            Some(NOW + 24 * H),
        ));
        assert!(close(
            capacity(s, &opus, Some(Family::Opus), NOW),
            0.1 / 24.0
        ));
        assert!(close(
            capacity(s, &opus, Some(Family::Sonnet), NOW),
            0.8 / 24.0
        ));
    }

    /// Eight new conversations on seven fresh accounts: none takes more than two, whether
    /// they start within a minute (the placements of the last minute count) or one by one
    /// (the conversations on each account count); and eight conversations moving off a
    /// spent account within a minute take at most their fair share of any one account,
    /// even when one account has far more capacity left than the rest.
    #[test]
    fn placements_spread_no_account_takes_more_than_its_fair_share() {
        for s in [Strategy::Spread, Strategy::SoonestReset] {
            let accounts: Vec<AccountState> = (1..=7).map(|i| acct(&format!("a{i}"))).collect();
            // Within a minute: `recent` grows with each placement.
            let mut recent = vec![0u32; 7];
            for _ in 0..8 {
                let c: Vec<Candidate> = accounts
                    .iter()
                    .zip(&recent)
                    .map(|(a, r)| ranked_cand(a, s, 0, *r))
                    .collect();
                let id = place(&c, s).unwrap();
                recent[accounts.iter().position(|a| a.id == id).unwrap()] += 1;
            }
            assert!(
                recent.iter().all(|n| *n <= 2),
                "{s:?} within a minute: {recent:?}"
            );
            // One by one: `live` grows, `recent` has lapsed.
            let mut live = vec![0u32; 7];
            for _ in 0..8 {
                let c: Vec<Candidate> = accounts
                    .iter()
                    .zip(&live)
                    .map(|(a, l)| ranked_cand(a, s, *l, 0))
                    .collect();
                let id = place(&c, s).unwrap();
                live[accounts.iter().position(|a| a.id == id).unwrap()] += 1;
            }
            assert!(live.iter().all(|n| *n <= 2), "{s:?} one by one: {live:?}");
            // Movers: one account is far ahead of the five others.
            let mut movers: Vec<AccountState> = (1..=5)
                .map(|i| {
                    windows(
                        &format!("m{i}"),
                        vec![window("7d", None, 0.7, "allowed", Some(NOW + 100 * H))],
                    )
                })
                .collect();
            movers.push(windows(
                "best",
                vec![window("7d", None, 0.0, "allowed", Some(NOW + 10 * H))],
            ));
            let mut recent = vec![0u32; 6];
            for _ in 0..8 {
                let c: Vec<Candidate> = movers
                    .iter()
                    .zip(&recent)
                    .map(|(a, r)| ranked_cand(a, s, 0, *r))
                    .collect();
                let id = place(&c, s).unwrap();
                recent[movers.iter().position(|a| a.id == id).unwrap()] += 1;
            }
            assert!(recent.iter().all(|n| *n <= 2), "{s:?} movers: {recent:?}");
            assert_eq!(recent[5], 2, "the best account takes its share first");
        }
        assert_eq!(ranked(std::iter::empty::<&Candidate>()), None);
    }

    /// Last-resort accounts are skipped while any other account is eligible (preferred or
    /// reserve), used when none is, for new conversations and detours alike; a pinned
    /// conversation stays on one; a child does not inherit one while another can serve.
    #[test]
    fn last_resort_serves_only_when_no_other_account_is_eligible() {
        let mut lr = acct("lr");
        lr.options.last_resort = true;
        assert_eq!(standby(&lr, NOW), Standby::LastResort);
        let near = windows(
            "near",
            vec![window("5h", None, 0.99, "allowed", Some(NOW + H))],
        );
        let spent = windows(
            "spent",
            vec![window("5h", None, 1.0, "rejected", Some(NOW + H))],
        );
        for s in Strategy::ALL {
            let c = [&lr, &near, &spent].map(|x| ranked_cand(x, s, 0, 0));
            let pick = |pinned, inherited, placing| {
                choose(Selection {
                    candidates: &c,
                    attempted: &[],
                    pinned,
                    inherited,
                    cursor: Some("lr"),
                    previous: None,
                    placing,
                    strategy: s,
                })
                .map(|(id, _)| id)
            };
            assert_eq!(pick(None, None, true).as_deref(), Some("near"), "{s:?}");
            assert_eq!(
                pick(None, Some("lr"), true).as_deref(),
                Some("near"),
                "{s:?}"
            );
            assert_eq!(
                pick(Some("lr"), None, false).as_deref(),
                Some("lr"),
                "{s:?}"
            );
            assert_eq!(
                pick(Some("spent"), None, true).as_deref(),
                Some("near"),
                "{s:?}"
            );
            let c = [&lr, &spent].map(|x| ranked_cand(x, s, 0, 0));
            let alone = choose(Selection {
                candidates: &c,
                attempted: &[],
                pinned: Some("spent"),
                inherited: None,
                cursor: None,
                previous: None,
                placing: true,
                strategy: s,
            });
            assert_eq!(alone.map(|(id, _)| id).as_deref(), Some("lr"), "{s:?}");
            let detour = choose(Selection {
                candidates: &[ranked_cand(&lr, s, 0, 0), ranked_cand(&near, s, 0, 0)],
                attempted: &["x".to_owned()],
                pinned: Some("x"),
                inherited: None,
                cursor: None,
                previous: Some("x"),
                placing: false,
                strategy: s,
            });
            assert_eq!(detour.map(|(id, _)| id).as_deref(), Some("near"), "{s:?}");
        }
    }

    /// `preserve`: at or over its ceiling of weekly utilization an account takes no new
    /// conversation while another can (a pinned one stays); under it, or when nothing else
    /// can serve, it does. A ceiling of 1 is none.
    #[test]
    fn preserve_keeps_an_account_over_its_ceiling_from_new_conversations() {
        let mut kept = windows(
            "kept",
            vec![window("7d", None, 0.85, "allowed", Some(NOW + H))],
        );
        kept.options.preserve = 0.8;
        assert_eq!(standby(&kept, NOW), Standby::Preserved);
        assert_eq!(standby(&kept, NOW + H), Standby::No, "the week reset");
        let mut under = kept.clone();
        under.options.preserve = 0.9;
        assert_eq!(standby(&under, NOW), Standby::No);
        let mut none = kept.clone();
        none.options.preserve = 1.0;
        assert_eq!(standby(&none, NOW), Standby::No);
        let other = windows(
            "other",
            vec![window("7d", None, 0.95, "allowed", Some(NOW + H))],
        );
        let mut lr = acct("lr");
        lr.options.last_resort = true;
        for s in Strategy::ALL {
            let c = [&kept, &other, &lr].map(|x| ranked_cand(x, s, 0, 0));
            let placed = choose(Selection {
                candidates: &c,
                attempted: &[],
                pinned: None,
                inherited: None,
                cursor: Some("kept"),
                previous: None,
                placing: true,
                strategy: s,
            });
            assert_eq!(placed.map(|(id, _)| id).as_deref(), Some("other"), "{s:?}");
            let c = [&kept, &lr].map(|x| ranked_cand(x, s, 0, 0));
            let placed = choose(Selection {
                candidates: &c,
                attempted: &[],
                pinned: None,
                inherited: None,
                cursor: Some("lr"),
                previous: None,
                placing: true,
                strategy: s,
            });
            assert_eq!(
                placed.map(|(id, _)| id).as_deref(),
                Some("kept"),
                "{s:?}: before a last-resort account"
            );
            let pinned = choose(Selection {
                candidates: &[ranked_cand(&kept, s, 0, 0), ranked_cand(&other, s, 0, 0)],
                attempted: &[],
                pinned: Some("kept"),
                inherited: None,
                cursor: None,
                previous: None,
                placing: false,
                strategy: s,
            });
            assert_eq!(pinned, Some(("kept".to_owned(), Role::Pinned)));
        }
    }

    /// The provider's billing refusals (observed shapes and the assumed 402), told from
    /// the 400s a client must see.
    #[test]
    fn billing_refusals_are_told_from_other_refusals() {
        let claude = |message: &str| json_error("invalid_request_error", message);
        let table = [
            (
                400,
                claude(
                    "You're out of extra usage. Add more at claude.ai/settings/usage and keep going.",
                ),
                true,
            ),
            (
                400,
                claude("Third-party apps now draw from your extra usage, not your plan limits."),
                true,
            ),
            (
                400,
                claude(
                    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
                ),
                true,
            ),
            (400, json_error("billing_error", "Billing problem."), true),
            (402, String::new(), true),
            (400, claude("max_tokens: Field required"), false),
            (
                400,
                claude("prompt is too long: 210000 tokens > 200000 maximum"),
                false,
            ),
            (429, claude("You're out of extra usage."), false),
            (500, claude("credit balance is too low"), false),
        ];
        for (status, body, want) in table {
            assert_eq!(
                billing_refusal(status, body.as_bytes()),
                want,
                "{status} {body}"
            );
        }
    }

    fn json_error(kind: &str, message: &str) -> String {
        serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
            .to_string()
    }

    /// The stored words are the WIT `attempt-outcome` case names, one per outcome, and read
    /// back to the same outcome; any other text names none.
    #[test]
    fn attempt_outcomes_are_stored_as_their_wit_words_and_read_back() {
        let words: Vec<&str> = AttemptOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            words,
            [
                "served",
                "detour",
                "passed-through",
                "transient",
                "hold",
                "quota",
                "family",
                "auth",
                "cancelled"
            ]
        );
        for &o in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(o.as_str()), Some(o));
        }
        for other in ["", "Served", "detoured", "served ", "passed through"] {
            assert_eq!(AttemptOutcome::parse(other), None, "{other:?}");
        }
    }

    /// The outcome table of spec §4.
    #[test]
    fn classify_outcomes() {
        let none = Observation::default();
        let shared = Observation {
            windows: vec![window("5h", None, 1.0, "rejected", Some(NOW + 1))],
            ..Observation::default()
        };
        let opus = Observation {
            windows: vec![window("7d_opus", Some(Family::Opus), 1.0, "rejected", None)],
            ..Observation::default()
        };
        let table = [
            (200, &none, None, Classified::Served),
            (201, &none, None, Classified::Served),
            (429, &shared, Some(Family::Opus), Classified::Quota),
            (429, &opus, Some(Family::Opus), Classified::Family),
            (429, &opus, Some(Family::Sonnet), Classified::RateLimited),
            (429, &none, None, Classified::RateLimited),
            (401, &none, None, Classified::AuthRefused),
            (403, &none, None, Classified::AuthRefused),
            (408, &none, None, Classified::Transient),
            (500, &none, None, Classified::Transient),
            (502, &none, None, Classified::Transient),
            (503, &none, None, Classified::Transient),
            (504, &none, None, Classified::Transient),
            (529, &none, None, Classified::Transient),
            (400, &none, None, Classified::PassThrough),
            (404, &none, None, Classified::PassThrough),
            (413, &none, None, Classified::PassThrough),
            (501, &none, None, Classified::PassThrough),
        ];
        for (status, obs, family, want) in table {
            assert_eq!(classify(status, obs, family, NOW), want, "{status}");
        }
    }

    /// #6990: detours never move the pin; lasting reasons and new sessions bind.
    #[test]
    fn pin_commit_rule() {
        let seen = |account: &str, claimed| PinSeen {
            account: account.into(),
            generation: 1,
            claimed,
            confirmed_use: None,
        };
        let table = [
            ("no key", false, None, "b", false, PinAction::Keep),
            ("new session binds", true, None, "b", false, PinAction::Bind),
            (
                "own account touches",
                true,
                Some(seen("a", false)),
                "a",
                false,
                PinAction::Touch,
            ),
            (
                "detour keeps",
                true,
                Some(seen("a", false)),
                "b",
                false,
                PinAction::Keep,
            ),
            (
                "lasting rebinds",
                true,
                Some(seen("a", false)),
                "b",
                true,
                PinAction::Bind,
            ),
            (
                "claimed binds to server",
                true,
                Some(seen("a", true)),
                "b",
                false,
                PinAction::Bind,
            ),
        ];
        for (name, has_key, seen, served, gone, want) in table {
            assert_eq!(
                pin_action(has_key, seen.as_ref(), served, gone),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn cursor_rule_and_lasting_reasons() {
        assert!(cursor_moves(None, "a", false));
        assert!(!cursor_moves(Some("a"), "a", true));
        assert!(!cursor_moves(Some("a"), "b", false));
        assert!(cursor_moves(Some("a"), "b", true));

        let a = acct("a");
        let mut off = acct("off");
        off.enabled = false;
        let fam = with_window(
            "f",
            window("7d_opus", Some(Family::Opus), 1.0, "rejected", None),
        );
        let table = [
            (None, None, true),
            (Some(&a), None, false),
            (Some(&a), Some(AttemptOutcome::Transient), false),
            (Some(&a), Some(AttemptOutcome::Hold), false),
            (Some(&a), Some(AttemptOutcome::Family), false),
            (Some(&a), Some(AttemptOutcome::Auth), true),
            (Some(&a), Some(AttemptOutcome::Quota), true),
            (Some(&off), None, true),
            (Some(&fam), None, false),
        ];
        for (account, outcome, want) in table {
            assert_eq!(
                gone_for_good(account, outcome, T, NOW),
                want,
                "{account:?} {outcome:?}"
            );
        }
    }

    #[test]
    fn expired_token_in_refresh_backoff_is_unusable_until_the_retry() {
        let mut a = acct("o");
        a.kind = CredentialKind::OAuth;
        a.token_expires_at = Some(NOW - 1);
        a.refresh_retry_at = Some(NOW + 4_000);
        assert_eq!(a.unusable_until(NOW), Some(NOW + 4_000));
        a.token_expires_at = Some(NOW + 1);
        assert_eq!(
            a.unusable_until(NOW),
            None,
            "a valid token keeps serving during backoff"
        );
    }
}
