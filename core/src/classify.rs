//! Failure classification: from what a provider (or the pool, or the network) answered, to
//! the failure description of spec §1 — category, provider code, HTTP status, origin and
//! retry-after. Pure functions, tested case by case.
//!
//! The rule that shaped this module is bug #4839: nothing known is dropped. The HTTP
//! status is kept whatever the category, the status inside a Codex error variant is kept,
//! an unmapped provider code is still reported, the `Retry-After` header (or a body reset
//! field) becomes an absolute deadline, and `x-pooler-origin: pool` tells the pool's own
//! answers from the provider's.

use pooler_plugin_kit::time::{RetryAfter, within_horizon};

use hyper::HeaderMap;
use serde_json::Value;

use crate::model::{Failure, FailureCategory as C, FailureOrigin, Timestamp};

/// The header the pool sets on every answer it makes itself.
pub const POOL_ORIGIN_HEADER: &str = "x-pooler-origin";

/// The longest message kept, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `pool` when the response carries `x-pooler-origin: pool`, else `provider`.
pub fn origin_of(headers: &HeaderMap) -> FailureOrigin {
    let pool = headers
        .get(POOL_ORIGIN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("pool"));
    if pool {
        FailureOrigin::Pool
    } else {
        FailureOrigin::Provider
    }
}

/// Parses a `Retry-After` value (the plugins' reading of it): delay seconds, rounded up to
/// a whole second, or an HTTP date. Returns the absolute deadline; None when unreadable or
/// further ahead than [`RESET_HORIZON_MS`](crate::ratelimit::RESET_HORIZON_MS) (a date in
/// year 9999 is no deadline to schedule a retry for).
pub fn parse_retry_after(value: &str, now: Timestamp) -> Option<Timestamp> {
    let at = match pooler_plugin_kit::time::parse_retry_after(value)? {
        // Whole seconds: a deadline a person reads and a due time the queue keeps.
        RetryAfter::Delay(ms) => now.saturating_add(ms.div_ceil(1000).saturating_mul(1000)),
        RetryAfter::At(at) => at,
    };
    within_horizon(at, now)
}

/// The deadline stated by the response: the `Retry-After` header, else `retry-after-ms`,
/// else a reset field of the error body; each within
/// [`RESET_HORIZON_MS`](crate::ratelimit::RESET_HORIZON_MS), else unknown.
pub fn retry_after(headers: &HeaderMap, body: Option<&Value>, now: Timestamp) -> Option<Timestamp> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(at) = header("retry-after").and_then(|v| parse_retry_after(v, now)) {
        return Some(at);
    }
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
        && let Some(at) = within_horizon(now.saturating_add(ms.ceil() as u64), now)
    {
        return Some(at);
    }
    body.and_then(|b| body_reset(b, now))
}

/// A reset stated in an error body: `resets_at` / `reset_at` (epoch seconds or
/// milliseconds), `resets_in_seconds` / `retry_after` (seconds from now), `retry_after_ms`.
/// Looked up in the `error` object first, then at the top level. A reset further ahead
/// than [`RESET_HORIZON_MS`](crate::ratelimit::RESET_HORIZON_MS) is unknown.
pub fn body_reset(body: &Value, now: Timestamp) -> Option<Timestamp> {
    stated_body_reset(body, now).and_then(|at| within_horizon(at, now))
}

fn stated_body_reset(body: &Value, now: Timestamp) -> Option<Timestamp> {
    let scopes = [body.get("error"), Some(body)];
    for scope in scopes.into_iter().flatten() {
        for key in ["resets_at", "reset_at"] {
            if let Some(at) = scope.get(key).and_then(number) {
                // Epoch seconds are ~1.8e9 today, milliseconds ~1.8e12.
                let ms = if at < 1e11 { at * 1000.0 } else { at };
                return Some(ms.ceil() as Timestamp);
            }
        }
        for key in ["resets_in_seconds", "retry_after"] {
            if let Some(s) = scope.get(key).and_then(number).filter(|s| *s >= 0.0) {
                return Some(now.saturating_add((s.ceil() as u64).saturating_mul(1000)));
            }
        }
        if let Some(ms) = scope
            .get("retry_after_ms")
            .and_then(number)
            .filter(|s| *s >= 0.0)
        {
            return Some(now.saturating_add(ms.ceil() as u64));
        }
    }
    None
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64().filter(|f| f.is_finite() && *f >= 0.0),
        Value::String(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0),
        _ => None,
    }
}

/// Truncates to [`MAX_MESSAGE_BYTES`] on a character boundary.
pub fn truncate_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

/// The category an HTTP status alone implies (the same for both providers).
pub fn category_for_status(status: u16) -> C {
    match status {
        529 => C::Overloaded,
        402 => C::Billing,
        401 | 403 => C::Unauthorized,
        429 => C::RateLimit,
        400..=499 => C::BadRequest,
        500..=599 => C::Internal,
        _ => C::Unknown,
    }
}

/// Claude's error codes: the Messages API `error.type` values and Claude Code's assistant
/// error codes. `None` for codes that say nothing more than the status (`unknown`) or that
/// are not known.
pub fn claude_category_for_code(code: &str) -> Option<C> {
    Some(match code {
        "overloaded_error" => C::Overloaded,
        "rate_limit_error" | "rate_limit" => C::RateLimit,
        "authentication_error"
        | "permission_error"
        | "authentication_failed"
        | "oauth_org_not_allowed" => C::Unauthorized,
        "billing_error" => C::Billing,
        "invalid_request_error"
        | "not_found_error"
        | "request_too_large"
        | "invalid_request"
        | "model_not_found" => C::BadRequest,
        "api_error" | "server_error" | "timeout_error" => C::Internal,
        "max_output_tokens" => C::MaxOutputTokens,
        _ => return None,
    })
}

/// Claude: 529 wins over everything (an overload whatever the body says), then the error
/// code, then the status.
pub fn claude_category(status: Option<u16>, code: Option<&str>) -> C {
    if status == Some(529) {
        return C::Overloaded;
    }
    if let Some(c) = code.and_then(claude_category_for_code) {
        return c;
    }
    status.map_or(C::Unknown, category_for_status)
}

/// OpenAI / Codex error codes (`error.code`, else `error.type`). The code wins over the
/// status: OpenAI answers 429 for `insufficient_quota`, which is billing, not a rate limit.
pub fn codex_category_for_code(code: &str) -> Option<C> {
    Some(match code {
        "rate_limit_exceeded" | "usage_limit_reached" | "rate_limit_error" => C::RateLimit,
        "insufficient_quota" | "usage_not_included" | "billing_hard_limit_reached" => C::Billing,
        "server_error" | "internal_error" | "api_error" => C::Internal,
        "server_is_overloaded" | "overloaded" | "slow_down" => C::Overloaded,
        "context_length_exceeded" => C::ContextWindowExceeded,
        "invalid_api_key" | "invalid_authentication" | "unauthorized" => C::Unauthorized,
        "invalid_request_error" | "invalid_prompt" | "model_not_found" => C::BadRequest,
        _ => return None,
    })
}

/// Codex's own error variants (`codexErrorInfo`), as a string (`"usageLimitExceeded"`) or
/// an object with the status inside (`{"responseStreamDisconnected":{"httpStatusCode":502}}`),
/// optionally wrapped as `{"codexErrorInfo": …}`. Returns the category, the variant name
/// (the provider code) and the status the variant carried.
pub fn codex_variant(info: &Value) -> Option<(C, String, Option<u16>)> {
    if let Some(inner) = info.get("codexErrorInfo") {
        return codex_variant(inner);
    }
    let (name, payload) = match info {
        Value::String(s) => (s.as_str(), None),
        Value::Object(map) if map.len() == 1 => {
            let (k, v) = map.iter().next()?;
            (k.as_str(), Some(v))
        }
        _ => return None,
    };
    let status = payload.and_then(|p| {
        p.get("httpStatusCode")
            .or_else(|| p.get("http_status_code"))
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
    });
    let category = match name {
        "contextWindowExceeded" => C::ContextWindowExceeded,
        "sessionBudgetExceeded" => C::BudgetExceeded,
        "usageLimitExceeded" => C::RateLimit,
        "serverOverloaded" => C::Overloaded,
        "cyberPolicy" | "misalignmentPolicyViolation" => C::Policy,
        "internalServerError" => C::Internal,
        "unauthorized" => C::Unauthorized,
        "badRequest" => C::BadRequest,
        "threadRollbackFailed" => C::ThreadRollbackFailed,
        "sandboxError" => C::Sandbox,
        "httpConnectionFailed" | "responseStreamConnectionFailed" => C::ConnectionFailed,
        "responseStreamDisconnected" => C::StreamDisconnected,
        "responseTooManyFailedAttempts" => C::TooManyFailedAttempts,
        "activeTurnNotSteerable" => C::ActiveTurnNotSteerable,
        _ => C::Unknown,
    };
    Some((category, name.to_string(), status))
}

/// The `error` object of a body, whether the body is `{"type":"error","error":{…}}`,
/// `{"error":{…}}`, or the error object itself (a stream `error` event).
fn error_object(body: &Value) -> Option<&Value> {
    match body.get("error") {
        Some(e) if e.is_object() => Some(e),
        _ if body.get("code").is_some() || body.get("message").is_some() => Some(body),
        _ => None,
    }
}

fn text_field<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a str> {
    v.and_then(|v| v.get(key))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn message_of(error: Option<&Value>, fallback: &[u8]) -> Option<String> {
    match text_field(error, "message") {
        Some(m) => Some(truncate_message(m)),
        None => {
            let text = String::from_utf8_lossy(fallback);
            let text = text.trim();
            (!text.is_empty()).then(|| truncate_message(text))
        }
    }
}

/// A failed HTTP answer to a Claude request (`status` ≥ 400, or any non-success status).
pub fn claude_http_failure(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: Timestamp,
) -> Failure {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let error = json.as_ref().and_then(error_object);
    let code = text_field(error, "type").or_else(|| text_field(error, "code"));
    Failure {
        category: claude_category(Some(status), code),
        provider_code: code.map(str::to_string),
        http_status: Some(status),
        origin: origin_of(headers),
        retry_after: retry_after(headers, json.as_ref(), now),
        message: message_of(error, body),
    }
}

/// A failed HTTP answer to a Codex request.
pub fn codex_http_failure(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: Timestamp,
) -> Failure {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let error = json.as_ref().and_then(error_object);
    let code = text_field(error, "code");
    let kind = text_field(error, "type");
    let variant = json.as_ref().and_then(|j| {
        j.get("codexErrorInfo")
            .or_else(|| error.and_then(|e| e.get("codexErrorInfo")))
            .and_then(codex_variant)
    });
    let (category, provider_code, http_status) = if status == 529 {
        (C::Overloaded, code.or(kind).map(str::to_string), status)
    } else if let Some(c) = code.and_then(codex_category_for_code) {
        (c, code.map(str::to_string), status)
    } else if let Some((c, name, carried)) = variant {
        (c, Some(name), carried.unwrap_or(status))
    } else if let Some(c) = kind.and_then(codex_category_for_code) {
        (c, code.or(kind).map(str::to_string), status)
    } else {
        // An unknown code is still reported; the status decides the category.
        (
            category_for_status(status),
            code.or(kind).map(str::to_string),
            status,
        )
    };
    Failure {
        category,
        provider_code,
        http_status: Some(http_status),
        origin: origin_of(headers),
        retry_after: retry_after(headers, json.as_ref(), now),
        message: message_of(error, body),
    }
}

/// A Codex failure reported as an error variant (from a Codex app-server, or an error event
/// carrying `codexErrorInfo`). The status inside the variant is kept.
pub fn codex_variant_failure(
    info: &Value,
    origin: FailureOrigin,
    retry_after: Option<Timestamp>,
    message: Option<&str>,
) -> Failure {
    let (category, code, status) =
        codex_variant(info).unwrap_or((C::Unknown, "other".into(), None));
    Failure {
        category,
        provider_code: Some(code),
        http_status: status,
        origin,
        retry_after,
        message: message.map(truncate_message),
    }
}

/// No HTTP answer at all: refused, reset or timed out before the response headers.
pub fn connection_failed(message: &str) -> Failure {
    Failure {
        category: C::ConnectionFailed,
        provider_code: None,
        http_status: None,
        origin: FailureOrigin::Transport,
        retry_after: None,
        message: Some(truncate_message(message)),
    }
}

/// A streamed answer that broke (connection lost, stalled, or ended without its final
/// event) after it had begun. The stream's 2xx status is not a failure status, so none is
/// reported.
pub fn stream_disconnected(headers: &HeaderMap, message: &str) -> Failure {
    Failure {
        category: C::StreamDisconnected,
        provider_code: None,
        http_status: None,
        origin: origin_of(headers),
        retry_after: None,
        message: Some(truncate_message(message)),
    }
}

/// A Claude SSE `error` event mid-stream (`{"type":"error","error":{"type":"overloaded_error",…}}`).
/// Its code decides; an unknown code means the stream broke.
pub fn claude_stream_error(headers: &HeaderMap, data: &Value, now: Timestamp) -> Failure {
    let error = error_object(data);
    let code = text_field(error, "type").or_else(|| text_field(error, "code"));
    let status = error
        .and_then(|e| e.get("status"))
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok());
    let category = match code.and_then(claude_category_for_code) {
        Some(c) => c,
        None => status.map_or(C::StreamDisconnected, category_for_status),
    };
    Failure {
        category,
        provider_code: code.map(str::to_string),
        http_status: status,
        origin: origin_of(headers),
        retry_after: retry_after(headers, Some(data), now),
        message: message_of(error, b""),
    }
}

/// A Codex stream failure event: `response.failed` (`{"response":{"error":{code,message}}}`),
/// or an `error` event (`{"type":"error","code":…,"message":…}`, possibly with
/// `codexErrorInfo`).
pub fn codex_stream_error(headers: &HeaderMap, data: &Value, now: Timestamp) -> Failure {
    let error = data
        .get("response")
        .and_then(|r| r.get("error"))
        .filter(|e| e.is_object())
        .or_else(|| error_object(data));
    let origin = origin_of(headers);
    let reset = retry_after(headers, error, now);
    if let Some(info) = error
        .and_then(|e| e.get("codexErrorInfo"))
        .or_else(|| data.get("codexErrorInfo"))
    {
        return codex_variant_failure(info, origin, reset, text_field(error, "message"));
    }
    let code = text_field(error, "code").or_else(|| text_field(error, "type"));
    Failure {
        category: code
            .and_then(codex_category_for_code)
            .unwrap_or(C::StreamDisconnected),
        provider_code: code.map(str::to_string),
        http_status: None,
        origin,
        retry_after: reset,
        message: message_of(error, b""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};
    use serde_json::json;

    const NOW: Timestamp = 1_790_000_000_000;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn anthropic_body(kind: &str) -> Vec<u8> {
        json!({"type": "error", "error": {"type": kind, "message": format!("{kind} happened")}})
            .to_string()
            .into_bytes()
    }

    fn claude(status: u16, body: &[u8]) -> Failure {
        claude_http_failure(status, &HeaderMap::new(), body, NOW)
    }

    fn codex(status: u16, body: &Value) -> Failure {
        codex_http_failure(status, &HeaderMap::new(), body.to_string().as_bytes(), NOW)
    }

    // ---- Claude, by HTTP status (spec §1) ----

    #[test]
    fn claude_529_is_overloaded() {
        let f = claude(529, &anthropic_body("overloaded_error"));
        assert_eq!((f.category, f.http_status), (C::Overloaded, Some(529)));
        assert_eq!(f.provider_code.as_deref(), Some("overloaded_error"));
    }

    #[test]
    fn claude_529_is_overloaded_whatever_the_body_code() {
        assert_eq!(
            claude(529, &anthropic_body("api_error")).category,
            C::Overloaded
        );
    }

    #[test]
    fn claude_401_is_unauthorized() {
        assert_eq!(claude(401, b"").category, C::Unauthorized);
    }

    #[test]
    fn claude_403_is_unauthorized() {
        assert_eq!(claude(403, b"").category, C::Unauthorized);
    }

    #[test]
    fn claude_402_is_billing() {
        assert_eq!(claude(402, b"").category, C::Billing);
    }

    #[test]
    fn claude_429_is_rate_limit() {
        let f = claude(429, &anthropic_body("rate_limit_error"));
        assert_eq!((f.category, f.http_status), (C::RateLimit, Some(429)));
        assert_eq!(f.provider_code.as_deref(), Some("rate_limit_error"));
        assert_eq!(f.message.as_deref(), Some("rate_limit_error happened"));
    }

    #[test]
    fn claude_other_4xx_is_bad_request() {
        assert_eq!(claude(404, b"").category, C::BadRequest);
        assert_eq!(claude(413, b"").category, C::BadRequest);
    }

    #[test]
    fn claude_other_5xx_is_internal() {
        for status in [500, 502, 503, 504] {
            let f = claude(status, b"<html>bad gateway</html>");
            assert_eq!((f.category, f.http_status), (C::Internal, Some(status)));
            assert_eq!(f.message.as_deref(), Some("<html>bad gateway</html>"));
        }
    }

    #[test]
    fn claude_status_outside_4xx_5xx_is_unknown_with_its_status() {
        let f = claude(302, b"");
        assert_eq!((f.category, f.http_status), (C::Unknown, Some(302)));
    }

    // ---- Claude, by error code (reference §2.1) ----

    #[test]
    fn claude_code_overloaded_error_is_overloaded_even_on_500() {
        assert_eq!(
            claude(500, &anthropic_body("overloaded_error")).category,
            C::Overloaded
        );
    }

    #[test]
    fn claude_code_authentication_error_is_unauthorized() {
        assert_eq!(
            claude(400, &anthropic_body("authentication_error")).category,
            C::Unauthorized
        );
    }

    #[test]
    fn claude_code_permission_error_is_unauthorized() {
        assert_eq!(
            claude(400, &anthropic_body("permission_error")).category,
            C::Unauthorized
        );
    }

    #[test]
    fn claude_code_invalid_request_error_is_bad_request() {
        assert_eq!(
            claude(400, &anthropic_body("invalid_request_error")).category,
            C::BadRequest
        );
    }

    #[test]
    fn claude_code_not_found_error_is_bad_request() {
        assert_eq!(
            claude(404, &anthropic_body("not_found_error")).category,
            C::BadRequest
        );
    }

    #[test]
    fn claude_code_api_error_is_internal() {
        assert_eq!(
            claude(500, &anthropic_body("api_error")).category,
            C::Internal
        );
    }

    #[test]
    fn claude_code_billing_error_is_billing() {
        assert_eq!(
            claude(400, &anthropic_body("billing_error")).category,
            C::Billing
        );
    }

    #[test]
    fn claude_code_rate_limit_error_is_rate_limit() {
        assert_eq!(
            claude(400, &anthropic_body("rate_limit_error")).category,
            C::RateLimit
        );
    }

    #[test]
    fn claude_code_of_claude_code_are_mapped() {
        assert_eq!(
            claude_category(None, Some("authentication_failed")),
            C::Unauthorized
        );
        assert_eq!(
            claude_category(None, Some("oauth_org_not_allowed")),
            C::Unauthorized
        );
        assert_eq!(claude_category(None, Some("rate_limit")), C::RateLimit);
        assert_eq!(
            claude_category(None, Some("invalid_request")),
            C::BadRequest
        );
        assert_eq!(
            claude_category(None, Some("model_not_found")),
            C::BadRequest
        );
        assert_eq!(claude_category(None, Some("server_error")), C::Internal);
        assert_eq!(
            claude_category(None, Some("max_output_tokens")),
            C::MaxOutputTokens
        );
    }

    #[test]
    fn claude_code_unknown_falls_back_to_the_status() {
        assert_eq!(claude_category(Some(503), Some("unknown")), C::Internal);
        assert_eq!(claude_category(None, Some("unknown")), C::Unknown);
    }

    #[test]
    fn claude_unmapped_code_is_kept_as_provider_code() {
        let f = claude(418, &anthropic_body("teapot_error"));
        assert_eq!(f.category, C::BadRequest);
        assert_eq!(f.provider_code.as_deref(), Some("teapot_error"));
    }

    #[test]
    fn claude_sse_error_event_mid_stream_uses_its_code() {
        let data = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        let f = claude_stream_error(&HeaderMap::new(), &data, NOW);
        assert_eq!(f.category, C::Overloaded);
        assert_eq!(f.provider_code.as_deref(), Some("overloaded_error"));
        assert_eq!(f.http_status, None);
        assert_eq!(f.origin, FailureOrigin::Provider);
        assert_eq!(f.message.as_deref(), Some("Overloaded"));
    }

    #[test]
    fn claude_sse_error_event_with_unknown_code_is_stream_disconnected() {
        let data = json!({"type": "error", "error": {"type": "mystery", "message": "?"}});
        let f = claude_stream_error(&HeaderMap::new(), &data, NOW);
        assert_eq!(f.category, C::StreamDisconnected);
        assert_eq!(f.provider_code.as_deref(), Some("mystery"));
    }

    // ---- Transport ----

    #[test]
    fn no_response_is_connection_failed_from_transport() {
        let f = connection_failed("connection refused");
        assert_eq!(
            (f.category, f.origin, f.http_status),
            (C::ConnectionFailed, FailureOrigin::Transport, None)
        );
    }

    #[test]
    fn a_stream_broken_after_it_began_is_stream_disconnected() {
        let f = stream_disconnected(&HeaderMap::new(), "connection reset mid-stream");
        assert_eq!(
            (f.category, f.origin),
            (C::StreamDisconnected, FailureOrigin::Provider)
        );
    }

    #[test]
    fn a_stream_broken_behind_the_pool_keeps_the_pool_origin() {
        let f = stream_disconnected(&headers(&[("x-pooler-origin", "pool")]), "reset");
        assert_eq!(f.origin, FailureOrigin::Pool);
    }

    // ---- Origin ----

    #[test]
    fn origin_is_pool_when_the_pool_header_says_so() {
        let f = claude_http_failure(429, &headers(&[("x-pooler-origin", "pool")]), b"", NOW);
        assert_eq!(f.origin, FailureOrigin::Pool);
    }

    #[test]
    fn origin_is_provider_for_any_other_http_answer() {
        assert_eq!(claude(502, b"").origin, FailureOrigin::Provider);
        let f = claude_http_failure(502, &headers(&[("x-pooler-origin", "upstream")]), b"", NOW);
        assert_eq!(f.origin, FailureOrigin::Provider);
    }

    // ---- Retry-After ----

    #[test]
    fn retry_after_seconds_become_an_absolute_deadline() {
        let f = claude_http_failure(503, &headers(&[("retry-after", "120")]), b"", NOW);
        assert_eq!(f.retry_after, Some(NOW + 120_000));
    }

    #[test]
    fn retry_after_fractional_seconds_round_up() {
        assert_eq!(parse_retry_after("1.2", NOW), Some(NOW + 2_000));
    }

    #[test]
    fn retry_after_http_date_is_read() {
        // 2026-09-21T12:53:20Z = 1_790_000_000 s.
        let at = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_790_000_600),
        );
        assert_eq!(parse_retry_after(&at, NOW), Some(1_790_000_600_000));
    }

    #[test]
    fn retry_after_garbage_is_ignored() {
        assert_eq!(parse_retry_after("soon", NOW), None);
        assert_eq!(parse_retry_after("-5", NOW), None);
    }

    #[test]
    fn retry_after_ms_header_is_read_when_retry_after_is_absent() {
        let h = headers(&[("retry-after-ms", "1500.5")]);
        assert_eq!(retry_after(&h, None, NOW), Some(NOW + 1501));
    }

    #[test]
    fn body_resets_at_in_epoch_seconds_is_read() {
        let body = json!({"error": {"type": "usage_limit_reached", "resets_at": 1_790_003_600}});
        assert_eq!(body_reset(&body, NOW), Some(1_790_003_600_000));
    }

    #[test]
    fn body_reset_at_in_epoch_milliseconds_is_read() {
        let body = json!({"reset_at": 1_790_003_600_123u64});
        assert_eq!(body_reset(&body, NOW), Some(1_790_003_600_123));
    }

    #[test]
    fn body_relative_resets_are_read() {
        assert_eq!(
            body_reset(&json!({"error": {"resets_in_seconds": 30}}), NOW),
            Some(NOW + 30_000)
        );
        assert_eq!(
            body_reset(&json!({"retry_after": "7"}), NOW),
            Some(NOW + 7_000)
        );
        assert_eq!(
            body_reset(&json!({"retry_after_ms": 250}), NOW),
            Some(NOW + 250)
        );
    }

    #[test]
    fn the_header_wins_over_a_body_reset() {
        let h = headers(&[("retry-after", "10")]);
        let body = json!({"error": {"resets_in_seconds": 30}});
        assert_eq!(retry_after(&h, Some(&body), NOW), Some(NOW + 10_000));
    }

    /// A deadline further than the horizon (30 days) is unknown, wherever it is stated:
    /// the failure then carries none, and a retry is scheduled by policy, not for year 9999.
    #[test]
    fn deadlines_past_the_horizon_are_unknown() {
        use crate::ratelimit::RESET_HORIZON_MS;
        let last = NOW + RESET_HORIZON_MS;
        assert_eq!(parse_retry_after("2592000", NOW), Some(last));
        assert_eq!(parse_retry_after("2592001", NOW), None);
        assert_eq!(parse_retry_after("1e300", NOW), None);
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", NOW),
            None
        );
        let h = headers(&[("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")]);
        let f = claude_http_failure(429, &h, b"", NOW);
        assert_eq!(f.retry_after, None);
        let h = headers(&[("retry-after-ms", "2592000001")]);
        assert_eq!(retry_after(&h, None, NOW), None);
        for body in [
            json!({"error": {"resets_at": 99_999_999_999u64}}),
            json!({"resets_at": 253_402_300_799_000u64}),
            json!({"error": {"resets_in_seconds": 2_592_001}}),
            json!({"retry_after": "1e300"}),
            json!({"retry_after_ms": 2_592_000_001u64}),
        ] {
            assert_eq!(body_reset(&body, NOW), None, "{body}");
        }
        assert_eq!(
            body_reset(&json!({"resets_at": last / 1000}), NOW),
            Some(last)
        );
    }

    // ---- Codex: error variants (reference §2.2) ----

    fn variant(v: Value) -> (C, String, Option<u16>) {
        codex_variant(&v).unwrap()
    }

    #[test]
    fn codex_usage_limit_exceeded_is_rate_limit() {
        assert_eq!(variant(json!("usageLimitExceeded")).0, C::RateLimit);
    }

    #[test]
    fn codex_server_overloaded_is_overloaded() {
        assert_eq!(variant(json!("serverOverloaded")).0, C::Overloaded);
    }

    #[test]
    fn codex_too_many_failed_attempts_keeps_its_status() {
        let v = variant(json!({"responseTooManyFailedAttempts": {"httpStatusCode": 429}}));
        assert_eq!(
            v,
            (
                C::TooManyFailedAttempts,
                "responseTooManyFailedAttempts".into(),
                Some(429)
            )
        );
    }

    #[test]
    fn codex_stream_disconnected_keeps_its_status() {
        let v = variant(json!({"responseStreamDisconnected": {"httpStatusCode": 502}}));
        assert_eq!(
            v,
            (
                C::StreamDisconnected,
                "responseStreamDisconnected".into(),
                Some(502)
            )
        );
    }

    #[test]
    fn codex_http_connection_failed_is_connection_failed_with_its_status() {
        let v = variant(json!({"httpConnectionFailed": {"httpStatusCode": 503}}));
        assert_eq!((v.0, v.2), (C::ConnectionFailed, Some(503)));
    }

    #[test]
    fn codex_response_stream_connection_failed_is_connection_failed() {
        let v = variant(json!({"responseStreamConnectionFailed": {"httpStatusCode": null}}));
        assert_eq!((v.0, v.2), (C::ConnectionFailed, None));
    }

    #[test]
    fn codex_context_window_exceeded_is_context_window_exceeded() {
        assert_eq!(
            variant(json!("contextWindowExceeded")).0,
            C::ContextWindowExceeded
        );
    }

    #[test]
    fn codex_session_budget_exceeded_is_budget_exceeded() {
        assert_eq!(variant(json!("sessionBudgetExceeded")).0, C::BudgetExceeded);
    }

    #[test]
    fn codex_policy_variants_are_policy() {
        assert_eq!(variant(json!("cyberPolicy")).0, C::Policy);
        assert_eq!(variant(json!("misalignmentPolicyViolation")).0, C::Policy);
    }

    #[test]
    fn codex_internal_server_error_is_internal() {
        assert_eq!(variant(json!("internalServerError")).0, C::Internal);
    }

    #[test]
    fn codex_unauthorized_is_unauthorized() {
        assert_eq!(variant(json!("unauthorized")).0, C::Unauthorized);
    }

    #[test]
    fn codex_bad_request_is_bad_request() {
        assert_eq!(variant(json!("badRequest")).0, C::BadRequest);
    }

    #[test]
    fn codex_thread_rollback_failed_is_thread_rollback_failed() {
        assert_eq!(
            variant(json!("threadRollbackFailed")).0,
            C::ThreadRollbackFailed
        );
    }

    #[test]
    fn codex_sandbox_error_is_sandbox() {
        assert_eq!(variant(json!("sandboxError")).0, C::Sandbox);
    }

    #[test]
    fn codex_active_turn_not_steerable_is_active_turn_not_steerable() {
        assert_eq!(
            variant(json!({"activeTurnNotSteerable": {}})).0,
            C::ActiveTurnNotSteerable
        );
    }

    #[test]
    fn codex_other_is_unknown_and_unknown_variants_keep_their_name() {
        assert_eq!(variant(json!("other")).0, C::Unknown);
        assert_eq!(
            variant(json!("brandNewVariant")),
            (C::Unknown, "brandNewVariant".into(), None)
        );
    }

    #[test]
    fn codex_variant_wrapped_in_codex_error_info_is_read() {
        let v = variant(
            json!({"codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 502}}}),
        );
        assert_eq!((v.0, v.2), (C::StreamDisconnected, Some(502)));
    }

    // ---- Codex: HTTP answers and OpenAI codes ----

    #[test]
    fn codex_rate_limit_exceeded_is_rate_limit() {
        let f = codex(
            429,
            &json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}),
        );
        assert_eq!((f.category, f.http_status), (C::RateLimit, Some(429)));
        assert_eq!(f.provider_code.as_deref(), Some("rate_limit_exceeded"));
    }

    #[test]
    fn codex_insufficient_quota_is_billing_despite_its_429() {
        let f = codex(
            429,
            &json!({"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "quota"}}),
        );
        assert_eq!((f.category, f.http_status), (C::Billing, Some(429)));
    }

    #[test]
    fn codex_server_error_is_internal() {
        let f = codex(
            500,
            &json!({"error": {"type": "server_error", "code": null, "message": "oops"}}),
        );
        assert_eq!(f.category, C::Internal);
        assert_eq!(f.provider_code.as_deref(), Some("server_error"));
    }

    #[test]
    fn codex_context_length_exceeded_is_context_window_exceeded() {
        let f = codex(
            400,
            &json!({"error": {"type": "invalid_request_error", "code": "context_length_exceeded"}}),
        );
        assert_eq!(f.category, C::ContextWindowExceeded);
    }

    #[test]
    fn codex_usage_limit_reached_body_is_rate_limit_with_its_reset() {
        let f = codex(
            429,
            &json!({"error": {"type": "usage_limit_reached", "message": "limit", "resets_at": 1_790_003_600}}),
        );
        assert_eq!(f.category, C::RateLimit);
        assert_eq!(f.retry_after, Some(1_790_003_600_000));
    }

    #[test]
    fn codex_plain_statuses_map_like_claude() {
        assert_eq!(codex(401, &json!({})).category, C::Unauthorized);
        assert_eq!(codex(403, &json!({})).category, C::Unauthorized);
        assert_eq!(codex(402, &json!({})).category, C::Billing);
        assert_eq!(codex(429, &json!({})).category, C::RateLimit);
        assert_eq!(codex(404, &json!({})).category, C::BadRequest);
        assert_eq!(codex(502, &json!({})).category, C::Internal);
        assert_eq!(codex(529, &json!({})).category, C::Overloaded);
    }

    #[test]
    fn codex_http_body_with_a_variant_keeps_the_variant_status() {
        let body = json!({"error": {"message": "gave up"}, "codexErrorInfo": {"responseTooManyFailedAttempts": {"httpStatusCode": 429}}});
        let f = codex(500, &body);
        assert_eq!(
            (f.category, f.http_status),
            (C::TooManyFailedAttempts, Some(429))
        );
    }

    #[test]
    fn codex_response_failed_event_uses_its_code() {
        let data = json!({"type": "response.failed", "response": {"error": {"code": "server_is_overloaded", "message": "busy"}}});
        let f = codex_stream_error(&HeaderMap::new(), &data, NOW);
        assert_eq!(f.category, C::Overloaded);
        assert_eq!(f.provider_code.as_deref(), Some("server_is_overloaded"));
    }

    #[test]
    fn codex_error_event_with_rate_limit_code_is_rate_limit() {
        let data = json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "resets_in_seconds": 60});
        let f = codex_stream_error(&HeaderMap::new(), &data, NOW);
        assert_eq!(f.category, C::RateLimit);
        assert_eq!(f.retry_after, Some(NOW + 60_000));
    }

    #[test]
    fn codex_error_event_with_unknown_code_is_stream_disconnected() {
        let data = json!({"type": "error", "code": "weird", "message": "?"});
        assert_eq!(
            codex_stream_error(&HeaderMap::new(), &data, NOW).category,
            C::StreamDisconnected
        );
    }

    // ---- The #4839 shapes: every known fact survives classification ----

    /// #4839 shape 1: a Claude 429 without any rate-limit snapshot — category, status and the
    /// pool's Retry-After and origin are all kept.
    #[test]
    fn issue_4839_claude_429_without_snapshot_keeps_status_origin_and_retry_after() {
        let h = headers(&[("retry-after", "60"), ("x-pooler-origin", "pool")]);
        let f = claude_http_failure(429, &h, &anthropic_body("rate_limit_error"), NOW);
        assert_eq!(f.category, C::RateLimit);
        assert_eq!(f.http_status, Some(429));
        assert_eq!(f.origin, FailureOrigin::Pool);
        assert_eq!(f.retry_after, Some(NOW + 60_000));
    }

    /// #4839 shape 2: a Claude 502 from a gateway (HTML body) is `internal`, status 502.
    #[test]
    fn issue_4839_claude_502_keeps_its_status() {
        let f = claude(502, b"<html><body>502 Bad Gateway</body></html>");
        assert_eq!(
            (f.category, f.http_status, f.origin),
            (C::Internal, Some(502), FailureOrigin::Provider)
        );
    }

    /// #4839 shape 3: a Claude 503 with Retry-After keeps both.
    #[test]
    fn issue_4839_claude_503_keeps_status_and_retry_after() {
        let f = claude_http_failure(503, &headers(&[("retry-after", "120")]), b"", NOW);
        assert_eq!(
            (f.category, f.http_status, f.retry_after),
            (C::Internal, Some(503), Some(NOW + 120_000))
        );
    }

    /// #4839 shape 4: Codex too-many-failed-attempts whose cause was a 429 keeps the 429.
    #[test]
    fn issue_4839_codex_too_many_failed_attempts_keeps_the_429() {
        let f = codex_variant_failure(
            &json!({"responseTooManyFailedAttempts": {"httpStatusCode": 429}}),
            FailureOrigin::Provider,
            Some(NOW + 5_000),
            Some("exceeded retry limit, last status: 429 Too Many Requests"),
        );
        assert_eq!(f.category, C::TooManyFailedAttempts);
        assert_eq!(f.http_status, Some(429));
        assert_eq!(
            f.provider_code.as_deref(),
            Some("responseTooManyFailedAttempts")
        );
        assert_eq!(f.retry_after, Some(NOW + 5_000));
    }

    /// #4839 shape 5: Codex stream-disconnected with 502 keeps the 502.
    #[test]
    fn issue_4839_codex_stream_disconnected_keeps_the_502() {
        let data = json!({"type": "error", "message": "stream disconnected before completion",
                          "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 502}}});
        let f = codex_stream_error(&HeaderMap::new(), &data, NOW);
        assert_eq!(f.category, C::StreamDisconnected);
        assert_eq!(f.http_status, Some(502));
        assert_eq!(
            f.provider_code.as_deref(),
            Some("responseStreamDisconnected")
        );
    }

    /// #4839 negative control: HTTP 401 stays unauthorized.
    #[test]
    fn issue_4839_claude_401_stays_unauthorized() {
        let f = claude(401, &anthropic_body("authentication_error"));
        assert_eq!((f.category, f.http_status), (C::Unauthorized, Some(401)));
    }

    /// #4839 positive control: 529 stays overloaded.
    #[test]
    fn issue_4839_claude_529_stays_overloaded() {
        assert_eq!(claude(529, b"").category, C::Overloaded);
    }

    #[test]
    fn long_messages_are_truncated_on_a_character_boundary() {
        let long = "é".repeat(1000);
        let t = truncate_message(&long);
        assert!(t.len() <= MAX_MESSAGE_BYTES);
        assert!(long.starts_with(&t));
    }
}
