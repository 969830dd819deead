//! The `wasi:http` hook every store's outgoing requests go through ([`OutgoingPolicy`], in
//! place of wasmtime-wasi-http's default `send_request`): the calling plugin's allow-list
//! ([`super::allow`]) first, then the shared client ([`super::client`]). The list is empty
//! by default (deny); a refused request fails with `HTTP-request-denied`, an error the guest
//! sees and handles — it is not a trap.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::allow::AllowList;
use super::client::{IoFuture, OutgoingClient};

/// How much of a refused request's body is read before the refusal is returned.
const DENIED_BODY_DRAIN: usize = 1 << 20;

/// Per-instance outgoing policy: who is calling, what they may reach, the client, and how
/// long a failed answer's body may stall.
pub struct OutgoingPolicy {
    plugin: Arc<str>,
    allow: Arc<AllowList>,
    client: OutgoingClient,
    error_body_timeout: Duration,
}

impl OutgoingPolicy {
    /// The policy of one instance of `plugin`: only origins `allow` lists are reached, through
    /// `client`; a failed answer's body may stall for at most `error_body_timeout`.
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

impl WasiHttpHooks for OutgoingPolicy {
    fn send_request(
        &mut self,
        request: hyper::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> Box<dyn Future<Output = Result<(hyper::Response<WasiBody>, IoFuture), Error>> + Send> {
        if let Err(rule) = self.allow.check(request.uri()) {
            tracing::warn!(
                plugin = &*self.plugin,
                scheme = request.uri().scheme_str().unwrap_or(""),
                host = request.uri().host().unwrap_or(""),
                port = request.uri().port_u16(),
                rule,
                "outgoing request refused"
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
        Box::new(self.client.send_request(
            request,
            options,
            self.plugin.clone(),
            self.error_body_timeout,
        ))
    }
}
