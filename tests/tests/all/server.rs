//! The HTTP listener: streaming without buffering, request limits, host-made responses, the
//! admin API and a graceful drain.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use pooler_host::runtime::roles::Role;
use pooler_tests::client::TestClient;
use pooler_tests::fixtures;
use pooler_tests::harness::{Setup, TestHost};
use pooler_tests::upstream::{FakeUpstream, Gate, Reply};

const SOON: Duration = Duration::from_secs(10);

async fn pool_host(settings: &str, extra: &str) -> (TestHost, String) {
    let mut host = Setup::new()
        .role(Role::AccountPool, fixtures::POOL, settings)
        .config(extra)
        .start()
        .unwrap();
    let url = host.serve().await.unwrap();
    (host, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_reaches_the_client_before_the_upstream_finishes() {
    let upstream = FakeUpstream::start().await;
    let gate = Gate::new();
    upstream.push(
        Reply::sse()
            .event("message_start", "{\"n\":1}")
            .pause(&gate)
            .event("message_stop", "{\"n\":2}"),
    );
    let (_host, url) = pool_host("allowed-hosts = [\"127.0.0.1\"]", "").await;
    let request = Request::get(format!("{url}/proxy/{}/v1/messages", upstream.addr()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = tokio::time::timeout(SOON, TestClient::new().open(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(SOON, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        first.data_ref().unwrap().as_ref(),
        b"event: message_start\ndata: {\"n\":1}\n\n"
    );
    // The upstream is still paused: the first event came through on its own.
    gate.open();
    let rest = tokio::time::timeout(SOON, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest.as_ref(), b"event: message_stop\ndata: {\"n\":2}\n\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_over_the_limit_gets_413_from_the_host() {
    let (_host, url) = pool_host("", "[server]\nmax-body-bytes = 1024\n").await;
    let client = TestClient::new();
    let big = Request::post(format!("{url}/echo"))
        .body(Full::new(Bytes::from(vec![b'x'; 2048])))
        .unwrap();
    let answer = client.send(big).await.unwrap();
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    let fits = Request::post(format!("{url}/echo"))
        .body(Full::new(Bytes::from(vec![b'y'; 1024])))
        .unwrap();
    let answer = client.send(fits).await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body.len(), 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_headers_are_refused_before_reaching_the_plugin() {
    let (_host, url) = pool_host("", "[server]\nmax-headers = 8\n").await;
    let mut request = Request::get(format!("{url}/echo"));
    for i in 0..20 {
        request = request.header(format!("x-h{i}"), "v");
    }
    let result = TestClient::new()
        .send(request.body(Full::new(Bytes::new())).unwrap())
        .await;
    match result {
        Ok(answer) => assert_eq!(answer.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        // hyper may also just close the connection.
        Err(e) => assert!(e.to_string().contains("connection"), "{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_pool_the_host_answers_503_itself() {
    let mut host = Setup::new().start().unwrap();
    let url = host.serve().await.unwrap();
    let answer = TestClient::new()
        .get_within(&format!("{url}/v1/messages"), SOON)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.header("x-pooler-origin"), Some("pool"));
    assert!(
        answer
            .body
            .contains("no plugin fills the account-pool role"),
        "{}",
        answer.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_token_the_server_wrote_privately() {
    let (host, url) = pool_host("", "").await;
    let client = TestClient::new();
    let token = host.admin_token().unwrap();
    assert_eq!(token.len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(host.data.path().join("admin-token")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    let anonymous = client
        .get_within(&format!("{url}/_pooler/status"), SOON)
        .await
        .unwrap();
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong = Request::get(format!("{url}/_pooler/status"))
        .header("authorization", "Bearer nope")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        client.send(wrong).await.unwrap().status,
        StatusCode::UNAUTHORIZED
    );
    let authorized = Request::get(format!("{url}/_pooler/status"))
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let status = client.send(authorized).await.unwrap();
    assert_eq!(status.status, StatusCode::OK);
    assert!(status.body.contains("\"status\":\"ok\""), "{}", status.body);
    assert!(
        status.body.contains("\"role\":\"account-pool\""),
        "{}",
        status.body
    );
    assert!(!status.body.contains(&token), "the token is never echoed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_lets_an_in_flight_stream_finish() {
    let upstream = FakeUpstream::start().await;
    let gate = Gate::new();
    upstream.push(Reply::sse().event("a", "1").pause(&gate).event("b", "2"));
    let (mut host, url) = pool_host("allowed-hosts = [\"127.0.0.1\"]", "").await;
    let request = Request::get(format!("{url}/proxy/{}/stream", upstream.addr()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = tokio::time::timeout(SOON, TestClient::new().open(request))
        .await
        .unwrap()
        .unwrap();
    let mut body = response.into_body();
    let _first = tokio::time::timeout(SOON, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let stopping = tokio::spawn(async move {
        host.stop_server().await.unwrap();
        host
    });
    tokio::task::yield_now().await;
    assert!(
        !stopping.is_finished(),
        "the server stopped with a response in flight"
    );
    gate.open();
    let rest = tokio::time::timeout(SOON, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest.as_ref(), b"event: b\ndata: 2\n\n");
    let _host = tokio::time::timeout(SOON, stopping).await.unwrap().unwrap();
}

/// Counts the wakes of the task it stands for.
#[derive(Default)]
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The guest runs inside the request's own task, so what it does there must not wake that
/// task: tokio answers a task woken during its own poll by running it once more after it goes
/// idle, handed to the other worker (a futex wake and two context switches a request, for
/// nothing). A guest that answers at once sets its response and writes its body without
/// waiting on anything outside, so its request task is not woken. The one exception is by
/// design: a guest still running when the epoch ticks (every 10 ms) yields once, so some of
/// the tries may see a wake; a host that wakes itself sees one in every try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_answering_at_once_does_not_wake_its_request_task() {
    use std::task::{Context, Poll};
    // Polled with `waker`; when pending, the test's own task comes back to it.
    async fn counted<F: Future>(future: F, waker: &std::task::Waker) -> F::Output {
        let mut future = std::pin::pin!(future);
        std::future::poll_fn(
            |outer| match future.as_mut().poll(&mut Context::from_waker(waker)) {
                Poll::Ready(out) => Poll::Ready(out),
                Poll::Pending => {
                    outer.waker().wake_by_ref();
                    Poll::Pending
                }
            },
        )
        .await
    }
    let (host, _url) = pool_host("", "").await;
    let mut fewest = usize::MAX;
    for _ in 0..20 {
        let wakes = std::sync::Arc::new(CountingWaker::default());
        let waker = std::task::Waker::from(wakes.clone());
        let request = Request::get("http://pool.test/time")
            .body(
                http_body_util::Empty::<Bytes>::new()
                    .map_err(|never| -> wasmtime_wasi_http::Error { match never {} }),
            )
            .unwrap();
        let response = counted(host.host.handle_http(request), &waker).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = counted(response.into_body().collect(), &waker)
            .await
            .unwrap()
            .to_bytes();
        assert!(body.starts_with(b"wall="), "{body:?}");
        fewest = fewest.min(wakes.0.load(std::sync::atomic::Ordering::SeqCst));
        if fewest == 0 {
            break;
        }
    }
    assert_eq!(fewest, 0, "every try woke the task the guest runs in");
}
