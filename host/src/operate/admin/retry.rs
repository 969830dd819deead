//! `/_pooler/retry…`: Provider Retry's diagnostics and a person's cancel, through the
//! plugin's `retry-admin` export (`wit/retry-admin.wit`), for `pooler retry status|explain|
//! cancel`. (`send-now` and `opt-out` are the core's: `/_pooler/threads/{id}/…`.)
//!
//! | method and path              | answer |
//! |------------------------------|--------|
//! | `GET /retry/status[?thread=T]` | `{"candidates": [candidate…]}`, by next send time, watches last |
//! | `GET /retry/explain/{thread}`  | `{"thread": T, "chains": [chain…]}`, oldest chain first |
//! | `POST /retry/cancel/{thread}`  | `{"cancelled": candidate}` (as it was before the cancel) |
//!
//! The records are those of [`crate::operate::wire`] (`pooler retry explain` renders them).
//! A thread filter that matches nothing is an empty list (the CLI says "nothing pending");
//! `explain` of a thread the plugin never saw and `cancel` of a thread with no open
//! candidate are 404 with a message that says the thread has nothing pending. The plugin's
//! database or a capability failing is 503.

use super::{Admin, AdminRequest, ApiError, Reply};
use super::convert::{candidate_view, chain_view};
use crate::operate::wire::{CandidateView, ChainView};
use crate::runtime::bindings::retry::exports::pooler::plugins::retry_admin::{
    AdminError, Candidate, ChainHistory,
};

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", ["status"]) => status(admin, req.query("thread").map(str::to_owned)).await,
        ("GET", ["explain", thread]) => explain(admin, thread).await,
        ("POST", ["cancel", thread]) => cancel(admin, thread).await,
        _ => Err(ApiError::no_endpoint(req)),
    }
}

async fn status(admin: &Admin, thread: Option<String>) -> Result<Reply, ApiError> {
    if thread.as_deref() == Some("") {
        return Err(ApiError::bad_request(
            "invalid-thread",
            "`thread` must name a thread (or be left out for every thread)",
        ));
    }
    let thread_asked = thread.clone();
    let candidates = admin
        .retry("retry-admin.status", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_retry_admin()
                    .call_status(store, thread.as_ref())
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    let candidates = checked_candidates(admin, thread_asked.as_deref(), candidates);
    let candidates: Vec<CandidateView> = candidates.into_iter().map(candidate_view).collect();
    Reply::ok(serde_json::json!({ "candidates": candidates }))
}

async fn explain(admin: &Admin, thread: &str) -> Result<Reply, ApiError> {
    let target = thread.to_owned();
    let chains = admin
        .retry("retry-admin.explain", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_retry_admin()
                    .call_explain(store, &target)
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    let (chains, foreign): (Vec<ChainHistory>, Vec<ChainHistory>) =
        chains.into_iter().partition(|c| c.thread == thread);
    if !foreign.is_empty() {
        warn_foreign("retry-admin.explain", thread, foreign.len());
    }
    let chains: Vec<ChainView> = chains.into_iter().map(chain_view).collect();
    Reply::ok(serde_json::json!({ "thread": thread, "chains": chains }))
}

async fn cancel(admin: &Admin, thread: &str) -> Result<Reply, ApiError> {
    let target = thread.to_owned();
    let now = admin.host().clock().now_ms();
    let cancelled = admin
        .retry("retry-admin.cancel", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_retry_admin()
                    .call_cancel(store, &target, now)
                    .await
            })
        })
        .await?
        .map_err(refused)?;
    if cancelled.thread != thread {
        warn_foreign("retry-admin.cancel", thread, 1);
        return Err(ApiError::internal(
            "plugin-answer",
            format!(
                "the retry plugin answered the cancel of thread {thread} with a candidate of thread {}; \
                 `pooler retry status --thread {thread}` shows what is pending",
                cancelled.thread
            ),
        ));
    }
    let cancelled = checked_candidates(admin, Some(thread), vec![cancelled]);
    Reply::ok(serde_json::json!({ "cancelled": cancelled.into_iter().next().map(candidate_view) }))
}

/// A plugin's answer named threads other than the one asked about: dropped, with a warning
/// naming the plugin and the rule.
fn warn_foreign(call: &str, thread: &str, count: usize) {
    tracing::warn!(
        plugin = crate::runtime::roles::Role::ProviderRetry.name(),
        call,
        thread,
        count,
        rule = "an answer about a thread names only that thread",
        "retry plugin answered about other threads; left out"
    );
}

/// The candidates as the host shows them: when one thread was asked about, only that
/// thread's; and a row id only when it is not a live row of another thread in the core
/// (a plugin cannot make `pooler retry status` point a person at another chain's row).
fn checked_candidates(admin: &Admin, asked: Option<&str>, candidates: Vec<Candidate>) -> Vec<Candidate> {
    let (mut kept, foreign): (Vec<Candidate>, Vec<Candidate>) = candidates
        .into_iter()
        .partition(|c| asked.is_none_or(|t| c.thread == t));
    if let Some(thread) = asked
        && !foreign.is_empty()
    {
        warn_foreign("retry-admin.status", thread, foreign.len());
    }
    let Some(core) = admin.core() else { return kept };
    if kept.iter().all(|c| c.row.is_none()) {
        return kept;
    }
    let Ok(rows) = core.core().list_rows(None) else { return kept };
    let owner: std::collections::HashMap<u64, &str> =
        rows.iter().map(|r| (r.id, r.thread.as_str())).collect();
    for c in &mut kept {
        if let Some(row) = c.row
            && owner.get(&row).is_some_and(|t| *t != c.thread)
        {
            tracing::warn!(
                plugin = crate::runtime::roles::Role::ProviderRetry.name(),
                thread = %c.thread,
                row,
                rule = "a candidate's row is a row of its own thread",
                "retry plugin named another thread's row; row left out"
            );
            c.row = None;
            c.send_at = None;
        }
    }
    kept
}

/// What the plugin's `admin-error` means for a person, with its HTTP status.
pub(super) fn refused(e: AdminError) -> ApiError {
    match e {
        AdminError::NothingPending(t) => {
            ApiError::not_found("nothing-pending", format!("thread {t} has nothing pending"))
        }
        AdminError::UnknownThread(t) => ApiError::not_found(
            "unknown-thread",
            format!(
                "thread {t} has nothing pending: the retry plugin has no record of it \
                 (none of its turns failed in a way it was asked about)"
            ),
        ),
        AdminError::Dependency(why) => ApiError::unavailable(
            "dependency",
            format!("the retry plugin could not reach what it needs ({why}); try again"),
        ),
        AdminError::Storage(why) => ApiError::unavailable(
            "storage",
            format!("the retry plugin's database failed ({why}); try again"),
        ),
    }
}

#[cfg(test)]
mod tests {
    //! The router without the plugin (its paths, methods and the 503 of a missing plugin)
    //! and the mapping of the WIT data and errors. With the real plugin the area is driven
    //! end to end by `host/tests/all/cli_retry.rs`.

    use hyper::StatusCode;
    use serde_json::Value;

    use super::*;
    use crate::operate::admin::tests::{TOKEN, admin};

    async fn call(admin: &Admin, method: &str, path: &str) -> (StatusCode, Value) {
        crate::operate::admin::tests::call(admin, method, path, Some(TOKEN), "").await
    }

    fn code(body: &Value) -> &str {
        body["error"]["code"].as_str().unwrap()
    }

    #[tokio::test]
    async fn each_endpoint_reaches_the_plugin_and_a_missing_one_is_503() {
        let (_dir, admin) = admin();
        for (method, path) in [
            ("GET", "/_pooler/retry/status"),
            ("GET", "/_pooler/retry/status?thread=th_1"),
            ("GET", "/_pooler/retry/explain/th_1"),
            ("GET", "/_pooler/retry/explain/th%2F1"),
            ("POST", "/_pooler/retry/cancel/th_1"),
        ] {
            let (status, body) = call(&admin, method, path).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{method} {path}");
            assert_eq!(code(&body), "plugin-unavailable", "{method} {path}");
        }
    }

    #[tokio::test]
    async fn other_paths_and_methods_are_404_naming_them() {
        let (_dir, admin) = admin();
        for (method, path) in [
            ("POST", "/_pooler/retry/status"),
            ("GET", "/_pooler/retry"),
            ("GET", "/_pooler/retry/explain"),
            ("GET", "/_pooler/retry/cancel/th_1"),
            ("DELETE", "/_pooler/retry/cancel/th_1"),
            ("POST", "/_pooler/retry/cancel"),
            ("GET", "/_pooler/retry/explain/th_1/more"),
            ("GET", "/_pooler/retry/unknown"),
        ] {
            let (status, body) = call(&admin, method, path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_eq!(code(&body), "no-such-endpoint", "{method} {path}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("{method} /_pooler/retry")),
                "{body}"
            );
        }
    }

    #[tokio::test]
    async fn an_empty_thread_filter_is_refused() {
        let (_dir, admin) = admin();
        let (status, body) = call(&admin, "GET", "/_pooler/retry/status?thread=").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(code(&body), "invalid-thread");
    }

    #[tokio::test]
    async fn the_core_keeps_send_now_and_opt_out_under_threads() {
        // Those are the core's (`admin/core.rs`), answered 503 here without a core; the
        // retry area does not shadow them.
        let (_dir, admin) = admin();
        for (method, path) in [
            ("POST", "/_pooler/threads/th_1/send-now"),
            ("PUT", "/_pooler/threads/th_1/opt-out"),
        ] {
            let (status, body) = call(&admin, method, path).await;
            assert_ne!(code(&body), "no-such-endpoint", "{method} {path}: {body}");
            assert_ne!(status, StatusCode::OK);
        }
    }

    #[test]
    fn every_admin_error_becomes_a_clear_api_error() {
        let e = refused(AdminError::NothingPending("th_1".into()));
        assert_eq!(
            (e.status, e.code, e.message.as_str()),
            (
                StatusCode::NOT_FOUND,
                "nothing-pending",
                "thread th_1 has nothing pending"
            )
        );
        let e = refused(AdminError::UnknownThread("th_2".into()));
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, "unknown-thread"));
        assert!(
            e.message.starts_with("thread th_2 has nothing pending"),
            "{}",
            e.message
        );
        let e = refused(AdminError::Dependency("queue closed".into()));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::SERVICE_UNAVAILABLE, "dependency")
        );
        assert!(e.message.contains("queue closed") && e.message.contains("try again"));
        let e = refused(AdminError::Storage("disk I/O error".into()));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::SERVICE_UNAVAILABLE, "storage")
        );
        assert!(e.message.contains("disk I/O error") && e.message.contains("try again"));
    }
}
