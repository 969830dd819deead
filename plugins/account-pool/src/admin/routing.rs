//! The `routing` interface: opening and closing a thread's route (its token and the
//! environment an agent needs), and explaining where a session is pinned and why.

use super::Admin;
use crate::engine::{Cancel, Clock, Level, Log, Random, Upstream};
use crate::model::Provider;
use crate::policy::AttemptOutcome;
use crate::session;
use crate::token;
use pooler_plugin_kit::{Db, DbError};

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

/// The records this interface answers with: the kit's, which the host's admin API serves.
pub use pooler_plugin_kit::admin::{
    AttemptRecord, EnvVar, Route, RouteSummary, SessionExplanation, SessionSummary,
};

/// The name of the environment variable that holds a Codex route's token.
pub const CODEX_TOKEN_VAR: &str = "POOLER_CODEX_TOKEN";

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

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

impl<'a, D: Db, U: Upstream, E: Clock + Random + Log + Cancel + pooler_plugin_kit::Metrics>
    Admin<'a, D, U, E>
{
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
                    env_var("ANTHROPIC_BASE_URL", endpoint),
                    env_var("ANTHROPIC_AUTH_TOKEN", &secret),
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
                (base, vec![env_var(CODEX_TOKEN_VAR, &secret)], args, lines)
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

    /// The open routes, of one provider or all, by thread then provider. No token.
    pub fn list_routes(
        &self,
        provider: Option<Provider>,
    ) -> Result<Vec<RouteSummary>, RoutingError> {
        Ok(self
            .store
            .routes(provider)?
            .into_iter()
            .map(|(thread, provider, opened_at)| RouteSummary {
                thread,
                provider,
                opened_at,
            })
            .collect())
    }

    /// The sessions with a fresh pin, of one thread and/or provider, most recently used
    /// first.
    /// Token usage since `since` (of `thread` only when given), per account or per
    /// thread, account and model (the `tokens.totals` export).
    pub fn token_totals(
        &self,
        since: u64,
        thread: Option<&str>,
        by_thread: bool,
    ) -> Result<Vec<crate::store::TokenRow>, RoutingError> {
        if let Some(t) = thread
            && !valid_thread(t)
        {
            return Err(RoutingError::InvalidThread(
                "a thread id must be 1 to 128 characters without control characters".into(),
            ));
        }
        Ok(self.store.token_totals(since, thread, by_thread)?)
    }

    pub fn list_sessions(
        &self,
        thread: Option<&str>,
        provider: Option<Provider>,
    ) -> Result<Vec<SessionSummary>, RoutingError> {
        if let Some(t) = thread
            && !valid_thread(t)
        {
            return Err(RoutingError::InvalidThread(
                "a thread id must be 1 to 128 characters without control characters".into(),
            ));
        }
        let now = self.env.now();
        let lifetime = self.store.settings()?.pin_lifetime_ms;
        Ok(self
            .store
            .pins(thread, provider, now, lifetime)?
            .into_iter()
            .map(|(provider, key, pin)| SessionSummary {
                provider,
                key,
                account: pin.account,
                thread: pin.thread,
                last_used_at: pin.last_used_at,
                expires_at: pooler_plugin_kit::time::after(pin.last_used_at, lifetime),
                provisional: pin.provisional,
            })
            .collect())
    }

    /// Where a session is pinned and why, with its latest attempts.
    ///
    /// The attempts table stores each outcome as its word. A stored word that names no
    /// [`AttemptOutcome`] (only an edited database has one) leaves that attempt out of
    /// `recent`, with a warning, rather than failing the explanation.
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
        let recent = recent
            .into_iter()
            .filter_map(|r| match AttemptOutcome::parse(&r.outcome) {
                Some(outcome) => Some(AttemptRecord {
                    at: r.at,
                    account: r.account,
                    status: r.status,
                    outcome,
                }),
                None => {
                    self.env.log(
                        Level::Warn,
                        "Account Pooler skipped a recorded attempt with an unknown outcome",
                        &[
                            ("provider", provider.to_string()),
                            ("account", r.account),
                            ("outcome", r.outcome),
                        ],
                    );
                    None
                }
            })
            .collect();
        Ok(SessionExplanation {
            provider,
            account: pin.as_ref().map(|p| p.account.clone()),
            thread: pin.as_ref().and_then(|p| p.thread.clone()),
            last_used_at: pin.as_ref().map(|p| p.last_used_at),
            expires_at: pin
                .as_ref()
                .map(|p| pooler_plugin_kit::time::after(p.last_used_at, lifetime)),
            why,
            recent,
            key,
        })
    }
}
