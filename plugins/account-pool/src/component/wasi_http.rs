//! wasi:http both ways: the incoming handler the pool exports (every proxied request, read
//! and screened here, then handled by the engine) and the upstream calls it makes through
//! the outgoing handler (the host applies its allow-list).

use super::{DATABASE, WasiEnv};
use crate::body::{Collector, Refused, RequestBody};
use crate::engine::{
    self, Engine, IncomingRequest, TransportError, Upstream, UpstreamRequest, UpstreamResponse,
};
use crate::http::{Headers, PoolError};
use crate::model::Provider;
use crate::stream::BodyStream;
use pooler_plugin_kit::component::WitDb;
use wstd::http::body::util::BodyExt as _;
use wstd::http::{Body, Client, Request, Response};

/// A body as wasi:http hands it over, frame by frame.
type IncomingBody =
    wstd::http::body::util::combinators::UnsyncBoxBody<wstd::http::body::Bytes, wstd::http::Error>;

/// A response body read frame by frame from wasi:http.
pub(super) struct WasiBody(IncomingBody);

impl BodyStream for WasiBody {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
        loop {
            match self.0.frame().await? {
                Err(e) => return Some(Err(e.to_string())),
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data.to_vec()));
                    }
                }
            }
        }
    }
}

/// Upstream calls over wasi:http (the host applies its allow-list).
pub(super) struct WasiUpstream;

impl Upstream for WasiUpstream {
    type Body = WasiBody;
    async fn send(
        &self,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse<WasiBody>, TransportError> {
        let mut builder = Request::builder()
            .method(request.method.as_str())
            .uri(request.url.as_str());
        for (n, v) in request.headers.iter() {
            builder = builder.header(n, v);
        }
        // The body is whole in hand: sent with its length, not chunked (no chunk framing,
        // and servers that refuse chunked requests take it; the host checks the bytes
        // written match the length), chunk by chunk as it is held, never copied whole.
        if !request.body.is_empty() || !matches!(request.method.as_str(), "GET" | "HEAD") {
            builder = builder.header("content-length", request.body.len());
        }
        let body = match request.body.chunks() {
            [] => Body::empty(),
            [one] => Body::from(one.clone()),
            many => Body::from_stream(futures_lite::stream::iter(many.to_vec())),
        };
        let req = builder
            .body(body)
            .map_err(|e| TransportError(format!("invalid request: {e}")))?;
        let mut client = Client::new();
        client.set_connect_timeout(std::time::Duration::from_secs(15));
        if let Some(ms) = request.deadlines.first_byte_ms {
            client.set_first_byte_timeout(std::time::Duration::from_millis(ms));
        }
        if let Some(ms) = request.deadlines.between_bytes_ms {
            client.set_between_bytes_timeout(std::time::Duration::from_millis(ms));
        }
        let response = client
            .send(req)
            .await
            .map_err(|e| TransportError(e.to_string()))?;
        let status = response.status().as_u16();
        let mut headers = Headers::new();
        for (n, v) in response.headers() {
            if let Ok(v) = v.to_str() {
                headers.push(n.as_str(), v);
            }
        }
        Ok(UpstreamResponse {
            status,
            headers,
            body: WasiBody(response.into_body().into_boxed_body()),
        })
    }
}

// ---- the HTTP handler -------------------------------------------------------------------

#[derive(Debug)]
struct StreamBroke(String);

impl std::fmt::Display for StreamBroke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StreamBroke {}

fn pool_response(e: &PoolError) -> Response<Body> {
    shaped(Provider::Claude, e)
}

/// The pool's own response in `provider`'s error shape.
fn shaped(provider: Provider, e: &PoolError) -> Response<Body> {
    let mut b = Response::builder().status(e.status);
    for (n, v) in e.headers().iter() {
        b = b.header(n, v);
    }
    b.body(Body::from(e.body(provider)))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// The default `max-request-body`: how much of a body is read when storage could not say.
const DEFAULT_BODY_LIMIT: u64 = 32 << 20;

/// The pool's `wasi:http/incoming-handler` export: what `#[wstd::http_server]` generates,
/// except that a request wstd cannot turn into an `http::Request` — a `CONNECT`, whose
/// target names no path — is answered in the pool's error shape, where the generated
/// handler failed it with wstd's internal text (the host's 502).
struct Proxy;

impl wasip2::exports::http::incoming_handler::Guest for Proxy {
    fn handle(
        request: wasip2::http::types::IncomingRequest,
        out: wasip2::http::types::ResponseOutparam,
    ) {
        let method = method_name(&request.method());
        let path = request.path_with_query().unwrap_or_default();
        let responder = wstd::http::server::Responder::new(out);
        wstd::runtime::block_on(async move {
            let response = match wstd::http::request::try_from_incoming(request) {
                Ok(request) => match serve(request).await {
                    Ok(response) => response,
                    Err(e) => return responder.fail(e),
                },
                Err(_) => unreadable(&method, &path),
            };
            // As the generated handler: the body is written here, and a failure to write
            // it (the host dropped the response) ends the call.
            responder
                .respond(response)
                .await
                .expect("the response body was written");
        })
    }
}

wasip2::http::proxy::export!(Proxy);

/// The name of a wasi:http method.
fn method_name(method: &wasip2::http::types::Method) -> String {
    use wasip2::http::types::Method as M;
    match method {
        M::Get => "GET",
        M::Head => "HEAD",
        M::Post => "POST",
        M::Put => "PUT",
        M::Delete => "DELETE",
        M::Connect => "CONNECT",
        M::Options => "OPTIONS",
        M::Trace => "TRACE",
        M::Patch => "PATCH",
        M::Other(other) => other.as_str(),
    }
    .to_owned()
}

/// The answer to a request that could not be read as an HTTP request: 405 when its method
/// is one the pool does not serve (the engine's screen says so), else 400; in the pool's
/// error shape either way.
fn unreadable(method: &str, path_with_query: &str) -> Response<Body> {
    let path = path_with_query.split('?').next().unwrap_or_default();
    let Ok(db) = WitDb::open(DATABASE) else {
        return pool_response(&PoolError::pool(
            503,
            "Account Pooler storage is unavailable; try again.",
        ));
    };
    let engine = Engine::new(&db, &WasiUpstream, &WasiEnv);
    if let engine::Screen::Refused(response) = engine.screen(method, path, &Headers::new()) {
        engine.refused(method, path, &response);
        return to_wstd(response);
    }
    // Storage could not screen it (not migrated yet): the method alone still decides.
    match crate::http::match_route(method, path) {
        crate::http::RouteMatch::MethodNotAllowed(provider) => shaped(
            provider,
            &PoolError::pool(405, engine::not_allowed(method, path)),
        ),
        _ => pool_response(&PoolError::pool(400, "The request could not be read.")),
    }
}

/// Serve one request the handler could read.
async fn serve(request: Request<Body>) -> Result<Response<Body>, wstd::http::Error> {
    let Ok(db) = WitDb::open(DATABASE) else {
        return Ok(pool_response(&PoolError::pool(
            503,
            "Account Pooler storage is unavailable; try again.",
        )));
    };
    let (parts, body) = request.into_parts();
    let mut headers = Headers::new();
    for (n, v) in parts.headers.iter() {
        if let Ok(v) = v.to_str() {
            headers.push(n.as_str(), v);
        }
    }
    let mut body = body.into_boxed_body();
    let mut engine = Engine::new(&db, &WasiUpstream, &WasiEnv);
    // The head first: a request the pool refuses anyway (a wrong token, say) has its body
    // read and dropped, never kept, so it cannot make the pool hold `max-request-body`.
    let limit = match engine.screen(parts.method.as_str(), parts.uri.path(), &headers) {
        engine::Screen::Refused(response) => {
            drain(&mut body, DEFAULT_BODY_LIMIT).await;
            engine.refused(parts.method.as_str(), parts.uri.path(), &response);
            return Ok(to_wstd(response));
        }
        engine::Screen::Admitted(admitted) => {
            let limit = admitted.max_body();
            engine = engine.with_admitted(admitted);
            limit
        }
        engine::Screen::Unknown => DEFAULT_BODY_LIMIT,
    };
    // Held in chunks as it arrives, each frame copied once, within the instance's memory
    // ([`crate::body`]): a body the memory cannot hold is refused, not trapped on.
    let declared = parts
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let mut collector = Collector::new(limit, declared);
    let mut refused = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref()
                    && let Err(r) = collector.push(data)
                {
                    refused = Some(r);
                    break;
                }
            }
            Err(_) => {
                return Ok(pool_response(&PoolError::pool(
                    400,
                    "The request body could not be read.",
                )));
            }
        }
    }
    let held = match refused {
        None => collector.finish(),
        Some(r) => {
            // What was held is freed before the request goes on to its answer.
            drop(collector);
            if let Refused::OutOfMemory { held } = r {
                drain(&mut body, limit.saturating_sub(held)).await;
            }
            RequestBody::new()
        }
    };
    let incoming = IncomingRequest {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers,
        body: held,
        body_refused: refused,
    };
    Ok(to_wstd(engine.handle(incoming).await))
}

/// Read the rest of a body the pool will not keep, dropping each frame, up to `limit`
/// bytes: a server that answers and closes with a body still arriving makes the client's
/// kernel see a reset, and the client may lose the answer.
async fn drain(body: &mut IncomingBody, limit: u64) {
    let mut left = limit;
    while let Some(Ok(frame)) = body.frame().await {
        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
        let Some(rest) = left.checked_sub(n) else {
            break;
        };
        left = rest;
    }
}

/// A relayed answer and the in-flight lease held while it is relayed. When the relay ends
/// or is dropped (the client went away) the answer's token usage is recorded and the
/// lease ended, on a connection of its own.
struct Relayed {
    relay: crate::stream::Relay<WasiBody>,
    lease: Option<String>,
}

impl Drop for Relayed {
    fn drop(&mut self) {
        if self.lease.is_none() && !self.relay.is_metered() {
            return;
        }
        let Ok(db) = WitDb::open(DATABASE) else {
            return;
        };
        engine::record_tokens(&db, &WasiEnv, &mut self.relay);
        if let Some(lease) = self.lease.take() {
            // Not ended here, it expires by itself.
            let _ = engine::end_flight(&db, &lease);
        }
    }
}

/// The engine's response as wstd's: a body the pool made, or the upstream's relayed.
fn to_wstd(response: engine::Response<WasiBody>) -> Response<Body> {
    let mut b = Response::builder().status(response.status);
    for (n, v) in response.headers.iter() {
        b = b.header(n, v);
    }
    let body = match response.body {
        engine::Body::Full(bytes) => {
            // A body in hand holds no lease (only relayed answers do); ended all the same.
            if let Some(lease) = response.lease
                && let Ok(db) = WitDb::open(DATABASE)
            {
                let _ = engine::end_flight(&db, &lease);
            }
            Body::from(bytes)
        }
        engine::Body::Stream(relay) => Body::from_try_stream(futures_lite::stream::unfold(
            Relayed {
                relay,
                lease: response.lease,
            },
            |mut r| async move {
                engine::relay_next(&mut r.relay, &WasiEnv)
                    .await
                    .map(|chunk| (chunk.map_err(StreamBroke), r))
            },
        )),
    };
    b.body(body).unwrap_or_else(|_| {
        pool_response(&PoolError::pool(
            502,
            "Account Pooler could not relay the upstream response.",
        ))
    })
}
