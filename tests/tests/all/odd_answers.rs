//! Odd answers and growth: what a hostile or broken upstream, a bad setting or an odd client
//! request gets from the real pool in the real host — a clear status, never a corrupted body,
//! a hold until year 9999, an internal error text, or unbounded storage.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::settings::SettingsError;
use pooler_host::runtime::roles::Role;
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::harness::{Setup, TestHost, find_file};
use pooler_tests::pool::{Pool, PoolSetup, SOON, five_hour_rejected, reply};
use pooler_tests::raw::{RawUpstream, exchange, read_answer};
use pooler_tests::upstream::Reply;
use tokio::io::AsyncWriteExt;

/// 30 days in seconds: the horizon past which a Retry-After or a reset is unknown.
const HORIZON_SECS: u64 = 30 * 86_400;

/// CRC-32 (IEEE), for a gzip member built by hand.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// `data` as a gzip member with one stored (uncompressed) deflate block: real gzip, no
/// compressor needed.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let len = u16::try_from(data.len()).expect("one stored block");
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.push(1);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The pool asks for bodies it can read (`accept-encoding: identity`); an upstream that
/// compresses anyway has its body relayed byte for byte with its `content-encoding`, so the
/// client can decode it (it used to arrive compressed with the header stripped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_upstream_body_reaches_the_client_with_its_encoding() {
    let pool = Pool::claude().await;
    let json = br#"{"type":"message","content":[{"type":"text","text":"hi"}]}"#;
    let gz = gzip_stored(json);
    pool.upstream.push(
        Reply::status(200)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(gz.clone()),
    );
    let response = tokio::time::timeout(SOON, pool.client.open(pool.messages("S")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap()),
        Some("gzip"),
        "{:?}",
        response.headers()
    );
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body.as_ref(), gz.as_slice(), "relayed byte for byte");
    let sent = &pool.upstream.received()[0];
    assert_eq!(
        sent.header("accept-encoding"),
        Some("identity"),
        "{:?}",
        sent.headers
    );
}

/// `Retry-After: Fri, 31 Dec 9999 23:59:59 GMT` is past the 30-day horizon: unknown, as if
/// absent. The account is not held until year 9999, the client is never told to wait
/// 251606013630 s, and once the short hold of an unknown Retry-After ends the account
/// serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_in_year_9999_holds_nothing_until_then() {
    let pool = PoolSetup::claude_keys(1).start().await;
    let far = "Fri, 31 Dec 9999 23:59:59 GMT";
    for _ in 0..2 {
        pool.upstream.push(
            pooler_tests::provider::claude::error(429, "rate_limit_error", "slow down")
                .header("retry-after", far),
        );
    }
    let (answer, _) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    let told = answer
        .header("retry-after")
        .map(|v| v.parse::<u64>().expect("seconds"));
    assert!(
        told.is_none_or(|s| s <= HORIZON_SECS),
        "the client was told to wait {told:?} s"
    );
    let a = pool.account("A").await;
    assert!(
        a.held_until
            .is_none_or(|t| t <= pool.now() + HORIZON_SECS * 1000),
        "held until {:?}",
        a.held_until
    );
    pool.advance(Duration::from_secs(60));
    let hits = pool.hits();
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(pool.hits(), hits + 1, "A was asked again");
}

/// A unified 5-hour reset in year 9999 is past the horizon: the window is refused with no
/// known reset, so the pool's 429 says `Retry-After: 60` and availability says
/// `reset-unknown` (both from the one verdict), not a wait of eight thousand years.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unified_reset_in_year_9999_is_an_unknown_reset() {
    let pool = PoolSetup::claude_keys(1).start().await;
    pool.upstream
        .push(reply(429, &five_hour_rejected(Some(253_402_300_799_000))));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert_eq!(answer.header("retry-after"), Some("60"));
    assert_eq!(
        pool.availability(pooler_tests::pool::THREAD, None).await,
        "unavailable(ResetUnknown)"
    );
}

/// An upstream that answers a plain POST with `101 Switching Protocols` gave no answer the
/// client can use: a transport failure, retried by the transient rules (the first try and
/// two retries), then the pool's 502 — never a 101 relayed to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_101_is_a_transport_failure() {
    let upstream =
        RawUpstream::start(Reply::status(101).header("upgrade", "websocket").to_http1()).await;
    let pool = PoolSetup::claude_keys(1).start().await;
    pool.set("claude-upstream-url", &upstream.url())
        .await
        .unwrap();
    let (answer, _) = pool.drive(pool.messages("S")).await;
    assert_eq!(answer.status, 502, "{}", answer.body);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["type"], "error", "{}", answer.body);
    assert_eq!(upstream.answered(), 3, "one try and two transient retries");
}

/// `CONNECT 127.0.0.1:22` and other methods the pool does not serve get 405 in the pool's
/// error shape (Claude's envelope, `x-pooler-origin: pool`), never a 502 with internal text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_other_unserved_methods_get_405_in_the_pools_shape() {
    let pool = PoolSetup::claude_keys(1).start().await;
    let addr = pool.host.addr().unwrap();
    let requests = [
        "CONNECT 127.0.0.1:22 HTTP/1.1\r\nhost: 127.0.0.1:22\r\nconnection: close\r\n\r\n"
            .to_owned(),
        format!(
            "TRACE /v1/messages HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\nconnection: close\r\n\r\n",
            pool.token
        ),
        "DELETE /v1/complete HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_owned(),
    ];
    for request in requests {
        let answer = exchange(addr, request.as_bytes(), SOON).await;
        let line = request.lines().next().unwrap();
        assert_eq!(answer.status(), Some(405), "{line}: {}", answer.text);
        assert_eq!(
            answer.header("x-pooler-origin"),
            Some("pool"),
            "{line}: {}",
            answer.text
        );
        // The first JSON value of the body (its chunk framing around it).
        let json = &answer.body()[answer.body().find('{').expect("a JSON body")..];
        let body: serde_json::Value = serde_json::Deserializer::from_str(json)
            .into_iter()
            .next()
            .expect("a JSON value")
            .unwrap();
        assert_eq!(body["type"], "error", "{line}: {json}");
        assert_eq!(body["error"]["type"], "api_error", "{line}: {json}");
        for internal in ["wasi", "uri", "path missing"] {
            assert!(!json.contains(internal), "{line}: {json}");
        }
    }
    assert_eq!(pool.hits(), 0);
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
}

/// `PUT /_pooler/settings/{key}` through the admin API: the status and the JSON answer.
async fn put_setting(
    host: &TestHost,
    url: &str,
    key: &str,
    value: &str,
) -> (u16, serde_json::Value) {
    let token = host.admin_token().unwrap();
    let request = Request::put(format!("{url}/_pooler/settings/{key}"))
        .header("authorization", format!("Bearer {}", token.trim()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::json!({ "value": value }).to_string(),
        )))
        .unwrap();
    let answer = tokio::time::timeout(SOON, TestClient::new().send(request))
        .await
        .unwrap()
        .unwrap();
    let json = serde_json::from_str(&answer.body).unwrap_or(serde_json::Value::Null);
    (answer.status.as_u16(), json)
}

/// URLs that parse loosely but can never be reached as meant: a port past 65535,
/// userinfo behind a backslash, a percent-encoded NUL in the host; and a raw NUL and a
/// backslash in the host.
const BAD_URLS: [&str; 5] = [
    "http://127.0.0.1:99999/",
    "http://evil.example\\@127.0.0.1/",
    "http://127.0.0.1%00.evil.example/",
    "http://127.0.0.1\0/",
    "http://127.0.0.1\\evil/",
];

/// The grants file of the pool (empty when none was written).
fn grants(host: &TestHost) -> String {
    let mut stack = vec![host.data.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "allowed-hosts") {
                return std::fs::read_to_string(path).unwrap();
            }
        }
    }
    String::new()
}

/// Each bad URL is refused where it is first accepted — the admin API (as `pooler config
/// set` sends it) and the pool's own settings export — by the setting's name with the
/// accepted form; the stored value, the grants and the service stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_upstream_urls_are_refused_by_name_and_nothing_changes() {
    let pool = PoolSetup::claude_keys(1).start().await;
    let before = pool.get("claude-upstream-url").await;
    let granted = grants(&pool.host);
    for bad in BAD_URLS {
        let (status, answer) =
            put_setting(&pool.host, &pool.url, "pool.claude-upstream-url", bad).await;
        assert_eq!(status, 400, "{bad:?}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("pool.claude-upstream-url") && message.contains("URL"),
            "{bad:?}: {message}"
        );
        match pool.set("claude-upstream-url", bad).await {
            Err(SettingsError::InvalidValue(v)) => {
                assert_eq!(v.key, "claude-upstream-url");
                assert!(v.accepted.contains("URL"), "{}", v.accepted);
            }
            other => panic!("{bad:?}: {other:?}"),
        }
        assert_eq!(pool.get("claude-upstream-url").await, before, "{bad:?}");
        assert_eq!(grants(&pool.host), granted, "{bad:?}");
    }
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
}

/// The host checks a URL value before any plugin stores it: the fixture pool stores
/// whatever it is given, yet none of the bad URLs reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_refuses_a_bad_url_before_the_plugin_stores_it() {
    let mut host = Setup::new()
        .role(Role::AccountPool, fixtures::POOL, "")
        .start()
        .unwrap();
    let url = host.serve().await.unwrap();
    let (status, _) = put_setting(&host, &url, "pool.upstream-url", "http://127.0.0.1:9/").await;
    assert_eq!(status, 200);
    for bad in BAD_URLS {
        let (status, answer) = put_setting(&host, &url, "pool.upstream-url", bad).await;
        assert_eq!(status, 400, "{bad:?}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid-value", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("pool.upstream-url"), "{message}");
        assert_eq!(
            host.setting(Role::AccountPool, "upstream-url")
                .await
                .as_deref(),
            Some("http://127.0.0.1:9/"),
            "{bad:?} reached the plugin"
        );
    }
}

/// A flood of new sessions with `pin-cap 10`: pins stay at 10, and attempts are kept for
/// at most 10 sessions plus the 16 one trimming pass lets through (the most recently active
/// ones), instead of one row per session for a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_attempts_stay_bounded_under_a_session_flood() {
    let pool = PoolSetup::claude_keys(1).start().await;
    pool.set("pin-cap", "10").await.unwrap();
    for i in 0..300 {
        let answer = pool.send(pool.messages(&format!("flood-{i}"))).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        pool.advance(Duration::from_secs(1));
    }
    let db = rusqlite::Connection::open(find_file(pool.host.data.path(), "pool.sqlite3")).unwrap();
    let count = |sql: &str| -> u64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    let pins = count("SELECT COUNT(*) FROM pins");
    let attempts = count("SELECT COUNT(*) FROM attempts");
    let sessions = count("SELECT COUNT(DISTINCT key) FROM attempts");
    assert!(pins <= 10, "pins: {pins}");
    assert!(
        attempts <= 10 + 16 && sessions <= 10 + 16,
        "attempts: {attempts} of {sessions} sessions"
    );
    // The newest sessions are still explained.
    let view = pool.explain("flood-299").await.unwrap();
    assert_eq!(view.recent.len(), 1, "{view:?}");
}

/// The head of a Claude request with the route token, a chunked body to follow.
fn chunked_head(pool: &Pool) -> String {
    format!(
        "POST /v1/messages?beta=true HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\nanthropic-version: 2023-06-01\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        pool.token
    )
}

/// A chunked body (no content-length, so the early 413 cannot see it) that runs past the
/// host's `max-body-bytes` gets the documented 413 from the host, not the pool's 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_over_the_host_limit_gets_413() {
    let pool = PoolSetup::claude_keys(1)
        .config("[server]\nmax-body-bytes = 1024\n")
        .start()
        .await;
    let mut request = chunked_head(&pool).into_bytes();
    request.extend_from_slice(b"800\r\n");
    request.extend(std::iter::repeat_n(b'x', 0x800));
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    let answer = exchange(pool.host.addr().unwrap(), &request, SOON).await;
    assert_eq!(answer.status(), Some(413), "{}", answer.text);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert!(answer.body().contains("1024"), "{}", answer.text);
    assert_eq!(pool.hits(), 0);
}

/// A body that stops arriving is cut once no byte came for `body-read-timeout-ms` (200 ms
/// here): the host answers 408 and closes the connection, instead of holding it open for as
/// long as the client likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_stalls_is_cut() {
    let pool = PoolSetup::claude_keys(1)
        .config("[server]\nbody-read-timeout-ms = 200\n")
        .start()
        .await;
    let mut stream = tokio::net::TcpStream::connect(pool.host.addr().unwrap())
        .await
        .unwrap();
    stream
        .write_all(chunked_head(&pool).as_bytes())
        .await
        .unwrap();
    stream.write_all(b"1\r\n{\r\n").await.unwrap();
    // Nothing more is sent, and the write side stays open.
    let answer = read_answer(&mut stream, SOON).await;
    assert!(answer.closed, "still open: {}", answer.text);
    assert_eq!(answer.status(), Some(408), "{}", answer.text);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert_eq!(pool.hits(), 0);
}

/// A request head past the configured 64 KiB is refused by the listener (431, or the
/// connection closed) before anything reaches the pool; a 32 KiB header still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_past_the_configured_cap_is_refused() {
    let pool = PoolSetup::claude_keys(1).start().await;
    let addr = pool.host.addr().unwrap();
    let head = |size: usize| {
        format!(
            "GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: {}\r\nconnection: close\r\n\r\n",
            "a".repeat(size)
        )
    };
    let fits = exchange(addr, head(32 << 10).as_bytes(), SOON).await;
    assert_eq!(
        fits.header("x-pooler-origin"),
        Some("pool"),
        "the pool answered: {}",
        fits.text
    );
    let big = exchange(addr, head(100 << 10).as_bytes(), SOON).await;
    assert!(big.closed, "{}", big.text);
    assert!(
        big.status().is_none_or(|s| s == 431),
        "a 100 KiB header was served: {}",
        big.text
    );
    assert_eq!(big.header("x-pooler-origin"), None, "{}", big.text);
}
