//! The status page: `/_pooler/page`, a small self-contained HTML page (with its script and
//! style, embedded in the binary) that shows the [`overview`](crate::operate::wire::overview) and refreshes
//! it every 2 s, with the actions a person needs in an incident (enable or disable an
//! account, send a thread's retry now). It calls the admin API like the CLI does.
//!
//! # Signing in without the admin token in a URL
//!
//! | method and path                    | auth         | answer |
//! |------------------------------------|--------------|--------|
//! | `POST /page/login-codes`           | admin        | 201 `{"url", "expires_at"}` |
//! | `GET /page/login?code=CODE`        | the code     | 303 to `/_pooler/page`, `Set-Cookie` |
//! | `GET /page`, `/page/app.js`, `/page/app.css` | page session | the page |
//!
//! `pooler page` mints a **login code** (random, 128 bits, single use, valid
//! [`CODE_TTL_MS`] on the host clock) and prints `http://ADDR/_pooler/page/login?code=CODE`.
//! Opening it exchanges the code for a **page session**: a random session id in the cookie
//! `pooler_session` (`HttpOnly; SameSite=Strict; Path=/_pooler`, valid [`SESSION_TTL_MS`])
//! and a random per-session **CSRF token**, written into the page (a `<meta>` element the
//! script reads). The redirect takes the code out of the address bar. Codes and sessions
//! live in the server's memory only: a restarted server needs a new `pooler page`. The
//! admin token never appears in a URL, and a token in a query string is not accepted.
//!
//! # The admin API with a page session
//!
//! Every admin endpoint accepts the session cookie in place of `Authorization: Bearer`
//! (a request that has an `Authorization` header is judged by it alone). A request that may
//! change state (any method but `GET`, `HEAD`) with cookie authentication must also
//! - carry an `Origin` header equal to `http://` + its `Host` header (same origin), and
//! - carry `x-pooler-csrf` equal to the session's CSRF token,
//!
//! else it is refused with 403 `csrf` and nothing happens. `SameSite=Strict` already keeps
//! the cookie off cross-site requests; the two checks hold even where it does not.
//!
//! Every page answer carries `Content-Security-Policy: default-src 'self'` (no inline
//! script, no external resource), `X-Frame-Options: DENY`, `Cache-Control: no-store` and
//! `Referrer-Policy: no-referrer`.

use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use super::{Admin, AdminRequest, ApiError, Reply, constant_time_eq};
use crate::operate::wire::ADMIN_PREFIX;

/// How long a login code may be used, after it was minted.
pub const CODE_TTL_MS: u64 = 5 * 60 * 1000;
/// How long a page session lasts, after sign-in.
pub const SESSION_TTL_MS: u64 = 12 * 3600 * 1000;
/// The session cookie's name.
pub const COOKIE: &str = "pooler_session";
/// The header the page's script sends its CSRF token in.
pub const CSRF_HEADER: &str = "x-pooler-csrf";
/// At most this many codes and sessions are kept (the oldest go first).
const MAX_KEPT: usize = 32;

const PAGE_HTML: &str = include_str!("page/index.html");
const PAGE_JS: &str = include_str!("page/app.js");
const PAGE_CSS: &str = include_str!("page/app.css");
/// The quota timeline's script (its own file: the chart reads `/_pooler/timeline`).
const PAGE_TIMELINE_JS: &str = include_str!("page/timeline.js");

/// A signed-in page session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    id: String,
    csrf: String,
    expires_at: u64,
}

#[derive(Debug, Default)]
struct Kept {
    /// (code, expires at)
    codes: Vec<(String, u64)>,
    sessions: Vec<Session>,
}

/// The login codes and page sessions of one server (in memory).
#[derive(Debug, Default)]
pub struct PageAuth {
    kept: Mutex<Kept>,
}

fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut raw = vec![0u8; bytes];
    getrandom::fill(&mut raw)
        .map_err(|e| ApiError::internal("no-randomness", format!("no randomness: {e}")))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

impl PageAuth {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh login code, valid until the answer's second value.
    pub fn mint_code(&self, now: u64) -> Result<(String, u64), ApiError> {
        let code = random_hex(16)?;
        let expires_at = now + CODE_TTL_MS;
        let mut kept = self.kept();
        kept.codes.retain(|(_, until)| *until > now);
        if kept.codes.len() >= MAX_KEPT {
            kept.codes.remove(0);
        }
        kept.codes.push((code.clone(), expires_at));
        Ok((code, expires_at))
    }

    /// Exchange a login code for a new session: `None` when the code is unknown, used or
    /// expired. The code is spent either way.
    pub fn redeem(&self, code: &str, now: u64) -> Result<Option<Session>, ApiError> {
        let session = Session {
            id: random_hex(32)?,
            csrf: random_hex(32)?,
            expires_at: now + SESSION_TTL_MS,
        };
        let mut kept = self.kept();
        let found = kept
            .codes
            .iter()
            .position(|(c, _)| constant_time_eq(c.as_bytes(), code.as_bytes()));
        let Some(index) = found else {
            return Ok(None);
        };
        let (_, until) = kept.codes.remove(index);
        if until <= now {
            return Ok(None);
        }
        kept.sessions.retain(|s| s.expires_at > now);
        if kept.sessions.len() >= MAX_KEPT {
            kept.sessions.remove(0);
        }
        kept.sessions.push(session.clone());
        Ok(Some(session))
    }

    /// The live session the request's cookie names, if any.
    pub fn session(&self, headers: &HeaderMap, now: u64) -> Option<Session> {
        let id = cookie(headers, COOKIE)?;
        self.kept()
            .sessions
            .iter()
            .find(|s| constant_time_eq(s.id.as_bytes(), id.as_bytes()) && s.expires_at > now)
            .cloned()
    }
}

/// The value of cookie `name` among the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// The CSRF defence for a state-changing request authenticated by a page session: the same
/// origin, and the session's token in [`CSRF_HEADER`].
pub(super) fn check_csrf(headers: &HeaderMap, session: &Session) -> Result<(), ApiError> {
    let forbidden = |why: &str| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "csrf",
            format!("refused a change made with the page's cookie: {why}"),
        )
    };
    let text = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let host = text(hyper::header::HOST.as_str()).ok_or_else(|| forbidden("no Host header"))?;
    match text(hyper::header::ORIGIN.as_str()) {
        Some(origin) if origin == format!("http://{host}") => {}
        Some(_) => return Err(forbidden("it came from another origin")),
        None => return Err(forbidden("no Origin header")),
    }
    match text(CSRF_HEADER) {
        Some(token) if constant_time_eq(token.as_bytes(), session.csrf.as_bytes()) => Ok(()),
        _ => Err(forbidden(&format!("no valid `{CSRF_HEADER}` header"))),
    }
}

/// `/_pooler/page/…` answered with JSON (after authentication): minting login codes.
pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("POST", ["login-codes"]) => {
            req.fields()?.finish()?;
            let now = admin.host().clock().now_ms();
            let (code, expires_at) = admin.page.mint_code(now)?;
            Reply::created(serde_json::json!({
                "url": format!("{}{ADMIN_PREFIX}page/login?code={code}", admin.endpoint()),
                "expires_at": expires_at,
            }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

/// The page's own answers (HTML, script, style, the login exchange), or `None` for a
/// request the JSON API answers.
pub(super) fn answer_page(
    admin: &Admin,
    method: &str,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response<HyperOutgoingBody>> {
    let rest = path.strip_prefix(ADMIN_PREFIX)?;
    let rest = rest.strip_prefix("page")?;
    if method != "GET" || !matches!(
            rest,
            "" | "/" | "/login" | "/app.js" | "/app.css" | "/timeline.js"
        ) {
        return None;
    }
    let now = admin.host().clock().now_ms();
    if rest == "/login" {
        let code = query
            .unwrap_or("")
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(n, _)| *n == "code")
            .map_or("", |(_, v)| v);
        return Some(match admin.page.redeem(code, now) {
            Ok(Some(session)) => {
                let mut response = page_response(StatusCode::SEE_OTHER, "text/plain", "");
                let headers = response.headers_mut();
                headers.insert(
                    hyper::header::LOCATION,
                    HeaderValue::from_static("/_pooler/page"),
                );
                let cookie = format!(
                    "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/_pooler; Max-Age={}",
                    session.id,
                    SESSION_TTL_MS / 1000
                );
                if let Ok(value) = HeaderValue::from_str(&cookie) {
                    headers.insert(hyper::header::SET_COOKIE, value);
                }
                response
            }
            Ok(None) => refusal(
                "This sign-in link was already used or has expired. Run <code>pooler page</code> \
                 for a new one.",
            ),
            Err(e) => page_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                &e.message,
            ),
        });
    }
    let Some(session) = admin.page.session(headers, now) else {
        return Some(refusal(
            "Not signed in. Run <code>pooler page</code> and open the link it prints.",
        ));
    };
    Some(match rest {
        "/app.js" => page_response(StatusCode::OK, "text/javascript; charset=utf-8", PAGE_JS),
        "/app.css" => page_response(StatusCode::OK, "text/css; charset=utf-8", PAGE_CSS),
        "/timeline.js" => page_response(
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            PAGE_TIMELINE_JS,
        ),
        _ => page_response(
            StatusCode::OK,
            "text/html; charset=utf-8",
            &PAGE_HTML.replace("{{CSRF}}", &session.csrf),
        ),
    })
}

fn refusal(message: &str) -> Response<HyperOutgoingBody> {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Pooler</title>\
         </head><body><h1>Pooler</h1><p>{message}</p></body></html>\n"
    );
    page_response(StatusCode::UNAUTHORIZED, "text/html; charset=utf-8", &html)
}

fn page_response(
    status: StatusCode,
    content_type: &'static str,
    body: &str,
) -> Response<HyperOutgoingBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_owned()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    headers.insert(
        hyper::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; frame-ancestors 'none'; base-uri 'none'"),
    );
    headers.insert(
        hyper::header::X_FRAME_OPTIONS,
        HeaderValue::from_static("DENY"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    headers.insert(
        hyper::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        hyper::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, StatusCode};
    use serde_json::Value;

    use super::super::tests::{TOKEN, admin};
    use super::*;

    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: String,
    }

    async fn send(admin: &Admin, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = admin
            .handle(request.body(Full::new(Bytes::new())).unwrap())
            .await;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    fn code_of(answer: &Answer) -> String {
        let value: Value = serde_json::from_str(&answer.body).unwrap();
        value["error"]["code"].as_str().unwrap_or("").to_owned()
    }

    /// Mint a code with the admin token and exchange it: the cookie pair and the CSRF token
    /// (read from the page, as the script does).
    async fn sign_in(admin: &Admin) -> (String, String) {
        let bearer = format!("Bearer {TOKEN}");
        let minted = send(
            admin,
            "POST",
            "/_pooler/page/login-codes",
            &[("authorization", bearer.as_str())],
        )
        .await;
        assert_eq!(minted.status, StatusCode::CREATED, "{}", minted.body);
        let minted: Value = serde_json::from_str(&minted.body).unwrap();
        let url = minted["url"].as_str().unwrap();
        assert!(!url.contains(TOKEN), "{url}");
        let path = url.strip_prefix("http://127.0.0.1:8787").unwrap();
        assert!(path.starts_with("/_pooler/page/login?code="), "{url}");
        let login = send(admin, "GET", path, &[]).await;
        assert_eq!(login.status, StatusCode::SEE_OTHER);
        assert_eq!(login.headers["location"], "/_pooler/page");
        let set = login.headers["set-cookie"].to_str().unwrap().to_owned();
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/_pooler"] {
            assert!(set.contains(attribute), "{set}");
        }
        let pair = set.split(';').next().unwrap().to_owned();
        assert!(pair.starts_with("pooler_session="), "{set}");
        let page = send(admin, "GET", "/_pooler/page", &[("cookie", pair.as_str())]).await;
        assert_eq!(page.status, StatusCode::OK);
        let csrf = page
            .body
            .split("name=\"pooler-csrf\" content=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .to_owned();
        assert_eq!(csrf.len(), 64, "{csrf}");
        (pair, csrf)
    }

    #[tokio::test]
    async fn without_a_cookie_the_page_and_the_api_are_401() {
        let (_dir, admin) = admin();
        let page = send(&admin, "GET", "/_pooler/page", &[]).await;
        assert_eq!(page.status, StatusCode::UNAUTHORIZED);
        assert!(page.body.contains("pooler page"), "{}", page.body);
        let api = send(&admin, "GET", "/_pooler/status", &[]).await;
        assert_eq!(api.status, StatusCode::UNAUTHORIZED);
        // A made-up cookie is no session.
        let forged = send(
            &admin,
            "GET",
            "/_pooler/status",
            &[("cookie", "pooler_session=00ff")],
        )
        .await;
        assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn a_signed_in_cookie_reads_the_page_and_the_api() {
        let (_dir, admin) = admin();
        let (cookie, _) = sign_in(&admin).await;
        let page = send(&admin, "GET", "/_pooler/page", &[("cookie", cookie.as_str())]).await;
        let csp = page.headers["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{csp}");
        assert!(page.headers["content-type"].to_str().unwrap().starts_with("text/html"));
        for asset in ["/_pooler/page/app.js", "/_pooler/page/app.css"] {
            let got = send(&admin, "GET", asset, &[("cookie", cookie.as_str())]).await;
            assert_eq!(got.status, StatusCode::OK, "{asset}");
            assert!(!got.body.is_empty());
            let anonymous = send(&admin, "GET", asset, &[]).await;
            assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{asset}");
        }
        let status = send(
            &admin,
            "GET",
            "/_pooler/status",
            &[("cookie", format!("other=1; {cookie}").as_str())],
        )
        .await;
        assert_eq!(status.status, StatusCode::OK, "{}", status.body);
    }

    #[tokio::test]
    async fn a_change_with_the_cookie_needs_the_same_origin_and_the_csrf_header() {
        let (_dir, admin) = admin();
        let (cookie, csrf) = sign_in(&admin).await;
        let path = "/_pooler/accounts/a1/enable";
        let host = ("host", "127.0.0.1:8787");
        let cases: [(&[(&str, &str)], &str); 4] = [
            (&[("cookie", cookie.as_str()), host], "no Origin"),
            (
                &[("cookie", cookie.as_str()), host, ("origin", "http://127.0.0.1:8787")],
                "x-pooler-csrf",
            ),
            (
                &[
                    ("cookie", cookie.as_str()),
                    host,
                    ("origin", "http://evil.example"),
                    ("x-pooler-csrf", csrf.as_str()),
                ],
                "another origin",
            ),
            (
                &[
                    ("cookie", cookie.as_str()),
                    host,
                    ("origin", "http://127.0.0.1:8787"),
                    ("x-pooler-csrf", "0000"),
                ],
                "x-pooler-csrf",
            ),
        ];
        for (headers, says) in cases {
            let answer = send(&admin, "POST", path, headers).await;
            assert_eq!(answer.status, StatusCode::FORBIDDEN, "{says}: {}", answer.body);
            assert_eq!(code_of(&answer), "csrf");
            assert!(answer.body.contains(says), "{}", answer.body);
        }
        // Same origin and the token: past the check (no pool here, so 503 from the area).
        let answer = send(
            &admin,
            "POST",
            path,
            &[
                ("cookie", cookie.as_str()),
                host,
                ("origin", "http://127.0.0.1:8787"),
                ("x-pooler-csrf", csrf.as_str()),
            ],
        )
        .await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{}", answer.body);
        // The admin token needs no CSRF header (the CLI).
        let bearer = format!("Bearer {TOKEN}");
        let answer = send(&admin, "POST", path, &[("authorization", bearer.as_str())]).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{}", answer.body);
    }

    #[tokio::test]
    async fn a_login_code_works_once() {
        let (_dir, admin) = admin();
        let (code, _) = admin.page.mint_code(admin.host().clock().now_ms()).unwrap();
        let path = format!("/_pooler/page/login?code={code}");
        assert_eq!(send(&admin, "GET", &path, &[]).await.status, StatusCode::SEE_OTHER);
        let again = send(&admin, "GET", &path, &[]).await;
        assert_eq!(again.status, StatusCode::UNAUTHORIZED);
        assert!(again.headers.get("set-cookie").is_none());
        assert!(again.body.contains("already used or has expired"));
        for made_up in ["/_pooler/page/login", "/_pooler/page/login?code=abc"] {
            assert_eq!(
                send(&admin, "GET", made_up, &[]).await.status,
                StatusCode::UNAUTHORIZED
            );
        }
    }

    #[test]
    fn codes_and_sessions_expire() {
        let auth = PageAuth::default();
        let (code, until) = auth.mint_code(1_000).unwrap();
        assert_eq!(until, 1_000 + CODE_TTL_MS);
        assert_eq!(auth.redeem(&code, until).unwrap(), None, "expired");
        assert_eq!(auth.redeem(&code, 1_000).unwrap(), None, "spent by the late try");
        let (code, until) = auth.mint_code(1_000).unwrap();
        let session = auth.redeem(&code, until - 1).unwrap().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            hyper::header::COOKIE,
            HeaderValue::from_str(&format!("{COOKIE}={}", session.id)).unwrap(),
        );
        assert_eq!(auth.session(&headers, session.expires_at - 1), Some(session.clone()));
        assert_eq!(auth.session(&headers, session.expires_at), None);
    }

    #[tokio::test]
    async fn the_admin_token_is_never_accepted_in_a_query_string() {
        let (_dir, admin) = admin();
        for query in ["token", "access_token", "admin_token", "authorization", "code"] {
            let path = format!("/_pooler/status?{query}={TOKEN}");
            assert_eq!(
                send(&admin, "GET", &path, &[]).await.status,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
        }
        // Nor as a login code.
        let path = format!("/_pooler/page/login?code={TOKEN}");
        assert_eq!(
            send(&admin, "GET", &path, &[]).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
}
