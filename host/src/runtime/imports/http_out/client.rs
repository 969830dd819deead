//! The shared outgoing client: pooled keep-alive connections over hyper and rustls (HTTP and
//! HTTPS, webpki roots), where wasmtime-wasi-http's default opens a connection per request
//! (`shared/TOOLCHAIN.md`: +30–45 % req/s). A guest's request options are honoured:
//! connect, first byte and between bytes, each with a finite default; the body of an answer
//! that is not a 2xx gets at most the plugin's `error-body-timeout-ms` between bytes. Which
//! requests may go out is not decided here: the hook ([`super::hook`]) asks the allow-list
//! ([`super::allow`]) first.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The shared outgoing client: pooled keep-alive connections, HTTP and HTTPS (webpki roots).
#[derive(Clone)]
pub struct OutgoingClient {
    client: Client<Connector, WasiBody>,
}

/// How long to wait for a connection when the guest set no connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for response headers when the guest set no first-byte timeout. Long:
/// model APIs may think for minutes before answering.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a response body may go without a byte when the guest set no between-bytes
/// timeout. Long for the same reason; finite so a stalled upstream cannot hold an instance
/// (and the agent's request) forever.
const BETWEEN_BYTES_TIMEOUT: Duration = Duration::from_secs(600);

impl OutgoingClient {
    /// A client with an empty connection pool (its clones share it); idle connections close
    /// after 90 seconds.
    pub fn new() -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        OutgoingClient { client }
    }
}

impl OutgoingClient {
    /// Send a small request the host makes itself (an alert's webhook; the caller checks
    /// its allow-list first): answers the status, the body read (at most 64 KiB) and
    /// dropped. The error says what failed, never the URL (it may hold a secret).
    pub async fn send_bytes(&self, request: hyper::Request<bytes::Bytes>) -> Result<u16, String> {
        let request = request.map(|body| {
            http_body_util::Full::new(body)
                .map_err(|never| match never {})
                .boxed_unsync()
        });
        let response = self.client.request(request).await.map_err(|e| {
            if e.is_connect() {
                "cannot connect".to_string()
            } else {
                "the connection failed".to_string()
            }
        })?;
        let status = response.status().as_u16();
        let _ = http_body_util::Limited::new(response.into_body(), 64 << 10)
            .collect()
            .await;
        Ok(status)
    }
}

impl OutgoingClient {
    /// Send a guest's request with the timeouts it asked for (`options`), or the defaults,
    /// its answer's body bounded between bytes (a failed answer's by at most
    /// `error_body_timeout`, see [`body_limit`]). Failures are `wasi:http` error codes;
    /// `plugin` names the caller in the log. Whether the request may be sent at all is the
    /// hook's to decide, before.
    pub(super) fn send_request(
        &self,
        request: hyper::Request<WasiBody>,
        options: Option<RequestOptions>,
        plugin: Arc<str>,
        error_body_timeout: Duration,
    ) -> impl Future<Output = Result<(hyper::Response<WasiBody>, IoFuture), Error>> + Send + 'static
    {
        let client = self.client.clone();
        let connect_timeout = options
            .and_then(|o| o.connect_timeout)
            .unwrap_or(CONNECT_TIMEOUT);
        let first_byte_timeout = options
            .and_then(|o| o.first_byte_timeout)
            .unwrap_or(FIRST_BYTE_TIMEOUT);
        let between_bytes_timeout = options
            .and_then(|o| o.between_bytes_timeout)
            .unwrap_or(BETWEEN_BYTES_TIMEOUT);
        async move {
            let response = tokio::time::timeout(
                connect_timeout + first_byte_timeout,
                client.request(request),
            )
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?
            .map_err(|e| {
                tracing::debug!(plugin = &*plugin, error = %e, "outgoing request failed");
                if e.is_connect() {
                    Error::ConnectionRefused
                } else {
                    Error::HttpProtocolError
                }
            })?;
            let limit = body_limit(response.status(), between_bytes_timeout, error_body_timeout);
            let response = response
                .map(|body| BetweenBytes::new(body.map_err(Error::from), limit).boxed_unsync());
            // The shared client drives its connections itself; nothing is left to await.
            let io: IoFuture = Box::new(async { Ok(()) });
            Ok((response, io))
        }
    }
}

impl Default for OutgoingClient {
    fn default() -> Self {
        Self::new()
    }
}

/// How long a response body may go without a byte: what the guest asked for, or at most
/// `error_body` when the answer is not a 2xx (a short error document, which comes with its
/// head; an upstream that sends a failure's head and stalls must not hold the guest for the
/// long limit a model's stream needs).
fn body_limit(status: hyper::StatusCode, asked: Duration, error_body: Duration) -> Duration {
    if status.is_success() {
        asked
    } else {
        asked.min(error_body)
    }
}

/// What wasmtime-wasi-http awaits besides the response: the connection's I/O.
pub(super) type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// A response body that fails with `connection-read-timeout` when no frame arrives within
/// `limit` of the previous one (or of the response head). The clock runs only while the
/// body is waited on and has nothing: a frame that arrived while the guest was busy
/// elsewhere is delivered, however late it is read.
struct BetweenBytes<B> {
    body: B,
    limit: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timed_out: bool,
}

impl<B> BetweenBytes<B> {
    fn new(body: B, limit: Duration) -> Self {
        BetweenBytes {
            body,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            timed_out: false,
        }
    }
}

impl<B> Body for BetweenBytes<B>
where
    B: Body<Error = Error> + Unpin,
{
    type Data = B::Data;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Error>>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(frame)) => {
                let next = tokio::time::Instant::now() + this.limit;
                this.deadline.as_mut().reset(next);
                Poll::Ready(Some(frame))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                ready!(this.deadline.as_mut().poll(cx));
                this.timed_out = true;
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body fed by hand: each `Bytes` sent is one data frame; dropping the sender ends it.
    struct Fed(tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>);

    impl Body for Fed {
        type Data = bytes::Bytes;
        type Error = Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<bytes::Bytes>, Error>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    /// A 2xx body gets the limit the guest asked for; any other answer's body at most the
    /// error-body limit, and less if the guest asked for less.
    #[test]
    fn a_failed_answer_s_body_gets_the_shorter_limit() {
        use hyper::StatusCode;
        let (long, error) = (Duration::from_secs(600), Duration::from_secs(10));
        assert_eq!(body_limit(StatusCode::OK, long, error), long);
        assert_eq!(body_limit(StatusCode::NO_CONTENT, long, error), long);
        for status in [
            StatusCode::MOVED_PERMANENTLY,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::from_u16(529).unwrap(),
        ] {
            assert_eq!(body_limit(status, long, error), error, "{status}");
        }
        let short = Duration::from_secs(2);
        assert_eq!(body_limit(StatusCode::BAD_GATEWAY, short, error), short);
    }

    fn fed(
        limit: Duration,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<bytes::Bytes>,
        BetweenBytes<Fed>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, BetweenBytes::new(Fed(rx), limit))
    }

    const LIMIT: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_coming_is_never_cut_however_long_it_lasts() {
        let (tx, mut body) = fed(LIMIT);
        let start = tokio::time::Instant::now();
        // The reader waits on the body while the writer takes just under the limit per frame.
        let writer = tokio::spawn(async move {
            for i in 0..5u8 {
                tokio::time::sleep(LIMIT - Duration::from_secs(1)).await;
                tx.send(bytes::Bytes::from(vec![i])).unwrap();
            }
        });
        for i in 0..5u8 {
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), vec![i]);
        }
        writer.await.unwrap();
        assert!(
            body.frame().await.is_none(),
            "the end is the end, not an error"
        );
        assert!(
            start.elapsed() > LIMIT * 4,
            "the whole body took longer than the limit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_fails_with_a_read_timeout_one_limit_after_its_last_frame() {
        let (tx, mut body) = fed(LIMIT);
        tokio::time::advance(Duration::from_secs(20)).await;
        tx.send(bytes::Bytes::from_static(b"part")).unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        let last = tokio::time::Instant::now();
        // Nothing more comes (the sender stays open): the paused clock runs to the deadline.
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(matches!(err, Error::ConnectionReadTimeout), "{err:?}");
        assert_eq!(
            last.elapsed(),
            LIMIT,
            "timed from the last frame, not the head"
        );
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none(), "nothing after the timeout");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_that_waited_while_the_reader_was_busy_is_still_delivered() {
        let (tx, mut body) = fed(LIMIT);
        tx.send(bytes::Bytes::from_static(b"early")).unwrap();
        tokio::time::advance(LIMIT * 3).await;
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), &b"early"[..]);
        drop(tx);
        assert!(body.frame().await.is_none());
    }
}
