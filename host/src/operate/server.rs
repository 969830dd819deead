//! The HTTP listener: accepts connections, refuses what the host answers for itself — with
//! `x-pooler-origin: pool` — (a head or body too large, a body that stalls, no pool
//! loaded), counts requests in flight and records an agent turn's answers
//! ([`crate::operate::tap`]), and hands every other request to the pool
//! ([`crate::operate::http_in`]). Paths under `/_pooler/` go to the admin
//! API ([`crate::operate::admin`]), authenticated by the token the server writes to
//! `DATA_DIR/admin-token` (0600) at start; `/metrics` to the metrics scrape (same token).
//! Every request is counted in `pooler_http_requests_total{kind,status}`.

use pooler_core::private_file::{Existing, create_private_file};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::CONTENT_LENGTH;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::mediation::core_link::CoreLink;
use crate::operate::admin::{Admin, METRICS_PATH};
use crate::operate::http_in::error_response;
use crate::operate::wire::{ADMIN_PREFIX, ADMIN_TOKEN_FILE};
use crate::runtime::Host;

/// A bound listener, ready to serve.
pub struct Server {
    listener: TcpListener,
    host: Host,
    admin: Admin,
    in_flight: Arc<AtomicUsize>,
}

impl Server {
    /// Bind `addr` and write a fresh admin token to the data directory.
    pub async fn bind(host: Host, addr: SocketAddr) -> anyhow::Result<Server> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        if !is_local(addr.ip()) {
            tracing::warn!(
                %addr,
                "listening beyond loopback: agents on other machines can reach the pool \
                 (anyone who can reach it and holds a route token spends your accounts); the \
                 admin API and /metrics still answer only on loopback"
            );
        }
        let token = write_admin_token(host.data_dir())?;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let admin = Admin::new(
            host.clone(),
            token,
            listener.local_addr()?,
            in_flight.clone(),
        );
        Ok(Server {
            listener,
            host,
            admin,
            in_flight,
        })
    }

    /// Wire the host's core in (`pooler serve` does, after `CoreLink::attach`): the core
    /// sends its turns through this listener, as an agent would, and the admin API's
    /// `threads` area answers from it.
    pub fn with_core(mut self, core: Arc<CoreLink>) -> anyhow::Result<Server> {
        core.set_listener(self.listener.local_addr()?);
        self.admin = self.admin.with_core(core);
        Ok(self)
    }

    /// The address the server listens on (the actual port when bound to port 0).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serve until `shutdown` resolves, then stop accepting and let in-flight requests
    /// finish for at most `server.drain-ms`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let graceful = GracefulShutdown::new();
        let config = self.host.config().server.clone();
        let mut shutdown = std::pin::pin!(shutdown);
        let admin = Arc::new(self.admin);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors and the like: keep serving the connections we have.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let host = self.host.clone();
            let admin = admin.clone();
            let in_flight = self.in_flight.clone();
            let local_peer = is_local(peer.ip());
            let service = hyper::service::service_fn(move |req| {
                let host = host.clone();
                let admin = admin.clone();
                let in_flight = in_flight.clone();
                async move {
                    Ok::<_, Infallible>(handle(&host, &admin, &in_flight, local_peer, req).await)
                }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            // The read buffer alone does not cap a head: one read may carry it past the
            // buffer's size, and a head complete in the buffer was accepted whole.
            http.timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .max_headers(config.max_headers)
                .max_buf_size(config.max_header_bytes)
                .max_header_size(config.max_header_bytes);
            let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
        drop(self.listener);
        let drain = Duration::from_millis(config.drain_ms);
        if tokio::time::timeout(drain, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                drain_ms = config.drain_ms,
                "in-flight requests did not finish in time"
            );
        }
        Ok(())
    }
}

/// Write a fresh random admin token to `DATA_DIR/admin-token`, readable by the owner only.
fn write_admin_token(data_dir: &Path) -> anyhow::Result<String> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw)
        .map_err(|e| anyhow::anyhow!("no randomness for the admin token: {e}"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    pooler_core::private_file::create_private_dir(data_dir)
        .with_context(|| format!("cannot use the data directory {}", data_dir.display()))?;
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    let mut file = create_private_file(&path, Existing::Truncate)
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::io::Write::write_all(&mut file, token.as_bytes())?;
    Ok(token)
}

/// Counts a request as in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether a peer is on this machine's loopback (an IPv4-mapped IPv6 loopback included).
fn is_local(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// `local_peer`: the connection comes from loopback (admin and metrics answer only then).
async fn handle(
    host: &Host,
    admin: &Admin,
    in_flight: &Arc<AtomicUsize>,
    local_peer: bool,
    req: Request<Incoming>,
) -> Response<HyperOutgoingBody> {
    let _counted = InFlight::new(in_flight);
    let path = req.uri().path();
    let kind = if path == METRICS_PATH {
        "metrics"
    } else if path.starts_with(ADMIN_PREFIX) || path == ADMIN_PREFIX.trim_end_matches('/') {
        "admin"
    } else {
        "proxy"
    };
    let response = match kind {
        "metrics" | "admin" if !local_peer => crate::operate::admin::loopback_only(),
        "metrics" => admin.metrics(&req).await,
        "admin" => admin.handle(req).await,
        _ => proxy(host, req).await,
    };
    let status = response.status();
    let _ = host.metrics().counter_add(
        "pooler_http_requests_total",
        "Requests through the host's listener, by kind (proxy, admin, metrics) and status.",
        &[("kind", kind), ("status", status.as_str())],
        1,
    );
    response
}

/// A request for the pool: refused by the host (too large, no pool), or handed to the pool.
async fn proxy(host: &Host, req: Request<Incoming>) -> Response<HyperOutgoingBody> {
    let config = &host.config().server;
    let limit = config.max_body_bytes;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large(limit);
    }
    // An agent turn's requests: the answers are recorded for its failure description.
    let recorder = host.taps().find(req.headers());
    let gap = Duration::from_millis(config.body_read_timeout_ms);
    let verdict = Arc::new(AtomicU8::new(BODY_READ));
    let body_verdict = verdict.clone();
    let response = host
        .handle_http(req.map(|body| GuardedBody {
            inner: body,
            remaining: limit,
            limit,
            gap,
            silence: None,
            verdict: body_verdict,
        }))
        .await;
    // The pool answered a body the host cut (it may only have seen a read error): the
    // client hears why, as it would from the early 413.
    let response = match verdict.load(Ordering::SeqCst) {
        BODY_TOO_LARGE => too_large(limit),
        BODY_STALLED => error_response(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body stalled: no byte arrived for {} ms",
                config.body_read_timeout_ms
            ),
        ),
        _ => response,
    };
    match recorder {
        None => response,
        Some(recorder) => {
            let (parts, body) = response.into_parts();
            let body = recorder.head(parts.status.as_u16(), &parts.headers, host.clock(), body);
            Response::from_parts(parts, body.boxed_unsync())
        }
    }
}

/// The host's 413 for a body over `server.max-body-bytes`.
fn too_large(limit: u64) -> Response<HyperOutgoingBody> {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than the host's limit of {limit} bytes"),
    )
}

/// What [`GuardedBody`] came to: read as sent, cut for passing the limit, or cut for
/// stalling.
const BODY_READ: u8 = 0;
const BODY_TOO_LARGE: u8 = 1;
const BODY_STALLED: u8 = 2;

/// A request body as the host hands it to the pool: it fails once more than `limit` bytes
/// have arrived (a body without a Content-Length, which the early 413 cannot catch), or
/// once no byte arrived for `gap` while the pool waited for one (the header read timeout
/// ends with the head; this is the body's). Real network time, not the host clock: it
/// measures the client's socket. Which of the two it was goes to `verdict`.
struct GuardedBody {
    inner: Incoming,
    remaining: u64,
    limit: u64,
    gap: Duration,
    /// Armed when a poll found no data, disarmed by the next frame: it only runs out while
    /// the pool is waiting on the client.
    silence: Option<Pin<Box<tokio::time::Sleep>>>,
    verdict: Arc<AtomicU8>,
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.silence = None;
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > self.remaining {
                        self.verdict.store(BODY_TOO_LARGE, Ordering::SeqCst);
                        let limit = self.limit;
                        return Poll::Ready(Some(Err(
                            wasmtime_wasi_http::Error::HttpRequestBodySize(Some(limit)),
                        )));
                    }
                    self.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let gap = self.gap;
                let silence = self
                    .silence
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                if silence.as_mut().poll(cx).is_ready() {
                    self.verdict.store(BODY_STALLED, Ordering::SeqCst);
                    return Poll::Ready(Some(Err(
                        wasmtime_wasi_http::Error::ConnectionReadTimeout,
                    )));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_are_local() {
        for local in ["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"] {
            assert!(is_local(local.parse().unwrap()), "{local}");
        }
        for remote in [
            "10.0.0.2",
            "192.168.1.7",
            "0.0.0.0",
            "::",
            "fe80::1",
            "::ffff:10.0.0.2",
        ] {
            assert!(!is_local(remote.parse().unwrap()), "{remote}");
        }
    }
}
