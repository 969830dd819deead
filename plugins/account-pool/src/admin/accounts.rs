//! The `accounts` interface: adding (a key, OAuth tokens, a login file), removing,
//! enabling and disabling, priority and order, refreshing and listing accounts, and how
//! a person sees an account (no secret).

use super::Admin;
use crate::engine::{Cancel, Clock, Log, Random, Upstream, new_id};
use crate::model::{
    AccountOptions, ChangeCause, Credential, CredentialKind, OAuthTokens, OptionsChange, Provider,
};
use crate::oauth;
use crate::policy::{self, AccountState};
use crate::quota::BlockingReset;
use pooler_plugin_kit::{Db, DbError};

/// An account to add.
#[derive(Debug, Clone)]
pub struct NewAccount {
    pub provider: Provider,
    pub credential: Credential,
    pub label: Option<String>,
    pub priority: Option<i32>,
    /// Its options; None: the defaults.
    pub options: Option<AccountOptions>,
}

/// An account and its windows as a person sees them (no secret): the kit's records.
pub use pooler_plugin_kit::admin::{AccountInfo, WindowInfo};

/// Why an account operation was refused (mirror of the WIT `accounts-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountsError {
    NoSuchAccount(String),
    ApiKeyNotSupported(Provider),
    InvalidCredential(String),
    InvalidLoginFile(String),
    InvalidLabel(String),
    InvalidOrder(String),
    InvalidOptions(String),
    RefreshRefused(String),
    UpstreamUnreachable(String),
    Storage(String),
}

impl From<DbError> for AccountsError {
    fn from(e: DbError) -> Self {
        AccountsError::Storage(e.to_string())
    }
}

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Admin<'a, D, U, E>
{
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
                family: w.family.map(|f| f.as_str().to_owned()),
                utilization: w.utilization,
                resets_at: w.resets_at,
                status: w.status.clone(),
                blocking: w.blocks(a.quota.extra_usage(now), now),
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
            options: a.options,
        })
    }

    fn account_info(&self, id: &str) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        Ok(self.info(&a)?)
    }

    /// Add an account.
    pub fn add(&self, new: NewAccount) -> Result<AccountInfo, AccountsError> {
        let NewAccount {
            provider,
            credential,
            label,
            priority,
            options,
        } = new;
        validate_credential(provider, &credential)?;
        let options = match options {
            Some(o) => OptionsChange {
                last_resort: Some(o.last_resort),
                extra_usage: Some(o.extra_usage),
                max_in_flight: Some(o.max_in_flight),
                preserve: Some(o.preserve),
            }
            .apply(AccountOptions::default())
            .map_err(AccountsError::InvalidOptions)?,
            None => AccountOptions::default(),
        };
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
            &options,
            self.env.now(),
        )?;
        self.signal(provider, ChangeCause::AccountAdded)?;
        self.account_info(&id)
    }

    /// Replace an account's credential in place: id, label, priority, order, enabled flag,
    /// windows and pins stay; the error, a token hold, the sign-in flag and the refresh
    /// backoff clear. Signals `error-cleared` (and `hold-ended` when a hold was cleared).
    pub fn update_credential(
        &self,
        id: &str,
        credential: Credential,
    ) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        validate_credential(a.provider, &credential)?;
        let hold_cleared = self
            .store
            .replace_credential(id, &credential)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        self.signal(a.provider, ChangeCause::ErrorCleared)?;
        if hold_cleared {
            self.signal(a.provider, ChangeCause::HoldEnded)?;
        }
        self.account_info(id)
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
            options: None,
        })
    }

    /// Change an account's options (fields left None keep theirs). Refused, with nothing
    /// changed, when a value is out of range. A change of extra usage may change what the
    /// account can serve: it signals `config-changed`.
    pub fn update_options(
        &self,
        id: &str,
        change: OptionsChange,
    ) -> Result<AccountInfo, AccountsError> {
        let a = self
            .store
            .account(id)?
            .ok_or_else(|| AccountsError::NoSuchAccount(id.to_owned()))?;
        let options = change
            .apply(a.options)
            .map_err(AccountsError::InvalidOptions)?;
        self.store.set_options(id, &options)?;
        if options.extra_usage != a.options.extra_usage {
            self.signal(a.provider, ChangeCause::ConfigChanged)?;
        }
        self.account_info(id)
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
                        self.store.set_error(id, &text, self.env.now())?;
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

    /// The quota history of the accounts of `provider` (all when None) from `since` on,
    /// oldest first.
    pub fn quota_history(
        &self,
        provider: Option<Provider>,
        since: u64,
    ) -> Result<Vec<crate::history::HistoryEntry>, AccountsError> {
        Ok(self.store.read(|s| s.quota_history(provider, since))?)
    }
}

fn join(ids: &[&String]) -> String {
    ids.iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `provider` can take `credential` and it is well formed (never names a value).
fn validate_credential(provider: Provider, credential: &Credential) -> Result<(), AccountsError> {
    match credential {
        Credential::ApiKey(_) if provider != Provider::Claude => {
            Err(AccountsError::ApiKeyNotSupported(provider))
        }
        Credential::ApiKey(k) if k.trim().is_empty() || k.chars().any(char::is_control) => {
            Err(AccountsError::InvalidCredential(
                "api-key is empty or contains control characters".into(),
            ))
        }
        Credential::OAuth(t) => validate_oauth(provider, t),
        Credential::ApiKey(_) => Ok(()),
    }
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
