//! `pooler account login`: signing in to a Claude or Codex subscription without the
//! provider's own CLI, in this process (it is interactive), then storing the tokens through
//! the admin API like any other OAuth credential. `docs/login-flows.md` says where each
//! endpoint and parameter comes from.
//!
//! - **Claude**: OAuth 2.0 authorization code with PKCE (S256), as Claude Code signs in: the
//!   person opens the authorize URL, signs in, and pastes back the `CODE#STATE` the callback
//!   page shows (or the whole callback URL); the code is exchanged at the token URL with a
//!   JSON request.
//! - **Codex**: the device-code flow of `codex login --device-auth`: the person enters a user
//!   code at the verification page while this process polls; the authorization code it then
//!   receives (with the PKCE pair the server made) is exchanged at `/oauth/token` with a form
//!   request. The ChatGPT account id comes from the id token's claims.
//!
//! Every endpoint can be overridden (flags and environment), so tests point them at fakes on
//! loopback. Nothing secret is ever printed or put in an error message: not the codes, the
//! verifier, the state or the tokens (the user code is shown: the person must type it).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::UsageError;
use super::format::now_ms;

/// Claude Code's public OAuth client id.
pub const CLAUDE_CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
/// Where Claude Code sends a person to sign in.
pub const CLAUDE_AUTHORIZE_URL: &str = "https://claude.ai/oauth/authorize";
/// Where Claude Code exchanges the code.
pub const CLAUDE_TOKEN_URL: &str = "https://console.anthropic.com/v1/oauth/token";
/// The callback page that shows the person `CODE#STATE` to paste back.
pub const CLAUDE_REDIRECT_URI: &str = "https://console.anthropic.com/oauth/code/callback";
/// The scopes Claude Code asks for.
pub const CLAUDE_SCOPES: &str = "org:create_api_key user:profile user:inference";
/// Codex CLI's public OAuth client id.
pub const CODEX_CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
/// Codex CLI's OAuth issuer.
pub const CODEX_ISSUER: &str = "https://auth.openai.com";
/// How long Codex CLI waits for a device code to be entered.
pub const DEVICE_CODE_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// How long one call to an OAuth endpoint may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read from an OAuth endpoint.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// The tokens of a finished sign-in: the admin API's `oauth` credential.
#[derive(Clone)]
pub struct Tokens {
    /// The OAuth access token the pool sends upstream.
    pub access_token: String,
    /// The refresh token the pool renews the access token with.
    pub refresh_token: String,
    /// Epoch milliseconds, when known.
    pub expires_at: Option<u64>,
    /// Codex only.
    pub chatgpt_account_id: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(<redacted>)")
    }
}

impl Tokens {
    /// The admin API's `credential` object.
    pub fn credential(&self) -> Value {
        json!({ "oauth": {
            "access_token": self.access_token,
            "refresh_token": self.refresh_token,
            "expires_at": self.expires_at,
            "chatgpt_account_id": self.chatgpt_account_id,
        }})
    }
}

/// Where the person is told things (the authorize URL, the user code, progress): standard
/// error, so standard output carries only the result (`--json`).
fn tell(text: &str) {
    eprintln!("{text}");
}

/// 32 random bytes, base64url without padding (43 characters).
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no random source: {e}"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// The PKCE S256 challenge of a verifier: base64url(SHA-256(verifier)).
pub fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// `application/x-www-form-urlencoded` body or query string of `pairs`. A space is `%20`
/// rather than `+` (both mean a space there; `%20` also reads right to a plain URL decoder).
fn form(pairs: &[(&str, &str)]) -> String {
    let encode =
        |text| percent_encoding::utf8_percent_encode(text, crate::operate::wire::COMPONENT);
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Decode a query component (`+` is a space, as a browser writes it).
fn query_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// An OAuth error code (`invalid_grant`) from an error answer, when it is one: a short
/// word, safe to show. Descriptions are never shown (they may quote what was sent).
fn oauth_error_code(answer: &Value) -> Option<String> {
    let code = answer.get("error")?;
    let code = code
        .as_str()
        .or_else(|| code.get("code").and_then(Value::as_str))?;
    let plain = !code.is_empty()
        && code.len() <= 64
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit());
    plain.then(|| code.to_owned())
}

/// A small HTTPS (and, for fakes on loopback, plain HTTP) client for the OAuth endpoints,
/// on the host's own rustls and webpki roots.
pub struct OAuthHttp {
    http: HttpClient<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// What an OAuth endpoint answered: its status and its body as JSON (`null` when it was
/// not JSON).
pub struct Answer {
    /// The HTTP status the endpoint answered with.
    pub status: StatusCode,
    /// The body parsed as JSON; `null` when it was not JSON.
    pub body: Value,
}

impl OAuthHttp {
    /// A client with a 10-second connect timeout; loopback may be plain HTTP, the rest HTTPS.
    pub fn new() -> OAuthHttp {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        OAuthHttp {
            http: HttpClient::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// POST `body` (of `content_type`) to `url`. A transport failure names the endpoint's
    /// URL (configuration, never a secret) and what failed.
    pub async fn post(
        &self,
        url: &str,
        content_type: &str,
        body: String,
    ) -> anyhow::Result<Answer> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(CONTENT_TYPE, content_type)
            .header(ACCEPT, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("pooler/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body)))
            .with_context(|| format!("{url} is not a usable URL"))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| anyhow::anyhow!("{url} could not be reached ({e})"))?;
            let status = response.status();
            let bytes = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|_| anyhow::anyhow!("the answer of {url} was cut off or too large"))?
                .to_bytes();
            Ok::<_, anyhow::Error>(Answer {
                status,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            })
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                anyhow::anyhow!("{url} did not answer within {}s", CALL_TIMEOUT.as_secs())
            })?
    }

    async fn post_json(&self, url: &str, body: &Value) -> anyhow::Result<Answer> {
        self.post(url, "application/json", body.to_string()).await
    }
}

impl Default for OAuthHttp {
    fn default() -> Self {
        Self::new()
    }
}

// ---- Claude: authorization code with PKCE ------------------------------------------------

/// Where Claude's sign-in happens (each overridable for tests).
#[derive(Debug, Clone)]
pub struct ClaudeEndpoints {
    /// The page the person is sent to, to sign in.
    pub authorize_url: String,
    /// Where the authorization code is exchanged for tokens.
    pub token_url: String,
    /// The redirect URI registered for the client: the page that shows `CODE#STATE`.
    pub redirect_uri: String,
    /// The public OAuth client id.
    pub client_id: String,
    /// The scopes asked for, space-separated.
    pub scopes: String,
}

impl Default for ClaudeEndpoints {
    fn default() -> Self {
        ClaudeEndpoints {
            authorize_url: CLAUDE_AUTHORIZE_URL.into(),
            token_url: CLAUDE_TOKEN_URL.into(),
            redirect_uri: CLAUDE_REDIRECT_URI.into(),
            client_id: CLAUDE_CLIENT_ID.into(),
            scopes: CLAUDE_SCOPES.into(),
        }
    }
}

/// One Claude sign-in in progress: its PKCE verifier and state. `Debug` shows neither.
pub struct ClaudeSignIn {
    verifier: String,
    state: String,
    endpoints: ClaudeEndpoints,
}

impl std::fmt::Debug for ClaudeSignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaudeSignIn(<redacted>)")
    }
}

impl ClaudeSignIn {
    /// Start a sign-in with a fresh random PKCE verifier and state.
    pub fn start(endpoints: ClaudeEndpoints) -> anyhow::Result<ClaudeSignIn> {
        Ok(ClaudeSignIn {
            verifier: random_token()?,
            state: random_token()?,
            endpoints,
        })
    }

    /// The URL the person opens to sign in.
    pub fn authorize_url(&self) -> String {
        let e = &self.endpoints;
        let query = form(&[
            ("code", "true"),
            ("client_id", &e.client_id),
            ("response_type", "code"),
            ("redirect_uri", &e.redirect_uri),
            ("scope", &e.scopes),
            ("code_challenge", &pkce_challenge(&self.verifier)),
            ("code_challenge_method", "S256"),
            ("state", &self.state),
        ]);
        let sep = if e.authorize_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{sep}{query}", e.authorize_url)
    }

    /// Exchange what the person pasted (`CODE#STATE`, or the callback URL with `code` and
    /// `state` in its query) for tokens. A paste that is neither is a usage error (exit 2);
    /// a state that is not this sign-in's, or a refused exchange, fails (exit 1).
    pub async fn finish(&self, http: &OAuthHttp, pasted: &str, now: u64) -> anyhow::Result<Tokens> {
        let (code, state) = parse_pasted_code(pasted)?;
        if state != self.state {
            bail!(
                "the pasted code belongs to another sign-in (its state does not match this one's): \
                 nothing was stored; run `pooler account login` again and paste the code it leads to"
            );
        }
        let e = &self.endpoints;
        let answer = http
            .post_json(
                &e.token_url,
                &json!({
                    "grant_type": "authorization_code",
                    "code": code,
                    "state": state,
                    "client_id": e.client_id,
                    "redirect_uri": e.redirect_uri,
                    "code_verifier": self.verifier,
                }),
            )
            .await?;
        if !answer.status.is_success() {
            return Err(refused_exchange(&answer));
        }
        tokens_from(&answer.body, now, None)
    }
}

/// `CODE#STATE`, or a callback URL whose query has `code` and `state`.
pub fn parse_pasted_code(pasted: &str) -> anyhow::Result<(String, String)> {
    let pasted = pasted.trim();
    let unusable = || {
        UsageError(
            "paste the code exactly as the sign-in page shows it (CODE#STATE), or the whole \
             callback URL"
                .to_owned(),
        )
    };
    if let Some((_, query)) = pasted.split_once('?')
        && (pasted.starts_with("http://") || pasted.starts_with("https://"))
    {
        let query = query.split('#').next().unwrap_or("");
        let mut code = None;
        let mut state = None;
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "code" => code = query_decode(v),
                "state" => state = query_decode(v),
                _ => {}
            }
        }
        return match (code, state) {
            (Some(c), Some(s)) if !c.is_empty() && !s.is_empty() => Ok((c, s)),
            _ => Err(unusable().into()),
        };
    }
    match pasted.split_once('#') {
        Some((code, state))
            if !code.is_empty()
                && !state.is_empty()
                && !state.contains('#')
                && !pasted.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            Ok((code.to_owned(), state.to_owned()))
        }
        _ => Err(unusable().into()),
    }
}

/// The error for a token endpoint's refusal: its status and OAuth error code, never its
/// description.
fn refused_exchange(answer: &Answer) -> anyhow::Error {
    let code = oauth_error_code(&answer.body);
    let status = answer.status.as_u16();
    let what = match code.as_deref() {
        Some(c) => format!("HTTP {status}, {c}"),
        None => format!("HTTP {status}"),
    };
    if code.as_deref() == Some("invalid_grant") {
        anyhow::anyhow!(
            "the token endpoint refused the code ({what}): it expired, was already used or was \
             mistyped; nothing was stored; run `pooler account login` again"
        )
    } else {
        anyhow::anyhow!("the token endpoint refused the sign-in ({what}); nothing was stored")
    }
}

/// The tokens of a token endpoint's success answer. `expires_in` (seconds) sets the expiry,
/// else the access token's JWT `exp`, else unknown.
fn tokens_from(
    body: &Value,
    now: u64,
    chatgpt_account_id: Option<String>,
) -> anyhow::Result<Tokens> {
    let field = |name: &str| {
        body.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
    };
    let access_token = field("access_token")
        .context("the token endpoint's answer has no access_token; nothing was stored")?;
    let refresh_token = field("refresh_token")
        .context("the token endpoint's answer has no refresh_token; nothing was stored")?;
    let expires_at = body
        .get("expires_in")
        .and_then(Value::as_u64)
        .map(|s| now.saturating_add(s.saturating_mul(1000)))
        .or_else(|| {
            jwt_claims(&access_token)?
                .get("exp")?
                .as_u64()
                .map(|s| s * 1000)
        });
    Ok(Tokens {
        access_token,
        refresh_token,
        expires_at,
        chatgpt_account_id,
    })
}

/// The claims of a JWT (its signature is not checked: the token came straight from the
/// issuer over TLS).
fn jwt_claims(jwt: &str) -> Option<Value> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The ChatGPT account id in an OpenAI id token's `https://api.openai.com/auth` claims.
pub fn chatgpt_account_id(id_token: &str) -> Option<String> {
    jwt_claims(id_token)?
        .get("https://api.openai.com/auth")?
        .get("chatgpt_account_id")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

// ---- Codex: device code ---------------------------------------------------------------

/// Where Codex's sign-in happens (overridable for tests).
#[derive(Debug, Clone)]
pub struct CodexEndpoints {
    /// The issuer: `…/api/accounts/deviceauth/{usercode,token}`, `…/codex/device`,
    /// `…/oauth/token` and `…/deviceauth/callback` hang off it.
    pub issuer: String,
    /// The public OAuth client id.
    pub client_id: String,
    /// How long to wait for the person to enter the code.
    pub lifetime: Duration,
}

impl Default for CodexEndpoints {
    fn default() -> Self {
        CodexEndpoints {
            issuer: CODEX_ISSUER.into(),
            client_id: CODEX_CLIENT_ID.into(),
            lifetime: DEVICE_CODE_LIFETIME,
        }
    }
}

/// Sign in to Codex with a device code: show the user code, poll until it is entered,
/// exchange the authorization code.
pub async fn codex_device_login(http: &OAuthHttp, e: &CodexEndpoints) -> anyhow::Result<Tokens> {
    let issuer = e.issuer.trim_end_matches('/');
    let api = format!("{issuer}/api/accounts");
    let answer = http
        .post_json(
            &format!("{api}/deviceauth/usercode"),
            &json!({ "client_id": e.client_id }),
        )
        .await?;
    if answer.status == StatusCode::NOT_FOUND {
        bail!("device code sign-in is not enabled at {issuer}; nothing was stored");
    }
    if !answer.status.is_success() {
        bail!(
            "the device code request was refused (HTTP {}); nothing was stored",
            answer.status.as_u16()
        );
    }
    let text = |name: &str| {
        answer
            .body
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let device_auth_id = text("device_auth_id")
        .context("the device code answer has no device_auth_id; nothing was stored")?;
    let user_code = text("user_code")
        .or_else(|| text("usercode"))
        .context("the device code answer has no user_code; nothing was stored")?;
    // Codex's server sends the interval as a string of seconds; accept a number too.
    let interval = match answer.body.get("interval") {
        Some(Value::String(s)) => s.trim().parse().ok(),
        Some(v) => v.as_u64(),
        None => None,
    }
    .unwrap_or(5);
    tell(&format!(
        "To sign in to Codex:\n  1. open {issuer}/codex/device and sign in\n  2. enter this one-time code (it expires in {} minutes): {}\n\nNever share this code. Waiting…",
        e.lifetime.as_secs() / 60,
        super::format::visible(&user_code)
    ));

    let started = Instant::now();
    let code = loop {
        let answer = http
            .post_json(
                &format!("{api}/deviceauth/token"),
                &json!({ "device_auth_id": device_auth_id, "user_code": user_code }),
            )
            .await?;
        if answer.status.is_success() {
            break answer.body;
        }
        let pending = matches!(answer.status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND);
        let error = oauth_error_code(&answer.body);
        match error.as_deref() {
            Some("expired_token") => bail!(
                "the device code expired before the sign-in was completed; nothing was stored; \
                 run `pooler account login --provider codex` again"
            ),
            Some("access_denied") => bail!("the sign-in was denied; nothing was stored"),
            _ if !pending => bail!(
                "device sign-in failed (HTTP {}); nothing was stored",
                answer.status.as_u16()
            ),
            _ => {}
        }
        if started.elapsed() >= e.lifetime {
            bail!(
                "the device code expired ({} minutes) before the sign-in was completed; nothing \
                 was stored; run `pooler account login --provider codex` again",
                e.lifetime.as_secs() / 60
            );
        }
        let wait = Duration::from_secs(interval).min(e.lifetime.saturating_sub(started.elapsed()));
        tokio::time::sleep(wait).await;
    };
    let field = |name: &str| {
        code.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let (Some(authorization_code), Some(code_verifier)) =
        (field("authorization_code"), field("code_verifier"))
    else {
        bail!("the device sign-in answer has no authorization code; nothing was stored");
    };
    let answer = http
        .post(
            &format!("{issuer}/oauth/token"),
            "application/x-www-form-urlencoded",
            form(&[
                ("grant_type", "authorization_code"),
                ("code", &authorization_code),
                ("redirect_uri", &format!("{issuer}/deviceauth/callback")),
                ("client_id", &e.client_id),
                ("code_verifier", &code_verifier),
            ]),
        )
        .await?;
    if !answer.status.is_success() {
        return Err(refused_exchange(&answer));
    }
    let account = answer
        .body
        .get("id_token")
        .and_then(Value::as_str)
        .and_then(chatgpt_account_id)
        .context(
            "the token endpoint's answer has no id token with a ChatGPT account id; nothing was \
             stored",
        )?;
    tokens_from(&answer.body, now_ms(), Some(account))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7636 appendix B's example pair.
    #[test]
    fn the_pkce_challenge_is_rfc_7636_s256() {
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn a_pasted_code_is_code_hash_state_or_a_callback_url() {
        assert_eq!(
            parse_pasted_code("  abc#st-1\n").unwrap(),
            ("abc".into(), "st-1".into())
        );
        assert_eq!(
            parse_pasted_code(
                "https://console.anthropic.com/oauth/code/callback?code=a%2Bb&state=s"
            )
            .unwrap(),
            ("a+b".into(), "s".into())
        );
        for bad in [
            "",
            "abc",
            "#s",
            "abc#",
            "a#b#c",
            "a b#c",
            "https://x/cb?code=a",
        ] {
            let e = parse_pasted_code(bad).unwrap_err();
            assert!(e.downcast_ref::<UsageError>().is_some(), "{bad:?}");
        }
    }

    #[test]
    fn the_authorize_url_carries_every_parameter_and_no_verifier() {
        let sign_in = ClaudeSignIn::start(ClaudeEndpoints::default()).unwrap();
        let url = sign_in.authorize_url();
        assert!(
            url.starts_with("https://claude.ai/oauth/authorize?code=true&"),
            "{url}"
        );
        for part in [
            "client_id=9d1c250a-e61b-44d9-88ed-5944d1962f5e",
            "response_type=code",
            "redirect_uri=https%3A%2F%2Fconsole.anthropic.com%2Foauth%2Fcode%2Fcallback",
            "scope=org%3Acreate_api_key%20user%3Aprofile%20user%3Ainference",
            "code_challenge_method=S256",
            &format!("code_challenge={}", pkce_challenge(&sign_in.verifier)),
            &format!("state={}", sign_in.state),
        ] {
            assert!(url.contains(part), "{part} missing from {url}");
        }
        assert!(!url.contains(&sign_in.verifier));
        assert!(!format!("{sign_in:?}").contains(&sign_in.verifier));
    }

    #[test]
    fn token_answers_set_the_expiry_and_account_id() {
        let claims = URL_SAFE_NO_PAD.encode(
            json!({"exp": 2_000_000_000u64, "https://api.openai.com/auth": {"chatgpt_account_id": "acct-9"}})
                .to_string(),
        );
        let jwt = format!("h.{claims}.s");
        assert_eq!(chatgpt_account_id(&jwt).as_deref(), Some("acct-9"));
        assert_eq!(chatgpt_account_id("not-a-jwt"), None);
        let t = tokens_from(
            &json!({"access_token": "a", "refresh_token": "r", "expires_in": 60}),
            1000,
            None,
        )
        .unwrap();
        assert_eq!(t.expires_at, Some(61_000));
        let t = tokens_from(
            &json!({"access_token": jwt, "refresh_token": "r"}),
            1000,
            None,
        )
        .unwrap();
        assert_eq!(t.expires_at, Some(2_000_000_000_000));
        assert!(tokens_from(&json!({"access_token": "a"}), 0, None).is_err());
        assert_eq!(format!("{t:?}"), "Tokens(<redacted>)");
    }

    #[test]
    fn only_plain_oauth_error_codes_are_shown() {
        assert_eq!(
            oauth_error_code(&json!({"error": "invalid_grant", "error_description": "secret"})),
            Some("invalid_grant".into())
        );
        assert_eq!(oauth_error_code(&json!({"error": "Bearer abc.def"})), None);
        assert_eq!(
            oauth_error_code(&json!({"error": {"code": "expired_token"}})),
            Some("expired_token".into())
        );
        assert_eq!(oauth_error_code(&Value::Null), None);
    }
}
