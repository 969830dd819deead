//! HTTP vocabulary of the proxy: a small header list, the routes the pool serves, upstream
//! URL building, the header allow-lists toward each upstream and toward the client, and
//! the providers' error shapes for the responses the pool makes itself.

use crate::model::Provider;

/// The header that marks a response the pool made itself (as opposed to an upstream
/// response passed through).
pub const ORIGIN_HEADER: &str = "x-pooler-origin";

/// Every upstream call asks for an unencoded body (`accept-encoding: identity`): the pool
/// reads what it is answered (error details, the first event of a stream, token and usage
/// documents), and an encoded body it relays could take nothing the pool appends. An
/// upstream that encodes anyway has its `content-encoding` relayed with the body.
pub const ACCEPT_ENCODING: &str = "accept-encoding";
pub const IDENTITY: &str = "identity";

/// Whether a response body is encoded (`content-encoding` other than `identity`): relayed
/// as bytes, never read or added to.
pub fn is_encoded(headers: &Headers) -> bool {
    headers
        .get("content-encoding")
        .is_some_and(|e| !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case(IDENTITY))
}

/// An ordered list of headers with case-insensitive lookup. Names are stored lowercase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    pub fn new() -> Self {
        Headers(Vec::new())
    }

    /// Append a header (names are lowercased).
    pub fn push(&mut self, name: &str, value: impl Into<String>) {
        self.0.push((name.to_ascii_lowercase(), value.into()));
    }

    /// Replace every header of `name` with one value.
    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        let name = name.to_ascii_lowercase();
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value.into()));
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every (name, value) pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The rate-limit headers are read by the kit, from these.
impl pooler_plugin_kit::ratelimit::HeaderSource for Headers {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name)
    }
}

impl<const N: usize> From<[(&str, &str); N]> for Headers {
    fn from(pairs: [(&str, &str); N]) -> Self {
        let mut h = Headers::new();
        for (n, v) in pairs {
            h.push(n, v);
        }
        h
    }
}

/// An endpoint the pool serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// Claude `POST /v1/messages`.
    Messages,
    /// Claude `POST /v1/messages/count_tokens`.
    CountTokens,
    /// Codex `POST /v1/responses`.
    Responses,
    /// Codex `GET /v1/models`.
    Models,
}

impl Endpoint {
    pub fn provider(self) -> Provider {
        match self {
            Endpoint::Messages | Endpoint::CountTokens => Provider::Claude,
            Endpoint::Responses | Endpoint::Models => Provider::Codex,
        }
    }

    /// Whether requests to this endpoint carry a conversation (and so a session key).
    pub fn is_conversation(self) -> bool {
        matches!(self, Endpoint::Messages | Endpoint::Responses)
    }
}

/// What a method and path name: a served endpoint, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMatch {
    Endpoint(Endpoint),
    /// The path is served, but not with this method.
    MethodNotAllowed(Provider),
    /// Nothing is served at this path; the provider is a guess for the error shape.
    NotFound(Option<Provider>),
}

/// Match a request's method and path (without the query string). A trailing slash is
/// tolerated. The pool serves `GET` and `POST` only: any other method (`CONNECT`, whose
/// target has no path, included) is not allowed, whatever the path.
pub fn match_route(method: &str, path: &str) -> RouteMatch {
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    let guess = if path.starts_with("/v1/messages") {
        Some(Provider::Claude)
    } else if path.starts_with("/v1/responses") || path.starts_with("/v1/models") {
        Some(Provider::Codex)
    } else {
        None
    };
    if !method.eq_ignore_ascii_case("GET") && !method.eq_ignore_ascii_case("POST") {
        return RouteMatch::MethodNotAllowed(guess.unwrap_or(Provider::Claude));
    }
    let (endpoint, want) = match path {
        "/v1/messages" => (Endpoint::Messages, "POST"),
        "/v1/messages/count_tokens" => (Endpoint::CountTokens, "POST"),
        "/v1/responses" => (Endpoint::Responses, "POST"),
        "/v1/models" => (Endpoint::Models, "GET"),
        _ => return RouteMatch::NotFound(guess),
    };
    if method.eq_ignore_ascii_case(want) {
        RouteMatch::Endpoint(endpoint)
    } else {
        RouteMatch::MethodNotAllowed(endpoint.provider())
    }
}

/// The upstream URL for a request path and query: Claude appends the path to the base;
/// Codex drops the leading `/v1` (its base already names the API root, e.g.
/// `https://chatgpt.com/backend-api/codex` + `/responses`). The query string is kept.
pub fn upstream_url(provider: Provider, base: &str, path: &str, query: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    let path = match provider {
        Provider::Claude => path,
        Provider::Codex => path.strip_prefix("/v1").unwrap_or(path),
    };
    match query {
        Some(q) if !q.is_empty() => format!("{base}{path}?{q}"),
        _ => format!("{base}{path}"),
    }
}

/// Whether a client header is forwarded upstream. Everything else, including the client's
/// `authorization`, `x-api-key` and hop-by-hop headers, is dropped.
pub fn forward_request_header(provider: Provider, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    match provider {
        Provider::Claude => {
            matches!(
                name.as_str(),
                "accept" | "content-type" | "user-agent" | "x-app"
            ) || name.starts_with("anthropic-")
                || name.starts_with("x-stainless-")
                || name == "x-claude-code-session-id"
        }
        Provider::Codex => {
            matches!(
                name.as_str(),
                "accept"
                    | "content-encoding"
                    | "content-type"
                    | "openai-beta"
                    | "originator"
                    | "session-id"
                    | "session_id"
                    | "thread-id"
                    | "user-agent"
                    | "version"
                    | "x-openai-internal-codex-responses-lite"
            ) || name.starts_with("x-codex-")
                || name.starts_with("x-stainless-")
        }
    }
}

/// The beta the Messages API requires before it accepts a subscription (OAuth) access token.
pub const OAUTH_BETA: &str = "oauth-2025-04-20";

/// The `anthropic-beta` value of a request sent with an OAuth access token: the client's
/// betas (every `anthropic-beta` header, comma-separated, in order, each kept once) plus
/// [`OAUTH_BETA`] at the end unless the client already listed it. Claude Code sends its own
/// betas and never this one when it authenticates with `ANTHROPIC_AUTH_TOKEN`; without it
/// the API answers 401 "OAuth authentication is currently not supported."
pub fn with_oauth_beta<'a>(client: impl IntoIterator<Item = &'a str>) -> String {
    let mut betas: Vec<&str> = Vec::new();
    for value in client {
        for beta in value.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            if !betas.contains(&beta) {
                betas.push(beta);
            }
        }
    }
    if !betas.contains(&OAUTH_BETA) {
        betas.push(OAUTH_BETA);
    }
    betas.join(",")
}

/// Whether an upstream response header is passed to the client. Not passed: hop-by-hop
/// and framing headers (the host frames the body itself); `x-pooler-origin`, which only the
/// pool may set (from upstream it would read as the pool's verdict); and `set-cookie`, a
/// provider's cookie for a client that never talks to the provider. `content-encoding`
/// is passed: the body is relayed as encoded, and without it the client could not decode it.
pub fn forward_response_header(name: &str) -> bool {
    !matches!(
        name.to_ascii_lowercase().as_str(),
        "content-length"
            | "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | ORIGIN_HEADER
            | "set-cookie"
    )
}

/// A response the pool makes itself (never an upstream response).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolError {
    pub status: u16,
    pub message: String,
    /// `Retry-After` in whole seconds, when the response carries one.
    pub retry_after_secs: Option<u64>,
    /// Whether the pool itself produced the verdict (`x-pooler-origin: pool`). False for a
    /// recorded upstream failure re-shaped for the client.
    pub pool_origin: bool,
}

impl PoolError {
    pub fn pool(status: u16, message: impl Into<String>) -> Self {
        PoolError {
            status,
            message: message.into(),
            retry_after_secs: None,
            pool_origin: true,
        }
    }

    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// The JSON body in `provider`'s error shape.
    pub fn body(&self, provider: Provider) -> Vec<u8> {
        let value = match provider {
            Provider::Claude => {
                let kind = match self.status {
                    400 => "invalid_request_error",
                    401 => "authentication_error",
                    403 => "permission_error",
                    404 => "not_found_error",
                    413 => "request_too_large",
                    429 => "rate_limit_error",
                    529 => "overloaded_error",
                    _ => "api_error",
                };
                serde_json::json!({
                    "type": "error",
                    "error": { "type": kind, "message": self.message },
                })
            }
            Provider::Codex => {
                let (kind, code) = match self.status {
                    429 => ("rate_limit_error", Some("rate_limit_exceeded")),
                    400 | 404 | 405 | 413 => ("invalid_request_error", None),
                    401 | 403 => ("authentication_error", None),
                    _ => ("api_error", None),
                };
                serde_json::json!({
                    "error": { "message": self.message, "type": kind, "code": code },
                })
            }
        };
        value.to_string().into_bytes()
    }

    /// The response headers: content type, Retry-After, and the pool origin marker.
    pub fn headers(&self) -> Headers {
        let mut h = Headers::new();
        h.push("content-type", "application/json");
        if let Some(secs) = self.retry_after_secs {
            h.push("retry-after", secs.to_string());
        }
        if self.pool_origin {
            h.push(ORIGIN_HEADER, "pool");
        }
        h
    }
}

/// The message of an upstream error body (Claude `error.message`, Codex `error.message`,
/// or a top-level `message`), else the body text, truncated to 1 KiB.
pub fn upstream_detail(body: &[u8]) -> Option<String> {
    const LIMIT: usize = 1024;
    if body.is_empty() {
        return None;
    }
    let text = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(|m| m.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    let mut end = text.len().min(LIMIT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let trimmed = text[..end].trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_method_and_path() {
        use RouteMatch::*;
        let table = [
            ("POST", "/v1/messages", Endpoint(self::Endpoint::Messages)),
            ("POST", "/v1/messages/", Endpoint(self::Endpoint::Messages)),
            (
                "POST",
                "/v1/messages/count_tokens",
                Endpoint(self::Endpoint::CountTokens),
            ),
            ("POST", "/v1/responses", Endpoint(self::Endpoint::Responses)),
            ("GET", "/v1/models", Endpoint(self::Endpoint::Models)),
            ("GET", "/v1/messages", MethodNotAllowed(Provider::Claude)),
            (
                "POST",
                "/v1/messages/batches",
                NotFound(Some(Provider::Claude)),
            ),
            (
                "POST",
                "/v1/responses/compact",
                NotFound(Some(Provider::Codex)),
            ),
            ("GET", "/", NotFound(None)),
            ("POST", "/v2/chat", NotFound(None)),
            // The pool serves GET and POST only: any other method, on any path (even none,
            // as CONNECT's target has), is not allowed.
            ("CONNECT", "", MethodNotAllowed(Provider::Claude)),
            ("TRACE", "/v1/messages", MethodNotAllowed(Provider::Claude)),
            ("DELETE", "/v1/complete", MethodNotAllowed(Provider::Claude)),
            ("PUT", "/v1/responses", MethodNotAllowed(Provider::Codex)),
            ("HEAD", "/v1/models", MethodNotAllowed(Provider::Codex)),
            (
                "OPTIONS",
                "/v1/responses/x",
                MethodNotAllowed(Provider::Codex),
            ),
        ];
        for (method, path, want) in table {
            assert_eq!(match_route(method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn upstream_urls_keep_the_query_and_codex_drops_v1() {
        let table = [
            (
                Provider::Claude,
                "https://api.anthropic.com",
                "/v1/messages",
                Some("beta=true"),
                "https://api.anthropic.com/v1/messages?beta=true",
            ),
            (
                Provider::Claude,
                "http://127.0.0.1:9/",
                "/v1/messages/count_tokens",
                None,
                "http://127.0.0.1:9/v1/messages/count_tokens",
            ),
            (
                Provider::Codex,
                "https://chatgpt.com/backend-api/codex",
                "/v1/responses",
                None,
                "https://chatgpt.com/backend-api/codex/responses",
            ),
            (
                Provider::Codex,
                "https://chatgpt.com/backend-api/codex/",
                "/v1/models",
                Some("client_version=0.169.0"),
                "https://chatgpt.com/backend-api/codex/models?client_version=0.169.0",
            ),
            (
                Provider::Codex,
                "http://h",
                "/v1/responses",
                Some(""),
                "http://h/responses",
            ),
        ];
        for (provider, base, path, query, want) in table {
            assert_eq!(upstream_url(provider, base, path, query), want);
        }
    }

    #[test]
    fn the_oauth_beta_joins_the_clients_betas_once_in_their_order() {
        let claude_code = "claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24";
        let table: [(&[&str], &str); 6] = [
            (&[], "oauth-2025-04-20"),
            (
                &[claude_code],
                "claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24,oauth-2025-04-20",
            ),
            (&["a, oauth-2025-04-20 ,b"], "a,oauth-2025-04-20,b"),
            (&["a,b,a", "b,c"], "a,b,c,oauth-2025-04-20"),
            (&["oauth-2025-04-20,oauth-2025-04-20"], "oauth-2025-04-20"),
            (&[" , ,"], "oauth-2025-04-20"),
        ];
        for (client, want) in table {
            assert_eq!(with_oauth_beta(client.iter().copied()), want, "{client:?}");
        }
    }

    #[test]
    fn request_headers_are_allow_listed_per_provider() {
        let table = [
            (Provider::Claude, "anthropic-beta", true),
            (Provider::Claude, "Anthropic-Version", true),
            (Provider::Claude, "x-stainless-os", true),
            (Provider::Claude, "authorization", false),
            (Provider::Claude, "x-api-key", false),
            (Provider::Claude, "cookie", false),
            (Provider::Codex, "session-id", true),
            (Provider::Codex, "thread-id", true),
            (Provider::Codex, "x-codex-turn-metadata", true),
            (Provider::Codex, "originator", true),
            (Provider::Codex, "authorization", false),
            (Provider::Codex, "chatgpt-account-id", false),
        ];
        for (provider, name, want) in table {
            assert_eq!(
                forward_request_header(provider, name),
                want,
                "{provider} {name}"
            );
        }
        assert!(!forward_response_header("Transfer-Encoding"));
        assert!(!forward_response_header("X-Pooler-Origin"));
        assert!(!forward_response_header("Set-Cookie"));
        // The body is relayed as the upstream encoded it: its encoding goes with it.
        assert!(forward_response_header("Content-Encoding"));
        assert!(forward_response_header(
            "anthropic-ratelimit-unified-5h-status"
        ));
    }

    #[test]
    fn error_shapes_follow_each_provider() {
        let e = PoolError::pool(429, "busy").with_retry_after(60);
        let claude: serde_json::Value = serde_json::from_slice(&e.body(Provider::Claude)).unwrap();
        assert_eq!(claude["type"], "error");
        assert_eq!(claude["error"]["type"], "rate_limit_error");
        assert_eq!(claude["error"]["message"], "busy");
        let codex: serde_json::Value = serde_json::from_slice(&e.body(Provider::Codex)).unwrap();
        assert_eq!(codex["error"]["type"], "rate_limit_error");
        assert_eq!(codex["error"]["code"], "rate_limit_exceeded");
        let h = e.headers();
        assert_eq!(h.get("retry-after"), Some("60"));
        assert_eq!(h.get(ORIGIN_HEADER), Some("pool"));
        let passed = PoolError {
            pool_origin: false,
            ..PoolError::pool(503, "x")
        };
        assert_eq!(passed.headers().get(ORIGIN_HEADER), None);
    }

    #[test]
    fn upstream_detail_reads_messages_and_truncates() {
        assert_eq!(
            upstream_detail(br#"{"type":"error","error":{"type":"x","message":"Overloaded"}}"#),
            Some("Overloaded".into())
        );
        assert_eq!(upstream_detail(b"plain text"), Some("plain text".into()));
        assert_eq!(upstream_detail(b""), None);
        let long = "é".repeat(2000);
        let got = upstream_detail(long.as_bytes()).unwrap();
        assert!(got.len() <= 1024);
    }
}
