//! Account Pooler: a client that goes away stops its request's work (spec `account-pool.md`
//! §4, "the client cancelling stops every further attempt and wait"). The real pool in the
//! real host, a fake upstream on 127.0.0.1, the manual clock; a client whose connection the
//! test closes mid-request.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use pooler_tests::logs::{LogLine, logs};
use pooler_tests::pool::{Pool, PoolSetup, SOON, reply};
use pooler_tests::upstream::{Gate, Reply};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// What the pool logs when it stops a request whose client left.
const CANCELLED: &str = "Account Pooler request cancelled: the client went away";

/// A client on a connection of its own, which the test can close at any moment.
struct Leaving {
    connection: JoinHandle<()>,
    response: JoinHandle<Option<hyper::Response<hyper::body::Incoming>>>,
}

impl Leaving {
    /// Send `request` to the pool on a new connection (not the pooled test client's).
    async fn send(pool: &Pool, mut request: Request<Full<Bytes>>) -> Leaving {
        let addr = pool.host.addr().expect("the server runs");
        let stream = TcpStream::connect(addr).await.expect("connect to the pool");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("an HTTP/1.1 connection");
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        // On its own connection the request names its path, and the host in `Host`.
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        *request.uri_mut() = path.parse().expect("a path");
        request.headers_mut().insert(
            hyper::header::HOST,
            addr.to_string().parse().expect("a header value"),
        );
        let response = tokio::spawn(async move { sender.send_request(request).await.ok() });
        Leaving {
            connection,
            response,
        }
    }

    /// Close the connection, as an agent does when its person presses Esc.
    fn close(self) {
        self.response.abort();
        self.connection.abort();
    }
}

/// The pool's line saying it stopped a request on `account`, once it comes (None: it never
/// did). Tests run side by side in this binary; account ids tell their lines apart.
async fn cancelled_line(account: &str) -> Option<LogLine> {
    let field = format!("account={account}");
    logs()
        .wait_for(SOON, |l| {
            l.target == "pooler::plugin"
                && l.message == CANCELLED
                && l.fields.get("fields").is_some_and(|f| f.contains(&field))
        })
        .await
}

/// The case reported: two accounts, `pool.transient-backoff = 2s,2s`, the upstream answers
/// 503, and the client closes its connection while the pool waits out the backoff after the
/// first 503. The pool stops there: played forward past every backoff, the upstream has seen
/// that one attempt and no other (before the fix, five more followed: A's two retries, then
/// B's try and its two retries), the session's latest attempt is `cancelled`, its pin stays
/// on A, and one log line says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_during_the_backoff_after_a_503_stops_the_request() {
    let pool = PoolSetup::claude_keys(2).start().await;
    pool.set("transient-backoff", "2s,2s").await.unwrap();
    assert_eq!(pool.send(pool.messages("S")).await.status, 200);
    assert_eq!(pool.seen(), ["A"]);
    for _ in 0..6 {
        pool.upstream.push(reply(503, &[]));
    }

    let client = Leaving::send(&pool, pool.messages("S")).await;
    tokio::time::timeout(SOON, pool.upstream.wait_for_hits(2))
        .await
        .expect("the pool tried A");
    let backoff = pool.host.next_wake(SOON).await;
    assert_eq!(backoff, Some(Duration::from_secs(2)), "the pool backs off");
    client.close();

    let line = cancelled_line(&pool.id("A")).await;
    if line.is_none() {
        // The pool went on regardless: play its backoffs out so the count below shows it.
        while let Some(wake) = pool.host.next_wake(Duration::from_secs(2)).await {
            pool.advance(wake);
        }
    }
    // Past every backoff either way (2 s and 2 s on A, then on B).
    pool.advance(Duration::from_secs(10));
    assert_eq!(
        pool.seen(),
        ["A", "A"],
        "no attempt after the client left (the first request, then the 503)"
    );
    let line = line.expect("the pool logged that it stopped the request");
    let fields = line.fields.get("fields").cloned().unwrap_or_default();
    assert!(
        fields.contains(&format!("account={}", pool.id("A"))) && fields.contains("attempts=1"),
        "{fields}"
    );
    let explained = pool.explain("S").await.unwrap();
    let latest = explained.recent.last().expect("attempts recorded");
    assert_eq!(latest.outcome.as_str(), "cancelled");
    assert_eq!(latest.status, Some(503));
    assert_eq!(latest.account, pool.id("A"));
    assert_eq!(
        explained.account,
        Some(pool.id("A")),
        "the pin did not move"
    );
}

/// A client that goes away in the middle of a streamed answer, while the upstream is
/// silent (a model thinking): the pool stops relaying at once instead of waiting for the
/// upstream's next event, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_stops_the_relay() {
    let pool = Pool::claude().await;
    let gate = Gate::new();
    pool.upstream.push(
        Reply::sse()
            .event("message_start", "{}")
            .pause(&gate)
            .event("message_stop", "{}"),
    );
    let client = Leaving::send(&pool, pool.messages("S")).await;
    let response = tokio::time::timeout(SOON, client.response)
        .await
        .expect("the head came")
        .expect("the request task")
        .expect("a response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(SOON, body.frame())
        .await
        .expect("the first event came")
        .expect("a frame")
        .expect("data");
    assert!(
        first
            .data_ref()
            .is_some_and(|d| d.starts_with(b"event: message_start"))
    );
    drop(body);
    client.connection.abort();

    let line = cancelled_line(&pool.id("A")).await;
    gate.open();
    let line = line.expect("the pool stopped relaying without waiting for the upstream");
    let fields = line.fields.get("fields").cloned().unwrap_or_default();
    assert!(
        fields.contains("relaying") && fields.contains(&pool.id("A")),
        "{fields}"
    );
    assert_eq!(pool.seen(), ["A"]);
}
