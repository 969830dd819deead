//! The admin operations a person reaches through `pooler account update`, `route list` and
//! `session list`: replacing a credential in place, and listing routes and pinned sessions.

use super::*;
use crate::admin::AccountsError;
use crate::model::{AccountStatus, HoldKind, Provider};

/// A new API key replaces the old one in place: the id, label, priority, place in the order
/// and the session pinned to it survive; the error, a token hold and the sign-in flag clear;
/// `error-cleared` and `hold-ended` are signalled; the next request uses the new key.
#[test]
fn update_credential_keeps_the_account_and_its_pins_and_clears_its_error() {
    let p = Pool::abc();
    let a = p.id("a");
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a"]);
    p.admin().set_priority(&a, 7).unwrap();
    let store = p.store();
    store
        .set_error(&a, "API key refused (HTTP 401).", T0)
        .unwrap();
    store
        .set_hold(&a, T0 + 3_600_000, HoldKind::Token, T0)
        .unwrap();
    store.set_needs_sign_in(&a, true).unwrap();
    let seq = store.account(&a).unwrap().unwrap().seq;
    assert_eq!(p.status_of("a"), AccountStatus::Error);
    store.take_signals().unwrap();

    let info = p
        .admin()
        .update_credential(&a, Credential::ApiKey("a2".into()))
        .unwrap();
    assert_eq!(info.id, a);
    assert_eq!(info.label, "a");
    assert_eq!(info.priority, 7);
    assert!(info.enabled);
    assert_eq!(info.status, AccountStatus::Ready);
    assert_eq!(info.error, None);
    assert_eq!(info.held_until, None);
    assert!(!info.needs_sign_in);
    assert_eq!(info.secret_hint, "…a2");
    assert_eq!(store.account(&a).unwrap().unwrap().seq, seq);
    let signals = store.take_signals().unwrap();
    assert_eq!(signals.len(), 1, "{signals:?}");
    assert_eq!(signals[0].provider, Provider::Claude);
    assert_eq!(
        signals[0].causes,
        [ChangeCause::ErrorCleared, ChangeCause::HoldEnded]
    );
    assert_eq!(p.pinned(Provider::Claude, "S").as_deref(), Some("a"));
    // The session stays home, and goes upstream with the new key.
    assert_eq!(p.claude(Some("S")).status, 200);
    assert_eq!(p.up.seen(), ["a2"]);
}

/// A hold after a 429 is the account's quota, not its credential: it stays. The update is
/// still signalled (without `hold-ended`).
#[test]
fn update_credential_keeps_a_rate_limit_hold() {
    let p = Pool::abc();
    let a = p.id("a");
    p.store()
        .set_hold(&a, T0 + 3_600_000, HoldKind::RateLimit, T0)
        .unwrap();
    p.store().take_signals().unwrap();
    let info = p
        .admin()
        .update_credential(&a, Credential::ApiKey("a2".into()))
        .unwrap();
    assert_eq!(info.held_until, Some(T0 + 3_600_000));
    assert_eq!(info.status, AccountStatus::Held);
    let signals = p.store().take_signals().unwrap();
    assert_eq!(signals[0].causes, [ChangeCause::ErrorCleared]);
}

/// An OAuth account takes new tokens (Codex: with its ChatGPT account id); the kind may
/// change from API key to OAuth on Claude.
#[test]
fn update_credential_takes_new_tokens() {
    let p = Pool::abc();
    let x = p.add_oauth(Provider::Codex, "x", "at-old", None);
    let tokens = OAuthTokens {
        access_token: "at-new".into(),
        refresh_token: "rt-new".into(),
        expires_at: Some(T0 + 60_000),
        chatgpt_account_id: Some("acct-new".into()),
    };
    let info = p
        .admin()
        .update_credential(&x, Credential::OAuth(tokens.clone()))
        .unwrap();
    assert_eq!(info.token_expires_at, Some(T0 + 60_000));
    assert_eq!(
        p.store().credential(&x).unwrap(),
        Some(Credential::OAuth(tokens))
    );
    let a = p.id("a");
    let info = p
        .admin()
        .update_credential(
            &a,
            Credential::OAuth(OAuthTokens {
                access_token: "claude-at".into(),
                refresh_token: "claude-rt".into(),
                expires_at: None,
                chatgpt_account_id: None,
            }),
        )
        .unwrap();
    assert_eq!(info.kind, crate::model::CredentialKind::OAuth);
    assert_eq!(info.secret_hint, "oauth");
}

/// Refusals change nothing and signal nothing: an API key for Codex, a malformed
/// credential, an unknown id. No message repeats the value.
#[test]
fn update_credential_refuses_what_the_provider_cannot_take() {
    let p = Pool::abc();
    let x = p.add_oauth(Provider::Codex, "x", "at-old", None);
    let a = p.id("a");
    p.store().take_signals().unwrap();
    let before = p.store().credential(&x).unwrap();
    assert_eq!(
        p.admin()
            .update_credential(&x, Credential::ApiKey("sk-secret".into())),
        Err(AccountsError::ApiKeyNotSupported(Provider::Codex))
    );
    let missing_account = Credential::OAuth(OAuthTokens {
        access_token: "at-secret".into(),
        refresh_token: "rt-secret".into(),
        expires_at: None,
        chatgpt_account_id: None,
    });
    let err = p
        .admin()
        .update_credential(&x, missing_account)
        .unwrap_err();
    assert!(
        matches!(&err, AccountsError::InvalidCredential(m) if m.contains("chatgpt-account-id") && !m.contains("secret")),
        "{err:?}"
    );
    assert_eq!(p.store().credential(&x).unwrap(), before);
    assert!(matches!(
        p.admin()
            .update_credential(&a, Credential::ApiKey("  ".into())),
        Err(AccountsError::InvalidCredential(_))
    ));
    assert_eq!(
        p.store().credential(&a).unwrap(),
        Some(Credential::ApiKey("a".into()))
    );
    assert_eq!(
        p.admin()
            .update_credential("nope", Credential::ApiKey("k".into())),
        Err(AccountsError::NoSuchAccount("nope".into()))
    );
    assert!(p.store().take_signals().unwrap().is_empty());
}

/// Routes list by thread then provider, filtered by provider, and never carry a token.
#[test]
fn list_routes_shows_open_routes_without_tokens() {
    let p = Pool::new();
    p.env.advance(5);
    let t2 = p
        .admin()
        .open_route("t0", Provider::Claude, "http://127.0.0.1:8787")
        .unwrap();
    let all = p.admin().list_routes(None).unwrap();
    let seen: Vec<_> = all
        .iter()
        .map(|r| (r.thread.as_str(), r.provider, r.opened_at))
        .collect();
    assert_eq!(
        seen,
        [
            ("t0", Provider::Claude, T0 + 5),
            ("t1", Provider::Claude, T0),
            ("t1", Provider::Codex, T0),
        ]
    );
    let text = format!("{all:?}");
    for token in [&p.claude_token, &p.codex_token, &t2.token] {
        assert!(!text.contains(token.as_str()), "{text}");
    }
    let codex = p.admin().list_routes(Some(Provider::Codex)).unwrap();
    assert_eq!(codex.len(), 1);
    assert_eq!(codex[0].thread, "t1");
    p.admin().close_route("t1", Provider::Codex).unwrap();
    assert!(
        p.admin()
            .list_routes(Some(Provider::Codex))
            .unwrap()
            .is_empty()
    );
}

/// Sessions list most recently used first, filter by thread and provider, and drop out
/// once their pin expires.
#[test]
fn list_sessions_filters_by_thread_and_provider() {
    let p = Pool::abc();
    let a = p.id("a");
    let store = p.store();
    let lifetime = store.settings().unwrap().pin_lifetime_ms;
    let bind = |provider, key: &str, thread: Option<&str>| {
        assert!(
            store
                .bind_pin(
                    provider,
                    key,
                    &a,
                    thread,
                    None,
                    p.env.now(),
                    lifetime,
                    "test",
                    100
                )
                .unwrap()
        );
        p.env.advance(10);
    };
    bind(Provider::Claude, "session:one", Some("t1"));
    bind(Provider::Claude, "session:two", Some("t2"));
    bind(Provider::Codex, "session:three", Some("t1"));
    bind(Provider::Claude, "cache:four", None);
    let keys = |thread: Option<&str>, provider| -> Vec<String> {
        p.admin()
            .list_sessions(thread, provider)
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect()
    };
    assert_eq!(
        keys(None, None),
        ["cache:four", "session:three", "session:two", "session:one"]
    );
    assert_eq!(keys(Some("t1"), None), ["session:three", "session:one"]);
    assert_eq!(keys(Some("t1"), Some(Provider::Claude)), ["session:one"]);
    assert_eq!(
        keys(None, Some(Provider::Claude)),
        ["cache:four", "session:two", "session:one"]
    );
    assert_eq!(keys(Some("t9"), None), Vec::<String>::new());
    let one = p.admin().list_sessions(Some("t2"), None).unwrap().remove(0);
    assert_eq!(one.account, a);
    assert_eq!(one.thread.as_deref(), Some("t2"));
    assert_eq!(one.last_used_at, T0 + 10);
    assert_eq!(one.expires_at, T0 + 10 + lifetime);
    assert!(!one.provisional);
    assert!(matches!(
        p.admin().list_sessions(Some(""), None),
        Err(crate::admin::RoutingError::InvalidThread(_))
    ));
    // `session:one` was used at T0: it expires first.
    p.env.advance(lifetime - 40);
    assert_eq!(keys(Some("t1"), None), ["session:three"]);
}
