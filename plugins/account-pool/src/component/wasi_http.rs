//! wasi:http both ways: the incoming handler the pool exports (every proxied request, read
//! and screened here, then handled by the engine) and the upstream calls it makes through
//! the outgoing handler (the host applies its allow-list).
//!
//! Written on the wasi:http resources themselves rather than through an HTTP library's
//! request and response types, so each side's headers cross the boundary once (one
//! `entries` in, one `from-list` out) straight into and out of the engine's [`Headers`],
//! and each body chunk is the list the host handed over, relayed as it came. wstd is the
//! async runtime: its reactor waits on the streams' pollables.

use super::{DATABASE, WasiEnv};
use crate::body::{Collector, Refused, RequestBody};
use crate::engine::{
    self, Engine, IncomingRequest, TransportError, Upstream, UpstreamRequest, UpstreamResponse,
};
use crate::http::{Headers, PoolError};
use crate::model::Provider;
use crate::stream::BodyStream;
use pooler_plugin_kit::component::WitDb;
use wasip2::http::types::{
    ErrorCode, Fields, FutureTrailers, IncomingBody, IncomingRequest as WasiRequest, Method,
    OutgoingBody, OutgoingRequest, OutgoingResponse, RequestOptions, ResponseOutparam, Scheme,
};
use wasip2::io::streams::{InputStream, StreamError};
use wstd::io::{AsyncOutputStream, AsyncPollable};

/// The most a body chunk is read at once.
const MAX_CHUNK: u64 = 64 * 1024;

/// How long an upstream connection may take to open.
const CONNECT_TIMEOUT_NS: u64 = 15_000_000_000;

/// The break of a body stream, as the log and the relay say it.
const BODY_BROKE: &str = "reading incoming body stream";
/// A body whose trailers said it broke after its last chunk.
const TRAILERS_BROKE: &str = "reading incoming body trailers";

/// Headers as wasi:http holds them, in one call; a value that is not visible ASCII (which
/// no header the pool reads or forwards is) is left out.
fn headers_from(fields: &Fields) -> Headers {
    let mut headers = Headers::new();
    for (name, value) in fields.entries() {
        let visible = value
            .iter()
            .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b));
        if visible && let Ok(value) = String::from_utf8(value) {
            headers.push(&name, value);
        }
    }
    headers
}

/// `headers` as wasi:http fields, in one call.
fn fields_from(headers: &Headers, extra: Option<(&str, String)>) -> Result<Fields, String> {
    let mut list: Vec<(String, Vec<u8>)> = Vec::with_capacity(headers.len() + 1);
    list.extend(
        headers
            .iter()
            .map(|(n, v)| (n.to_owned(), v.as_bytes().to_vec())),
    );
    if let Some((n, v)) = extra {
        list.push((n.to_owned(), v.into_bytes()));
    }
    // The error names the kind of refusal, never a value (it may be a credential).
    Fields::from_list(&list).map_err(|e| format!("a header was refused: {e:?}"))
}

/// A body as wasi:http hands it over, chunk by chunk, then its trailers: a stream that
/// closed is whole only if its trailers did not report an error.
pub(super) struct WasiBody {
    // Dropped in this order: the pollable and the stream are children of the body.
    ready: Option<AsyncPollable>,
    stream: Option<InputStream>,
    body: Option<IncomingBody>,
    trailers: Option<FutureTrailers>,
}

impl WasiBody {
    fn new(body: IncomingBody) -> Self {
        let stream = body.stream().ok();
        WasiBody {
            ready: None,
            stream,
            body: Some(body),
            trailers: None,
        }
    }

    /// The body's trailers after its stream closed: None when the body ended whole.
    async fn end(&mut self) -> Option<Result<Vec<u8>, String>> {
        if let Some(body) = self.body.take() {
            self.trailers = Some(IncomingBody::finish(body));
        }
        let trailers = self.trailers.as_ref()?;
        // Kept in `self` while waited on, so a dropped call leaves it for the next.
        AsyncPollable::new(trailers.subscribe()).wait_for().await;
        let got = trailers.get();
        self.trailers = None;
        match got {
            Some(Ok(Ok(_))) => None,
            _ => Some(Err(TRAILERS_BROKE.to_owned())),
        }
    }
}

impl BodyStream for WasiBody {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
        loop {
            let Some(stream) = &self.stream else {
                return self.end().await;
            };
            match stream.read(MAX_CHUNK) {
                Ok(chunk) if !chunk.is_empty() => return Some(Ok(chunk)),
                Ok(_) => {
                    // Nothing yet: wait until the stream has something (or closed). A
                    // dropped call has read nothing, so nothing is lost.
                    let ready = self
                        .ready
                        .get_or_insert_with(|| AsyncPollable::new(stream.subscribe()));
                    ready.wait_for().await;
                }
                Err(StreamError::Closed) => {
                    self.ready = None;
                    self.stream = None;
                }
                Err(StreamError::LastOperationFailed(_)) => {
                    self.ready = None;
                    self.stream = None;
                    self.body = None;
                    return Some(Err(BODY_BROKE.to_owned()));
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
        let invalid = |what: String| TransportError(format!("invalid request: {what}"));
        let uri: wstd::http::Uri = request.url.parse().map_err(|e| invalid(format!("{e}")))?;
        // The body is whole in hand: sent with its length, not chunked (no chunk framing,
        // and servers that refuse chunked requests take it; the host checks the bytes
        // written match the length), chunk by chunk as it is held, never copied whole.
        let length = (!request.body.is_empty()
            || !matches!(request.method.as_str(), "GET" | "HEAD"))
        .then(|| ("content-length", request.body.len().to_string()));
        let outgoing =
            OutgoingRequest::new(fields_from(&request.headers, length).map_err(invalid)?);
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") | None => Scheme::Https,
            Some(other) => Scheme::Other(other.to_owned()),
        };
        let set = outgoing
            .set_method(&method(&request.method))
            .and_then(|()| outgoing.set_scheme(Some(&scheme)))
            .and_then(|()| outgoing.set_authority(uri.authority().map(|a| a.as_str())))
            .and_then(|()| outgoing.set_path_with_query(uri.path_and_query().map(|p| p.as_str())));
        set.map_err(|()| invalid(format!("{} {}", request.method, request.url)))?;
        let options = RequestOptions::new();
        // Setting an option the host does not support leaves its default.
        let _ = options.set_connect_timeout(Some(CONNECT_TIMEOUT_NS));
        if let Some(ms) = request.deadlines.first_byte_ms {
            let _ = options.set_first_byte_timeout(Some(ms.saturating_mul(1_000_000)));
        }
        if let Some(ms) = request.deadlines.between_bytes_ms {
            let _ = options.set_between_bytes_timeout(Some(ms.saturating_mul(1_000_000)));
        }
        let body = outgoing
            .body()
            .map_err(|()| invalid("its body was taken".to_owned()))?;
        let pending = wasip2::http::outgoing_handler::handle(outgoing, Some(options))
            .map_err(|e| TransportError(e.to_string()))?;
        // The body goes out while the answer is awaited: a server may answer before it has
        // read everything.
        let write = async {
            let out = AsyncOutputStream::new(
                body.write()
                    .map_err(|()| invalid("its body stream was taken".to_owned()))?,
            );
            for chunk in request.body.chunks() {
                out.write_all(chunk)
                    .await
                    .map_err(|e| TransportError(e.to_string()))?;
            }
            drop(out);
            OutgoingBody::finish(body, None).map_err(|e| TransportError(e.to_string()))
        };
        let answer = async {
            AsyncPollable::new(pending.subscribe()).wait_for().await;
            match pending.get() {
                Some(Ok(Ok(response))) => Ok(response),
                Some(Ok(Err(code))) => Err(TransportError(code.to_string())),
                _ => Err(TransportError("the upstream answer was lost".to_owned())),
            }
        };
        let ((), response) = futures_lite::future::try_zip(write, answer).await?;
        let status = response.status();
        let headers = headers_from(&response.headers());
        let body = response
            .consume()
            .map_err(|()| TransportError("the upstream body was taken".to_owned()))?;
        Ok(UpstreamResponse {
            status,
            headers,
            body: WasiBody::new(body),
        })
    }
}

/// The wasi:http method named `name`.
fn method(name: &str) -> Method {
    match name {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_owned()),
    }
}

/// The name of a wasi:http method.
fn method_name(method: &Method) -> String {
    match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(other) => other.as_str(),
    }
    .to_owned()
}

// ---- the HTTP handler -------------------------------------------------------------------

type Answer = engine::Response<WasiBody>;

/// The pool's own answer in `provider`'s error shape.
fn shaped(provider: Provider, e: &PoolError) -> Answer {
    engine::Response {
        status: e.status,
        headers: e.headers(),
        body: engine::Body::Full(e.body(provider)),
        lease: None,
    }
}

fn pool_response(e: &PoolError) -> Answer {
    shaped(Provider::Claude, e)
}

/// The default `max-request-body`: how much of a body is read when storage could not say.
const DEFAULT_BODY_LIMIT: u64 = 32 << 20;

/// The pool's `wasi:http/incoming-handler` export.
struct Proxy;

impl wasip2::exports::http::incoming_handler::Guest for Proxy {
    fn handle(request: WasiRequest, out: ResponseOutparam) {
        wstd::runtime::block_on(async move {
            let answer = serve(request).await;
            respond(out, answer).await;
        })
    }
}

wasip2::http::proxy::export!(Proxy);

/// The answer to a request that names no path (a `CONNECT`'s target is an authority): 405
/// when its method is one the pool does not serve (the engine's screen says so), else 400;
/// in the pool's error shape either way.
fn unreadable(method: &str) -> Answer {
    let Ok(db) = WitDb::open(DATABASE) else {
        return pool_response(&PoolError::pool(
            503,
            "Account Pooler storage is unavailable; try again.",
        ));
    };
    let engine = Engine::new(&db, &WasiUpstream, &WasiEnv);
    if let engine::Screen::Refused(response) = engine.screen(method, "", &Headers::new()) {
        engine.refused(method, "", &response);
        return response;
    }
    // Storage could not screen it (not migrated yet): the method alone still decides.
    match crate::http::match_route(method, "") {
        crate::http::RouteMatch::MethodNotAllowed(provider) => shaped(
            provider,
            &PoolError::pool(405, engine::not_allowed(method, "")),
        ),
        _ => pool_response(&PoolError::pool(400, "The request could not be read.")),
    }
}

/// Serve one request.
async fn serve(request: WasiRequest) -> Answer {
    let method = method_name(&request.method());
    let Some(path_with_query) = request.path_with_query() else {
        return unreadable(&method);
    };
    let (path, query) = match path_with_query.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (path_with_query.as_str(), None),
    };
    let path = if path.is_empty() { "/" } else { path };
    let headers = headers_from(&request.headers());
    let Ok(body) = request.consume() else {
        return pool_response(&PoolError::pool(400, "The request body could not be read."));
    };
    drop(request);
    let mut body = WasiBody::new(body);
    let Ok(db) = WitDb::open(DATABASE) else {
        return pool_response(&PoolError::pool(
            503,
            "Account Pooler storage is unavailable; try again.",
        ));
    };
    let mut engine = Engine::new(&db, &WasiUpstream, &WasiEnv);
    // The head first: a request the pool refuses anyway (a wrong token, say) has its body
    // read and dropped, never kept, so it cannot make the pool hold `max-request-body`.
    let limit = match engine.screen(&method, path, &headers) {
        engine::Screen::Refused(response) => {
            drain(&mut body, DEFAULT_BODY_LIMIT).await;
            engine.refused(&method, path, &response);
            return response;
        }
        engine::Screen::Admitted(admitted) => {
            let limit = admitted.max_body();
            engine = engine.with_admitted(admitted);
            limit
        }
        engine::Screen::Unknown => DEFAULT_BODY_LIMIT,
    };
    // Held in chunks as it arrives, each copied once, within the instance's memory
    // ([`crate::body`]): a body the memory cannot hold is refused, not trapped on.
    let declared = headers
        .get("content-length")
        .and_then(|v| v.parse::<u64>().ok());
    let mut collector = Collector::new(limit, declared);
    let mut refused = None;
    while let Some(chunk) = body.next_chunk().await {
        match chunk {
            Ok(chunk) => {
                if let Err(r) = collector.push(&chunk) {
                    refused = Some(r);
                    break;
                }
            }
            Err(_) => {
                return pool_response(&PoolError::pool(400, "The request body could not be read."));
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
        method,
        path: path.to_owned(),
        query,
        headers,
        body: held,
        body_refused: refused,
    };
    engine.handle(incoming).await
}

/// Read the rest of a body the pool will not keep, dropping each chunk, up to `limit`
/// bytes: a server that answers and closes with a body still arriving makes the client's
/// kernel see a reset, and the client may lose the answer.
async fn drain(body: &mut WasiBody, limit: u64) {
    let mut left = limit;
    while let Some(Ok(chunk)) = body.next_chunk().await {
        let Some(rest) = left.checked_sub(chunk.len() as u64) else {
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

/// Hand the engine's answer to the host and write its body: a body the pool made, or the
/// upstream's relayed chunk by chunk. A body that broke, or that the host stopped taking
/// (the client went away), is left unfinished, so the client sees it cut, never whole.
async fn respond(out: ResponseOutparam, answer: Answer) {
    let fields = fields_from(&answer.headers, None).unwrap_or_else(|_| {
        // One header wasi:http refuses does not cost the client its answer.
        let fields = Fields::new();
        for (n, v) in answer.headers.iter() {
            let _ = fields.append(n, v.as_bytes());
        }
        fields
    });
    let response = OutgoingResponse::new(fields);
    // The engine's statuses are all valid HTTP statuses.
    let _ = response.set_status_code(answer.status);
    let Ok(body) = response.body() else {
        ResponseOutparam::set(out, Err(ErrorCode::InternalError(None)));
        return;
    };
    ResponseOutparam::set(out, Ok(response));
    let Ok(stream) = body.write() else {
        return;
    };
    let stream = AsyncOutputStream::new(stream);
    match answer.body {
        engine::Body::Full(bytes) => {
            // A body in hand holds no lease (only relayed answers do); ended all the same.
            if let Some(lease) = answer.lease
                && let Ok(db) = WitDb::open(DATABASE)
            {
                let _ = engine::end_flight(&db, &lease);
            }
            if stream.write_all(&bytes).await.is_err() {
                return;
            }
        }
        engine::Body::Stream(relay) => {
            let mut relayed = Relayed {
                relay,
                lease: answer.lease,
            };
            while let Some(chunk) = engine::relay_next(&mut relayed.relay, &WasiEnv).await {
                let Ok(chunk) = chunk else {
                    return;
                };
                if stream.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        }
    }
    drop(stream);
    let _ = OutgoingBody::finish(body, None);
}
