//! `/_pooler/threads…`: the core's threads, their turns and retry rows, for `pooler thread …`
//! and `pooler retry send-now|opt-out`. Answered by the host's core
//! ([`crate::mediation::core_link::CoreLink`], wired in by `Server::with_core`); 503 when
//! the server runs without one.
//!
//! | method and path                   | body                        | answer |
//! |-----------------------------------|-----------------------------|--------|
//! | `POST /threads`                   | `{text, provider?, model?, agent?, cwd?, args?}` | 201 `{"thread": view, "request": id}` |
//! | `GET /threads`                    |                             | `{"threads": [view]}` |
//! | `GET /threads/{id}`               |                             | `{"thread": view, "turns", "rows", "history", "tokens"}` |
//! | `POST /threads/{id}/messages`     | `{text}`                    | 201 `{"thread": id, "request": id}` |
//! | `POST /threads/{id}/cancel`       |                             | `{"thread": id, "cancelled": true}`; 404 `not-running` |
//! | `POST /threads/{id}/archive`      |                             | `{"thread": id, "archived": true}` |
//! | `POST /threads/{id}/send-now`     |                             | `{"sent": {thread, row, request, attempt, plugin_told}}` |
//! | `PUT /threads/{id}/opt-out`       |                             | `{"thread": id, "retry_opt_out": true}` |
//! | `DELETE /threads/{id}/opt-out`    |                             | `{"thread": id, "retry_opt_out": false}` |
//!
//! A thread view is the core's `thread-info` plus `session_id`, `created_at`, `agent`
//! (`http`, `claude-code`, `codex`), `agent_session` and `cwd`; turns carry
//! their attempt number, chain, trigger (`user`, `retry`, `send-now`) and outcome with the
//! classified failure; rows are the live retry rows with their send times; `tokens` is the
//! pool's count of the thread's tokens per account and model (`tokens.totals`, null when
//! the pool cannot say). The route token
//! is never part of an answer.

use std::sync::Arc;

use serde_json::Value;

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::mediation::core_link::{CoreLink, LinkError};
use crate::operate::wire::ProviderName;
use pooler_core::{Agent, AgentSpec, CoreError, Provider};

/// The core's records serialise their fields in WIT spelling (`retry-opt-out`); the admin
/// API's convention is `snake_case` field names, with enum values left as WIT case names.
fn snake_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k.replace('-', "_"), snake_keys(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(snake_keys).collect()),
        other => other,
    }
}

fn json(value: impl serde::Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(value)
        .map(snake_keys)
        .map_err(|e| ApiError::internal("encoding", e.to_string()))
}

/// What a refusal of the core means for a person.
fn refused(e: LinkError) -> ApiError {
    match e {
        LinkError::Unavailable(why) => ApiError::unavailable("unavailable", why),
        LinkError::Core(e) => match e {
            CoreError::NoSuchThread(t) => {
                ApiError::not_found("no-such-thread", format!("no thread `{t}`"))
            }
            CoreError::Archived => ApiError::bad_request("archived", "the thread is archived"),
            CoreError::ThreadBusy(t) => ApiError::bad_request(
                "thread-busy",
                format!("thread `{t}` is running a turn; try again when it ends"),
            ),
            CoreError::NoPendingRetry(t) => ApiError::not_found(
                "nothing-pending",
                format!("thread `{t}` has no queued retry to send"),
            ),
            CoreError::InvalidArgument(why) => ApiError::bad_request("invalid-argument", why),
            CoreError::Storage(why) => ApiError::unavailable(
                "storage",
                format!("the core's database failed ({why}); try again"),
            ),
            e @ (CoreError::NoSuchRequest(_)
            | CoreError::NoSuchRow(_)
            | CoreError::ClaimLost(_)
            | CoreError::NotRunning(_)) => ApiError::internal("core", e.to_string()),
        },
    }
}

fn link(admin: &Admin) -> Result<Arc<CoreLink>, ApiError> {
    admin.core().cloned().ok_or_else(|| {
        ApiError::unavailable("no-core", "this host runs without a core: no threads")
    })
}

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let link = link(admin)?;
    match (req.method(), req.rest().as_slice()) {
        ("POST", []) => {
            let mut fields = req.fields()?;
            let text = fields.str("text")?;
            let provider = fields.opt_provider("provider")?;
            let model = fields.opt_str("model")?;
            let agent = match fields.opt_str("agent")? {
                None => Agent::Http,
                Some(name) => Agent::parse(&name).ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid-argument",
                        format!("unknown agent `{name}` (known: http, claude-code, codex)"),
                    )
                })?,
            };
            let cwd = fields.opt_str("cwd")?;
            let args = fields.opt_strings("args")?;
            fields.finish()?;
            // An agent CLI talks to one provider; it is the default.
            let provider = match provider.map(ProviderName::from) {
                Some(ProviderName::Codex) => Provider::Codex,
                Some(ProviderName::Claude) => Provider::Claude,
                None => agent.provider().unwrap_or(Provider::Claude),
            };
            if text.trim().is_empty() {
                return Err(ApiError::bad_request(
                    "invalid-argument",
                    "`text` must not be empty",
                ));
            }
            let spec = AgentSpec { agent, cwd, args };
            let thread = link
                .new_agent_thread(provider, model.as_deref(), &spec)
                .await
                .map_err(refused)?;
            let request = link.send(&thread, &text).map_err(refused)?;
            let view = link
                .core()
                .show(&thread)
                .map_err(|e| refused(e.into()))?
                .thread;
            Reply::created(serde_json::json!({ "thread": json(view)?, "request": request }))
        }
        ("GET", []) => {
            let threads = link.core().list_threads().map_err(|e| refused(e.into()))?;
            Reply::ok(serde_json::json!({ "threads": json(threads)? }))
        }
        ("GET", [thread]) => {
            let show = link.core().show(thread).map_err(|e| refused(e.into()))?;
            let mut answer = json(show)?;
            // The pool's count of the thread's tokens; null when it cannot say (no pool).
            let tokens = super::tokens::totals(admin, 0, Some((*thread).to_owned()), true)
                .await
                .ok();
            answer["tokens"] = serde_json::to_value(tokens).unwrap_or_default();
            Reply::ok(answer)
        }
        ("POST", [thread, "messages"]) => {
            let mut fields = req.fields()?;
            let text = fields.str("text")?;
            fields.finish()?;
            let request = link.send(thread, &text).map_err(refused)?;
            Reply::created(serde_json::json!({ "thread": thread, "request": request }))
        }
        ("POST", [thread, "cancel"]) => {
            if !link.cancel_turn(thread).map_err(refused)? {
                return Err(ApiError::not_found(
                    "not-running",
                    format!("thread `{thread}` is running no turn"),
                ));
            }
            Reply::ok(serde_json::json!({ "thread": thread, "cancelled": true }))
        }
        ("POST", [thread, "archive"]) => {
            link.archive(thread).await.map_err(refused)?;
            Reply::ok(serde_json::json!({ "thread": thread, "archived": true }))
        }
        ("POST", [thread, "send-now"]) => {
            let sent = link.send_now(thread).await.map_err(refused)?;
            Reply::ok(serde_json::json!({ "sent": json(sent)? }))
        }
        (method @ ("PUT" | "DELETE"), [thread, "opt-out"]) => {
            let opt_out = method == "PUT";
            link.set_opt_out(thread, opt_out).map_err(refused)?;
            Reply::ok(serde_json::json!({ "thread": thread, "retry_opt_out": opt_out }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_become_snake_case_and_values_stay() {
        let value = serde_json::json!({
            "retry-opt-out": true,
            "turns": [{"failure": {"http-status": 429, "category": "rate-limit"}}],
        });
        assert_eq!(
            snake_keys(value),
            serde_json::json!({
                "retry_opt_out": true,
                "turns": [{"failure": {"http_status": 429, "category": "rate-limit"}}],
            })
        );
    }
}
