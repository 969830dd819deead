//! The `tokens` table: the token usage served answers reported, summed per minute,
//! provider, account, thread and model, for `pooler status`, `thread show` and the page.
//! Kept [`TOKEN_RETENTION_MS`] (the tick prunes older minutes).

use super::Store;
use crate::model::Provider;
use crate::tokens::TokenCounts;
use pooler_plugin_kit::{Db, DbError};

/// How long token usage is kept: a week and a day, so a week's totals are always whole.
pub const TOKEN_RETENTION_MS: u64 = 8 * 24 * 3_600_000;

/// The length of the buckets usage is summed in: totals are to the minute.
pub const TOKEN_BUCKET_MS: u64 = 60_000;

/// Summed token usage of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub provider: Provider,
    pub account: String,
    /// The thread (grouped by thread only); None for answers without a route's thread.
    pub thread: Option<String>,
    /// The model (grouped by thread only); None when the answers did not name one.
    pub model: Option<String>,
    /// How many answers reported usage.
    pub answers: u64,
    pub counts: TokenCounts,
}

impl<'a, D: Db> Store<'a, D> {
    // ---- tokens -----------------------------------------------------------------------

    /// Add one answer's usage at `at`.
    pub fn record_tokens(
        &self,
        at: u64,
        provider: Provider,
        account: &str,
        thread: Option<&str>,
        model: Option<&str>,
        counts: &TokenCounts,
    ) -> Result<(), DbError> {
        let minute = at - at % TOKEN_BUCKET_MS;
        self.db.execute(
            "INSERT INTO tokens (at, provider, account_id, thread, model, answers,
                                 input, output, cache_read, cache_write)
             VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8, ?9)
             ON CONFLICT (at, provider, account_id, thread, model) DO UPDATE SET
                answers = answers + 1,
                input = input + excluded.input,
                output = output + excluded.output,
                cache_read = cache_read + excluded.cache_read,
                cache_write = cache_write + excluded.cache_write",
            &[
                minute.into(),
                provider.as_str().into(),
                account.into(),
                thread.unwrap_or("").into(),
                model.unwrap_or("").into(),
                clamp(counts.input).into(),
                clamp(counts.output).into(),
                clamp(counts.cache_read).into(),
                clamp(counts.cache_write).into(),
            ],
        )?;
        Ok(())
    }

    /// The usage recorded since `since` (to the minute: the minute `since` falls in
    /// counts whole), of `thread` only when given, summed per provider and account, or per
    /// provider, account, thread and model when `by_thread`. Ordered by thread (by
    /// thread), provider, account, model.
    pub fn token_totals(
        &self,
        since: u64,
        thread: Option<&str>,
        by_thread: bool,
    ) -> Result<Vec<TokenRow>, DbError> {
        let group = if by_thread {
            "thread, provider, account_id, model"
        } else {
            "provider, account_id"
        };
        let pick = if by_thread {
            "thread, model"
        } else {
            "'' AS thread, '' AS model"
        };
        let sql = format!(
            "SELECT provider, account_id, {pick}, SUM(answers) AS answers,
                    SUM(input) AS input, SUM(output) AS output,
                    SUM(cache_read) AS cache_read, SUM(cache_write) AS cache_write
             FROM tokens WHERE at >= ?1 AND (?2 IS NULL OR thread = ?2)
             GROUP BY {group} ORDER BY {group}"
        );
        let since = since - since % TOKEN_BUCKET_MS;
        let rows = self.db.query(&sql, &[since.into(), thread.into()])?;
        rows.iter()
            .map(|r| {
                let provider = r.text("provider")?;
                let nonempty = |s: String| (!s.is_empty()).then_some(s);
                Ok(TokenRow {
                    provider: super::decode("provider", Provider::parse(&provider))?,
                    account: r.text("account_id")?,
                    thread: nonempty(r.text("thread")?),
                    model: nonempty(r.text("model")?),
                    answers: r.u64("answers")?,
                    counts: TokenCounts {
                        input: r.u64("input")?,
                        output: r.u64("output")?,
                        cache_read: r.u64("cache_read")?,
                        cache_write: r.u64("cache_write")?,
                    },
                })
            })
            .collect()
    }

    /// Drop the usage of minutes older than `age`.
    pub fn prune_tokens(&self, now: u64, age: u64) -> Result<(), DbError> {
        self.db.execute(
            "DELETE FROM tokens WHERE at < ?1",
            &[now.saturating_sub(age).into()],
        )?;
        Ok(())
    }
}

/// A count as SQLite's integer holds it.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
