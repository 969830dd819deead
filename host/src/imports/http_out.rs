//! Outgoing `wasi:http` requests: wasmtime-wasi-http's `send_request` hook, replaced so that
//! every request goes through one shared keep-alive client (wasmtime-wasi-http's default
//! opens a connection per request; `shared/TOOLCHAIN.md`: +30–45 % req/s) and is checked
//! against the calling plugin's allow-list of hosts first. The list is empty by default
//! (deny); a refused request fails with `HTTP-request-denied`, an error the guest sees and
//! handles — it is not a trap. The guest's request options are honoured: connect, first
//! byte and between bytes, each with a finite default; the body of an answer that is not a
//! 2xx gets at most the plugin's `error-body-timeout-ms` between bytes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::Uri;
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The shared outgoing client: pooled keep-alive connections, HTTP and HTTPS (webpki roots).
#[derive(Clone)]
pub struct OutgoingClient {
    client: Client<Connector, WasiBody>,
}

/// How much of a refused request's body is read before the refusal is returned.
const DENIED_BODY_DRAIN: usize = 1 << 20;
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

impl Default for OutgoingClient {
    fn default() -> Self {
        Self::new()
    }
}

/// The hosts one plugin may call: `host` (any port) or `host:port`, case-insensitive.
///
/// Two sources: the configuration's `allowed-hosts`, and the hosts of URL-valued settings a
/// person set through the admin API (`pooler config set pool.claude-upstream-url …`), which
/// are granted as `host:port` and kept in a file in the plugin's directory so they survive
/// a restart. A plugin cannot grant itself a host: only the host's admin path grants.
#[derive(Debug, Default)]
pub struct AllowList {
    entries: Vec<(String, Option<u16>)>,
    granted: std::sync::RwLock<Vec<(String, Option<u16>)>>,
    grants_file: Option<std::path::PathBuf>,
}

impl AllowList {
    pub fn new(entries: &[String]) -> Self {
        AllowList {
            entries: parse_entries(entries),
            ..AllowList::default()
        }
    }

    /// The configured `entries` plus the grants kept in `grants_file` (one `host:port` a
    /// line; a missing file is no grants).
    pub fn with_grants(
        entries: &[String],
        grants_file: std::path::PathBuf,
    ) -> anyhow::Result<Self> {
        let granted = match std::fs::read_to_string(&grants_file) {
            Ok(text) => parse_entries(&text.lines().map(str::to_owned).collect::<Vec<_>>()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "cannot read {}: {e}",
                    grants_file.display()
                ));
            }
        };
        Ok(AllowList {
            entries: parse_entries(entries),
            granted: std::sync::RwLock::new(granted),
            grants_file: Some(grants_file),
        })
    }

    /// Allow the host and port of `url` if it is an absolute http(s) URL, and keep the grant.
    /// Returns whether `url` was such a URL. Anything else (a duration, a number) is ignored.
    pub fn grant_url(&self, url: &str) -> anyhow::Result<bool> {
        let Ok(uri) = url.parse::<Uri>() else {
            return Ok(false);
        };
        let port = match uri.scheme_str() {
            Some("https") => uri.port_u16().unwrap_or(443),
            Some("http") => uri.port_u16().unwrap_or(80),
            _ => return Ok(false),
        };
        let Some(host) = uri.host() else {
            return Ok(false);
        };
        let entry = (host.to_ascii_lowercase(), Some(port));
        let mut granted = self.granted.write().unwrap_or_else(|e| e.into_inner());
        if granted.contains(&entry) {
            return Ok(true);
        }
        granted.push(entry);
        if let Some(file) = &self.grants_file {
            let text: String = granted
                .iter()
                .map(|(host, port)| match port {
                    Some(port) => format!("{host}:{port}\n"),
                    None => format!("{host}\n"),
                })
                .collect();
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(file, text)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
        }
        Ok(true)
    }
}

fn parse_entries(entries: &[String]) -> Vec<(String, Option<u16>)> {
    entries
        .iter()
        .filter(|entry| !entry.trim().is_empty())
        .map(|entry| {
            let entry = entry.to_ascii_lowercase();
            // `[v6]:port`, `host:port`, or a bare host (a bare IPv6 address has colons
            // but no brackets).
            let split = match entry.rfind(':') {
                Some(i) if !entry[..i].contains(':') || entry[..i].ends_with(']') => entry[i + 1..]
                    .parse::<u16>()
                    .ok()
                    .map(|port| (entry[..i].to_string(), port)),
                _ => None,
            };
            match split {
                Some((host, port)) => (host, Some(port)),
                None => (entry, None),
            }
        })
        .collect()
}

impl AllowList {
    /// Whether a request to `uri` may be sent.
    pub fn allows(&self, uri: &Uri) -> bool {
        let Some(host) = uri.host() else { return false };
        let host = host.to_ascii_lowercase();
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            });
        let matches = |(allowed, allowed_port): &(String, Option<u16>)| {
            *allowed == host && allowed_port.is_none_or(|p| p == port)
        };
        self.entries.iter().any(matches)
            || self
                .granted
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(matches)
    }
}

/// Per-instance outgoing policy: who is calling, what they may reach, the client, and how
/// long a failed answer's body may stall.
pub struct OutgoingPolicy {
    plugin: Arc<str>,
    allow: Arc<AllowList>,
    client: OutgoingClient,
    error_body_timeout: Duration,
}

impl OutgoingPolicy {
    pub fn new(
        plugin: Arc<str>,
        allow: Arc<AllowList>,
        client: OutgoingClient,
        error_body_timeout: Duration,
    ) -> Self {
        OutgoingPolicy {
            plugin,
            allow,
            client,
            error_body_timeout,
        }
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

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for OutgoingPolicy {
    fn send_request(
        &mut self,
        request: hyper::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> Box<dyn Future<Output = Result<(hyper::Response<WasiBody>, IoFuture), Error>> + Send> {
        if !self.allow.allows(request.uri()) {
            tracing::warn!(
                plugin = &*self.plugin,
                host = request.uri().host().unwrap_or(""),
                "outgoing request refused: the host is not on the plugin's allowed-hosts list"
            );
            // Read (and discard) what the guest writes of its body first: a guest that sends
            // the body and awaits the response concurrently then sees the refusal itself,
            // not a broken body stream. Bounded, in case it streams without end.
            let mut body = request.into_body();
            return Box::new(async move {
                let mut seen = 0usize;
                while let Some(Ok(frame)) = body.frame().await {
                    seen += frame.data_ref().map_or(0, |data| data.len());
                    if seen > DENIED_BODY_DRAIN {
                        break;
                    }
                }
                Err(Error::HttpRequestDenied)
            });
        }
        let client = self.client.client.clone();
        let connect_timeout = options
            .and_then(|o| o.connect_timeout)
            .unwrap_or(CONNECT_TIMEOUT);
        let first_byte_timeout = options
            .and_then(|o| o.first_byte_timeout)
            .unwrap_or(FIRST_BYTE_TIMEOUT);
        let between_bytes_timeout = options
            .and_then(|o| o.between_bytes_timeout)
            .unwrap_or(BETWEEN_BYTES_TIMEOUT);
        let plugin = self.plugin.clone();
        let error_body_timeout = self.error_body_timeout;
        Box::new(async move {
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
        })
    }
}

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

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

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

    #[test]
    fn the_default_list_denies_everything() {
        assert!(!AllowList::default().allows(&uri("http://127.0.0.1:1/")));
    }

    #[test]
    fn hosts_match_with_or_without_a_port() {
        let list = AllowList::new(&[
            "API.example.com".into(),
            "127.0.0.1:8080".into(),
            "[::1]:9".into(),
        ]);
        assert!(list.allows(&uri("https://api.example.com/v1")));
        assert!(list.allows(&uri("http://api.example.com:81/")));
        assert!(list.allows(&uri("http://127.0.0.1:8080/x")));
        assert!(!list.allows(&uri("http://127.0.0.1:8081/x")));
        assert!(!list.allows(&uri("http://127.0.0.1/x")));
        assert!(list.allows(&uri("http://[::1]:9/")));
        assert!(!list.allows(&uri("https://evil.example.com/")));
        assert!(!list.allows(&uri("https://api.example.com.evil.test/")));
    }

    #[test]
    fn a_granted_url_opens_its_host_and_port_and_survives_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plugin").join("allowed-hosts");
        let list = AllowList::with_grants(&["api.example.com".to_string()], file.clone()).unwrap();
        assert!(!list.allows(&uri("http://127.0.0.1:9100/v1")));
        assert!(!list.grant_url("20s").unwrap(), "not a URL");
        assert!(!list.grant_url("ftp://127.0.0.1/").unwrap(), "not http(s)");
        assert!(list.grant_url("http://127.0.0.1:9100").unwrap());
        assert!(list.grant_url("https://Upstream.Test/base").unwrap());
        assert!(list.allows(&uri("http://127.0.0.1:9100/v1/messages")));
        assert!(
            !list.allows(&uri("http://127.0.0.1:9101/")),
            "only the granted port"
        );
        assert!(list.allows(&uri("https://upstream.test/x")));
        assert!(
            !list.allows(&uri("http://upstream.test/x")),
            "443 was granted, not 80"
        );
        assert!(
            list.allows(&uri("https://api.example.com/")),
            "configured hosts stay"
        );

        let reloaded = AllowList::with_grants(&[], file).unwrap();
        assert!(reloaded.allows(&uri("http://127.0.0.1:9100/v1")));
        assert!(reloaded.allows(&uri("https://upstream.test/")));
        assert!(!reloaded.allows(&uri("https://api.example.com/")));
    }
}
