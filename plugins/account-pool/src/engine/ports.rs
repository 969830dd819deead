//! The engine's ports: the traits it reaches the outside through ([`Upstream`],
//! [`Clock`], [`Random`], [`Log`], [`Cancel`]), the upstream request and response it
//! speaks, and [`new_id`] over [`Random`]. The component implements them over WIT imports
//! and wasi:http; the tests implement them with fakes.

use crate::body::RequestBody;
use crate::http::Headers;
use crate::stream::BodyStream;

/// A request to an upstream.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamRequest {
    pub method: String,
    pub url: String,
    pub headers: Headers,
    /// Shared with the incoming request: every attempt sends the same chunks, uncopied.
    pub body: RequestBody,
    pub deadlines: Deadlines,
}

/// Time limits of one upstream call; `None` leaves the host's default (wasi:http request
/// options). A call past a limit fails as a transport error (no head) or a broken body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// From sending the request to the response head.
    pub first_byte_ms: Option<u64>,
    /// Between two pieces of the response body.
    pub between_bytes_ms: Option<u64>,
}

impl Deadlines {
    /// A model call: a model may think for minutes before its head or between events, so
    /// the host's long defaults apply.
    pub const MODEL: Deadlines = Deadlines {
        first_byte_ms: None,
        between_bytes_ms: None,
    };
    /// A token or usage endpoint, which answers a small JSON document at once. Bounded so
    /// a stalled one cannot hold a request's refresh or a maintenance tick for minutes.
    pub const SERVICE: Deadlines = Deadlines {
        first_byte_ms: Some(30_000),
        between_bytes_ms: Some(30_000),
    };
}

/// An upstream's answer head and streaming body.
pub struct UpstreamResponse<B> {
    pub status: u16,
    pub headers: Headers,
    pub body: B,
}

/// Why no response head arrived (refused, reset, timed out, TLS failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError(pub String);

/// Sends requests upstream (wasi:http in the component, a script in tests).
#[allow(async_fn_in_trait)]
pub trait Upstream {
    type Body: BodyStream;
    async fn send(
        &self,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse<Self::Body>, TransportError>;
}

/// The host clock: epoch milliseconds, and sleeping (manual in tests).
#[allow(async_fn_in_trait)]
pub trait Clock {
    fn now(&self) -> u64;
    async fn sleep(&self, ms: u64);
}

/// Cryptographically secure random bytes.
pub trait Random {
    fn fill(&self, buf: &mut [u8]);
}

/// Structured logging, the kit's port shared by every plugin. Callers never pass a secret.
pub use pooler_plugin_kit::log::{Level, Log};

/// Whether the client of the request being served has gone (its connection closed before
/// the response ended): the host's `incoming-client` import in the component, a flag in
/// tests. Outside a request (admin calls, maintenance) the client never goes.
#[allow(async_fn_in_trait)]
pub trait Cancel {
    /// Whether the client has gone; once true, true for the rest of the request.
    fn gone(&self) -> bool;
    /// Resolves once the client has gone; never while it is there.
    async fn gone_wait(&self);
}

/// A random id: 16 random bytes in UUID v4 form.
pub fn new_id(random: &impl Random) -> String {
    let mut b = [0u8; 16];
    random.fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}
