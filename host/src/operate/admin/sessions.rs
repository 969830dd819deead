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
use crate::operate::wire::{SessionSummaryView, SessionView};
use crate::runtime::bindings::types::Provider;

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
