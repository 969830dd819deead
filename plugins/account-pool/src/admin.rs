//! The pool's non-HTTP operations, as plain Rust over the store: accounts (add, import,
//! remove, enable, disable, priority, reorder, refresh, list), settings, routes and
//! session explanations, the availability answer, the maintenance tick, and taking the
//! coalesced availability-changed signals for delivery.

use crate::engine::{Cancel, Clock, Engine, Log, Random, Upstream, new_id};
use crate::model::{
    AccountStatus, Availability, ChangeCause, Credential, CredentialKind, Family, OAuthTokens,
    Provider,
};
use crate::oauth;
use crate::policy::{self, AccountState};
use crate::quota::BlockingReset;
use crate::session;
use crate::settings::{self, SettingError};
use crate::store::{AttemptRow, PendingSignal, Store};
use crate::token;
use pooler_plugin_kit::{Db, DbError};

/// Attempts older than this are dropped by the tick.
const ATTEMPT_RETENTION_MS: u64 = 24 * 3_600_000;

/// An account to add.
#[derive(Debug, Clone)]
pub struct NewAccount {
    pub provider: Provider,
    pub credential: Credential,
    pub label: Option<String>,
    pub priority: Option<i32>,
}

/// One quota window as a person sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowInfo {
    pub name: String,
    pub family: Option<Family>,
    pub utilization: Option<f64>,
    pub resets_at: Option<u64>,
    pub status: Option<String>,
    pub blocking: bool,
    pub observed_at: u64,
}

/// An account as a person sees it: no secret.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountInfo {
    pub id: String,
    pub provider: Provider,
    pub kind: CredentialKind,
    pub label: String,
    pub priority: i32,
    pub enabled: bool,
    pub status: AccountStatus,
    pub secret_hint: String,
    pub created_at: u64,
    pub last_used_at: Option<u64>,
    pub error: Option<String>,
    pub held_until: Option<u64>,
    pub needs_sign_in: bool,
    pub token_expires_at: Option<u64>,
    pub windows: Vec<WindowInfo>,
    pub blocking_reset: Option<u64>,
}

/// Why an account operation was refused (mirror of the WIT `accounts-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountsError {
    NoSuchAccount(String),
    ApiKeyNotSupported(Provider),
    InvalidCredential(String),
    InvalidLoginFile(String),
    InvalidLabel(String),
    InvalidOrder(String),
    RefreshRefused(String),
    UpstreamUnreachable(String),
    Storage(String),
}

impl From<DbError> for AccountsError {
    fn from(e: DbError) -> Self {
        AccountsError::Storage(e.to_string())
    }
}

/// Why a routing operation was refused (mirror of the WIT `routing-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingError {
    InvalidThread(String),
    InvalidEndpoint(String),
    NoSuchRoute,
    InvalidSession(String),
    Storage(String),
}

impl From<DbError> for RoutingError {
    fn from(e: DbError) -> Self {
        RoutingError::Storage(e.to_string())
    }
}

/// A refused setting, or a storage failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsError {
    Refused(SettingError),
    Storage(String),
}

impl From<DbError> for SettingsError {
    fn from(e: DbError) -> Self {
        SettingsError::Storage(e.to_string())
    }
}

/// One setting as a person sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingInfo {
    pub key: String,
    pub value: String,
    pub default_value: String,
    pub description: String,
}

/// A route, with its token (returned once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub thread: String,
    pub provider: Provider,
    pub base_url: String,
    pub token: String,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    pub config_lines: Vec<String>,
    pub opened_at: u64,
}

/// Where a session is pinned and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionExplanation {
    pub provider: Provider,
    pub key: String,
    pub account: Option<String>,
    pub thread: Option<String>,
    pub last_used_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub why: String,
    pub recent: Vec<AttemptRow>,
}

/// An availability-changed signal ready for delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub provider: Provider,
    pub causes: Vec<ChangeCause>,
    pub earliest: Availability,
    pub detected_at: u64,
}

/// The name of the environment variable that holds a Codex route's token.
pub const CODEX_TOKEN_VAR: &str = "POOLER_CODEX_TOKEN";

fn valid_thread(s: &str) -> bool {
    !s.is_empty() && s.chars().count() <= 128 && !s.chars().any(char::is_control)
}

fn valid_endpoint(s: &str) -> bool {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"));
    rest.is_some_and(|r| {
        !r.is_empty()
            && !r.starts_with('/')
            && !r.chars().any(|c| c.is_whitespace() || c.is_control())
    })
}

/// The pool's operations, borrowing its capabilities for one call.
pub struct Admin<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel> {
    store: Store<'a, D>,
    engine: Engine<'a, D, U, E>,
    env: &'a E,
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel> Admin<'a, D, U, E> {
    /// Open the operations (migrating the schema if needed).
    pub fn new(db: &'a D, upstream: &'a U, env: &'a E) -> Result<Self, DbError> {
        let store = Store::new(db);
        store.ensure_schema()?;
        Ok(Admin {
            store,
            engine: Engine::new(db, upstream, env),
            env,
        })
    }

    // ---- accounts ---------------------------------------------------------------------

    fn info(&self, a: &AccountState) -> Result<AccountInfo, DbError> {
        let now = self.env.now();
        let threshold = self.store.settings()?.switch_threshold;
        let meta = self.store.account_meta(&a.id)?;
        let hint = self
            .store
            .credential(&a.id)?
            .map_or_else(|| "missing".to_owned(), |c| c.hint());
        let status = policy::status(a, threshold, now);
        let blocking_reset = match policy::blocked_until(a, None, threshold, now) {
            Some(Some(t)) if t > now => Some(t),
            _ => match a.quota.blocking_reset(None, now) {
                BlockingReset::At(t) => Some(t),
                _ => None,
            },
        };
        let windows = a
            .quota
            .windows
            .iter()
            .map(|w| WindowInfo {
                name: w.name.clone(),
                family: w.family,
                utilization: w.utilization,
                resets_at: w.resets_at,
                status: w.status.clone(),
                blocking: w.rejected(now) && (w.family.is_none() || !a.quota.extra_usage(now)),
                observed_at: w.observed_at,
            })
            .collect();
        Ok(AccountInfo {
            id: a.id.clone(),
            provider: a.provider,
            kind: a.kind,
            label: meta.as_ref().map_or_else(String::new, |m| m.label.clone()),
            priority: a.priority,
            enabled: a.enabled,
            status,
            secret_hint: hint,
            created_at: meta.as_ref().map_or(0, |m| m.created_at),
            last_used_at: meta.and_then(|m| m.last_used_at),
            error: a.error.clone(),
            held_until: a.held_until.filter(|t| *t > now),
            needs_sign_in: a.needs_sign_in,
            token_expires_at: a.token_expires_at,
            windows,
            blocking_reset,
        })
    }

    fn account_info(&self, id: &str) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        Ok(self.info(&a)?)
    }

    fn signal(&self, provider: Provider, cause: ChangeCause) -> Result<(), DbError> {
        self.store.push_signal(provider, cause, self.env.now())
    }

    /// Add an account.
    pub fn add(&self, new: NewAccount) -> Result<AccountInfo, AccountsError> {
        let NewAccount {
            provider,
            credential,
            label,
            priority,
        } = new;
        match &credential {
            Credential::ApiKey(_) if provider != Provider::Claude => {
                return Err(AccountsError::ApiKeyNotSupported(provider));
            }
            Credential::ApiKey(k) if k.trim().is_empty() || k.chars().any(char::is_control) => {
                return Err(AccountsError::InvalidCredential(
                    "api-key is empty or contains control characters".into(),
                ));
            }
            Credential::OAuth(t) => validate_oauth(provider, t)?,
            Credential::ApiKey(_) => {}
        }
        let label = match label {
            Some(l) if l.trim().is_empty() || l.chars().count() > 200 => {
                return Err(AccountsError::InvalidLabel(
                    "a label must be 1 to 200 characters".into(),
                ));
            }
            Some(l) => l,
            None => match (provider, credential.kind()) {
                (Provider::Claude, CredentialKind::ApiKey) => "Claude API key".to_owned(),
                (Provider::Claude, CredentialKind::OAuth) => "Claude account".to_owned(),
                (Provider::Codex, _) => "Codex account".to_owned(),
            },
        };
        let id = new_id(self.env);
        self.store.insert_account(
            &id,
            provider,
            &credential,
            &label,
            priority.unwrap_or(0),
            self.env.now(),
        )?;
        self.signal(provider, ChangeCause::AccountAdded)?;
        self.account_info(&id)
    }

    /// Add an account from a Claude Code or Codex CLI login file's contents.
    pub fn import_login(
        &self,
        provider: Provider,
        contents: &str,
        label: Option<String>,
        priority: Option<i32>,
    ) -> Result<AccountInfo, AccountsError> {
        let tokens =
            oauth::parse_login_file(provider, contents).map_err(AccountsError::InvalidLoginFile)?;
        self.add(NewAccount {
            provider,
            credential: Credential::OAuth(tokens),
            label,
            priority,
        })
    }

    pub fn remove(&self, id: &str) -> Result<(), AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        self.store.remove_account(id)?;
        self.signal(a.provider, ChangeCause::AccountRemoved)?;
        Ok(())
    }

    /// Enable an account; clears its error, hold and refresh backoff.
    pub fn enable(&self, id: &str) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        self.store.set_enabled(id, true)?;
        self.store.clear_refresh_failure(id)?;
        self.signal(a.provider, ChangeCause::AccountEnabled)?;
        if a.error.is_some() {
            self.signal(a.provider, ChangeCause::ErrorCleared)?;
        }
        self.account_info(id)
    }

    pub fn disable(&self, id: &str) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        self.store.set_enabled(id, false)?;
        if a.enabled {
            self.signal(a.provider, ChangeCause::AccountDisabled)?;
        }
        self.account_info(id)
    }

    pub fn set_priority(&self, id: &str, priority: i32) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        self.store.set_priority(id, priority)?;
        self.signal(a.provider, ChangeCause::PriorityChanged)?;
        self.account_info(id)
    }

    /// Reorder a provider's accounts: `ids` must name each exactly once. Priorities become
    /// 0, 1, 2, …; the cursor does not move.
    pub fn reorder(
        &self,
        provider: Provider,
        ids: &[String],
    ) -> Result<Vec<AccountInfo>, AccountsError> {
        let current: Vec<String> = self
            .store
            .accounts(Some(provider))?
            .into_iter()
            .map(|a| a.id)
            .collect();
        let mut problems = Vec::new();
        let missing: Vec<&String> = current.iter().filter(|c| !ids.contains(c)).collect();
        if !missing.is_empty() {
            problems.push(format!("missing {}", join(&missing)));
        }
        let unknown: Vec<&String> = ids.iter().filter(|i| !current.contains(i)).collect();
        if !unknown.is_empty() {
            problems.push(format!("unknown {}", join(&unknown)));
        }
        let mut dups: Vec<&String> = ids
            .iter()
            .enumerate()
            .filter(|(n, i)| ids[..*n].contains(i))
            .map(|(_, i)| i)
            .collect();
        dups.dedup();
        if !dups.is_empty() {
            problems.push(format!("duplicate {}", join(&dups)));
        }
        if !problems.is_empty() {
            return Err(AccountsError::InvalidOrder(format!(
                "the list must name every {provider} account exactly once: {}",
                problems.join("; ")
            )));
        }
        self.store.tx(|s| {
            for (n, id) in ids.iter().enumerate() {
                s.set_priority(id, i32::try_from(n).unwrap_or(i32::MAX))?;
            }
            Ok(())
        })?;
        self.signal(provider, ChangeCause::PriorityChanged)?;
        self.list(Some(provider))
    }

    /// Refresh usage now; for an OAuth account in error or flagged, force a token refresh
    /// first (success clears the error and the flag).
    pub async fn refresh(&self, id: &str) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        let s = self.store.settings()?;
        if a.kind == CredentialKind::OAuth && (a.error.is_some() || a.needs_sign_in) {
            let Some(Credential::OAuth(tokens)) = self.store.credential(id)? else {
                return Err(AccountsError::InvalidCredential(
                    "the account has no OAuth credential".into(),
                ));
            };
            match self.engine.refresh(a.provider, id, &tokens, &s).await? {
                crate::engine::Refreshed::Tokens(_) => {
                    if self.store.clear_error(id)? {
                        self.signal(a.provider, ChangeCause::ErrorCleared)?;
                    }
                }
                crate::engine::Refreshed::Refused(status) => {
                    let text = format!("OAuth refresh failed with HTTP {status}.");
                    if a.error.is_some() {
                        self.store.set_error(id, &text)?;
                    }
                    return Err(AccountsError::RefreshRefused(format!("HTTP {status}")));
                }
                crate::engine::Refreshed::Transient(detail) => {
                    return Err(AccountsError::UpstreamUnreachable(detail));
                }
            }
        }
        if a.kind == CredentialKind::OAuth
            && let Err(why) = self.engine.refresh_usage(a.provider, id, &s).await?
        {
            return Err(AccountsError::UpstreamUnreachable(why.to_string()));
        }
        self.account_info(id)
    }

    /// Accounts of one provider or all, in selection order.
    pub fn list(&self, provider: Option<Provider>) -> Result<Vec<AccountInfo>, AccountsError> {
        let accounts = self.store.accounts(provider)?;
        accounts.iter().map(|a| Ok(self.info(a)?)).collect()
    }

    // ---- settings ---------------------------------------------------------------------

    pub fn list_settings(&self) -> Result<Vec<SettingInfo>, SettingsError> {
        let pairs = self.store.setting_pairs()?;
        Ok(settings::SPECS
            .iter()
            .map(|spec| SettingInfo {
                key: spec.key.to_owned(),
                value: pairs
                    .iter()
                    .find(|(k, _)| k == spec.key)
                    .map_or_else(|| spec.default.to_owned(), |(_, v)| v.clone()),
                default_value: spec.default.to_owned(),
                description: spec.description.to_owned(),
            })
            .collect())
    }

    pub fn get_setting(&self, key: &str) -> Result<SettingInfo, SettingsError> {
        self.list_settings()?
            .into_iter()
            .find(|s| s.key == key)
            .ok_or_else(|| SettingsError::Refused(SettingError::UnknownKey(key.to_owned())))
    }

    /// Validate and store a setting; a change that may alter availability queues
    /// `config-changed` (or `routing-changed`) for the providers it affects.
    pub fn set_setting(&self, key: &str, value: &str) -> Result<SettingInfo, SettingsError> {
        let canonical = settings::canonical(key, value).map_err(SettingsError::Refused)?;
        let before = self.get_setting(key)?.value;
        self.store.put_setting(key, &canonical)?;
        if before != canonical {
            let cause = if key.ends_with("-routing") {
                ChangeCause::RoutingChanged
            } else {
                ChangeCause::ConfigChanged
            };
            let affects =
                key.ends_with("-routing") || key.ends_with("-url") || key == "switch-threshold";
            if affects {
                for p in settings::affected_providers(key) {
                    self.signal(p, cause)?;
                }
            }
        }
        self.get_setting(key)
    }

    // ---- routes -----------------------------------------------------------------------

    /// Open (or re-open, replacing the token) a thread's route for a provider.
    pub fn open_route(
        &self,
        thread: &str,
        provider: Provider,
        endpoint: &str,
    ) -> Result<Route, RoutingError> {
        if !valid_thread(thread) {
            return Err(RoutingError::InvalidThread(
                "a thread id must be 1 to 128 characters without control characters".into(),
            ));
        }
        let endpoint = endpoint.trim().trim_end_matches('/');
        if !valid_endpoint(endpoint) {
            return Err(RoutingError::InvalidEndpoint(format!(
                "{endpoint:?} is not an absolute http(s) URL"
            )));
        }
        let mut bytes = [0u8; 32];
        self.env.fill(&mut bytes);
        let secret = token::encode(&bytes);
        let now = self.env.now();
        self.store
            .open_route(thread, provider, &token::hash(&secret), now)?;
        let (base_url, env, args, config_lines) = match provider {
            Provider::Claude => (
                endpoint.to_owned(),
                vec![
                    ("ANTHROPIC_BASE_URL".to_owned(), endpoint.to_owned()),
                    ("ANTHROPIC_AUTH_TOKEN".to_owned(), secret.clone()),
                ],
                Vec::new(),
                Vec::new(),
            ),
            Provider::Codex => {
                let base = format!("{endpoint}/v1");
                let args = vec![
                    "-c".into(),
                    "model_providers.pooler.name=\"Pooler\"".into(),
                    "-c".into(),
                    format!("model_providers.pooler.base_url=\"{base}\""),
                    "-c".into(),
                    "model_providers.pooler.wire_api=\"responses\"".into(),
                    "-c".into(),
                    format!("model_providers.pooler.env_key=\"{CODEX_TOKEN_VAR}\""),
                    "-c".into(),
                    "model_provider=\"pooler\"".into(),
                ];
                let lines = vec![
                    "model_provider = \"pooler\"".into(),
                    "[model_providers.pooler]".into(),
                    "name = \"Pooler\"".into(),
                    format!("base_url = \"{base}\""),
                    "wire_api = \"responses\"".into(),
                    format!("env_key = \"{CODEX_TOKEN_VAR}\""),
                ];
                (
                    base,
                    vec![(CODEX_TOKEN_VAR.to_owned(), secret.clone())],
                    args,
                    lines,
                )
            }
        };
        Ok(Route {
            thread: thread.to_owned(),
            provider,
            base_url,
            token: secret,
            env,
            args,
            config_lines,
            opened_at: now,
        })
    }

    pub fn close_route(&self, thread: &str, provider: Provider) -> Result<(), RoutingError> {
        if !valid_thread(thread) {
            return Err(RoutingError::InvalidThread(
                "a thread id must be 1 to 128 characters without control characters".into(),
            ));
        }
        if self.store.close_route(thread, provider)? {
            Ok(())
        } else {
            Err(RoutingError::NoSuchRoute)
        }
    }

    pub fn has_route(&self, thread: &str, provider: Provider) -> Result<bool, DbError> {
        self.store.has_route(thread, provider)
    }

    /// Where a session is pinned and why, with its latest attempts.
    pub fn explain_session(
        &self,
        provider: Provider,
        session: &str,
    ) -> Result<SessionExplanation, RoutingError> {
        let key = session::normalise_key(session).ok_or_else(|| {
            RoutingError::InvalidSession(
                "a session must be 1 to 512 characters without control characters".into(),
            )
        })?;
        let now = self.env.now();
        let lifetime = self.store.settings()?.pin_lifetime_ms;
        let pin = self.store.pin(provider, &key, now, lifetime)?;
        let recent = self.store.recent_attempts(provider, &key)?;
        let why = match &pin {
            Some(p) if p.provisional => "claimed by a request still in flight".to_owned(),
            Some(p) => p.why.clone(),
            None if recent.is_empty() => {
                "no pin: the pool has not seen this session (or its pin expired)".to_owned()
            }
            None => "no pin: its pin expired or no request of it succeeded".to_owned(),
        };
        Ok(SessionExplanation {
            provider,
            account: pin.as_ref().map(|p| p.account.clone()),
            thread: pin.as_ref().and_then(|p| p.thread.clone()),
            last_used_at: pin.as_ref().map(|p| p.last_used_at),
            expires_at: pin.as_ref().map(|p| p.last_used_at + lifetime),
            why,
            recent,
            key,
        })
    }

    // ---- availability -----------------------------------------------------------------

    /// The availability answer for a thread's next request (pure read).
    pub fn availability(
        &self,
        thread: &str,
        provider: Provider,
        model: Option<&str>,
    ) -> Result<Availability, DbError> {
        let mut answers = self.availability_many(&[(thread, provider, model)])?;
        Ok(answers.remove(0))
    }

    /// The answers for several threads' next requests, as [`Admin::availability`] gives
    /// each, read at one instant: settings and each provider's accounts are read once.
    pub fn availability_many(
        &self,
        queries: &[(&str, Provider, Option<&str>)],
    ) -> Result<Vec<Availability>, DbError> {
        self.store.read(|store| {
            let s = store.settings()?;
            let now = self.env.now();
            let mut accounts = std::collections::HashMap::new();
            let mut answers = Vec::with_capacity(queries.len());
            for &(thread, provider, model) in queries {
                if !s.routing(provider) || !store.has_route(thread, provider)? {
                    answers.push(Availability::NotRouted);
                    continue;
                }
                let family = match provider {
                    Provider::Claude => model.map(Family::of),
                    Provider::Codex => None,
                };
                let accounts = match accounts.entry(provider) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(store.accounts(Some(provider))?)
                    }
                };
                answers.push(policy::verdict(accounts, family, s.switch_threshold, now));
            }
            Ok(answers)
        })
    }

    /// The pool-wide answer for a new conversation of `provider`.
    fn provider_availability(&self, provider: Provider) -> Result<Availability, DbError> {
        let s = self.store.settings()?;
        if !s.routing(provider) {
            return Ok(Availability::NotRouted);
        }
        let accounts = self.store.accounts(Some(provider))?;
        Ok(policy::verdict(
            &accounts,
            None,
            s.switch_threshold,
            self.env.now(),
        ))
    }

    /// Take the pending signals, each with the provider's current answer.
    pub fn take_changes(&self) -> Result<Vec<Change>, DbError> {
        let pending: Vec<PendingSignal> = self.store.take_signals()?;
        pending
            .into_iter()
            .map(|p| {
                Ok(Change {
                    earliest: self.provider_availability(p.provider)?,
                    provider: p.provider,
                    causes: p.causes,
                    detected_at: p.detected_at,
                })
            })
            .collect()
    }

    // ---- maintenance ------------------------------------------------------------------

    /// Periodic work: detect ended holds and passed resets (queueing signals), drop
    /// expired pins and old attempts, refresh tokens that expire soon and usage when due.
    pub async fn tick(&self, now: u64) -> Result<(), DbError> {
        let s = self.store.settings()?;
        let last = self
            .store
            .meta_i64("last-tick")?
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(now);
        let passed = |t: Option<u64>| t.is_some_and(|t| t > last && t <= now);
        for a in self.store.accounts(None)? {
            if passed(a.held_until) {
                self.store
                    .push_signal(a.provider, ChangeCause::HoldEnded, now)?;
            }
            let reset_passed = a.quota.windows.iter().any(|w| {
                passed(w.resets_at)
                    && (w.status.as_deref() == Some("rejected")
                        || w.utilization.is_some_and(|u| u >= s.switch_threshold))
            }) || passed(a.quota.restriction.as_ref().and_then(|r| r.resets_at));
            if reset_passed {
                self.store
                    .push_signal(a.provider, ChangeCause::ResetPassed, now)?;
            }
        }
        self.store.prune_pins(now, s.pin_lifetime_ms, s.pin_cap)?;
        self.store.prune_attempts(now, ATTEMPT_RETENTION_MS)?;
        self.store
            .set_meta_i64("last-tick", i64::try_from(now).unwrap_or(i64::MAX))?;

        for a in self.store.accounts(None)? {
            if a.kind != CredentialKind::OAuth || !a.enabled || a.error.is_some() {
                continue;
            }
            let rs = self.store.refresh_state(&a.id)?;
            let backing_off = rs.retry_at.is_some_and(|t| t > now);
            if oauth::need(a.token_expires_at, now) != oauth::Need::None
                && !backing_off
                && let Some(Credential::OAuth(tokens)) = self.store.credential(&a.id)?
            {
                let result = self.engine.refresh(a.provider, &a.id, &tokens, &s).await?;
                let expired = a.token_expires_at.is_some_and(|t| t <= now);
                if matches!(result, crate::engine::Refreshed::Refused(_)) && expired {
                    self.refused_refresh_of_expired_token(&a, now)?;
                    continue;
                }
            }
            if rs
                .last_usage_at
                .is_none_or(|t| now >= t + s.usage_refresh_ms)
            {
                // A failed usage fetch is retried on a later tick; responses keep quota
                // current. A refused access token gets one refresh first; a refused refresh
                // of a token that has not expired flags the sign-in and keeps serving
                // (#6167), as above.
                let _ = self
                    .engine
                    .refresh_usage_signed_in(a.provider, &a.id, &s)
                    .await?;
            }
        }
        Ok(())
    }

    /// #6167: only an expired token whose refresh was refused puts an account in error.
    fn refused_refresh_of_expired_token(&self, a: &AccountState, now: u64) -> Result<(), DbError> {
        let text = "OAuth refresh failed and the access token has expired.";
        if self.store.set_error(&a.id, text)? {
            self.store
                .push_signal(a.provider, ChangeCause::ErrorSet, now)?;
        }
        Ok(())
    }
}

fn join(ids: &[&String]) -> String {
    ids.iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn validate_oauth(provider: Provider, t: &OAuthTokens) -> Result<(), AccountsError> {
    let bad = |s: &str| s.trim().is_empty() || s.chars().any(char::is_control);
    if bad(&t.access_token) {
        return Err(AccountsError::InvalidCredential(
            "access-token is empty or contains control characters".into(),
        ));
    }
    if bad(&t.refresh_token) {
        return Err(AccountsError::InvalidCredential(
            "refresh-token is empty or contains control characters".into(),
        ));
    }
    match (provider, &t.chatgpt_account_id) {
        (Provider::Codex, None) => Err(AccountsError::InvalidCredential(
            "chatgpt-account-id is required for Codex".into(),
        )),
        (Provider::Codex, Some(a)) if bad(a) => Err(AccountsError::InvalidCredential(
            "chatgpt-account-id is empty".into(),
        )),
        (Provider::Claude, Some(_)) => Err(AccountsError::InvalidCredential(
            "chatgpt-account-id must be absent for Claude".into(),
        )),
        _ => Ok(()),
    }
}
