//! AP-24, big bodies: a request body within the limits never traps the pool. Long strings
//! where the pool reads a session or a model (tens of MiB of them), and a body at the
//! configured maximum, are forwarded (a session id over 512 characters is no session id);
//! a body the pool's memory cannot hold gets the pool's 413, and a `max-request-body` the
//! memory cannot hold is refused when it is set. Each is answered without an ERROR line, and
//! the pool keeps serving.
//!
//! Every test of this file asserts that nothing in it logged an ERROR (a trapped pool logs
//! one with its backtrace), so no test here may log one on purpose.

use pooler_host::runtime::bindings::pool::exports::pooler::plugins::settings::SettingsError;
use pooler_host::runtime::bindings::types::Provider;
use pooler_tests::client::Answer;
use pooler_tests::logs::logs;
use pooler_tests::pool::{Pool, PoolSetup, SONNET, claude_body, oauth};
use serde_json::json;

const MIB: usize = 1 << 20;

/// No line at level ERROR was logged by this test binary (a trap logs one, with its
/// backtrace).
fn assert_no_error_logged() {
    let errors: Vec<_> = logs()
        .lines()
        .into_iter()
        .filter(|l| l.level == tracing::Level::ERROR)
        .map(|l| format!("{} {:?}", l.message, l.fields))
        .collect();
    assert!(errors.is_empty(), "ERROR lines: {errors:#?}");
}

/// The answer was forwarded upstream and relayed: 200, not the pool's own answer.
fn assert_forwarded(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 200, "{what}: {:.300}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), None, "{what}");
}

/// The pool still serves a plain request, and pins its session.
async fn assert_still_serving(pool: &Pool, session: &str) {
    let answer = match pool.provider {
        Provider::Claude => pool.send(pool.messages(session)).await,
        Provider::Codex => {
            pool.send(codex_request(pool, codex_body(json!({}), session)))
                .await
        }
    };
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(pool.pinned(session).await.is_some(), "{session} is pinned");
}

/// A Codex Responses body with `extra` members, and `thread-id` header `session`.
fn codex_body(extra: serde_json::Value, session: &str) -> (String, String) {
    let mut body = json!({"model": "gpt-5-codex", "input": [], "stream": true, "store": false});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    (body.to_string(), session.to_owned())
}

fn codex_request(
    pool: &Pool,
    (body, session): (String, String),
) -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    let mut request = pool.request("POST", "/v1/responses", body);
    if !session.is_empty() {
        request
            .headers_mut()
            .insert("thread-id", session.parse().unwrap());
    }
    request
}

/// The last body the upstream received is `sent`, byte for byte.
fn assert_received_whole(pool: &Pool, sent: &[u8]) {
    let received = pool.upstream.received();
    let last = &received.last().expect("a request upstream").body;
    assert_eq!(last.len(), sent.len());
    assert!(last.as_ref() == sent, "the body went upstream unchanged");
}

/// A 16 MiB model name is forwarded (the upstream judges it) with the session stated
/// beside it, which is read and pinned as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_16_mib_model_name_is_forwarded_without_a_trap() {
    let pool = Pool::claude().await;
    let user_id = json!({"device_id": "d1", "session_id": "S-model"}).to_string();
    let body = json!({
        "model": format!("claude-{}-sonnet", "x".repeat(16 * MIB)),
        "max_tokens": 16,
        "metadata": {"user_id": user_id},
        "messages": [{"role": "user", "content": "hi"}],
    })
    .to_string();
    let answer = pool
        .send(pool.request("POST", "/v1/messages", body.clone()))
        .await;
    assert_forwarded(&answer, "16 MiB model");
    assert_received_whole(&pool, body.as_bytes());
    assert_eq!(pool.pinned("S-model").await.as_deref(), Some("A"));
    assert_no_error_logged();
    assert_still_serving(&pool, "S-after").await;
}

/// A 16 MiB session id in `metadata.user_id`, in Claude Code's JSON form and in the legacy
/// `…_session_<id>` form, is no session id: each request is forwarded session-less (the
/// session header, when sent, is the session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_16_mib_user_id_session_is_no_session_and_is_forwarded() {
    let pool = Pool::claude().await;
    let long = "s".repeat(16 * MIB);
    let json_form = claude_body(&long, SONNET);
    let answer = pool
        .send(pool.request("POST", "/v1/messages", json_form.clone()))
        .await;
    assert_forwarded(&answer, "JSON form");
    assert_received_whole(&pool, json_form.as_bytes());

    let legacy = json!({
        "model": SONNET, "max_tokens": 16,
        "metadata": {"user_id": format!("user_ab_account_cd_session_{long}")},
        "messages": [{"role": "user", "content": "hi"}],
    })
    .to_string();
    let mut request = pool.request("POST", "/v1/messages", legacy.clone());
    request
        .headers_mut()
        .insert("x-claude-code-session-id", "S-header".parse().unwrap());
    let answer = pool.send(request).await;
    assert_forwarded(&answer, "legacy form");
    assert_received_whole(&pool, legacy.as_bytes());
    assert_eq!(
        pool.pinned("S-header").await.as_deref(),
        Some("A"),
        "the header's session, as the body states none that is valid"
    );
    assert_no_error_logged();
    assert_still_serving(&pool, "S-after").await;
}

/// A 10 MB session id on `/v1/responses`, stated where the Codex CLI states its id (as
/// `prompt_cache_key` and in `client_metadata`, 30 MB in all), or in the body's turn
/// metadata, is no session id: forwarded session-less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mb_codex_session_is_no_session_and_is_forwarded() {
    let pool = PoolSetup::new(Provider::Codex)
        .account(oauth(Provider::Codex, "A", None))
        .start()
        .await;
    let long = "t".repeat(10_000_000);
    let turn = json!({"thread_id": long}).to_string();
    for extra in [
        json!({
            "prompt_cache_key": long,
            "client_metadata": {"session_id": long, "thread_id": long},
        }),
        json!({"client_metadata": {"x-codex-turn-metadata": turn}, "prompt_cache_key": long}),
    ] {
        let (body, _) = codex_body(extra, "");
        let answer = pool
            .send(codex_request(&pool, (body.clone(), String::new())))
            .await;
        assert_forwarded(&answer, &body[..120]);
        assert_received_whole(&pool, body.as_bytes());
    }
    assert_no_error_logged();
    assert_still_serving(&pool, "T-after").await;
}

/// A body of exactly the configured maximum is forwarded whole, its session read: at the
/// defaults (32 MiB, the pool's memory 64 MiB), and with `max-request-body` (and the host's
/// `max-body-bytes`) raised to the most the default memory holds, which a maximum of 64 MiB
/// is refused with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_at_the_configured_maximum_is_forwarded() {
    let pool = PoolSetup::claude_keys(1)
        .config(&format!("[server]\nmax-body-bytes = {}\n", 64 * MIB))
        .start()
        .await;
    let default: usize = pool.get("max-request-body").await.parse().unwrap();
    assert_eq!(default, 32 * MIB);
    let body = padded_claude_body("S-default", default);
    let answer = pool
        .send(pool.request("POST", "/v1/messages", body.clone()))
        .await;
    assert_forwarded(&answer, "a body at the default maximum");
    assert_received_whole(&pool, &body);
    assert_eq!(pool.pinned("S-default").await.as_deref(), Some("A"));

    let refused = pool.set("max-request-body", &(64 * MIB).to_string()).await;
    let Err(SettingsError::InvalidValue(invalid)) = &refused else {
        panic!("64 MiB bodies in 64 MiB of memory: {refused:?}");
    };
    let most: usize = invalid
        .accepted
        .split("at most ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the most the memory holds: {}", invalid.accepted));
    assert!(
        (48 * MIB..64 * MIB).contains(&most),
        "64 MiB of memory holds a body of {most} bytes"
    );
    pool.set("max-request-body", &most.to_string())
        .await
        .unwrap();
    let body = padded_claude_body("S-max", most);
    let answer = pool
        .send(pool.request("POST", "/v1/messages", body.clone()))
        .await;
    assert_forwarded(&answer, "a body at the raised maximum");
    assert_received_whole(&pool, &body);
    assert_eq!(pool.pinned("S-max").await.as_deref(), Some("A"));
    assert_no_error_logged();
    assert_still_serving(&pool, "S-after").await;
}

/// A Claude body of session `session` exactly `len` bytes long, the conversation padding
/// it out.
fn padded_claude_body(session: &str, len: usize) -> Vec<u8> {
    let small = claude_body(session, SONNET);
    let with = |pad: usize| {
        let user_id = json!({"device_id": "d1", "session_id": session}).to_string();
        json!({
            "model": SONNET, "max_tokens": 16,
            "messages": [{"role": "user", "content": "x".repeat(pad)}],
            "metadata": {"user_id": user_id},
        })
        .to_string()
        .into_bytes()
    };
    let overhead = with(0).len();
    assert!(small.len() <= len && overhead <= len);
    let body = with(len - overhead);
    assert_eq!(body.len(), len);
    body
}

/// With the pool's memory capped below what a body needs, the body gets the pool's 413 (in
/// the provider's error shape, `x-pooler-origin: pool`), never a trap; a `max-request-body`
/// the memory cannot hold is refused when it is set, naming the memory; and the pool keeps
/// serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_memory_cannot_hold_gets_the_pools_413_and_such_a_limit_is_refused() {
    let pool = PoolSetup::claude_keys(1)
        .plugin("memory-mib = 24")
        .start()
        .await;
    // Stored before the memory was known to be too small: the default, 32 MiB.
    let body = padded_claude_body("S-big", 30 * MIB);
    let answer = pool.send(pool.request("POST", "/v1/messages", body)).await;
    assert_eq!(answer.status, 413, "{:.300}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    let error: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(error["type"], "error", "{}", answer.body);
    assert_eq!(
        error["error"]["type"], "request_too_large",
        "{}",
        answer.body
    );
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("memory"), "{message}");
    assert_eq!(pool.hits(), 0, "nothing reached the upstream");

    let refused = pool.set("max-request-body", &(32 * MIB).to_string()).await;
    let Err(SettingsError::InvalidValue(invalid)) = refused else {
        panic!("a limit the memory cannot hold was accepted: {refused:?}");
    };
    assert_eq!(invalid.key, "max-request-body");
    assert!(invalid.accepted.contains("memory"), "{}", invalid.accepted);
    pool.set("max-request-body", &(8 * MIB).to_string())
        .await
        .expect("a limit the memory holds");
    let body = padded_claude_body("S-fits", 8 * MIB);
    let answer = pool.send(pool.request("POST", "/v1/messages", body)).await;
    assert_forwarded(&answer, "a body at the lowered maximum");
    assert_no_error_logged();
    assert_still_serving(&pool, "S-after").await;
}

/// Bodies of random shapes up to the configured maximum, with the pool's memory capped at
/// 16 MiB and `max-request-body` at the most it holds: long strings wherever a session or
/// a model is read or skipped, long keys, nesting past what the pool reads, JSON held in
/// strings, and damage. None traps: each is forwarded (the upstream's answer relayed) or
/// gets the pool's 413, and the pool keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bodies_up_to_the_maximum_never_trap() {
    let pool = PoolSetup::claude_keys(1)
        .plugin("memory-mib = 16")
        .start()
        .await;
    let refused = pool.set("max-request-body", &(16 * MIB).to_string()).await;
    let Err(SettingsError::InvalidValue(invalid)) = &refused else {
        panic!("16 MiB bodies in 16 MiB of memory: {refused:?}");
    };
    let most: usize = invalid
        .accepted
        .split("at most ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    pool.set("max-request-body", &most.to_string())
        .await
        .unwrap();
    let mut r = Lcg(0x9e37_79b9_7f4a_7c15);
    for case in 0..12 {
        // Half the bodies exactly at the maximum, the rest near it or just past it.
        let target = match case % 4 {
            0 | 1 => most,
            2 => most - r.below(most / 2),
            _ => most + 1 + r.below(1000),
        };
        let share = most / 4;
        let mut body = serde_json::Map::new();
        body.insert("max_tokens".into(), json!(16));
        let model = if r.below(2) == 0 {
            r.text(share)
        } else {
            SONNET.into()
        };
        body.insert("model".into(), json!(model));
        let user_id = match r.below(4) {
            0 => json!(r.text(share)),
            1 => json!(json!({"session_id": r.text(share)}).to_string()),
            2 => json!({"session_id": r.text(600), "parent_session_id": r.text(share)}),
            _ => json!(format!("user_a_session_{}", r.text(700))),
        };
        body.insert("metadata".into(), json!({"user_id": user_id}));
        if r.below(3) == 0 {
            body.insert(r.text(share / 4), json!(1));
        }
        let deep = if r.below(4) == 0 { r.below(3_000) } else { 0 };
        // The conversation pads the body out to its target length.
        body.insert("messages".into(), json!([{"role": "user", "content": ""}]));
        let bare = serde_json::Value::Object(body.clone()).to_string().len();
        let extra = if deep > 0 { deep * 2 + 8 } else { 0 };
        let pad = target.saturating_sub(bare + extra);
        body.insert(
            "messages".into(),
            json!([{"role": "user", "content": "x".repeat(pad)}]),
        );
        let mut text = serde_json::Value::Object(body).to_string().into_bytes();
        if deep > 0 {
            // Nesting past what the pool reads, in a member it skips.
            text.pop();
            text.extend_from_slice(b",\"deep\":");
            text.extend(std::iter::repeat_n(b'[', deep));
            text.extend(std::iter::repeat_n(b']', deep));
            text.push(b'}');
        }
        if r.below(5) == 0 {
            let at = r.below(text.len());
            text[at] = [b'"', b'\\', 0x01, b'{', 0xff][r.below(5)];
        }
        let len = text.len();
        let answer = pool.send(pool.request("POST", "/v1/messages", text)).await;
        let own = answer.header("x-pooler-origin") == Some("pool");
        match (answer.status.as_u16(), own) {
            (413, true) => assert!(len > most, "case {case}: {len} bytes, within {most}"),
            (_, false) if answer.status != 500 => assert!(len <= most, "case {case}"),
            _ => panic!(
                "case {case}: {len} bytes: {} {:.300}",
                answer.status, answer.body
            ),
        }
    }
    assert_no_error_logged();
    assert_still_serving(&pool, "S-after").await;
}

/// A fixed linear congruential sequence: the same bodies on every run.
struct Lcg(u64);

impl Lcg {
    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as usize % n.max(1)
    }

    /// Text of up to `most` bytes: one piece repeated (quotes, backslashes, newlines,
    /// non-ASCII, `_session_`, JSON), as a string to be written as JSON.
    fn text(&mut self, most: usize) -> String {
        const PIECES: [&str; 8] = [
            "x",
            "é",
            "\n",
            "😀",
            "_session_",
            "\"",
            "\\",
            "{\"session_id\":\"s\"}",
        ];
        let piece = PIECES[self.below(PIECES.len())];
        piece.repeat(self.below(most) / piece.len() + 1)
    }
}
