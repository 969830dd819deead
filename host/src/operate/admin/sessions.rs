//! `/_pooler/sessions…`: where a conversation (session) is pinned and why, via the pool's
//! `routing.explain-session`.
//!
//! | method and path                       | answer |
//! |---------------------------------------|--------|
//! | `GET /sessions/{provider}/{session}`  | `{"session": {provider, key, account, thread, last_used_at, expires_at, why, recent: [attempt…]}}` |
//! | `GET /sessions[?thread=T&provider=P]` | `{"sessions": [{provider, key, account, thread, last_used_at, expires_at, provisional}…]}`, most recently used first |
//!
//! `session` is a raw session id or a stored key (`session:<id>`, `cache:<key>`),
//! percent-encoded. A session with no pin is not an error: `account` is null and `why` says so.

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::operate::wire::{AttemptView, SessionSummaryView, SessionView};
use crate::runtime::bindings::pool::exports::pooler::plugins::routing::{
    AttemptOutcome, AttemptRecord, SessionExplanation, SessionSummary,
};
use crate::runtime::bindings::types::Provider;

impl From<SessionSummary> for SessionSummaryView {
    fn from(s: SessionSummary) -> Self {
        SessionSummaryView {
            provider: s.provider.into(),
            key: s.key,
            account: s.account,
            thread: s.thread,
            last_used_at: s.last_used_at,
            expires_at: s.expires_at,
            provisional: s.provisional,
        }
    }
}

impl From<SessionExplanation> for SessionView {
    fn from(s: SessionExplanation) -> Self {
        SessionView {
            provider: s.provider.into(),
            key: s.key,
            account: s.account,
            thread: s.thread,
            last_used_at: s.last_used_at,
            expires_at: s.expires_at,
            why: s.why,
            recent: s.recent.into_iter().map(AttemptView::from).collect(),
        }
    }
}

impl From<AttemptRecord> for AttemptView {
    fn from(a: AttemptRecord) -> Self {
        AttemptView {
            at: a.at,
            account: a.account,
            status: a.status,
            outcome: outcome_word(a.outcome).to_owned(),
        }
    }
}

/// The outcome as the admin API and the CLI show it: the WIT case's name.
fn outcome_word(o: AttemptOutcome) -> &'static str {
    match o {
        AttemptOutcome::Served => "served",
        AttemptOutcome::Detour => "detour",
        AttemptOutcome::PassedThrough => "passed-through",
        AttemptOutcome::Transient => "transient",
        AttemptOutcome::Hold => "hold",
        AttemptOutcome::Quota => "quota",
        AttemptOutcome::Family => "family",
        AttemptOutcome::Auth => "auth",
        AttemptOutcome::Cancelled => "cancelled",
    }
}

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => list(admin, req).await,
        ("GET", [provider, session]) => {
            let provider = super::path_provider(provider)?;
            let target = session.to_string();
            let explained = admin
                .pool("routing.explain-session", move |store, pool| {
                    Box::pin(async move {
                        pool.pooler_plugins_routing()
                            .call_explain_session(store, provider, &target)
                            .await
                    })
                })
                .await?
                .map_err(|e| super::routes::refused(e, "", provider))?;
            Reply::ok(serde_json::json!({ "session": SessionView::from(explained) }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

async fn list(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let provider = req
        .query("provider")
        .map(super::path_provider)
        .transpose()?;
    let thread = req.query("thread").map(str::to_owned);
    let target = thread.clone();
    let sessions = admin
        .pool("routing.list-sessions", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_list_sessions(store, target.as_ref(), provider)
                    .await
            })
        })
        .await?
        .map_err(|e| {
            super::routes::refused(
                e,
                thread.as_deref().unwrap_or(""),
                provider.unwrap_or(Provider::Claude),
            )
        })?;
    let sessions: Vec<SessionSummaryView> =
        sessions.into_iter().map(SessionSummaryView::from).collect();
    Reply::ok(serde_json::json!({ "sessions": sessions }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome shows as the word the pool recorded before the WIT had an enum, so the
    /// admin API's `outcome` strings did not change.
    #[test]
    fn every_attempt_outcome_shows_as_its_stable_word() {
        let cases = [
            (AttemptOutcome::Served, "served"),
            (AttemptOutcome::Detour, "detour"),
            (AttemptOutcome::PassedThrough, "passed-through"),
            (AttemptOutcome::Transient, "transient"),
            (AttemptOutcome::Hold, "hold"),
            (AttemptOutcome::Quota, "quota"),
            (AttemptOutcome::Family, "family"),
            (AttemptOutcome::Auth, "auth"),
            (AttemptOutcome::Cancelled, "cancelled"),
        ];
        for (outcome, word) in cases {
            let view = AttemptView::from(AttemptRecord {
                at: 7,
                account: "acc".into(),
                status: Some(503),
                outcome,
            });
            assert_eq!(
                serde_json::to_value(&view).unwrap(),
                serde_json::json!({"at": 7, "account": "acc", "status": 503, "outcome": word})
            );
        }
    }
}
