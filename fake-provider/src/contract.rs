//! The provider contracts the strict fake upstream enforces, and replies shaped like the real
//! services' answers. A fake that accepts anything proves nothing about the service it
//! stands for: every integration test that forwards upstream runs against these rules, so a
//! pool that sends a credential in the wrong shape, or without what the service requires,
//! gets the refusal the real service would give — and the test sees it.
//!
//! Each rule says where it comes from:
//! - **observed**: seen from the real service or the real CLIs (`shared/reference/real-clients.md`
//!   and the issue that introduced the rule);
//! - **documented**: stated by the provider's public API documentation;
//! - **assumed**: not confirmed; the fake's best reading of the service. Such a rule may be
//!   stricter or looser than the real one.
//!
//! | contract | rule | source |
//! |---|---|---|
//! | Claude | `anthropic-version` is required (400 `invalid_request_error`) | documented |
//! | Claude | `x-api-key` must be an API key (`sk-ant-api…`), else 401 `invalid x-api-key` | documented (shape), assumed (prefix test) |
//! | Claude | a Bearer token must be an OAuth access token (`sk-ant-oat…`) *and* come with `anthropic-beta: …oauth-2025-04-20…`, else 401 "OAuth authentication is currently not supported." | observed |
//! | Claude | no credential: 401 `x-api-key header is required` | documented |
//! | Claude | `POST /v1/messages` needs a JSON body with `model`, `max_tokens` and `messages` (400) | documented |
//! | Claude usage (`/api/oauth/usage`) | Bearer OAuth access token with the OAuth beta (401) | assumed |
//! | Codex | `Authorization: Bearer <access token>` and `chatgpt-account-id` (a ChatGPT login), else 401 | observed (Codex CLI sends both); the 401 body is assumed |
//! | Codex | `POST …/responses` needs a JSON body with `stream: true` and `store: false` (400 `{"detail": …}`) | assumed (reported by users of the ChatGPT backend) |
//! | Codex usage (`…/wham/usage`) | Bearer and `chatgpt-account-id` (401) | assumed |
//! | token endpoint | `POST`, JSON `grant_type: refresh_token`, a non-empty `refresh_token` and a `client_id`, else 400 `invalid_request` | assumed (the shape Claude Code and Codex CLI send) |
//!
//! Billing refusals the fake can answer (not rules it enforces: a test scripts them), with
//! what is known of the real ones (`docs/extra-usage.md` has the sources):
//!
//! | contract | answer | source |
//! |---|---|---|
//! | Claude subscription | extra usage spent (or required and off): 400 `invalid_request_error` "You're out of extra usage. Add more at claude.ai/settings/usage and keep going." ([`claude::out_of_extra_usage`]) | observed (quoted in public issue reports); the headers sent with it are assumed |
//! | Claude subscription | a client the plan does not cover draws on extra usage: 400 `invalid_request_error` "Third-party apps now draw from your extra usage, not your plan limits. …" | observed (quoted in public issue reports) |
//! | Claude subscription | served within the plan, overage closed: `anthropic-ratelimit-unified-overage-status: rejected` with `…-overage-disabled-reason: out_of_credits` on a 200 | observed (quoted in public issue reports) |
//! | Claude API key | the organisation's prepaid credits spent: 400 `invalid_request_error` "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits." ([`claude::credit_balance_too_low`]) | observed (quoted in many public issue reports) |
//! | Claude | an error of type `billing_error`, as HTTP 402 | documented (the type: the API reference and the SDKs); the status assumed |
//! | Codex | plan window and credits spent: 429 `usage_limit_reached` with the window at 100 % and `x-codex-credits-has-credits: False`, `x-codex-credits-balance: 0` ([`codex::credits_spent`]) | observed (quoted in public issue reports) |
//!
//! The replies below follow the real answers: Claude's error envelope
//! `{"type":"error","error":{"type":…,"message":…}}`, its unified rate-limit headers, 529
//! `overloaded_error`, the Messages stream (`message_start` … `message_stop`) and an `error`
//! event in the middle of a stream; Codex's `x-codex-primary-*` headers, its usage-limit 429
//! body and the Responses stream.

use serde_json::{Value, json};

use crate::server::{Received, Reply};

/// Which service a strict fake upstream stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// The providers' APIs, told apart by path: the ChatGPT Codex backend under
    /// `/backend-api/` (`…/codex/responses`, `…/wham/usage`), the Anthropic Messages API
    /// (and Claude's OAuth usage endpoint) everywhere else. One fake can then stand behind
    /// both of the pool's upstream URLs.
    Api,
    /// An OAuth token endpoint (refresh grants).
    TokenEndpoint,
}

/// The beta the Messages API requires with an OAuth access token.
pub const OAUTH_BETA: &str = "oauth-2025-04-20";

/// The refusal the real service would give `request`, or `None` when it would serve it.
pub fn refusal(contract: Contract, request: &Received) -> Option<Reply> {
    match contract {
        Contract::Api if request.path.starts_with("/backend-api/") => codex_refusal(request),
        Contract::Api => claude_refusal(request),
        Contract::TokenEndpoint => token_refusal(request),
    }
}

fn bearer(request: &Received) -> Option<&str> {
    request
        .header("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn has_oauth_beta(request: &Received) -> bool {
    request
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("anthropic-beta"))
        .flat_map(|(_, v)| v.split(','))
        .any(|b| b.trim() == OAUTH_BETA)
}

fn json_body(request: &Received) -> Option<Value> {
    serde_json::from_slice(&request.body).ok()
}

fn claude_refusal(request: &Received) -> Option<Reply> {
    let path = request.path.split('?').next().unwrap_or_default();
    if path == "/api/oauth/usage" {
        return match bearer(request) {
            Some(t) if t.starts_with("sk-ant-oat") && has_oauth_beta(request) => None,
            _ => Some(claude::error(
                401,
                "authentication_error",
                "OAuth authentication is currently not supported.",
            )),
        };
    }
    if request.header("anthropic-version").is_none() {
        return Some(claude::error(
            400,
            "invalid_request_error",
            "anthropic-version: header is required",
        ));
    }
    let credential_refusal = match (request.header("x-api-key"), bearer(request)) {
        (Some(key), _) if !key.starts_with("sk-ant-api") => Some("invalid x-api-key"),
        (Some(_), _) => None,
        (None, Some(token)) if token.starts_with("sk-ant-oat") && has_oauth_beta(request) => None,
        (None, Some(_)) => Some("OAuth authentication is currently not supported."),
        (None, None) => Some("x-api-key header is required"),
    };
    if let Some(message) = credential_refusal {
        return Some(claude::error(401, "authentication_error", message));
    }
    if request.method == "POST" && path == "/v1/messages" {
        let Some(body) = json_body(request) else {
            return Some(claude::error(
                400,
                "invalid_request_error",
                "The request body is not valid JSON.",
            ));
        };
        let field = |name: &str| body.get(name).cloned();
        let missing = match (field("model"), field("max_tokens"), field("messages")) {
            (None, _, _) => Some("model: Field required"),
            (_, None, _) => Some("max_tokens: Field required"),
            (_, _, Some(Value::Array(_))) => None,
            _ => Some("messages: Field required"),
        };
        if let Some(message) = missing {
            return Some(claude::error(400, "invalid_request_error", message));
        }
    }
    None
}

fn codex_refusal(request: &Received) -> Option<Reply> {
    let path = request.path.split('?').next().unwrap_or_default();
    if bearer(request).is_none() || request.header("chatgpt-account-id").is_none() {
        return Some(
            Reply::status(401)
                .header("content-type", "application/json")
                .body(
                    json!({"error": {"message": "Missing bearer or ChatGPT account id.",
                                     "type": "invalid_request_error", "code": "unauthorized"}})
                    .to_string(),
                ),
        );
    }
    if request.method == "POST" && path.ends_with("/responses") {
        let body = json_body(request).unwrap_or(Value::Null);
        let detail = if body.get("stream") != Some(&Value::Bool(true)) {
            Some("Stream must be set to true")
        } else if body.get("store") != Some(&Value::Bool(false)) {
            Some("Store must be set to false")
        } else {
            None
        };
        if let Some(detail) = detail {
            return Some(
                Reply::status(400)
                    .header("content-type", "application/json")
                    .body(json!({ "detail": detail }).to_string()),
            );
        }
    }
    None
}

fn token_refusal(request: &Received) -> Option<Reply> {
    let body = json_body(request).unwrap_or(Value::Null);
    let text = |name: &str| body.get(name).and_then(Value::as_str).unwrap_or_default();
    let refused = request.method != "POST"
        || text("grant_type") != "refresh_token"
        || text("refresh_token").is_empty()
        || text("client_id").is_empty();
    refused.then(|| {
        Reply::status(400)
            .header("content-type", "application/json")
            .body(
                json!({"error": "invalid_request",
                       "error_description": "a refresh grant needs grant_type, refresh_token and client_id"})
                .to_string(),
            )
    })
}

/// The token usage an answer reports, in the pool's terms: `input` is the input neither
/// read from nor written to the prompt cache. Each API's replies state it in its own shape
/// ([`claude::message_with`], [`codex::response_with`], and their whole-body forms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

/// The usage [`claude::message`] and [`codex::response`] report: 10 fresh input tokens, 5
/// output tokens, nothing cached.
pub const USAGE: Usage = Usage {
    input: 10,
    output: 5,
    cache_read: 0,
    cache_write: 0,
};

/// A stand-in for a provider's prompt cache, which is per account: a conversation's
/// prompt is written to the cache of the account that first answers it and read from that
/// cache on its later requests there; on another account it is written again. A
/// conversation is its session id (Claude Code's `x-claude-code-session-id`, Codex's
/// `session-id`), an account its credential.
#[derive(Debug, Default)]
pub struct PromptCache {
    seen: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

impl PromptCache {
    /// The usage of an answer to `request` whose prompt is `prompt` tokens (all cached
    /// but the `fresh` last ones) and whose output is `output` tokens; the prompt is in
    /// the account's cache afterwards.
    pub fn usage(&self, request: &Received, prompt: u64, fresh: u64, output: u64) -> Usage {
        let account = request
            .header("x-api-key")
            .or_else(|| request.header("authorization"))
            .unwrap_or_default()
            .to_owned();
        let session = request
            .header("x-claude-code-session-id")
            .or_else(|| request.header("session-id"))
            .unwrap_or_default()
            .to_owned();
        let cached = prompt.saturating_sub(fresh);
        let first = self.seen.lock().unwrap().insert((account, session));
        Usage {
            input: fresh,
            output,
            cache_read: if first { 0 } else { cached },
            cache_write: if first { cached } else { 0 },
        }
    }
}

/// Replies shaped like the Anthropic Messages API's.
pub mod claude {
    use super::*;

    /// An error in the API's envelope, e.g. `(529, "overloaded_error", "Overloaded")`.
    pub fn error(status: u16, kind: &str, message: &str) -> Reply {
        Reply::status(status)
            .header("content-type", "application/json")
            .header("request-id", "req_fake")
            .body(json!({"type": "error", "error": {"type": kind, "message": message}}).to_string())
    }

    /// A subscription whose extra usage is spent (or required and not turned on): the 400
    /// the Messages API answers, with the overage closed in its headers (the headers are
    /// assumed).
    pub fn out_of_extra_usage() -> Reply {
        error(
            400,
            "invalid_request_error",
            "You're out of extra usage. Add more at claude.ai/settings/usage and keep going.",
        )
        .header("anthropic-ratelimit-unified-overage-status", "rejected")
        .header(
            "anthropic-ratelimit-unified-overage-disabled-reason",
            "out_of_credits",
        )
    }

    /// An API organisation whose prepaid credits are spent.
    pub fn credit_balance_too_low() -> Reply {
        error(
            400,
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
        )
    }

    /// 529 `overloaded_error`, as the API answers when it is overloaded.
    pub fn overloaded() -> Reply {
        error(529, "overloaded_error", "Overloaded")
    }

    /// A subscription's rate limit: 429 `rate_limit_error` with the unified headers of a
    /// rejected 5-hour window resetting at `reset_ms` (epoch ms, sent in seconds) and a
    /// `Retry-After` to match (from `now_ms`).
    pub fn rate_limited(reset_ms: u64, now_ms: u64) -> Reply {
        let mut reply = error(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your rate limit.",
        );
        for (name, value) in unified_headers("rejected", 1.0, reset_ms) {
            reply = reply.header(&name, &value);
        }
        reply.header(
            "retry-after",
            &reset_ms
                .saturating_sub(now_ms)
                .div_ceil(1000)
                .max(1)
                .to_string(),
        )
    }

    /// The unified rate-limit headers of a subscription whose 5-hour window has `status`
    /// (`allowed`, `allowed_warning`, `rejected`) at `utilization`, resetting at `reset_ms`.
    pub fn unified_headers(status: &str, utilization: f64, reset_ms: u64) -> Vec<(String, String)> {
        let reset = (reset_ms / 1000).to_string();
        let p = "anthropic-ratelimit-unified-";
        vec![
            (format!("{p}status"), status.to_owned()),
            (format!("{p}5h-status"), status.to_owned()),
            (format!("{p}5h-utilization"), utilization.to_string()),
            (format!("{p}5h-reset"), reset.clone()),
            (format!("{p}reset"), reset),
            (format!("{p}representative-claim"), "five_hour".to_owned()),
        ]
    }

    fn start(reply: Reply, model: &str) -> Reply {
        start_with(reply, model, USAGE)
    }

    /// `message_start` reports the input and cache counts and one output token; the
    /// final output count comes with `message_delta` (as the API streams it).
    fn start_with(reply: Reply, model: &str, usage: Usage) -> Reply {
        let start = json!({"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": usage.input, "output_tokens": 1,
                      "cache_creation_input_tokens": usage.cache_write,
                      "cache_read_input_tokens": usage.cache_read}}});
        reply.event("message_start", &start.to_string()).event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        )
    }

    fn delta(reply: Reply, text: &str) -> Reply {
        let delta = json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": text}});
        reply.event("content_block_delta", &delta.to_string())
    }

    /// A complete streamed answer with `text` (`stop_reason: end_turn`), reporting
    /// [`USAGE`].
    pub fn message(text: &str) -> Reply {
        message_with(text, USAGE)
    }

    /// A complete streamed answer with `text` reporting `usage`.
    pub fn message_with(text: &str, usage: Usage) -> Reply {
        let reply = delta(start_with(Reply::sse(), "claude-sonnet-4-5", usage), text);
        let end = json!({"type": "message_delta",
                         "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                         "usage": {"output_tokens": usage.output}});
        reply
            .event(
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            )
            .event("message_delta", &end.to_string())
            .event("message_stop", r#"{"type":"message_stop"}"#)
    }

    /// A whole (non-streamed) answer with `text` reporting `usage`.
    pub fn message_body(text: &str, usage: Usage) -> Reply {
        Reply::status(200)
            .header("content-type", "application/json")
            .header("request-id", "req_fake")
            .body(
                json!({"id": "msg_fake", "type": "message", "role": "assistant",
                       "model": "claude-sonnet-4-5",
                       "content": [{"type": "text", "text": text}],
                       "stop_reason": "end_turn", "stop_sequence": null,
                       "usage": {"input_tokens": usage.input, "output_tokens": usage.output,
                                 "cache_creation_input_tokens": usage.cache_write,
                                 "cache_read_input_tokens": usage.cache_read}})
                .to_string(),
            )
    }

    /// A stream that starts answering with `text` and then fails with an `error` event of
    /// `kind` (e.g. `overloaded_error`), as the API does when it fails mid-answer.
    pub fn stream_error(text: &str, kind: &str) -> Reply {
        let error = json!({"type": "error", "error": {"type": kind, "message": "Overloaded"}});
        delta(start(Reply::sse(), "claude-sonnet-4-5"), text).event("error", &error.to_string())
    }

    /// A streamed request the API accepted (200) and failed before its first event: the
    /// stream's only event is an `error` of `kind` (`overloaded_error`, `rate_limit_error`)
    /// in place of `message_start`. The shape is the Messages API streaming documentation's
    /// ("error events": `event: error`, `{"type":"error","error":{"type":"overloaded_error",
    /// "message":"Overloaded"}}`, what a non-streamed request gets as a 529); a
    /// `rate_limit_error` there follows the same envelope. Add the head's rate-limit headers
    /// with [`Reply::header`].
    pub fn failed_stream(kind: &str, message: &str) -> Reply {
        let error = json!({"type": "error", "error": {"type": kind, "message": message}});
        Reply::sse()
            .header("request-id", "req_fake")
            .event("error", &error.to_string())
    }
}

/// Replies shaped like the ChatGPT Codex backend's.
pub mod codex {
    use super::*;

    /// The `x-codex-primary-*` headers of a window `used_percent` full, resetting in
    /// `reset_after_s` seconds.
    pub fn primary_headers(
        used_percent: f64,
        window_minutes: u64,
        reset_after_s: u64,
    ) -> Vec<(String, String)> {
        vec![
            (
                "x-codex-primary-used-percent".into(),
                used_percent.to_string(),
            ),
            (
                "x-codex-primary-window-minutes".into(),
                window_minutes.to_string(),
            ),
            (
                "x-codex-primary-reset-after-seconds".into(),
                reset_after_s.to_string(),
            ),
        ]
    }

    /// The usage-limit 429: `usage_limit_reached` with `resets_in_seconds`, and the primary
    /// window full.
    pub fn usage_limit(resets_in_s: u64) -> Reply {
        let mut reply = Reply::status(429).header("content-type", "application/json");
        for (name, value) in primary_headers(100.0, 300, resets_in_s) {
            reply = reply.header(&name, &value);
        }
        reply.body(
            json!({"error": {"type": "usage_limit_reached",
                             "message": "The usage limit has been reached",
                             "plan_type": "plus", "resets_in_seconds": resets_in_s}})
            .to_string(),
        )
    }

    /// A Responses stream that announces its response and then fails with `code`
    /// (`rate_limit_exceeded`, `server_is_overloaded`): `response.created`,
    /// `response.in_progress`, then `response.failed` carrying `response.error`. The shape
    /// is the one the Codex CLI's SSE tests keep as received from the service (a
    /// `rate_limit_exceeded` at sequence number 3, `codex-rs/codex-api/src/sse/responses.rs`).
    pub fn failed_response(code: &str, message: &str) -> Reply {
        let response =
            |status: &str| json!({"id": "resp_fake", "object": "response", "status": status});
        let mut failed = response("failed");
        failed["error"] = json!({"code": code, "message": message});
        Reply::sse()
            .event(
                "response.created",
                &json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress")}).to_string(),
            )
            .event(
                "response.in_progress",
                &json!({"type": "response.in_progress", "sequence_number": 1, "response": response("in_progress")}).to_string(),
            )
            .event(
                "response.failed",
                &json!({"type": "response.failed", "sequence_number": 2, "response": failed}).to_string(),
            )
    }

    /// The usage-limit 429 of a plan whose window and credits are both spent.
    pub fn credits_spent(resets_in_s: u64) -> Reply {
        usage_limit(resets_in_s)
            .header("x-codex-credits-has-credits", "False")
            .header("x-codex-credits-balance", "0")
            .header("x-codex-credits-unlimited", "False")
    }

    /// The Responses API's `usage`: its `input_tokens` count the cached ones too (a
    /// prompt cache write is not reported, so `usage.cache_write` must be 0).
    fn usage_json(usage: Usage) -> Value {
        let input = usage.input + usage.cache_read;
        json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": usage.cache_read},
               "output_tokens": usage.output, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": input + usage.output})
    }

    fn response_object(text: &str, usage: Usage) -> Value {
        json!({"id": "resp_fake", "object": "response", "status": "completed",
               "model": "gpt-5-codex",
               "output": [{"type": "message", "id": "msg_fake", "role": "assistant",
                           "status": "completed",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]}],
               "usage": usage_json(usage)})
    }

    /// A whole (non-streamed) Responses answer with `text` reporting `usage`.
    pub fn response_body(text: &str, usage: Usage) -> Reply {
        Reply::status(200)
            .header("content-type", "application/json")
            .body(response_object(text, usage).to_string())
    }

    /// A complete Responses stream answering `text`, reporting [`USAGE`].
    pub fn response(text: &str) -> Reply {
        response_with(text, USAGE)
    }

    /// A complete Responses stream answering `text`, reporting `usage` in its
    /// `response.completed`.
    pub fn response_with(text: &str, usage: Usage) -> Reply {
        let item = json!({"type": "message", "id": "msg_fake", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]});
        Reply::sse()
            .event(
                "response.created",
                &json!({"type": "response.created", "response": {"id": "resp_fake"}}).to_string(),
            )
            .event(
                "response.output_item.added",
                &json!({"type": "response.output_item.added", "output_index": 0,
                        "item": {"type": "message", "id": "msg_fake", "role": "assistant", "status": "in_progress", "content": []}})
                .to_string(),
            )
            .event(
                "response.output_text.delta",
                &json!({"type": "response.output_text.delta", "item_id": "msg_fake", "output_index": 0,
                        "content_index": 0, "delta": text})
                .to_string(),
            )
            .event(
                "response.output_item.done",
                &json!({"type": "response.output_item.done", "output_index": 0, "item": item}).to_string(),
            )
            .event(
                "response.completed",
                &json!({"type": "response.completed", "response": response_object(text, usage)})
                    .to_string(),
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, path: &str, headers: &[(&str, &str)], body: Value) -> Received {
        Received {
            method: method.into(),
            path: path.into(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.to_string().into(),
        }
    }

    fn messages() -> Value {
        json!({"model": "m", "max_tokens": 1, "messages": []})
    }

    fn status(reply: Option<Reply>) -> Option<u16> {
        reply.map(|r| r.status_code())
    }

    #[test]
    fn claude_refuses_what_the_messages_api_refuses() {
        let v = ("anthropic-version", "2023-06-01");
        let key = ("x-api-key", "sk-ant-api03-x");
        let oat = ("authorization", "Bearer sk-ant-oat01-x");
        let beta = ("anthropic-beta", "claude-code-20250219, oauth-2025-04-20");
        type Headers<'a> = &'a [(&'a str, &'a str)];
        let table: [(Headers<'_>, Option<u16>); 8] = [
            (&[v, key], None),
            (&[key], Some(400)),
            (&[v, ("x-api-key", "key-a")], Some(401)),
            (&[v, oat, beta], None),
            (&[v, oat], Some(401)),
            (
                &[v, ("authorization", "Bearer sk-ant-api03-x"), beta],
                Some(401),
            ),
            (&[v], Some(401)),
            (
                &[v, oat, ("anthropic-beta", "claude-code-20250219")],
                Some(401),
            ),
        ];
        for (headers, want) in table {
            let r = request("POST", "/v1/messages?beta=true", headers, messages());
            assert_eq!(status(refusal(Contract::Api, &r)), want, "{headers:?}");
        }
        let no_tokens = request(
            "POST",
            "/v1/messages",
            &[v, key],
            json!({"model": "m", "messages": []}),
        );
        assert_eq!(status(refusal(Contract::Api, &no_tokens)), Some(400));
        let count = request(
            "POST",
            "/v1/messages/count_tokens",
            &[v, key],
            json!({"model": "m", "messages": []}),
        );
        assert_eq!(status(refusal(Contract::Api, &count)), None);
        let usage = request("GET", "/api/oauth/usage", &[oat], Value::Null);
        assert_eq!(status(refusal(Contract::Api, &usage)), Some(401));
        let usage = request("GET", "/api/oauth/usage", &[oat, beta], Value::Null);
        assert_eq!(status(refusal(Contract::Api, &usage)), None);
    }

    #[test]
    fn codex_needs_a_bearer_and_the_account_id_and_a_streamed_unstored_request() {
        let bearer = ("authorization", "Bearer tok");
        let acct = ("chatgpt-account-id", "acct");
        let ok = json!({"stream": true, "store": false});
        let path = "/backend-api/codex/responses";
        assert_eq!(
            status(refusal(
                Contract::Api,
                &request("POST", path, &[bearer, acct], ok.clone())
            )),
            None
        );
        assert_eq!(
            status(refusal(
                Contract::Api,
                &request("POST", path, &[bearer], ok.clone())
            )),
            Some(401)
        );
        assert_eq!(
            status(refusal(Contract::Api, &request("POST", path, &[acct], ok))),
            Some(401)
        );
        let stored = json!({"stream": true, "store": true});
        assert_eq!(
            status(refusal(
                Contract::Api,
                &request("POST", path, &[bearer, acct], stored)
            )),
            Some(400)
        );
        assert_eq!(
            status(refusal(
                Contract::Api,
                &request(
                    "GET",
                    "/backend-api/wham/usage",
                    &[bearer, acct],
                    Value::Null
                )
            )),
            None
        );
    }

    #[test]
    fn the_token_endpoint_takes_only_refresh_grants() {
        let grant = json!({"grant_type": "refresh_token", "refresh_token": "r", "client_id": "c"});
        assert_eq!(
            status(refusal(
                Contract::TokenEndpoint,
                &request("POST", "/oauth/token", &[], grant.clone())
            )),
            None
        );
        assert_eq!(
            status(refusal(
                Contract::TokenEndpoint,
                &request("GET", "/oauth/token", &[], grant)
            )),
            Some(400)
        );
        let no_client = json!({"grant_type": "refresh_token", "refresh_token": "r"});
        assert_eq!(
            status(refusal(
                Contract::TokenEndpoint,
                &request("POST", "/oauth/token", &[], no_client)
            )),
            Some(400)
        );
    }
}
