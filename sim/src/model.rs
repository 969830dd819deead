//! The provider model: the strict fake provider grown into a stateful service. Each account
//! has the windows of its plan — a 5-hour window (Codex: primary) that starts at the first
//! request after the previous one ended, a weekly window (Codex: secondary) that resets at
//! the account's own instant, model-scoped weekly buckets (Claude `7d_<family>`), or
//! per-minute limits for API keys — and every answer carries the real headers
//! (`anthropic-ratelimit-unified-*`, `x-codex-primary-*`/`secondary-*`), the real 429s
//! (unified `rejected` with its reset and representative claim; Codex
//! `usage_limit_reached`), 529 `overloaded_error` in an incident, and streams that take the
//! time their tokens take. OAuth access tokens expire and are refreshed at a token endpoint
//! that rotates refresh tokens.
//!
//! What the model assumes about real limits is in the scenario (plan sizes in abstract
//! units, what a token costs); the request rules and answer shapes come from
//! [`pooler_fake_provider::contract`] (the strict fake), whose refusals the server applies
//! before this model answers.
//!
//! The model is also the **oracle**: [`Model::can_serve`] says whether some enabled account
//! could serve a request of a model family at this instant — what "waiting while capacity
//! existed" is measured against.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use pooler_fake_provider::contract::claude;
use pooler_fake_provider::server::{Received, Reply};
use serde_json::{Value, json};

use crate::rng::draw;
use crate::scenario::{
    CredentialKind, HOUR, Incident, IncidentKind, MINUTE, Plan, ProviderName, ProviderParams,
    Scenario, WEEK, group_member,
};

const FIVE_HOURS: u64 = 5 * HOUR;

/// What a request of the simulated agents says about itself, in its message text
/// (`sim t=3 r=57 c=45000 o=800 k=main`): the thread, the request's number in the thread,
/// the context it carries, the output it asks for and the prompt-cache prefix it extends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    pub thread: u32,
    pub request: u64,
    pub context: u64,
    pub output: u64,
    pub cache_key: String,
}

impl Tag {
    pub fn text(&self) -> String {
        format!(
            "sim t={} r={} c={} o={} k={}",
            self.thread, self.request, self.context, self.output, self.cache_key
        )
    }

    pub fn parse(text: &str) -> Option<Tag> {
        let rest = text.trim().strip_prefix("sim ")?;
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for part in rest.split_whitespace() {
            let (k, v) = part.split_once('=')?;
            fields.insert(k, v);
        }
        Some(Tag {
            thread: fields.get("t")?.parse().ok()?,
            request: fields.get("r")?.parse().ok()?,
            context: fields.get("c")?.parse().ok()?,
            output: fields.get("o")?.parse().ok()?,
            cache_key: (*fields.get("k")?).to_owned(),
        })
    }
}

/// The family a model name belongs to (`claude-opus-4-1` → `opus`), as the pool reads it.
pub fn family_of(model: &str) -> String {
    for family in ["opus", "sonnet", "haiku"] {
        if model.contains(family) {
            return family.to_owned();
        }
    }
    model.to_owned()
}

/// How one upstream attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Served,
    /// 429: a window spent, or a per-minute limit.
    RateLimited,
    /// 529 `overloaded_error`.
    Overloaded,
    /// 500 `api_error`.
    Error,
    /// The connection dropped before the head.
    Dropped,
    /// 401: an unknown or expired credential.
    Unauthorized,
}

/// One upstream attempt on a tagged request, as the model answered it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub at: u64,
    pub account: usize,
    pub thread: u32,
    pub request: u64,
    /// The conversation (session id) the request belongs to.
    pub session: String,
    pub end: AttemptEnd,
    /// Tokens served (input of every kind plus output); 0 unless served.
    pub tokens: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    /// What it cost, in the plan's units (0 unless served).
    pub units: f64,
}

/// A weekly window that ended with quota left.
#[derive(Debug, Clone)]
pub struct Expiry {
    pub account: usize,
    pub at: u64,
    /// Share of the week's capacity left unused.
    pub unused: f64,
}

/// One point of an account's utilization over time (true values, not the pool's view).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: u64,
    pub five_hour: f32,
    pub weekly: f32,
}

enum Credential {
    ApiKey(String),
    OAuth {
        /// Access tokens that still work, with their expiry (an old one stays valid until it
        /// expires, as real ones do).
        access: Vec<(String, u64)>,
        refresh: String,
        /// Refreshes are refused with `invalid_grant` (another client rotated the token).
        revoked: bool,
        serial: u32,
    },
}

/// One account of the model.
struct Account {
    name: String,
    provider: ProviderName,
    plan: Plan,
    credential: Credential,
    /// The open 5-hour (primary) window: its end and what it spent.
    five: Option<(u64, f64)>,
    /// The end of the weekly cycle `week_used` belongs to.
    week_end: u64,
    week_used: f64,
    family_used: BTreeMap<String, f64>,
    /// Requests of the last minute: (when, input tokens).
    minute: VecDeque<(u64, u64)>,
    /// Prompt caches: cache key → (last use, prefix tokens).
    caches: HashMap<String, (u64, u64)>,
    samples: Vec<Sample>,
}

/// OAuth tokens the model issued for an account.
#[derive(Debug, Clone)]
pub struct Issued {
    pub access: String,
    pub refresh: String,
    pub expires_at: u64,
    /// Codex's `chatgpt-account-id`.
    pub account_id: Option<String>,
}

struct State {
    accounts: Vec<Account>,
    /// Attempts so far per (thread, request): names each attempt's random draws.
    tries: HashMap<(u32, u64), u64>,
    attempts: Vec<Attempt>,
    /// The account that served each (thread, request).
    served_by: HashMap<(u32, u64), usize>,
    expiries: Vec<Expiry>,
    refreshes: u64,
    refresh_refusals: u64,
}

/// The provider model (one for every account of both providers).
pub struct Model {
    seed: u64,
    params: ProviderParams,
    incidents: Vec<(u64, u64, IncidentKind, f64)>,
    state: Mutex<State>,
    /// Called after every change of what an account can serve (the oracle re-evaluates).
    on_change: Box<dyn Fn(u64) + Send + Sync>,
}

impl Model {
    /// The model of `scenario`'s accounts at its start. `on_change(now)` is called after
    /// every answer that may change what the accounts can serve.
    pub fn new(
        scenario: &Scenario,
        on_change: Box<dyn Fn(u64) + Send + Sync>,
    ) -> anyhow::Result<Model> {
        let start = scenario.start_ms;
        let mut accounts = Vec::new();
        for group in &scenario.accounts {
            let plan = scenario.plans[&group.plan].clone();
            let first_reset = match &group.weekly_reset {
                Some(at) => scenario.at(at)?,
                None => start + WEEK,
            };
            for i in 0..group.count {
                let idx = accounts.len();
                let stagger = (group.weekly_stagger_h * f64::from(i) * HOUR as f64) as u64;
                let mut week_end = first_reset + stagger;
                while week_end > start + WEEK {
                    week_end -= WEEK;
                }
                let spent = (group.spent_at_start - group.spent_stagger * f64::from(i)).max(0.0);
                let credential = match group.credential {
                    CredentialKind::ApiKey => Credential::ApiKey(format!("sk-ant-api03-sim-{idx}")),
                    CredentialKind::Oauth => Credential::OAuth {
                        access: Vec::new(),
                        refresh: String::new(),
                        revoked: false,
                        serial: 0,
                    },
                };
                accounts.push(Account {
                    name: group_member(&group.name, group.count, i),
                    provider: plan.provider,
                    week_used: plan.weekly.unwrap_or(0.0) * spent,
                    plan: plan.clone(),
                    credential,
                    five: None,
                    week_end,
                    family_used: BTreeMap::new(),
                    minute: VecDeque::new(),
                    caches: HashMap::new(),
                    samples: Vec::new(),
                });
            }
        }
        let incidents = scenario
            .incidents
            .iter()
            .map(|i: &Incident| {
                let at = scenario.at(&i.at)?;
                Ok((at, at + (i.minutes * MINUTE as f64) as u64, i.kind, i.rate))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Model {
            seed: scenario.seed,
            params: scenario.provider.clone(),
            incidents,
            state: Mutex::new(State {
                accounts,
                tries: HashMap::new(),
                attempts: Vec::new(),
                served_by: HashMap::new(),
                expiries: Vec::new(),
                refreshes: 0,
                refresh_refusals: 0,
            }),
            on_change,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn account_count(&self) -> usize {
        self.state().accounts.len()
    }

    pub fn account_name(&self, idx: usize) -> String {
        self.state().accounts[idx].name.clone()
    }

    pub fn provider_of(&self, idx: usize) -> ProviderName {
        self.state().accounts[idx].provider
    }

    /// The API key of an API-key account.
    pub fn api_key(&self, idx: usize) -> Option<String> {
        match &self.state().accounts[idx].credential {
            Credential::ApiKey(k) => Some(k.clone()),
            Credential::OAuth { .. } => None,
        }
    }

    /// New OAuth tokens for an account, as a sign-in gives them: the old refresh token
    /// stops working, a revocation is lifted.
    pub fn sign_in(&self, idx: usize, now: u64) -> Issued {
        let life = (self.params.access_token_h * HOUR as f64) as u64;
        let mut state = self.state();
        let account = &mut state.accounts[idx];
        let provider = account.provider;
        let Credential::OAuth {
            access,
            refresh,
            revoked,
            serial,
        } = &mut account.credential
        else {
            panic!("sign-in of an API-key account");
        };
        *serial += 1;
        let (a, r) = tokens(provider, idx, *serial);
        access.push((a.clone(), now + life));
        *refresh = r.clone();
        *revoked = false;
        Issued {
            access: a,
            refresh: r,
            expires_at: now + life,
            account_id: (provider == ProviderName::Codex).then(|| format!("acct-sim-{idx}")),
        }
    }

    /// Another client used the account's refresh token: refreshes now get `invalid_grant`.
    pub fn revoke_refresh(&self, idx: usize) {
        if let Credential::OAuth { revoked, .. } = &mut self.state().accounts[idx].credential {
            *revoked = true;
        }
    }

    /// Whether some account in `enabled` could serve a request of `provider` and `family`
    /// now: a credential that works (or can be refreshed), no window spent, room in its
    /// per-minute limits, and no provider-wide incident failing every attempt.
    pub fn can_serve(
        &self,
        provider: ProviderName,
        family: &str,
        enabled: &[bool],
        now: u64,
    ) -> bool {
        if self
            .incidents
            .iter()
            .any(|(from, to, _, rate)| *from <= now && now < *to && *rate >= 1.0)
        {
            return false;
        }
        let mut state = self.state();
        let State {
            accounts, expiries, ..
        } = &mut *state;
        accounts.iter_mut().enumerate().any(|(idx, a)| {
            a.provider == provider
                && enabled.get(idx).copied().unwrap_or(false)
                && a.credential_works(now)
                && {
                    a.roll(idx, now, expiries);
                    a.refusal(family, 0, now).is_none()
                }
        })
    }

    /// The next instant after `now` at which what an account can serve changes by itself
    /// (a window ends, an incident starts or ends, a per-minute slot frees, a token whose
    /// refresh is revoked expires).
    pub fn next_change(&self, now: u64) -> Option<u64> {
        let state = self.state();
        let mut times: Vec<u64> = Vec::new();
        for (from, to, _, _) in &self.incidents {
            times.extend([*from, *to]);
        }
        for a in &state.accounts {
            times.push(a.week_end);
            if let Some((end, _)) = a.five {
                times.push(end);
            }
            if let Some((t, _)) = a.minute.front() {
                times.push(t + MINUTE);
            }
            if let Credential::OAuth {
                access,
                revoked: true,
                ..
            } = &a.credential
            {
                times.extend(access.iter().map(|(_, exp)| *exp));
            }
        }
        times.into_iter().filter(|t| *t > now).min()
    }

    /// Close the weekly windows that ended by `now` (recording what expired unused).
    pub fn roll_all(&self, now: u64) {
        let mut state = self.state();
        let State {
            accounts, expiries, ..
        } = &mut *state;
        for (idx, a) in accounts.iter_mut().enumerate() {
            a.roll(idx, now, expiries);
        }
    }

    /// Every attempt so far, in order.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.state().attempts.clone()
    }

    /// The account that served request `request` of thread `thread`, if one did.
    pub fn served_by(&self, thread: u32, request: u64) -> Option<usize> {
        self.state().served_by.get(&(thread, request)).copied()
    }

    /// Weekly quota still unused at `now`, in accounts' weeks (windows that ended by then are
    /// closed first): what a run's end leaves that no reset inside the run counted.
    pub fn weekly_left(&self, now: u64) -> f64 {
        self.roll_all(now);
        let state = self.state();
        state
            .accounts
            .iter()
            .filter_map(|a| {
                let cap = a.plan.weekly.filter(|c| *c > 0.0)?;
                Some((1.0 - a.week_used / cap).max(0.0))
            })
            .fold(0.0, |sum, left| sum + left)
    }

    pub fn expiries(&self) -> Vec<Expiry> {
        self.state().expiries.clone()
    }

    /// (refreshes granted, refreshes refused).
    pub fn refreshes(&self) -> (u64, u64) {
        let s = self.state();
        (s.refreshes, s.refresh_refusals)
    }

    /// Each account's utilization over time.
    pub fn samples(&self) -> Vec<Vec<Sample>> {
        self.state()
            .accounts
            .iter()
            .map(|a| a.samples.clone())
            .collect()
    }

    /// The answer to a request at the provider API (after the strict fake's rules passed
    /// it); `None` for a path the model does not serve.
    pub fn respond(&self, request: &Received, now: u64) -> Option<Reply> {
        let path = request
            .path
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned();
        let reply = match (request.method.as_str(), path.as_str()) {
            ("POST", "/v1/messages") => self.turn(ProviderName::Claude, request, now),
            ("POST", p) if p.starts_with("/backend-api/") && p.ends_with("/responses") => {
                self.turn(ProviderName::Codex, request, now)
            }
            ("GET", "/api/oauth/usage") => self.usage(ProviderName::Claude, request, now),
            ("GET", p) if p.starts_with("/backend-api/") && p.ends_with("/usage") => {
                self.usage(ProviderName::Codex, request, now)
            }
            _ => return None,
        };
        Some(reply)
    }

    /// The token endpoint's answer to a refresh grant (the strict fake checked its shape).
    pub fn refresh(&self, request: &Received, now: u64) -> Reply {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let token = body
            .get("refresh_token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let life = (self.params.access_token_h * HOUR as f64) as u64;
        let mut state = self.state();
        let refused = Reply::status(400)
            .header("content-type", "application/json")
            .body(
                json!({"error": "invalid_grant", "error_description": "Invalid refresh token"})
                    .to_string(),
            );
        let Some(idx) = state.accounts.iter().position(
            |a| matches!(&a.credential, Credential::OAuth { refresh, .. } if refresh == token),
        ) else {
            state.refresh_refusals += 1;
            return refused;
        };
        let n = state.refreshes + state.refresh_refusals;
        let flaky = draw(self.seed, &[0x7e, idx as u64, n]) < self.params.refresh_failure_rate;
        let account = &mut state.accounts[idx];
        let provider = account.provider;
        let Credential::OAuth {
            access,
            refresh,
            revoked,
            serial,
        } = &mut account.credential
        else {
            unreachable!("matched an OAuth account above");
        };
        if *revoked || flaky {
            state.refresh_refusals += 1;
            return refused;
        }
        *serial += 1;
        let (a, r) = tokens(provider, idx, *serial);
        access.retain(|(_, exp)| *exp > now);
        access.push((a.clone(), now + life));
        *refresh = r.clone();
        state.refreshes += 1;
        Reply::status(200)
            .header("content-type", "application/json")
            .body(
                json!({"access_token": a, "refresh_token": r, "expires_in": life / 1000,
                   "token_type": "Bearer"})
                .to_string(),
            )
    }

    /// The account a request's credential belongs to, or the 401 the service gives.
    fn authenticate(
        &self,
        state: &State,
        provider: ProviderName,
        request: &Received,
        now: u64,
    ) -> Result<usize, Reply> {
        let key = request.header("x-api-key");
        let bearer = request
            .header("authorization")
            .and_then(|a| a.strip_prefix("Bearer "));
        let mut expired = false;
        for (idx, a) in state.accounts.iter().enumerate() {
            if a.provider != provider {
                continue;
            }
            match (&a.credential, key, bearer) {
                (Credential::ApiKey(k), Some(given), _) if k == given => return Ok(idx),
                (Credential::OAuth { access, .. }, _, Some(given)) => {
                    if let Some((_, exp)) = access.iter().find(|(t, _)| t == given) {
                        if *exp > now {
                            return Ok(idx);
                        }
                        expired = true;
                    }
                }
                _ => {}
            }
        }
        Err(match provider {
            ProviderName::Claude if expired => claude::error(
                401,
                "authentication_error",
                "OAuth token has expired. Please obtain a new token or refresh your existing token.",
            ),
            ProviderName::Claude => claude::error(401, "authentication_error", "invalid x-api-key"),
            ProviderName::Codex => Reply::status(401)
                .header("content-type", "application/json")
                .body(json!({"error": {"message": "Your authentication token has expired or is invalid.",
                                       "type": "invalid_request_error", "code": "token_expired"}}).to_string()),
        })
    }

    fn turn(&self, provider: ProviderName, request: &Received, now: u64) -> Reply {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned();
        let family = family_of(&model);
        let text = match provider {
            ProviderName::Claude => body.pointer("/messages/0/content").and_then(Value::as_str),
            ProviderName::Codex => body
                .pointer("/input/0/content/0/text")
                .and_then(Value::as_str),
        };
        let tag = text.and_then(Tag::parse).unwrap_or(Tag {
            thread: u32::MAX,
            request: 0,
            context: 1000,
            output: 100,
            cache_key: "untagged".into(),
        });
        let session = match provider {
            ProviderName::Claude => request.header("x-claude-code-session-id"),
            ProviderName::Codex => request.header("session-id"),
        }
        .unwrap_or_default()
        .to_owned();
        let mut state = self.state();
        let idx = match self.authenticate(&state, provider, request, now) {
            Ok(idx) => idx,
            Err(reply) => return reply,
        };
        let try_n = {
            let n = state.tries.entry((tag.thread, tag.request)).or_insert(0);
            *n += 1;
            *n
        };
        let occasion = [u64::from(tag.thread), tag.request, try_n];
        let record = |state: &mut State, end: AttemptEnd, served: (u64, u64, u64), units: f64| {
            if end == AttemptEnd::Served {
                state.served_by.insert((tag.thread, tag.request), idx);
            }
            state.attempts.push(Attempt {
                at: now,
                account: idx,
                thread: tag.thread,
                request: tag.request,
                session: session.clone(),
                end,
                tokens: served.0,
                cache_read: served.1,
                cache_write: served.2,
                units,
            });
        };
        // A provider-wide incident fails an attempt before any account state is touched.
        for (from, to, kind, rate) in &self.incidents {
            if *from <= now
                && now < *to
                && draw(self.seed, &[0x1c, occasion[0], occasion[1], occasion[2]]) < *rate
            {
                let (end, reply) = match kind {
                    IncidentKind::Overloaded => (AttemptEnd::Overloaded, overloaded(provider)),
                    IncidentKind::Errors => (AttemptEnd::Error, server_error(provider)),
                };
                record(&mut state, end, (0, 0, 0), 0.0);
                return reply;
            }
        }
        if draw(self.seed, &[0xe5, occasion[0], occasion[1], occasion[2]]) < self.params.error_rate
        {
            record(&mut state, AttemptEnd::Error, (0, 0, 0), 0.0);
            return server_error(provider);
        }
        if draw(self.seed, &[0xd5, occasion[0], occasion[1], occasion[2]]) < self.params.drop_rate {
            record(&mut state, AttemptEnd::Dropped, (0, 0, 0), 0.0);
            return Reply::drop_connection();
        }
        let State {
            accounts, expiries, ..
        } = &mut *state;
        let account = &mut accounts[idx];
        account.roll(idx, now, expiries);
        // Prompt cache: a prefix used within its lifetime is read, the rest written.
        let ttl = (self.params.cache_ttl_min * MINUTE as f64) as u64;
        let cached = account
            .caches
            .get(&format!("{session}/{}", tag.cache_key))
            .filter(|(last, _)| now.saturating_sub(*last) <= ttl)
            .map_or(0, |(_, prefix)| *prefix);
        let cache_read = cached.min(tag.context);
        let cache_write = tag.context - cache_read;
        let input = 4;
        // Per-minute input limits count what is not read from a cache (the Messages API's
        // cache-aware input limit).
        if let Some(refusal) = account.refusal(&family, input + cache_write, now) {
            let reply = account.refused(&refusal, now);
            account.sample(now);
            record(&mut state, AttemptEnd::RateLimited, (0, 0, 0), 0.0);
            drop(state);
            (self.on_change)(now);
            return reply;
        }
        account
            .caches
            .retain(|_, (last, _)| now.saturating_sub(*last) <= ttl);
        account.caches.insert(
            format!("{session}/{}", tag.cache_key),
            (now, tag.context + tag.output),
        );
        let c = &self.params.cost;
        let weight = self
            .params
            .family_weight
            .get(&family)
            .copied()
            .unwrap_or(1.0);
        let units = weight
            * (input as f64 * c.input
                + cache_write as f64 * c.cache_write
                + cache_read as f64 * c.cache_read
                + tag.output as f64 * c.output)
            / 1000.0;
        account.spend(&family, units, input + cache_write, now);
        account.sample(now);
        let headers = account.headers(now);
        let tokens = input + cache_read + cache_write + tag.output;
        record(
            &mut state,
            AttemptEnd::Served,
            (tokens, cache_read, cache_write),
            units,
        );
        drop(state);
        (self.on_change)(now);
        let ttft = self.params.ttft_ms[0]
            + (self.params.ttft_ms[1] - self.params.ttft_ms[0]).max(0.0)
                * draw(self.seed, &[0x77, occasion[0], occasion[1], occasion[2]]);
        let stream = Duration::from_secs_f64(tag.output as f64 / self.params.tokens_per_s.max(1.0));
        let usage = (input, cache_read, cache_write, tag.output);
        let mut reply = match provider {
            ProviderName::Claude => {
                claude_stream(&model, usage, Duration::from_millis(ttft as u64), stream)
            }
            ProviderName::Codex => codex_stream(usage, Duration::from_millis(ttft as u64), stream),
        };
        for (name, value) in headers {
            reply = reply.header(&name, &value);
        }
        reply
    }

    fn usage(&self, provider: ProviderName, request: &Received, now: u64) -> Reply {
        let mut state = self.state();
        let idx = match self.authenticate(&state, provider, request, now) {
            Ok(idx) => idx,
            Err(reply) => return reply,
        };
        let State {
            accounts, expiries, ..
        } = &mut *state;
        let a = &mut accounts[idx];
        a.roll(idx, now, expiries);
        let five = a.five.filter(|(end, _)| *end > now);
        let window = |used: f64, cap: Option<f64>, reset: Option<u64>| {
            json!({"utilization": 100.0 * cap.map_or(0.0, |c| used / c).min(1.0),
                   "resets_at": reset.map(rfc3339)})
        };
        let body = match provider {
            ProviderName::Claude => {
                let mut body = json!({
                    "five_hour": window(five.map_or(0.0, |(_, u)| u), a.plan.five_hour, five.map(|(e, _)| e)),
                    "seven_day": window(a.week_used, a.plan.weekly, Some(a.week_end)),
                });
                for (family, cap) in &a.plan.weekly_by_family {
                    let used = a.family_used.get(family).copied().unwrap_or(0.0);
                    body[format!("seven_day_{family}")] =
                        window(used, Some(*cap), Some(a.week_end));
                }
                body
            }
            ProviderName::Codex => {
                let pct =
                    |used: f64, cap: Option<f64>| 100.0 * cap.map_or(0.0, |c| used / c).min(1.0);
                json!({"rate_limit": {
                    "primary_window": {"used_percent": pct(five.map_or(0.0, |(_, u)| u), a.plan.five_hour),
                                       "reset_after_seconds": five.map_or(0, |(e, _)| (e - now) / 1000)},
                    "secondary_window": {"used_percent": pct(a.week_used, a.plan.weekly),
                                         "reset_after_seconds": (a.week_end - now) / 1000}}})
            }
        };
        Reply::status(200)
            .header("content-type", "application/json")
            .body(body.to_string())
    }
}

/// Why an account refuses a request.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    FiveHour(u64),
    Weekly(u64),
    Family(String, u64),
    /// A per-minute limit: free again at this time.
    PerMinute(u64),
}

impl Account {
    fn credential_works(&self, now: u64) -> bool {
        match &self.credential {
            Credential::ApiKey(_) => true,
            Credential::OAuth {
                access, revoked, ..
            } => !*revoked || access.iter().any(|(_, exp)| *exp > now),
        }
    }

    /// Close the windows that ended by `now`; a weekly window that ends records what it
    /// left unused.
    fn roll(&mut self, idx: usize, now: u64, expiries: &mut Vec<Expiry>) {
        if let Some((end, _)) = self.five.filter(|(end, _)| *end <= now) {
            self.five = None;
            self.sample(end);
        }
        while self.week_end <= now {
            if let Some(cap) = self.plan.weekly.filter(|c| *c > 0.0) {
                expiries.push(Expiry {
                    account: idx,
                    at: self.week_end,
                    unused: (1.0 - self.week_used / cap).max(0.0),
                });
            }
            self.week_used = 0.0;
            self.family_used.clear();
            self.week_end += WEEK;
            self.sample(self.week_end - WEEK);
        }
    }

    fn refusal(&mut self, family: &str, input: u64, now: u64) -> Option<Refusal> {
        let p = &self.plan;
        if let Some(rpm) = p
            .requests_per_minute
            .or(p.input_tokens_per_minute.map(|_| u32::MAX))
        {
            while self.minute.front().is_some_and(|(t, _)| t + MINUTE <= now) {
                self.minute.pop_front();
            }
            let used: u64 = self.minute.iter().map(|(_, n)| n).sum();
            let over_requests = self.minute.len() as u64 >= u64::from(rpm);
            let over_tokens = p
                .input_tokens_per_minute
                .is_some_and(|cap| used > 0 && used + input > cap);
            if over_requests || over_tokens {
                let free = self.minute.front().map_or(now, |(t, _)| t + MINUTE);
                return Some(Refusal::PerMinute(free));
            }
        }
        let week = p.weekly.is_some_and(|cap| self.week_used >= cap);
        let five = match (self.five, p.five_hour) {
            (Some((end, used)), Some(cap)) if used >= cap => Some(end),
            _ => None,
        };
        match (five, week) {
            (_, true) => return Some(Refusal::Weekly(self.week_end.max(five.unwrap_or(0)))),
            (Some(end), false) => return Some(Refusal::FiveHour(end)),
            (None, false) => {}
        }
        if let Some(cap) = p.weekly_by_family.get(family)
            && self.family_used.get(family).copied().unwrap_or(0.0) >= *cap
        {
            return Some(Refusal::Family(family.to_owned(), self.week_end));
        }
        None
    }

    fn spend(&mut self, family: &str, units: f64, input: u64, now: u64) {
        if self.plan.five_hour.is_some() {
            let (end, used) = self.five.unwrap_or((now + FIVE_HOURS, 0.0));
            self.five = Some((end, used + units));
        }
        self.week_used += units;
        if self.plan.weekly_by_family.contains_key(family) {
            *self.family_used.entry(family.to_owned()).or_insert(0.0) += units;
        }
        if self.plan.requests_per_minute.is_some() || self.plan.input_tokens_per_minute.is_some() {
            self.minute.push_back((now, input));
        }
    }

    fn sample(&mut self, now: u64) {
        let five = match (self.five, self.plan.five_hour) {
            (Some((end, used)), Some(cap)) if end > now => (used / cap).min(1.0),
            _ => 0.0,
        };
        let weekly = self
            .plan
            .weekly
            .map_or(0.0, |cap| (self.week_used / cap).min(1.0));
        let sample = Sample {
            at: now,
            five_hour: five as f32,
            weekly: weekly as f32,
        };
        match self.samples.last_mut() {
            // One point a minute is all a picture of a week can show.
            Some(last) if now.saturating_sub(last.at) < MINUTE && last.at <= now => {
                *last = Sample {
                    at: last.at,
                    ..sample
                }
            }
            _ => self.samples.push(sample),
        }
    }

    fn utilization(&self, now: u64) -> (f64, f64) {
        let five = match (self.five, self.plan.five_hour) {
            (Some((end, used)), Some(cap)) if end > now => used / cap,
            _ => 0.0,
        };
        (
            five,
            self.plan.weekly.map_or(0.0, |cap| self.week_used / cap),
        )
    }

    /// The rate-limit headers of an answer from this account now.
    fn headers(&self, now: u64) -> Vec<(String, String)> {
        let (five, week) = self.utilization(now);
        let five_reset = self.five.map_or(now + FIVE_HOURS, |(end, _)| end);
        match self.provider {
            ProviderName::Claude if self.plan.five_hour.is_some() || self.plan.weekly.is_some() => {
                let status = |u: f64| {
                    if u >= 1.0 {
                        "rejected"
                    } else if u >= 0.8 {
                        "allowed_warning"
                    } else {
                        "allowed"
                    }
                };
                let p = "anthropic-ratelimit-unified-";
                let mut h = vec![
                    (format!("{p}5h-status"), status(five).to_owned()),
                    (
                        format!("{p}5h-utilization"),
                        format!("{:.4}", five.min(1.0)),
                    ),
                    (format!("{p}5h-reset"), (five_reset / 1000).to_string()),
                    (format!("{p}7d-status"), status(week).to_owned()),
                    (
                        format!("{p}7d-utilization"),
                        format!("{:.4}", week.min(1.0)),
                    ),
                    (format!("{p}7d-reset"), (self.week_end / 1000).to_string()),
                    (format!("{p}overage-status"), "rejected".to_owned()),
                ];
                let mut claim = if week > five {
                    ("seven_day", self.week_end)
                } else {
                    ("five_hour", five_reset)
                };
                for (family, cap) in &self.plan.weekly_by_family {
                    let u = self.family_used.get(family).copied().unwrap_or(0.0) / cap;
                    h.push((format!("{p}7d_{family}-status"), status(u).to_owned()));
                    h.push((
                        format!("{p}7d_{family}-utilization"),
                        format!("{:.4}", u.min(1.0)),
                    ));
                    h.push((
                        format!("{p}7d_{family}-reset"),
                        (self.week_end / 1000).to_string(),
                    ));
                    if u >= 1.0 {
                        claim = ("seven_day_family", self.week_end);
                    }
                }
                let overall = if five >= 1.0 || week >= 1.0 {
                    "rejected"
                } else {
                    status(five.max(week))
                };
                h.push((format!("{p}status"), overall.to_owned()));
                h.push((format!("{p}representative-claim"), claim.0.to_owned()));
                h.push((format!("{p}reset"), (claim.1 / 1000).to_string()));
                h
            }
            ProviderName::Claude => {
                // API key: per-minute limits, as the Messages API reports them.
                let used = self.minute.len() as u64;
                let mut h = Vec::new();
                if let Some(rpm) = self.plan.requests_per_minute {
                    let reset = self.minute.front().map_or(now, |(t, _)| t + MINUTE);
                    h.push(("anthropic-ratelimit-requests-limit".into(), rpm.to_string()));
                    h.push((
                        "anthropic-ratelimit-requests-remaining".into(),
                        u64::from(rpm).saturating_sub(used).to_string(),
                    ));
                    h.push(("anthropic-ratelimit-requests-reset".into(), rfc3339(reset)));
                }
                h
            }
            ProviderName::Codex => {
                let left = |end: u64| ((end.saturating_sub(now)) / 1000).to_string();
                vec![
                    (
                        "x-codex-primary-used-percent".into(),
                        format!("{:.1}", 100.0 * five.min(1.0)),
                    ),
                    ("x-codex-primary-window-minutes".into(), "300".into()),
                    (
                        "x-codex-primary-reset-after-seconds".into(),
                        left(five_reset),
                    ),
                    (
                        "x-codex-secondary-used-percent".into(),
                        format!("{:.1}", 100.0 * week.min(1.0)),
                    ),
                    ("x-codex-secondary-window-minutes".into(), "10080".into()),
                    (
                        "x-codex-secondary-reset-after-seconds".into(),
                        left(self.week_end),
                    ),
                ]
            }
        }
    }

    /// The 429 for `refusal`, with the headers that explain it.
    fn refused(&self, refusal: &Refusal, now: u64) -> Reply {
        let reset = match refusal {
            Refusal::FiveHour(t)
            | Refusal::Weekly(t)
            | Refusal::Family(_, t)
            | Refusal::PerMinute(t) => *t,
        };
        let retry_after = reset.saturating_sub(now).div_ceil(1000).max(1).to_string();
        let mut reply = match self.provider {
            ProviderName::Claude => claude::error(
                429,
                "rate_limit_error",
                "This request would exceed your account's rate limit. Please try again later.",
            ),
            ProviderName::Codex => Reply::status(429)
                .header("content-type", "application/json")
                .body(
                    json!({"error": {"type": "usage_limit_reached",
                                        "message": "The usage limit has been reached",
                                        "plan_type": "pro",
                                        "resets_in_seconds": reset.saturating_sub(now) / 1000}})
                    .to_string(),
                ),
        };
        let mut headers = self.headers(now);
        if self.provider == ProviderName::Claude && !matches!(refusal, Refusal::PerMinute(_)) {
            let p = "anthropic-ratelimit-unified-";
            let (claim, shared) = match refusal {
                Refusal::FiveHour(_) => ("five_hour", true),
                Refusal::Weekly(_) => ("seven_day", true),
                Refusal::Family(..) => ("seven_day_family", false),
                Refusal::PerMinute(_) => unreachable!("handled above"),
            };
            headers.retain(|(n, _)| {
                n != &format!("{p}status")
                    && n != &format!("{p}representative-claim")
                    && n != &format!("{p}reset")
            });
            headers.push((
                format!("{p}status"),
                if shared { "rejected" } else { "allowed" }.into(),
            ));
            headers.push((format!("{p}representative-claim"), claim.into()));
            headers.push((format!("{p}reset"), (reset / 1000).to_string()));
            if let Refusal::Family(family, _) = refusal {
                headers.retain(|(n, _)| n != &format!("{p}7d_{family}-status"));
                headers.push((format!("{p}7d_{family}-status"), "rejected".into()));
            }
        }
        for (name, value) in headers {
            reply = reply.header(&name, &value);
        }
        match self.provider {
            ProviderName::Claude => reply.header("retry-after", &retry_after),
            ProviderName::Codex => reply,
        }
    }
}

fn tokens(provider: ProviderName, idx: usize, serial: u32) -> (String, String) {
    match provider {
        ProviderName::Claude => (
            format!("sk-ant-oat01-sim-{idx}-{serial}"),
            format!("sk-ant-ort01-sim-{idx}-{serial}"),
        ),
        ProviderName::Codex => (
            format!("codex-at-sim-{idx}-{serial}"),
            format!("codex-rt-sim-{idx}-{serial}"),
        ),
    }
}

fn overloaded(provider: ProviderName) -> Reply {
    match provider {
        ProviderName::Claude => claude::overloaded(),
        ProviderName::Codex => Reply::status(529)
            .header("content-type", "application/json")
            .body(json!({"error": {"type": "server_is_overloaded", "message": "Our servers are currently overloaded."}}).to_string()),
    }
}

fn server_error(provider: ProviderName) -> Reply {
    match provider {
        ProviderName::Claude => claude::error(500, "api_error", "Internal server error"),
        ProviderName::Codex => Reply::status(500)
            .header("content-type", "application/json")
            .body(json!({"error": {"type": "server_error", "message": "An error occurred while processing your request."}}).to_string()),
    }
}

/// A Messages stream: `message_start` with the input usage after the time to first token,
/// then the output after the time it takes to stream.
fn claude_stream(
    model: &str,
    (input, read, write, output): (u64, u64, u64, u64),
    ttft: Duration,
    stream: Duration,
) -> Reply {
    let start = json!({"type": "message_start", "message": {
        "id": "msg_sim", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": 1,
                  "cache_creation_input_tokens": write, "cache_read_input_tokens": read}}});
    Reply::sse()
        .delay(ttft)
        .event("message_start", &start.to_string())
        .event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        )
        .event(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}"#,
        )
        .delay(stream)
        .event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#)
        .event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": output}})
            .to_string(),
        )
        .event("message_stop", r#"{"type":"message_stop"}"#)
}

/// A Responses stream with its usage in `response.completed`.
fn codex_stream(
    (input, read, write, output): (u64, u64, u64, u64),
    ttft: Duration,
    stream: Duration,
) -> Reply {
    Reply::sse()
        .delay(ttft)
        .event(
            "response.created",
            &json!({"type": "response.created", "response": {"id": "resp_sim"}}).to_string(),
        )
        .event(
            "response.output_text.delta",
            &json!({"type": "response.output_text.delta", "item_id": "msg_sim", "output_index": 0,
                    "content_index": 0, "delta": "ok"})
            .to_string(),
        )
        .delay(stream)
        .event(
            "response.completed",
            &json!({"type": "response.completed", "response": {"id": "resp_sim", "usage": {
                "input_tokens": input + read + write,
                "input_tokens_details": {"cached_tokens": read},
                "output_tokens": output, "total_tokens": input + read + write + output}}})
            .to_string(),
        )
}

/// Unix epoch milliseconds as an RFC 3339 UTC time (`2026-01-05T09:00:00Z`).
pub use pooler_host::time::rfc3339;

#[cfg(test)]
mod tests {
    use account_pool::http::Headers;
    use account_pool::quota::{
        BlockingReset, QuotaState, parse_claude_headers, parse_codex_headers,
    };
    use serde_json::Value;

    use super::*;
    use crate::scenario::{DAY, Scenario};

    const START: u64 = crate::scenario::DEFAULT_START_MS;

    /// Costs that make a request's units its context in thousands of tokens (output free,
    /// every input kind alike, every family weighing 1 except opus, 2).
    fn scenario(extra: &str) -> Scenario {
        Scenario::parse(&format!(
            r#"
            name = "t"
            seed = 1
            days = 14
            [plans.sub]
            provider = "claude"
            five-hour = 100.0
            weekly = 250.0
            weekly-by-family = {{ opus = 60.0 }}
            [plans.key]
            provider = "claude"
            requests-per-minute = 2
            [plans.codex]
            provider = "codex"
            five-hour = 100.0
            weekly = 1000.0
            [[accounts]]
            name = "a"
            plan = "sub"
            credential = "oauth"
            weekly-reset = "day 3 00:00"
            [[accounts]]
            name = "k"
            plan = "key"
            credential = "api-key"
            [[accounts]]
            name = "c"
            plan = "codex"
            credential = "oauth"
            [[threads]]
            provider = "claude"
            models = {{ m = 1 }}
            task-gap-min = [1.0, 1.0]
            steps = [1, 1]
            tool-s = [1.0, 1.0]
            context-start = 1000
            context-growth = [0, 0]
            context-max = 5000
            output-tokens = [0, 0]
            [provider]
            ttft-ms = [1000.0, 1000.0]
            tokens-per-s = 50.0
            cache-ttl-min = 5.0
            access-token-h = 8.0
            error-rate = 0.0
            drop-rate = 0.0
            refresh-failure-rate = 0.0
            cost = {{ input = 1.0, cache-write = 1.0, cache-read = 1.0, output = 0.0 }}
            family-weight = {{ opus = 2.0 }}
            {extra}
            "#
        ))
        .unwrap()
    }

    fn model(extra: &str) -> Model {
        Model::new(&scenario(extra), Box::new(|_| {})).unwrap()
    }

    /// A tagged Messages request of `context` tokens (units: context / 1000, a 4-token
    /// uncached input aside) with `auth` as its credential header.
    fn messages(auth: (&str, String), model: &str, n: u64, context: u64) -> Received {
        let tag = Tag {
            thread: 0,
            request: n,
            context,
            output: 0,
            cache_key: format!("k{n}"),
        };
        Received {
            method: "POST".into(),
            path: "/v1/messages?beta=true".into(),
            headers: vec![
                (auth.0.into(), auth.1),
                ("x-claude-code-session-id".into(), "s".into()),
            ],
            body: json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": tag.text()}]})
                .to_string()
                .into(),
        }
    }

    fn bearer(token: &str) -> (&'static str, String) {
        ("authorization", format!("Bearer {token}"))
    }

    fn headers(reply: &Reply) -> Headers {
        let mut h = Headers::new();
        for (n, v) in reply.headers() {
            h.push(n, v.clone());
        }
        h
    }

    #[test]
    fn a_five_hour_window_starts_at_first_use_fills_rejects_with_its_reset_and_resets() {
        let m = model("");
        let t0 = START + 3_600_000;
        let token = m.sign_in(0, START).access;
        // 60 units at t0 (window t0 .. t0+5h), 40 at t0+1h: served, and the cap is reached.
        let first = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 1, 60_000),
                t0,
            )
            .unwrap();
        assert_eq!(first.status_code(), 200);
        let h = headers(&first);
        assert_eq!(
            h.get("anthropic-ratelimit-unified-5h-reset").unwrap(),
            &((t0 + FIVE_HOURS) / 1000).to_string()
        );
        assert_eq!(
            h.get("anthropic-ratelimit-unified-5h-utilization").unwrap(),
            "0.6000"
        );
        let second = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 2, 40_000),
                t0 + HOUR,
            )
            .unwrap();
        assert_eq!(second.status_code(), 200);
        // 100.008 spent: the next request is refused until the window's end.
        let third = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 3, 1000),
                t0 + 2 * HOUR,
            )
            .unwrap();
        assert_eq!(third.status_code(), 429);
        let h = headers(&third);
        assert_eq!(h.get("retry-after").unwrap(), &(3 * 3600).to_string());
        assert_eq!(
            h.get("anthropic-ratelimit-unified-status").unwrap(),
            "rejected"
        );
        assert_eq!(
            h.get("anthropic-ratelimit-unified-representative-claim")
                .unwrap(),
            "five_hour"
        );
        // The pool reads it as a shared rejection that lasts until the window's end.
        let mut q = QuotaState::default();
        q.merge(&parse_claude_headers(&h, t0 + 2 * HOUR));
        assert!(q.shared_exhausted(t0 + 2 * HOUR));
        assert_eq!(
            q.blocking_reset(None, t0 + 2 * HOUR),
            BlockingReset::At(t0 + FIVE_HOURS)
        );
        // At the end a new window opens with the next request.
        let fourth = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 4, 10_000),
                t0 + FIVE_HOURS,
            )
            .unwrap();
        assert_eq!(fourth.status_code(), 200);
        assert_eq!(
            headers(&fourth)
                .get("anthropic-ratelimit-unified-5h-reset")
                .unwrap(),
            &((t0 + 2 * FIVE_HOURS) / 1000).to_string()
        );
        let ends: Vec<AttemptEnd> = m.attempts().iter().map(|a| a.end).collect();
        assert_eq!(
            ends,
            [
                AttemptEnd::Served,
                AttemptEnd::Served,
                AttemptEnd::RateLimited,
                AttemptEnd::Served
            ]
        );
    }

    #[test]
    fn the_weekly_window_resets_at_the_accounts_instant_and_records_what_expired() {
        let m = model("");
        let reset = START + 2 * DAY;
        // 250 units spent over three 5-hour windows: the week is spent, whatever the 5 h.
        for (i, at) in [START, START + 6 * HOUR, START + 12 * HOUR]
            .into_iter()
            .enumerate()
        {
            let token = m.sign_in(0, at).access;
            let ok = m
                .respond(
                    &messages(bearer(&token), "claude-sonnet-4-5", i as u64, 84_000),
                    at,
                )
                .unwrap();
            assert_eq!(ok.status_code(), 200, "request {i}");
        }
        let token = m.sign_in(0, START + 18 * HOUR).access;
        let refused = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 9, 1000),
                START + 18 * HOUR,
            )
            .unwrap();
        assert_eq!(refused.status_code(), 429);
        let spent = m.weekly_left(START + 18 * HOUR);
        let h = headers(&refused);
        assert_eq!(
            h.get("anthropic-ratelimit-unified-representative-claim")
                .unwrap(),
            "seven_day"
        );
        assert_eq!(
            h.get("anthropic-ratelimit-unified-reset").unwrap(),
            &(reset / 1000).to_string()
        );
        assert!(!m.can_serve(
            ProviderName::Claude,
            "sonnet",
            &[true, false, false],
            START + 18 * HOUR
        ));
        assert!(m.can_serve(ProviderName::Claude, "sonnet", &[true, false, false], reset));
        // What is left unused counts the spent week as nothing until its reset gives a
        // whole one back (the other accounts served nothing: theirs stay as they were).
        assert_eq!(m.weekly_left(reset) - spent, 1.0);
        // Nothing expired at this reset (the week was spent); the next week's 250 units
        // expire whole a week later.
        m.roll_all(reset + WEEK);
        let expired: Vec<(u64, f64)> = m
            .expiries()
            .iter()
            .filter(|e| e.account == 0)
            .map(|e| (e.at, e.unused))
            .collect();
        assert_eq!(expired, [(reset, 0.0), (reset + WEEK, 1.0)]);
    }

    #[test]
    fn a_spent_family_bucket_refuses_that_family_only() {
        let m = model("");
        let token = m.sign_in(0, START).access;
        // Opus weighs 2: 30,000 tokens are 60 units, the bucket's size.
        let opus = m
            .respond(
                &messages(bearer(&token), "claude-opus-4-1", 1, 30_000),
                START,
            )
            .unwrap();
        assert_eq!(opus.status_code(), 200);
        let refused = m
            .respond(
                &messages(bearer(&token), "claude-opus-4-1", 2, 1000),
                START + MINUTE,
            )
            .unwrap();
        assert_eq!(refused.status_code(), 429);
        let h = headers(&refused);
        assert_eq!(
            h.get("anthropic-ratelimit-unified-7d_opus-status").unwrap(),
            "rejected"
        );
        assert_eq!(
            h.get("anthropic-ratelimit-unified-5h-status").unwrap(),
            "allowed"
        );
        let obs = parse_claude_headers(&h, START + MINUTE);
        assert!(
            !obs.rejects_shared(START + MINUTE),
            "a family limit is no shared one"
        );
        assert!(obs.rejects_family(account_pool::model::Family::Opus, START + MINUTE));
        let sonnet = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 3, 1000),
                START + MINUTE,
            )
            .unwrap();
        assert_eq!(sonnet.status_code(), 200);
        let on = [true, false, false];
        assert!(!m.can_serve(ProviderName::Claude, "opus", &on, START + MINUTE));
        assert!(m.can_serve(ProviderName::Claude, "sonnet", &on, START + MINUTE));
    }

    #[test]
    fn an_api_key_gets_its_per_minute_limit_with_the_time_it_frees() {
        let m = model("");
        let key = m.api_key(1).unwrap();
        let auth = || ("x-api-key", key.clone());
        assert_eq!(
            m.respond(&messages(auth(), "claude-sonnet-4-5", 1, 1000), START)
                .unwrap()
                .status_code(),
            200
        );
        assert_eq!(
            m.respond(
                &messages(auth(), "claude-sonnet-4-5", 2, 1000),
                START + 20_000
            )
            .unwrap()
            .status_code(),
            200
        );
        let refused = m
            .respond(
                &messages(auth(), "claude-sonnet-4-5", 3, 1000),
                START + 30_000,
            )
            .unwrap();
        assert_eq!(refused.status_code(), 429);
        assert_eq!(headers(&refused).get("retry-after").unwrap(), "30");
        assert!(
            headers(&refused)
                .get("anthropic-ratelimit-unified-status")
                .is_none()
        );
        assert_eq!(m.next_change(START + 30_000), Some(START + MINUTE));
        assert_eq!(
            m.respond(
                &messages(auth(), "claude-sonnet-4-5", 3, 1000),
                START + MINUTE
            )
            .unwrap()
            .status_code(),
            200
        );
        let wrong = m
            .respond(
                &messages(
                    ("x-api-key", "sk-ant-api03-nope".into()),
                    "claude-sonnet-4-5",
                    4,
                    1000,
                ),
                START,
            )
            .unwrap();
        assert_eq!(wrong.status_code(), 401);
    }

    #[test]
    fn oauth_tokens_expire_refresh_rotates_and_a_revoked_refresh_token_gets_invalid_grant() {
        let m = model("");
        let issued = m.sign_in(0, START);
        let grant = |token: &str| Received {
            method: "POST".into(),
            path: "/v1/oauth/token".into(),
            headers: vec![],
            body: json!({"grant_type": "refresh_token", "refresh_token": token, "client_id": "c"})
                .to_string()
                .into(),
        };
        let expired = START + 8 * HOUR;
        let refused = m
            .respond(
                &messages(bearer(&issued.access), "claude-sonnet-4-5", 1, 1000),
                expired,
            )
            .unwrap();
        assert_eq!(refused.status_code(), 401);
        assert!(String::from_utf8_lossy(&refused.body_bytes()).contains("OAuth token has expired"));
        let fresh = m.refresh(&grant(&issued.refresh), expired);
        assert_eq!(fresh.status_code(), 200);
        let body: Value = serde_json::from_slice(&fresh.body_bytes()).unwrap();
        let access = body["access_token"].as_str().unwrap().to_owned();
        assert_eq!(body["expires_in"], 8 * 3600);
        assert_eq!(
            m.respond(
                &messages(bearer(&access), "claude-sonnet-4-5", 2, 1000),
                expired
            )
            .unwrap()
            .status_code(),
            200
        );
        // The old refresh token was rotated away.
        assert_eq!(
            m.refresh(&grant(&issued.refresh), expired).status_code(),
            400
        );
        // Revoked: refused, and the account can serve only while its access token lasts.
        m.revoke_refresh(0);
        let refresh = body["refresh_token"].as_str().unwrap();
        let denied = m.refresh(&grant(refresh), expired + HOUR);
        assert!(String::from_utf8_lossy(&denied.body_bytes()).contains("invalid_grant"));
        let on = [true, false, false];
        assert!(m.can_serve(ProviderName::Claude, "sonnet", &on, expired + HOUR));
        assert!(!m.can_serve(ProviderName::Claude, "sonnet", &on, expired + 8 * HOUR));
        // Signing in again lifts it.
        m.sign_in(0, expired + 8 * HOUR);
        assert!(m.can_serve(ProviderName::Claude, "sonnet", &on, expired + 8 * HOUR));
        assert_eq!(m.refreshes(), (1, 2));
    }

    #[test]
    fn codex_windows_speak_the_codex_headers_and_usage_limit() {
        let m = model("");
        let issued = m.sign_in(2, START);
        let request = |n: u64, context: u64| {
            Received {
            method: "POST".into(),
            path: "/backend-api/codex/responses".into(),
            headers: vec![
                ("authorization".into(), format!("Bearer {}", issued.access)),
                ("chatgpt-account-id".into(), issued.account_id.clone().unwrap()),
                ("session-id".into(), "s".into()),
            ],
            body: json!({"model": "gpt-5-codex", "stream": true, "store": false,
                         "input": [{"type": "message", "role": "user", "content": [{"type": "input_text",
                          "text": Tag { thread: 0, request: n, context, output: 0, cache_key: "main".into() }.text()}]}]})
                .to_string()
                .into(),
        }
        };
        let ok = m.respond(&request(1, 100_000), START).unwrap();
        assert_eq!(ok.status_code(), 200);
        let h = headers(&ok);
        assert_eq!(h.get("x-codex-primary-used-percent").unwrap(), "100.0");
        assert_eq!(
            h.get("x-codex-primary-reset-after-seconds").unwrap(),
            &(5 * 3600).to_string()
        );
        let q = parse_codex_headers(&h, START);
        assert!(q.rejects_shared(START));
        let refused = m.respond(&request(2, 1000), START + HOUR).unwrap();
        assert_eq!(refused.status_code(), 429);
        let body: Value = serde_json::from_slice(&refused.body_bytes()).unwrap();
        assert_eq!(body["error"]["type"], "usage_limit_reached");
        assert_eq!(body["error"]["resets_in_seconds"], 4 * 3600);
    }

    #[test]
    fn an_incident_fails_every_attempt_and_the_oracle_knows_nobody_can_serve() {
        let m = model("[[incidents]]\nkind = \"overloaded\"\nat = \"day 1 10:00\"\nminutes = 20\n");
        let during = START + 10 * HOUR + 5 * MINUTE;
        let token = m.sign_in(0, during).access;
        let reply = m
            .respond(
                &messages(bearer(&token), "claude-sonnet-4-5", 1, 1000),
                during,
            )
            .unwrap();
        assert_eq!(reply.status_code(), 529);
        let on = [true, true, false];
        assert!(!m.can_serve(ProviderName::Claude, "sonnet", &on, during));
        assert!(m.can_serve(
            ProviderName::Claude,
            "sonnet",
            &on,
            START + 10 * HOUR + 20 * MINUTE
        ));
        assert_eq!(m.next_change(during), Some(START + 10 * HOUR + 20 * MINUTE));
        // Disabled accounts are no capacity.
        assert!(!m.can_serve(ProviderName::Claude, "sonnet", &[false, false, true], START));
    }

    #[test]
    fn a_prompt_cache_is_read_within_its_lifetime_and_written_again_after() {
        let m = model("");
        let token = m.sign_in(0, START).access;
        let req = |n: u64, context: u64, at: u64| {
            let mut r = messages(bearer(&token), "claude-sonnet-4-5", n, context);
            // One conversation's main prefix.
            r.body = String::from_utf8_lossy(&r.body)
                .replace(&format!("k=k{n}"), "k=main")
                .into_bytes()
                .into();
            m.respond(&r, at).unwrap();
        };
        req(1, 10_000, START);
        req(2, 12_000, START + 4 * MINUTE);
        req(3, 13_000, START + 20 * MINUTE);
        let seen: Vec<(u64, u64)> = m
            .attempts()
            .iter()
            .map(|a| (a.cache_read, a.cache_write))
            .collect();
        assert_eq!(seen, [(0, 10_000), (10_000, 2_000), (0, 13_000)]);
    }
}
