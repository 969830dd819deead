//! The `accounts` and `secrets` tables: an account's state, order, flags and holds, and
//! its credential, which is read only to send it upstream.

use super::{RefreshState, Store, TOUCH_GRANULARITY_MS, decode};
use crate::model::{AccountOptions, Credential, CredentialKind, HoldKind, OAuthTokens, Provider};
use crate::policy::AccountState;
use crate::quota::{QuotaState, Restriction, Window};
use pooler_plugin_kit::{Db, DbError, Row, Value};

/// An account's fields that only people need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountMeta {
    pub label: String,
    pub created_at: u64,
    pub last_used_at: Option<u64>,
}

impl<'a, D: Db> Store<'a, D> {
    /// Insert a new account with its secret; it gets the next insertion order.
    #[allow(clippy::too_many_arguments)]
    pub fn insert_account(
        &self,
        id: &str,
        provider: Provider,
        credential: &Credential,
        label: &str,
        priority: i32,
        options: &AccountOptions,
        now: u64,
    ) -> Result<(), DbError> {
        self.tx(|s| {
            let seq = s
                .db
                .query("SELECT COALESCE(MAX(seq), 0) + 1 AS n FROM accounts", &[])?
                .first()
                .map(|r| r.i64("n"))
                .transpose()?
                .unwrap_or(1);
            s.db.execute(
                "INSERT INTO accounts (id, seq, provider, kind, label, priority, enabled, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7)",
                &[
                    id.into(),
                    seq.into(),
                    provider.as_str().into(),
                    credential.kind().as_str().into(),
                    label.into(),
                    priority.into(),
                    now.into(),
                ],
            )?;
            s.set_options(id, options)?;
            s.put_credential(id, credential)
        })
    }

    const ACCOUNT_SELECT: &'static str =
        "SELECT a.id, a.seq, a.provider, a.kind, a.priority, a.enabled, a.error,
            a.held_until, a.hold_kind, a.needs_sign_in, a.last_used_at, a.last_resort, a.extra_usage,
            a.max_in_flight, a.preserve, s.expires_at, r.retry_at, r.failure,
            q.overage, q.credits, q.representative_claim, q.restriction_reason, q.restriction_reset
        FROM accounts a
        LEFT JOIN secrets s ON s.account_id = a.id
        LEFT JOIN refresh_state r ON r.account_id = a.id
        LEFT JOIN quota q ON q.account_id = a.id";

    fn account_from_row(&self, r: &Row<'_>, windows: Vec<Window>) -> Result<AccountState, DbError> {
        let id = r.text("id")?;
        let failure = r.opt_text("failure")?;
        let options = AccountOptions {
            last_resort: r.bool("last_resort")?,
            extra_usage: r.bool("extra_usage")?,
            max_in_flight: u32::try_from(r.i64("max_in_flight")?).unwrap_or(0),
            preserve: r.f64("preserve")?,
        };
        let quota = QuotaState {
            windows,
            overage: r.opt_text("overage")?,
            credits: r.get("credits")?.as_i64().map(|c| c != 0),
            representative_claim: r.opt_text("representative_claim")?,
            restriction: r.opt_text("restriction_reason")?.map(|reason| Restriction {
                reason,
                resets_at: r.opt_u64("restriction_reset").ok().flatten(),
            }),
            extra_usage_allowed: options.extra_usage,
        };
        Ok(AccountState {
            provider: decode("provider", Provider::parse(&r.text("provider")?))?,
            kind: decode("kind", CredentialKind::parse(&r.text("kind")?))?,
            priority: i32::try_from(r.i64("priority")?).unwrap_or(0),
            seq: r.i64("seq")?,
            enabled: r.bool("enabled")?,
            error: r.opt_text("error")?,
            held_until: r.opt_u64("held_until")?,
            hold_kind: r.opt_text("hold_kind")?.and_then(|k| HoldKind::parse(&k)),
            quota,
            needs_sign_in: r.bool("needs_sign_in")?,
            token_expires_at: r.opt_u64("expires_at")?,
            refresh_retry_at: if failure.as_deref() == Some("transient") {
                r.opt_u64("retry_at")?
            } else {
                None
            },
            last_used_at: r.opt_u64("last_used_at")?,
            options,
            id,
        })
    }

    /// Accounts of a provider (or all), in selection order: priority, then order added.
    pub fn accounts(&self, provider: Option<Provider>) -> Result<Vec<AccountState>, DbError> {
        let rows = match provider {
            Some(p) => self.db.query(
                &format!(
                    "{} WHERE a.provider = ?1 ORDER BY a.priority, a.seq",
                    Self::ACCOUNT_SELECT
                ),
                &[p.as_str().into()],
            )?,
            None => self.db.query(
                &format!(
                    "{} ORDER BY a.provider, a.priority, a.seq",
                    Self::ACCOUNT_SELECT
                ),
                &[],
            )?,
        };
        // Every listed account's windows in one query rather than one query per account.
        let mut windows = match provider {
            Some(p) => self.windows_where(
                "JOIN accounts a ON a.id = windows.account_id WHERE a.provider = ?1",
                &[p.as_str().into()],
            )?,
            None => self.windows_where("", &[])?,
        };
        rows.iter()
            .map(|r| {
                let own = windows.remove(&r.text("id")?).unwrap_or_default();
                self.account_from_row(&r, own)
            })
            .collect()
    }

    pub fn account(&self, id: &str) -> Result<Option<AccountState>, DbError> {
        let rows = self.db.query(
            &format!("{} WHERE a.id = ?1", Self::ACCOUNT_SELECT),
            &[id.into()],
        )?;
        rows.first()
            .map(|r| self.account_from_row(&r, self.windows(id)?))
            .transpose()
    }

    pub fn account_meta(&self, id: &str) -> Result<Option<AccountMeta>, DbError> {
        let rows = self.db.query(
            "SELECT label, created_at, last_used_at FROM accounts WHERE id = ?1",
            &[id.into()],
        )?;
        rows.first()
            .map(|r| {
                Ok(AccountMeta {
                    label: r.text("label")?,
                    created_at: r.u64("created_at")?,
                    last_used_at: r.opt_u64("last_used_at")?,
                })
            })
            .transpose()
    }

    /// Set `enabled`; enabling also clears the error, the hold and the sign-in flag.
    pub fn set_enabled(&self, id: &str, enabled: bool) -> Result<bool, DbError> {
        let sql = if enabled {
            "UPDATE accounts SET enabled = 1, error = NULL, held_until = NULL, hold_kind = NULL WHERE id = ?1"
        } else {
            "UPDATE accounts SET enabled = 0 WHERE id = ?1"
        };
        Ok(self.db.execute(sql, &[id.into()])? > 0)
    }

    /// Store an account's options. Returns whether the account exists.
    pub fn set_options(&self, id: &str, o: &AccountOptions) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "UPDATE accounts SET last_resort = ?2, extra_usage = ?3, max_in_flight = ?4, preserve = ?5
             WHERE id = ?1",
            &[
                id.into(),
                o.last_resort.into(),
                o.extra_usage.into(),
                o.max_in_flight.into(),
                o.preserve.into(),
            ],
        )? > 0)
    }

    pub fn set_priority(&self, id: &str, priority: i32) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "UPDATE accounts SET priority = ?2 WHERE id = ?1",
            &[id.into(), priority.into()],
        )? > 0)
    }

    /// Put the account in authentication error at `at` (kept in its quota history).
    /// Returns whether it was not already.
    pub fn set_error(&self, id: &str, text: &str, at: u64) -> Result<bool, DbError> {
        let set = self.db.execute(
            "UPDATE accounts SET error = ?2 WHERE id = ?1 AND error IS NULL",
            &[id.into(), text.into()],
        )? > 0;
        if set {
            self.record_history(id, at, &crate::history::HistoryEvent::Error)?;
        }
        Ok(set)
    }

    /// Clear the error and the sign-in flag. Returns whether an error was cleared.
    pub fn clear_error(&self, id: &str) -> Result<bool, DbError> {
        let had = self.db.execute(
            "UPDATE accounts SET error = NULL, needs_sign_in = 0 WHERE id = ?1 AND error IS NOT NULL",
            &[id.into()],
        )? > 0;
        self.db.execute(
            "UPDATE accounts SET needs_sign_in = 0 WHERE id = ?1",
            &[id.into()],
        )?;
        Ok(had)
    }

    pub fn set_needs_sign_in(&self, id: &str, flag: bool) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE accounts SET needs_sign_in = ?2 WHERE id = ?1",
            &[id.into(), flag.into()],
        )?;
        Ok(())
    }

    /// Hold the account until `until` (a later existing hold is kept), from `at` (a hold
    /// placed or extended is kept in its quota history).
    pub fn set_hold(&self, id: &str, until: u64, kind: HoldKind, at: u64) -> Result<(), DbError> {
        let set = self.db.execute(
            "UPDATE accounts SET held_until = ?2, hold_kind = ?3
             WHERE id = ?1 AND (held_until IS NULL OR held_until < ?2)",
            &[id.into(), until.into(), kind.as_str().into()],
        )? > 0;
        if set {
            self.record_history(id, at, &crate::history::HistoryEvent::Hold { until })?;
        }
        Ok(())
    }

    /// Record that the account was used at `now`, unless its last use is already within
    /// [`TOUCH_GRANULARITY_MS`] of it (then nothing is written). `seen` is its last use as
    /// the caller read it: when that is recent enough, no statement runs at all.
    pub fn touch_account(&self, id: &str, seen: Option<u64>, now: u64) -> Result<(), DbError> {
        if !crate::policy::use_due(seen, now, TOUCH_GRANULARITY_MS) {
            return Ok(());
        }
        self.db.execute(
            "UPDATE accounts SET last_used_at = ?2
             WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at + ?3 <= ?2)",
            &[id.into(), now.into(), TOUCH_GRANULARITY_MS.into()],
        )?;
        Ok(())
    }

    /// Remove an account, its secret, quota and refresh state. Pins to it stay and re-pin
    /// on their next success; the cursor moves on the next success elsewhere.
    pub fn remove_account(&self, id: &str) -> Result<bool, DbError> {
        self.tx(|s| {
            for sql in [
                "DELETE FROM secrets WHERE account_id = ?1",
                "DELETE FROM windows WHERE account_id = ?1",
                "DELETE FROM quota WHERE account_id = ?1",
                "DELETE FROM refresh_state WHERE account_id = ?1",
                "DELETE FROM in_flight WHERE account_id = ?1",
                "DELETE FROM placements WHERE account_id = ?1",
                "DELETE FROM quota_history WHERE account_id = ?1",
            ] {
                s.db.execute(sql, &[id.into()])?;
            }
            Ok(s.db
                .execute("DELETE FROM accounts WHERE id = ?1", &[id.into()])?
                > 0)
        })
    }

    /// Replace an account's credential in place (its kind follows the credential), and
    /// clear what the old credential caused: the error, a token hold, the sign-in flag and
    /// the refresh backoff. Everything else (label, priority, order, enabled, windows,
    /// pins) stays. Returns whether a hold was cleared, or None when there is no such
    /// account.
    pub fn replace_credential(
        &self,
        id: &str,
        credential: &Credential,
    ) -> Result<Option<bool>, DbError> {
        self.tx(|s| {
            let held = s.db.query(
                "SELECT hold_kind FROM accounts WHERE id = ?1",
                &[id.into()],
            )?;
            let Some(row) = held.first() else {
                return Ok(None);
            };
            let token_hold = row.opt_text("hold_kind")?.as_deref() == Some(HoldKind::Token.as_str());
            s.db.execute(
                "UPDATE accounts SET kind = ?2, error = NULL, needs_sign_in = 0 WHERE id = ?1",
                &[id.into(), credential.kind().as_str().into()],
            )?;
            if token_hold {
                s.db.execute(
                    "UPDATE accounts SET held_until = NULL, hold_kind = NULL WHERE id = ?1",
                    &[id.into()],
                )?;
            }
            s.db.execute(
                "UPDATE refresh_state SET failure = NULL, backoff_ms = NULL, retry_at = NULL WHERE account_id = ?1",
                &[id.into()],
            )?;
            s.put_credential(id, credential)?;
            Ok(Some(token_hold))
        })
    }

    // ---- secrets ----------------------------------------------------------------------

    pub fn credential(&self, id: &str) -> Result<Option<Credential>, DbError> {
        let rows = self.db.query(
            "SELECT a.kind, s.api_key, s.access_token, s.refresh_token, s.expires_at, s.chatgpt_account_id
             FROM accounts a JOIN secrets s ON s.account_id = a.id WHERE a.id = ?1",
            &[id.into()],
        )?;
        rows.first().map(credential_of).transpose()
    }

    /// What an attempt sends with on account `id`: its credential and its OAuth refresh
    /// bookkeeping, in one statement.
    pub fn secret(&self, id: &str) -> Result<Secret, DbError> {
        let rows = self.db.query(
            "SELECT a.kind, s.api_key, s.access_token, s.refresh_token, s.expires_at, s.chatgpt_account_id,
                    r.lease_until, r.lease_owner, r.backoff_ms, r.retry_at, r.failure, r.last_usage_at
             FROM accounts a JOIN secrets s ON s.account_id = a.id
             LEFT JOIN refresh_state r ON r.account_id = a.id WHERE a.id = ?1",
            &[id.into()],
        )?;
        let Some(r) = rows.first() else {
            return Ok(Secret {
                id: id.to_owned(),
                credential: None,
                refresh: RefreshState::default(),
            });
        };
        Ok(Secret {
            id: id.to_owned(),
            credential: Some(credential_of(r.clone())?),
            refresh: super::quota::refresh_state_of(r)?,
        })
    }

    pub fn put_credential(&self, id: &str, c: &Credential) -> Result<(), DbError> {
        let (api, at, rt, exp, acct): (Value, Value, Value, Value, Value) = match c {
            Credential::ApiKey(k) => (k.into(), Value::Null, Value::Null, Value::Null, Value::Null),
            Credential::OAuth(t) => (
                Value::Null,
                (&t.access_token).into(),
                (&t.refresh_token).into(),
                t.expires_at.into(),
                t.chatgpt_account_id.clone().into(),
            ),
        };
        self.db.execute(
            "INSERT INTO secrets (account_id, api_key, access_token, refresh_token, expires_at, chatgpt_account_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(account_id) DO UPDATE SET api_key = excluded.api_key,
                access_token = excluded.access_token, refresh_token = excluded.refresh_token,
                expires_at = excluded.expires_at, chatgpt_account_id = excluded.chatgpt_account_id",
            &[id.into(), api, at, rt, exp, acct],
        )?;
        Ok(())
    }

    /// Store a refresh's tokens only over the tokens it replaced (compare-and-set on the
    /// access and refresh token): false, writing nothing, when another writer stored
    /// other tokens meanwhile.
    pub fn replace_tokens(
        &self,
        id: &str,
        old: &OAuthTokens,
        new: &OAuthTokens,
    ) -> Result<bool, DbError> {
        Ok(self.db.execute(
            "UPDATE secrets SET access_token = ?4, refresh_token = ?5, expires_at = ?6,
                chatgpt_account_id = ?7
             WHERE account_id = ?1 AND access_token = ?2 AND refresh_token = ?3",
            &[
                id.into(),
                (&old.access_token).into(),
                (&old.refresh_token).into(),
                (&new.access_token).into(),
                (&new.refresh_token).into(),
                new.expires_at.into(),
                new.chatgpt_account_id.clone().into(),
            ],
        )? > 0)
    }

    /// The current access token of an OAuth account (to guard writes against a token that
    /// was replaced meanwhile).
    pub fn access_token(&self, id: &str) -> Result<Option<String>, DbError> {
        let rows = self.db.query(
            "SELECT access_token FROM secrets WHERE account_id = ?1",
            &[id.into()],
        )?;
        Ok(rows
            .first()
            .and_then(|r| r.opt_text("access_token").ok().flatten()))
    }
}

/// An account's credential and OAuth refresh bookkeeping, as one attempt reads them.
/// `Debug` never prints the secret ([`Credential`]'s own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// The account.
    pub id: String,
    /// None when the account has no secret row.
    pub credential: Option<Credential>,
    pub refresh: RefreshState,
}

/// The credential of a row with `kind` and the `secrets` columns.
fn credential_of(r: Row<'_>) -> Result<Credential, DbError> {
    Ok(match CredentialKind::parse(&r.text("kind")?) {
        Some(CredentialKind::ApiKey) => Credential::ApiKey(r.text("api_key")?),
        Some(CredentialKind::OAuth) => Credential::OAuth(OAuthTokens {
            access_token: r.text("access_token")?,
            refresh_token: r.text("refresh_token")?,
            expires_at: r.opt_u64("expires_at")?,
            chatgpt_account_id: r.opt_text("chatgpt_account_id")?,
        }),
        None => return Err(DbError::Decode("bad kind".into())),
    })
}
