//! The admin API: what `pooler account|config|route|session …` (and any other client holding
//! the admin token) asks of a running server, under `/_pooler/` on the pool's listener.
//!
//! This module owns the transport: the token check (constant time; or the status page's
//! session cookie with its CSRF defence, see `admin/page.rs`), reading a bounded JSON
//! body, splitting and percent-decoding the path, dispatching to one *area* module per
//! first path segment, and writing every answer as JSON. Errors are
//! `{"error": {"code": "...", "message": "..."}}` with 400 (refused input, naming what is
//! wrong), 401 (token), 403 (a change made with the page's cookie without its CSRF defence), 404 (unknown endpoint or id), 413 (body too large), 503 (plugin not
//! loaded, or a transient failure: try again) and 500 (a plugin trapped or ran out of time).
//!
//! Conventions every area keeps: timestamps are unix epoch milliseconds (UTC), as in the WIT
//! contract; JSON field names are `snake_case`; enum values are the WIT case names
//! (`near-limit`, `api-key`). **No request body, secret or token is logged**, and error
//! messages never repeat a value that may be secret (request bodies are read field by field
//! with [`Fields`], whose messages name the field, never its value).
//!
//! # Adding an area
//!
//! Write `admin/<area>.rs` with
//! `pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError>`
//! (match on `(req.method(), req.rest().as_slice())`), then add one line `"<segment>" =>
//! <area>,` to the `areas!` list below: `/_pooler/<segment>/…` is then yours.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};
use wasmtime::Store;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::mediation::core_link::CoreLink;
use crate::operate::wire::{ADMIN_PREFIX, ORIGIN_HEADER, ProviderName, endpoint_url};
use crate::runtime::bindings::pool::AccountPool;
use crate::runtime::bindings::retry::ProviderRetry;
use crate::runtime::bindings::types::Provider;
use crate::runtime::state::PluginState;
use crate::runtime::{CallError, CallFuture, Host};

/// The largest admin request body accepted (a login file is a few KB).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Declares the area modules and the router that picks one by the first path segment.
macro_rules! areas {
    ($($segment:literal => $area:ident,)*) => {
        $(mod $area;)*

        /// Hand `req` to the area its first path segment names.
        async fn dispatch(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
            match req.area() {
                $($segment => $area::handle(admin, req).await,)*
                _ => Err(ApiError::no_endpoint(req)),
            }
        }
    };
}

// One line per area: `/_pooler/<segment>/…` → `admin/<area>.rs`.
areas! {
    "status" => status,
    "accounts" => accounts,
    "settings" => settings,
    "routes" => routes,
    "sessions" => sessions,
    "threads" => core,
    "retry" => retry,
    "overview" => overview,
    "tokens" => tokens,
    "page" => page,
    "alerts" => alerts,
    "timeline" => timeline,
}

mod convert;
mod fields;
pub use fields::Fields;
mod scrape;
pub use scrape::METRICS_PATH;

/// The admin API of one server.
pub struct Admin {
    host: Host,
    /// The host's core, when it runs with one (wired in by the server).
    core: Option<Arc<CoreLink>>,
    token: String,
    endpoint: String,
    in_flight: Arc<AtomicUsize>,
    /// The status page's login codes and sessions (`admin/page.rs`).
    page: page::PageAuth,
}

impl Admin {
    /// `token` is the admin token the server wrote; `local_addr` is where the server listens
    /// (routes are opened at `http://<local_addr>`, loopback when bound to every address);
    /// `in_flight` counts the server's requests in flight (shown by `status`).
    pub fn new(
        host: Host,
        token: String,
        local_addr: SocketAddr,
        in_flight: Arc<AtomicUsize>,
    ) -> Admin {
        Admin {
            host,
            core: None,
            token,
            endpoint: endpoint_url(local_addr),
            in_flight,
            page: page::PageAuth::default(),
        }
    }

    /// The host whose plugins the admin API calls.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The admin API answering the `threads` area from `core`.
    pub fn with_core(mut self, core: Arc<CoreLink>) -> Admin {
        self.core = Some(core);
        self
    }

    /// The host's core, when it runs with one.
    pub fn core(&self) -> Option<&Arc<CoreLink>> {
        self.core.as_ref()
    }

    /// The URL agents reach this server at: what routes are opened with.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Answer one admin request (its path starts with [`ADMIN_PREFIX`]).
    pub async fn handle<B>(&self, req: Request<B>) -> Response<HyperOutgoingBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        if let Some(response) = page::answer_page(
            self,
            req.method().as_str(),
            req.uri().path(),
            req.uri().query(),
            req.headers(),
        ) {
            return response;
        }
        match self.answer(req).await {
            Ok(reply) => json_response(reply.status, &reply.body),
            Err(e) => {
                if e.status.is_server_error() {
                    tracing::warn!(code = e.code, message = %e.message, "admin request failed");
                }
                json_response(e.status, &e.to_json())
            }
        }
    }

    async fn answer<B>(&self, req: Request<B>) -> Result<Reply, ApiError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        self.authenticate(req.method(), req.headers())?;
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body-too-large",
                    format!("an admin request body may have at most {MAX_BODY_BYTES} bytes"),
                ));
            }
            Err(e) => {
                return Err(ApiError::bad_request(
                    "bad-body",
                    format!("the request body could not be read: {e}"),
                ));
            }
        };
        let req = AdminRequest::new(
            parts.method.as_str(),
            parts.uri.path(),
            parts.uri.query(),
            body,
        )?;
        tracing::debug!(
            method = req.method(),
            path = parts.uri.path(),
            "admin request"
        );
        dispatch(self, &req).await
    }

    /// The admin token in `Authorization: Bearer`, or else a status page session's cookie
    /// (`admin/page.rs`), which for a state-changing method also needs the page's CSRF
    /// defence (403 without it). A query string is never looked at.
    fn authenticate(
        &self,
        method: &hyper::Method,
        headers: &hyper::HeaderMap,
    ) -> Result<(), ApiError> {
        let unauthorized = || {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the admin API needs `Authorization: Bearer <token>` with the token from \
                 DATA_DIR/admin-token (or the status page's session: `pooler page`)",
            )
        };
        if let Some(value) = headers.get(hyper::header::AUTHORIZATION) {
            let presented = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            return if constant_time_eq(presented.as_bytes(), self.token.as_bytes()) {
                Ok(())
            } else {
                Err(unauthorized())
            };
        }
        let now = self.host.clock().now_ms();
        let session = self.page.session(headers, now).ok_or_else(unauthorized)?;
        if !matches!(*method, hyper::Method::GET | hyper::Method::HEAD) {
            page::check_csrf(headers, &session)?;
        }
        Ok(())
    }

    /// Call the pool on a fresh instance; a failed call becomes a 503/500 error.
    pub(crate) async fn pool<R: Send>(
        &self,
        call: &str,
        f: impl for<'a> FnOnce(&'a mut Store<PluginState>, &'a AccountPool) -> CallFuture<'a, R> + Send,
    ) -> Result<R, ApiError> {
        self.host.call_pool(call, f).await.map_err(ApiError::from)
    }

    /// Call Provider Retry (one call at a time); a failed call becomes a 503/500 error.
    pub(crate) async fn retry<R: Send>(
        &self,
        call: &str,
        f: impl for<'a> FnOnce(&'a mut Store<PluginState>, &'a ProviderRetry) -> CallFuture<'a, R>
        + Send,
    ) -> Result<R, ApiError> {
        self.host.call_retry(call, f).await.map_err(ApiError::from)
    }
}

/// The answer to an admin or `/metrics` request from a peer that is not on loopback: 403
/// `loopback-only`. The admin token must not cross a network in clear text, so a server
/// bound to a non-loopback address proxies for every peer but answers these only locally.
pub fn loopback_only() -> Response<HyperOutgoingBody> {
    let e = ApiError::new(
        StatusCode::FORBIDDEN,
        "loopback-only",
        "the admin API and /metrics answer only on loopback (127.0.0.1 or ::1); run the \
         command on the server's machine",
    );
    json_response(e.status, &e.to_json())
}

/// Compare two byte strings in time independent of where they differ (tokens, codes).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

fn json_response(status: StatusCode, body: &Value) -> Response<HyperOutgoingBody> {
    let mut text = body.to_string();
    text.push('\n');
    let mut response = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(ORIGIN_HEADER, HeaderValue::from_static("pool"));
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// One admin request, parsed: method, decoded path segments, query, body.
#[derive(Debug)]
pub struct AdminRequest {
    method: String,
    /// The path after `/_pooler/`, split on `/` and percent-decoded.
    segments: Vec<String>,
    query: Vec<(String, String)>,
    body: Bytes,
}

impl AdminRequest {
    fn new(method: &str, path: &str, query: Option<&str>, body: Bytes) -> Result<Self, ApiError> {
        let rest = path
            .strip_prefix(ADMIN_PREFIX)
            .or_else(|| path.strip_prefix(ADMIN_PREFIX.trim_end_matches('/')))
            .unwrap_or("");
        let segments = rest
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect::<Result<Vec<_>, _>>()?;
        let query = query
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                Ok((percent_decode(name)?, percent_decode(value)?))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(AdminRequest {
            method: method.to_owned(),
            segments,
            query,
            body,
        })
    }

    /// The HTTP method (`GET`, `POST`, …).
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The area: the first path segment after `/_pooler/`.
    pub fn area(&self) -> &str {
        self.segments.first().map_or("", String::as_str)
    }

    /// The decoded path segments after the area's.
    pub fn rest(&self) -> Vec<&str> {
        self.segments.iter().skip(1).map(String::as_str).collect()
    }

    /// A query parameter, decoded.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as a JSON object, read field by field (an empty body is an empty object).
    pub fn fields(&self) -> Result<Fields, ApiError> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Fields::new(Map::new()));
        }
        // serde_json's syntax errors give a position, never the text.
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(Value::Object(map)) => Ok(Fields::new(map)),
            Ok(_) => Err(ApiError::bad_request(
                "bad-body",
                "the request body must be a JSON object",
            )),
            Err(e) => Err(ApiError::bad_request(
                "bad-body",
                format!("the request body is not JSON: {e}"),
            )),
        }
    }

    /// `METHOD /_pooler/…`, for messages.
    fn describe(&self) -> String {
        format!("{} {ADMIN_PREFIX}{}", self.method, self.segments.join("/"))
    }
}

/// A provider named in a path segment.
pub(crate) fn path_provider(segment: &str) -> Result<Provider, ApiError> {
    ProviderName::parse(segment)
        .map(Provider::from)
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid-provider",
                format!("unknown provider `{segment}`: expected `claude` or `codex`"),
            )
        })
}

/// A successful answer.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status to answer with (200 or 201).
    pub status: StatusCode,
    /// The JSON body.
    pub body: Value,
}

impl Reply {
    /// 200 with `body` as JSON.
    pub fn ok(body: impl Serialize) -> Result<Reply, ApiError> {
        Self::with_status(StatusCode::OK, body)
    }

    /// 201 with `body` as JSON.
    pub fn created(body: impl Serialize) -> Result<Reply, ApiError> {
        Self::with_status(StatusCode::CREATED, body)
    }

    fn with_status(status: StatusCode, body: impl Serialize) -> Result<Reply, ApiError> {
        let body = serde_json::to_value(body).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("cannot encode the answer: {e}"),
            )
        })?;
        Ok(Reply { status, body })
    }
}

/// A refused or failed admin request: its HTTP status, a stable code, and a message for
/// people that says what is wrong (never a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status to answer with.
    pub status: StatusCode,
    /// A stable, kebab-case code a client can match on (`no-such-endpoint`, `transient`).
    pub code: &'static str,
    /// What is wrong, for a person; never a secret.
    pub message: String,
}

impl ApiError {
    /// An error answering `status`, with `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: the request itself is wrong.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404: the thing the request names does not exist.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// A transient failure (the plugin's database, an unreachable endpoint): try again.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }

    /// 500: the host or a plugin failed; trying again is unlikely to help.
    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, message)
    }

    /// No endpoint answers this method and path.
    pub fn no_endpoint(req: &AdminRequest) -> Self {
        Self::not_found(
            "no-such-endpoint",
            format!("no admin endpoint {}", req.describe()),
        )
    }

    /// The body a refusal answers with: `{"error": {"code": …, "message": …}}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "error": { "code": self.code, "message": self.message } })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<CallError> for ApiError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::NoPlugin(_) => ApiError::unavailable("plugin-unavailable", e.to_string()),
            CallError::Transient { .. } => ApiError::unavailable("transient", e.to_string()),
            CallError::Trap { .. } | CallError::Deadline { .. } | CallError::Instantiate { .. } => {
                ApiError::internal("plugin-failed", e.to_string())
            }
        }
    }
}

/// Decode a percent-encoded path segment or query component (`+` stays `+`).
/// A `%` not followed by two hex digits is refused, where the crate's decoder would keep it
/// as it is: a client that sent it meant something the path does not say.
pub fn percent_decode(text: &str) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request("bad-path", "the path has an invalid percent-encoding");
    let bytes = text.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return Err(bad());
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests;
