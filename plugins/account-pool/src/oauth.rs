//! OAuth decisions (spec §8, fixing #6167): when to refresh, what a refresh answer means,
//! how long to back off, and the token endpoint's request and response shapes; plus the
//! parsing of Claude Code and Codex CLI login files.

use crate::model::{OAuthTokens, Provider};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use pooler_plugin_kit::time::{FAR_FUTURE_MS, after, secs_to_ms};
use serde_json::{Value, json};

/// Refresh proactively when the access token expires within this time.
pub const REFRESH_AHEAD_MS: u64 = 5 * 60_000;
/// First backoff after a failed refresh.
pub const BACKOFF_START_MS: u64 = 1_000;
/// Longest backoff.
pub const BACKOFF_MAX_MS: u64 = 60_000;
/// How long a token endpoint's answer may take, from sending the refresh to its body's
/// last piece: a body still arriving after this is abandoned (the refresh fails as
/// transient). With the endpoint's own deadlines (30 s to the head, 30 s between pieces)
/// and the host's 10 s connect timeout, a refresh ends within
/// 10 s + [`REFRESH_BUDGET_MS`] + 30 s = 100 s of taking its lease.
pub const REFRESH_BUDGET_MS: u64 = 60_000;
/// How long a refresh lease is held before another request may take over: longer than the
/// slowest refresh (100 s, see [`REFRESH_BUDGET_MS`]), so a lease only expires under a
/// refresh that died with its instance. It was 15 s, less than a refresh may take: a
/// second request then took the lease and spent the same refresh token again.
/// A request that finds the lease taken waits this long at most for the refresh's token.
pub const LEASE_MS: u64 = 120_000;
/// Tokens with no stated lifetime are assumed to last this long.
const DEFAULT_LIFETIME_MS: u64 = 3_600_000;

/// The OAuth client ids of the CLIs whose logins the pool imports.
const CLAUDE_CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";
const CODEX_CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";

/// Whether a token needs a refresh before use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Valid beyond the refresh window (or expiry unknown).
    None,
    /// Still valid, but expires within 5 minutes: refresh, and keep using it if that fails.
    Proactive,
    /// Expired: it cannot be used without a refresh.
    Expired,
}

pub fn need(expires_at: Option<u64>, now: u64) -> Need {
    match expires_at {
        None => Need::None,
        Some(t) if t <= now => Need::Expired,
        Some(t) if t - now <= REFRESH_AHEAD_MS => Need::Proactive,
        Some(_) => Need::None,
    }
}

/// What a token endpoint answered.
#[derive(Debug, Clone, PartialEq)]
pub enum RefreshResult {
    /// New tokens.
    Refreshed(OAuthTokens),
    /// 400/401: the refresh token was refused (e.g. `invalid_grant`).
    Refused(u16),
    /// Anything else (other status, network error, unreadable body): try again later.
    Transient {
        retry_after_ms: Option<u64>,
        detail: String,
    },
}

/// What the account's state becomes after a refused refresh (#6167).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedEffect {
    /// The access token is still valid: keep serving, flag "sign-in needs attention",
    /// retry the refresh with backoff.
    KeepServing,
    /// The token has expired or the upstream refused it: the account is in error.
    MarkError,
}

/// A refused refresh errors the account only when its token can no longer be used.
pub fn on_refused(token_valid: bool) -> RefusedEffect {
    if token_valid {
        RefusedEffect::KeepServing
    } else {
        RefusedEffect::MarkError
    }
}

/// The next backoff: double the previous (1 s first), at least the endpoint's Retry-After,
/// at most 60 s.
pub fn next_backoff(previous_ms: Option<u64>, retry_after_ms: Option<u64>) -> u64 {
    let doubled = previous_ms.map_or(BACKOFF_START_MS, |p| {
        p.saturating_mul(2).max(BACKOFF_START_MS)
    });
    doubled.max(retry_after_ms.unwrap_or(0)).min(BACKOFF_MAX_MS)
}

/// The token endpoint request body (JSON): the refresh_token grant with the CLI's client
/// id.
pub fn refresh_request_body(provider: Provider, refresh_token: &str) -> Vec<u8> {
    let client_id = match provider {
        Provider::Claude => CLAUDE_CLIENT_ID,
        Provider::Codex => CODEX_CLIENT_ID,
    };
    json!({
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "client_id": client_id,
    })
    .to_string()
    .into_bytes()
}

/// Interpret a token endpoint answer. Expiry: `expires_at`, else now + `expires_in`, else
/// the access JWT's `exp`, else now + 1 h. A missing refresh token keeps the old one.
pub fn parse_refresh_response(
    status: u16,
    body: &[u8],
    retry_after_ms: Option<u64>,
    old: &OAuthTokens,
    now: u64,
) -> RefreshResult {
    if status == 400 || status == 401 {
        return RefreshResult::Refused(status);
    }
    if !(200..300).contains(&status) {
        return RefreshResult::Transient {
            retry_after_ms,
            detail: format!("token endpoint answered HTTP {status}"),
        };
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return RefreshResult::Transient {
            retry_after_ms,
            detail: "unreadable token response".into(),
        };
    };
    let Some(access) = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    else {
        return RefreshResult::Transient {
            retry_after_ms,
            detail: "token response without access_token".into(),
        };
    };
    let expires_at = v
        .get("expires_at")
        .and_then(Value::as_f64)
        .and_then(|n| crate::quota::parse_reset(&n.to_string()))
        .or_else(|| {
            v.get("expires_in")
                .and_then(Value::as_f64)
                .and_then(secs_to_ms)
                .map(|ms| after(now, ms))
        })
        .or_else(|| jwt_exp_ms(access))
        .unwrap_or(after(now, DEFAULT_LIFETIME_MS));
    RefreshResult::Refreshed(OAuthTokens {
        access_token: access.to_owned(),
        refresh_token: v
            .get("refresh_token")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map_or_else(|| old.refresh_token.clone(), str::to_owned),
        expires_at: Some(expires_at),
        chatgpt_account_id: old.chatgpt_account_id.clone(),
    })
}

/// The `exp` claim of a JWT, in milliseconds. The signature is not checked: the token
/// is ours to send, not to trust.
pub fn jwt_exp_ms(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    let exp = v.get("exp")?.as_f64()?;
    (exp.is_finite() && exp > 0.0).then_some(((exp * 1000.0) as u64).min(FAR_FUTURE_MS))
}

/// Parse a login file: Claude Code's `.credentials.json` (`claudeAiOauth.accessToken`,
/// `refreshToken`, `expiresAt` in ms) or Codex CLI's `auth.json` (`tokens.access_token`,
/// `refresh_token`, `account_id`; expiry from the access JWT). The error names what was
/// expected, never a value.
pub fn parse_login_file(provider: Provider, contents: &str) -> Result<OAuthTokens, String> {
    let v: Value =
        serde_json::from_str(contents).map_err(|_| "the login file is not JSON".to_owned())?;
    let text = |v: &Value, ptr: &str| -> Result<String, String> {
        v.pointer(ptr)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("missing {}", ptr.trim_start_matches('/').replace('/', ".")))
    };
    match provider {
        Provider::Claude => {
            let access = text(&v, "/claudeAiOauth/accessToken")?;
            Ok(OAuthTokens {
                refresh_token: text(&v, "/claudeAiOauth/refreshToken")?,
                expires_at: v
                    .pointer("/claudeAiOauth/expiresAt")
                    .and_then(Value::as_f64)
                    .and_then(|n| crate::quota::parse_reset(&n.to_string())),
                access_token: access,
                chatgpt_account_id: None,
            })
        }
        Provider::Codex => {
            let access = text(&v, "/tokens/access_token")?;
            Ok(OAuthTokens {
                refresh_token: text(&v, "/tokens/refresh_token")?,
                expires_at: jwt_exp_ms(&access),
                chatgpt_account_id: Some(text(&v, "/tokens/account_id")?),
                access_token: access,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 10_000_000;

    fn tokens() -> OAuthTokens {
        OAuthTokens {
            access_token: "old-at".into(),
            refresh_token: "old-rt".into(),
            expires_at: Some(NOW + 600_000),
            chatgpt_account_id: Some("acct".into()),
        }
    }

    #[test]
    fn refresh_need_by_expiry() {
        let table = [
            (None, Need::None),
            (Some(NOW + 600_000), Need::None),
            (Some(NOW + 300_000), Need::Proactive),
            (Some(NOW + 1), Need::Proactive),
            (Some(NOW), Need::Expired),
            (Some(NOW - 1), Need::Expired),
        ];
        for (exp, want) in table {
            assert_eq!(need(exp, NOW), want, "{exp:?}");
        }
    }

    /// #6167: a refused refresh errors the account only once the token is unusable.
    #[test]
    fn refused_refresh_keeps_a_valid_token_serving() {
        assert_eq!(on_refused(true), RefusedEffect::KeepServing);
        assert_eq!(on_refused(false), RefusedEffect::MarkError);
    }

    #[test]
    fn backoff_doubles_from_one_second_to_sixty() {
        let table = [
            (None, None, 1_000),
            (Some(1_000), None, 2_000),
            (Some(32_000), None, 60_000),
            (Some(60_000), None, 60_000),
            (None, Some(5_000), 5_000),
            (Some(2_000), Some(90_000), 60_000),
        ];
        for (prev, ra, want) in table {
            assert_eq!(next_backoff(prev, ra), want, "{prev:?} {ra:?}");
        }
    }

    #[test]
    fn token_responses_are_classified() {
        let old = tokens();
        let ok = parse_refresh_response(
            200,
            br#"{"access_token":"new","expires_in":3600}"#,
            None,
            &old,
            NOW,
        );
        match ok {
            RefreshResult::Refreshed(t) => {
                assert_eq!(t.access_token, "new");
                assert_eq!(t.refresh_token, "old-rt", "kept when none returned");
                assert_eq!(t.expires_at, Some(NOW + 3_600_000));
                assert_eq!(t.chatgpt_account_id.as_deref(), Some("acct"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_refresh_response(400, b"{}", None, &old, NOW),
            RefreshResult::Refused(400)
        );
        assert_eq!(
            parse_refresh_response(401, b"{}", None, &old, NOW),
            RefreshResult::Refused(401)
        );
        assert!(matches!(
            parse_refresh_response(503, b"", Some(7_000), &old, NOW),
            RefreshResult::Transient {
                retry_after_ms: Some(7_000),
                ..
            }
        ));
        assert!(matches!(
            parse_refresh_response(200, b"nope", None, &old, NOW),
            RefreshResult::Transient { .. }
        ));
        let body = refresh_request_body(Provider::Claude, "rt");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["grant_type"], "refresh_token");
        assert_eq!(v["refresh_token"], "rt");
    }

    /// A token lifetime of absurd length expires at the far future, never wrapping.
    #[test]
    fn a_huge_token_lifetime_saturates() {
        use pooler_plugin_kit::time::FAR_FUTURE_MS;
        let old = tokens();
        for body in [
            r#"{"access_token":"new","expires_in":1e300}"#,
            r#"{"access_token":"new","expires_in":1.8446744073709552e16}"#,
        ] {
            match parse_refresh_response(200, body.as_bytes(), None, &old, NOW) {
                RefreshResult::Refreshed(t) => {
                    assert_eq!(t.expires_at, Some(FAR_FUTURE_MS), "{body}");
                }
                other => panic!("{other:?}"),
            }
        }
        match parse_refresh_response(200, br#"{"access_token":"new"}"#, None, &old, u64::MAX) {
            RefreshResult::Refreshed(t) => assert_eq!(t.expires_at, Some(FAR_FUTURE_MS)),
            other => panic!("{other:?}"),
        }
    }

    fn jwt(exp: u64) -> String {
        let payload = URL_SAFE_NO_PAD.encode(json!({"exp": exp}).to_string());
        format!("h.{payload}.s")
    }

    #[test]
    fn login_files_parse_for_both_providers() {
        let claude = r#"{"claudeAiOauth":{"accessToken":"at","refreshToken":"rt","expiresAt":1700000000000,"scopes":[]}}"#;
        let t = parse_login_file(Provider::Claude, claude).unwrap();
        assert_eq!(
            (t.access_token.as_str(), t.expires_at),
            ("at", Some(1_700_000_000_000))
        );
        let codex = json!({"tokens":{"access_token": jwt(1_700_000_000), "refresh_token":"rt","account_id":"acc-1"}}).to_string();
        let t = parse_login_file(Provider::Codex, &codex).unwrap();
        assert_eq!(t.expires_at, Some(1_700_000_000_000));
        assert_eq!(t.chatgpt_account_id.as_deref(), Some("acc-1"));
        let err = parse_login_file(
            Provider::Codex,
            r#"{"tokens":{"access_token":"secret-value"}}"#,
        )
        .unwrap_err();
        assert!(
            err.contains("tokens.refresh_token") && !err.contains("secret-value"),
            "{err}"
        );
        assert!(parse_login_file(Provider::Claude, "nope").is_err());
    }
}
