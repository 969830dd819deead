//! Streaming pass-through. Once response headers have gone to the client nothing is
//! retried; if the upstream body breaks mid-way, a `text/event-stream` response gets an
//! SSE `error` event and ends cleanly, any other body ends with an error. What was read
//! before the head went out (a stream's first event, [`Prefix`]) goes first.

use crate::model::Provider;
use crate::redact::StreamRedactor;
use crate::tokens::{Meter, Tally};

/// A response body that arrives in chunks.
#[allow(async_fn_in_trait)]
pub trait BodyStream {
    /// The next chunk; None at the end; an error when the stream broke. Dropping the
    /// future before it resolves loses nothing: the next call gets that chunk (the wait
    /// for a stream's first event gives up on it when its time is up).
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>>;
}

/// The start of a body read before its head was relayed, and its end when that came too.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Prefix {
    pub bytes: Vec<u8>,
    pub end: BodyEnd,
}

/// How far a body read ahead got.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum BodyEnd {
    /// More may follow.
    #[default]
    Open,
    /// The body ended.
    Ended,
    /// The body broke with this error.
    Broke(String),
}

/// A body held in memory.
#[derive(Debug, Default)]
pub struct FullBody(Option<Vec<u8>>);

impl FullBody {
    pub fn new(bytes: Vec<u8>) -> Self {
        FullBody(Some(bytes))
    }
}

impl BodyStream for FullBody {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
        self.0.take().filter(|b| !b.is_empty()).map(Ok)
    }
}

/// Whether a content type is a server-sent event stream.
pub fn is_event_stream(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|c| {
        c.trim()
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
    })
}

/// The SSE `error` event the pool appends when an upstream stream breaks, in the
/// provider's streaming error shape.
pub fn sse_error_event(provider: Provider, message: &str) -> Vec<u8> {
    let data = match provider {
        Provider::Claude => serde_json::json!({
            "type": "error",
            "error": { "type": "api_error", "message": message },
        }),
        Provider::Codex => serde_json::json!({
            "type": "error",
            "code": "stream_error",
            "message": message,
        }),
    };
    format!("event: error\ndata: {data}\n\n").into_bytes()
}

/// Relays an upstream body chunk by chunk, turning a mid-stream break of an event stream
/// into a final SSE `error` event, and taking the account's credential out of it when
/// told to ([`Relay::redacting`]).
pub struct Relay<B> {
    inner: B,
    provider: Provider,
    sse: bool,
    done: bool,
    /// Whether what was sent so far ends at an event boundary (a blank line), so the error
    /// event is not glued onto a partial event.
    at_boundary: bool,
    /// The account whose answer this is, for log lines.
    account: Option<String>,
    /// Takes the account's credential out of the body (an upstream error relayed as is);
    /// boxed, as most relays (served answers) go without.
    redact: Option<Box<Redacting>>,
    /// What was read of the body before the relay began, given out first.
    /// (Boxed: a response carries its relay, and most relays have none.)
    prefix: Option<Box<Prefix>>,
    /// Reads the answer's token usage from what is given out ([`Relay::metering`]).
    metered: Option<Box<Metered>>,
}

/// A relay's token meter and the thread whose answer it reads.
struct Metered {
    meter: Meter,
    thread: Option<String>,
}

/// What a relayed answer reported of its tokens ([`Relay::tally`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    pub provider: Provider,
    pub account: String,
    pub thread: Option<String>,
    pub tally: Tally,
}

/// A relay's redaction.
struct Redacting {
    redactor: StreamRedactor,
    /// The break of a body that is not an event stream, given after the bytes held back
    /// before it.
    broke: Option<String>,
}

impl<B: BodyStream> Relay<B> {
    pub fn new(inner: B, provider: Provider, content_type: Option<&str>) -> Self {
        Relay {
            inner,
            provider,
            sse: is_event_stream(content_type),
            done: false,
            at_boundary: true,
            account: None,
            redact: None,
            prefix: None,
            metered: None,
        }
    }

    /// Read the answer's token usage as it is given out, for `thread` (a served answer of
    /// a conversation). The bytes are not held back: the meter keeps a bounded copy of the
    /// events that may carry usage ([`crate::tokens`]).
    pub fn metering(mut self, thread: Option<&str>) -> Self {
        self.metered = Some(Box::new(Metered {
            meter: Meter::new(self.provider, self.sse),
            thread: thread.map(str::to_owned),
        }));
        self
    }

    /// Whether the answer's token usage is metered (and not yet taken).
    pub fn is_metered(&self) -> bool {
        self.metered.is_some()
    }

    /// What the answer reported of its tokens so far (all of it once the relay ended),
    /// taken once: None when it is not metered, reported none, or was taken already.
    pub fn tally(&mut self) -> Option<Reported> {
        let mut metered = self.metered.take()?;
        let tally = metered.meter.finish()?;
        Some(Reported {
            provider: self.provider,
            account: self.account.clone().unwrap_or_default(),
            thread: metered.thread.take(),
            tally,
        })
    }

    /// Give out `prefix` (read from the body already) before reading on.
    pub fn after(mut self, prefix: Prefix) -> Self {
        self.prefix = (prefix != Prefix::default()).then(|| Box::new(prefix));
        self
    }

    /// Take the account's credential out of the body with `redact` (None: relay as is).
    /// The body's length changes, which is why the relay never passes the upstream's
    /// `content-length` on.
    pub fn redacting(mut self, redact: Option<StreamRedactor>) -> Self {
        self.redact = redact.map(|redactor| {
            Box::new(Redacting {
                redactor,
                broke: None,
            })
        });
        self
    }

    /// Name the account whose answer this is (for log lines; never a secret).
    pub fn for_account(mut self, account: &str) -> Self {
        self.account = Some(account.to_owned());
        self
    }

    /// The account whose answer this is, when named.
    pub fn account(&self) -> Option<&str> {
        self.account.as_deref()
    }

    /// Relay nothing more (the client went away). Returns whether it had already ended.
    pub fn stop(&mut self) -> bool {
        if let Some(r) = &mut self.redact {
            r.broke = None;
        }
        std::mem::replace(&mut self.done, true)
    }

    /// Whether the relayed body is an event stream.
    pub fn is_sse(&self) -> bool {
        self.sse
    }

    /// The next chunk for the client.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, String>> {
        if let Some(e) = self.redact.as_mut().and_then(|r| r.broke.take()) {
            return Some(Err(e));
        }
        loop {
            if self.done {
                return None;
            }
            let next = match self.read_ahead() {
                Some(next) => next,
                None => self.inner.next_chunk().await,
            };
            match next {
                Some(Ok(chunk)) => {
                    let chunk = match &mut self.redact {
                        Some(r) => r.redactor.push(&chunk),
                        None => chunk,
                    };
                    // All of it held back for now (a piece of the secret may go on).
                    if chunk.is_empty() && self.redact.is_some() {
                        continue;
                    }
                    self.note_sent(&chunk);
                    if let Some(m) = &mut self.metered {
                        m.meter.push(&chunk);
                    }
                    return Some(Ok(chunk));
                }
                None => {
                    self.done = true;
                    let rest = self.held_rest();
                    return (!rest.is_empty()).then_some(Ok(rest));
                }
                Some(Err(e)) => {
                    self.done = true;
                    let mut out = self.held_rest();
                    self.note_sent(&out);
                    if !self.sse {
                        return match &mut self.redact {
                            Some(r) if !out.is_empty() => {
                                r.broke = Some(e);
                                Some(Ok(out))
                            }
                            _ => Some(Err(e)),
                        };
                    }
                    if !self.at_boundary {
                        out.extend_from_slice(b"\n\n");
                    }
                    let message = format!(
                        "The {} stream was interrupted: {e}",
                        self.provider.upstream_name()
                    );
                    out.extend(sse_error_event(self.provider, &message));
                    return Some(Ok(out));
                }
            }
        }
    }

    /// The next piece of the prefix, as the body gave it (None: none is left).
    fn read_ahead(&mut self) -> Option<Option<Result<Vec<u8>, String>>> {
        let prefix = self.prefix.as_mut()?;
        if !prefix.bytes.is_empty() {
            return Some(Some(Ok(std::mem::take(&mut prefix.bytes))));
        }
        match std::mem::take(&mut self.prefix)?.end {
            BodyEnd::Open => None,
            BodyEnd::Ended => Some(None),
            BodyEnd::Broke(e) => Some(Some(Err(e))),
        }
    }

    /// What the redaction still held back, redacted; nothing when not redacting.
    fn held_rest(&mut self) -> Vec<u8> {
        self.redact
            .as_mut()
            .map(|r| r.redactor.finish())
            .unwrap_or_default()
    }

    /// Whether what was sent so far ends at an event boundary, after sending `chunk`.
    fn note_sent(&mut self, chunk: &[u8]) {
        if !chunk.is_empty() {
            self.at_boundary = chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n");
        }
    }
}

/// Read a body to its end, keeping at most `limit` bytes (the rest is drained).
pub async fn read_to_end<B: BodyStream>(body: &mut B, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next_chunk().await {
        let chunk = chunk?;
        let room = limit.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(out)
}

/// Read a body until at least `limit` bytes came, it ended or it broke: what was read,
/// to be relayed after all ([`Relay::after`]).
pub async fn read_head<B: BodyStream>(body: &mut B, limit: usize) -> Prefix {
    let mut prefix = Prefix::default();
    while prefix.bytes.len() < limit {
        match body.next_chunk().await {
            Some(Ok(chunk)) => prefix.bytes.extend_from_slice(&chunk),
            Some(Err(e)) => {
                prefix.end = BodyEnd::Broke(e);
                break;
            }
            None => {
                prefix.end = BodyEnd::Ended;
                break;
            }
        }
    }
    prefix
}

/// Read at most `limit` bytes of a body and stop (a failed response's detail).
pub async fn read_prefix<B: BodyStream>(body: &mut B, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match body.next_chunk().await {
            Some(Ok(chunk)) => {
                let room = limit - out.len();
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    struct Chunks(VecDeque<Result<Vec<u8>, String>>);

    impl BodyStream for Chunks {
        async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>> {
            self.0.pop_front()
        }
    }

    fn drain(mut r: Relay<Chunks>) -> Vec<Result<Vec<u8>, String>> {
        futures::executor::block_on(async {
            let mut out = Vec::new();
            while let Some(c) = r.next().await {
                out.push(c);
            }
            out
        })
    }

    /// A body whose start was read to judge it is relayed whole all the same: the chunks
    /// read first, then the rest, redacted alike.
    #[test]
    fn a_read_head_is_relayed_before_the_rest() {
        let chunks =
            |parts: &[&str]| Chunks(parts.iter().map(|p| Ok(p.as_bytes().to_vec())).collect());
        let mut body = chunks(&["{\"a\":", "\"secret-key-1\",", "\"b\":2}"]);
        let head = futures::executor::block_on(read_head(&mut body, 8));
        assert_eq!(
            head.bytes, b"{\"a\":\"secret-key-1\",",
            "chunks until 8 bytes came"
        );
        assert_eq!(head.end, BodyEnd::Open);
        let relay = Relay::new(body, Provider::Claude, Some("application/json"))
            .after(head)
            .redacting(Some(StreamRedactor::new(
                &crate::model::Credential::ApiKey("secret-key-1".into()),
            )));
        let text: Vec<u8> = drain(relay).into_iter().flat_map(Result::unwrap).collect();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.starts_with("{\"a\":") && text.ends_with("\"b\":2}"),
            "{text}"
        );
        assert!(!text.contains("secret-key-1"), "{text}");
        let mut short = chunks(&["{}"]);
        let head = futures::executor::block_on(read_head(&mut short, 1024));
        assert_eq!(head.end, BodyEnd::Ended);
        let text: Vec<u8> = drain(Relay::new(short, Provider::Claude, None).after(head))
            .into_iter()
            .flat_map(Result::unwrap)
            .collect();
        assert_eq!(text, b"{}");
    }

    #[test]
    fn sse_break_becomes_an_error_event_and_ends() {
        let body = Chunks(VecDeque::from([
            Ok(b"event: message_start\ndata: {}\n\n".to_vec()),
            Err("connection reset".to_owned()),
            Ok(b"never".to_vec()),
        ]));
        let out = drain(Relay::new(
            body,
            Provider::Claude,
            Some("text/event-stream; charset=utf-8"),
        ));
        assert_eq!(out.len(), 2);
        let event = String::from_utf8(out[1].clone().unwrap()).unwrap();
        assert!(event.starts_with("event: error\ndata: "), "{event}");
        assert!(event.contains("api_error") && event.contains("connection reset"));
    }

    #[test]
    fn sse_break_mid_event_closes_the_partial_event_first() {
        let body = Chunks(VecDeque::from([
            Ok(b"data: {\"partial".to_vec()),
            Err("eof".into()),
        ]));
        let out = drain(Relay::new(body, Provider::Codex, Some("text/event-stream")));
        let event = out[1].clone().unwrap();
        assert!(event.starts_with(b"\n\nevent: error\n"));
        assert!(String::from_utf8(event).unwrap().contains("stream_error"));
    }

    #[test]
    fn non_sse_break_ends_the_body_with_an_error() {
        let body = Chunks(VecDeque::from([Ok(b"{\"a\":".to_vec()), Err("eof".into())]));
        let out = drain(Relay::new(body, Provider::Claude, Some("application/json")));
        assert_eq!(out, vec![Ok(b"{\"a\":".to_vec()), Err("eof".to_owned())]);
    }

    /// A redacting relay gives out what it held back before a break: the body's end
    /// (redacted), then the break (an error, or the SSE error event).
    #[test]
    fn a_redacting_relay_flushes_what_it_held_before_a_break() {
        let key = "sk-ant-api03-Qz7xK2pL9mW4vN8rOKOK";
        let credential = crate::model::Credential::ApiKey(key.into());
        let body = || {
            Chunks(VecDeque::from([
                Ok(b"{\"message\":\"bad sk-ant-api03-Qz7x".to_vec()),
                Ok(b"K2pL9mW4vN8rOKOK".to_vec()),
                Err("eof".to_owned()),
            ]))
        };
        let relay = Relay::new(body(), Provider::Claude, Some("application/json"))
            .redacting(Some(crate::redact::StreamRedactor::new(&credential)));
        let out = drain(relay);
        assert_eq!(out.last(), Some(&Err("eof".to_owned())), "{out:?}");
        let text: Vec<u8> = out
            .iter()
            .filter_map(|c| c.clone().ok())
            .flatten()
            .collect();
        assert_eq!(text, b"{\"message\":\"bad [redacted]");

        let relay = Relay::new(body(), Provider::Claude, Some("text/event-stream"))
            .redacting(Some(crate::redact::StreamRedactor::new(&credential)));
        let text: Vec<u8> = drain(relay).into_iter().flat_map(Result::unwrap).collect();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.starts_with("{\"message\":\"bad [redacted]\n\nevent: error\n"),
            "{text}"
        );
    }

    /// What was read before the relay began goes first, and its end (or break) with it:
    /// the body is not read past an end already seen.
    #[test]
    fn a_prefix_goes_first_with_its_end() {
        let rest = || Chunks(VecDeque::from([Ok(b"event: b\ndata: 2\n\n".to_vec())]));
        let prefix = |end| Prefix {
            bytes: b"event: a\ndata: 1\n\n".to_vec(),
            end,
        };
        let sse = Some("text/event-stream");
        let out = drain(Relay::new(rest(), Provider::Claude, sse).after(prefix(BodyEnd::Open)));
        assert_eq!(
            out,
            vec![
                Ok(b"event: a\ndata: 1\n\n".to_vec()),
                Ok(b"event: b\ndata: 2\n\n".to_vec())
            ]
        );
        let out = drain(Relay::new(rest(), Provider::Claude, sse).after(prefix(BodyEnd::Ended)));
        assert_eq!(out, vec![Ok(b"event: a\ndata: 1\n\n".to_vec())]);
        let out = drain(
            Relay::new(rest(), Provider::Claude, sse).after(prefix(BodyEnd::Broke("eof".into()))),
        );
        assert_eq!(out.len(), 2);
        let event = String::from_utf8(out[1].clone().unwrap()).unwrap();
        assert!(event.starts_with("event: error\n") && event.contains("eof"));
        // An empty prefix is no prefix.
        let out = drain(Relay::new(rest(), Provider::Claude, sse).after(Prefix::default()));
        assert_eq!(out, vec![Ok(b"event: b\ndata: 2\n\n".to_vec())]);
    }

    #[test]
    fn bounded_reads() {
        futures::executor::block_on(async {
            let mut body = Chunks(VecDeque::from([
                Ok(vec![1; 700]),
                Ok(vec![2; 700]),
                Ok(vec![3; 10]),
            ]));
            assert_eq!(read_prefix(&mut body, 1024).await.len(), 1024);
            let mut body = Chunks(VecDeque::from([Ok(vec![1; 700]), Ok(vec![2; 700])]));
            assert_eq!(read_to_end(&mut body, 1000).await.unwrap().len(), 1000);
            let mut full = FullBody::new(b"xy".to_vec());
            assert_eq!(full.next_chunk().await, Some(Ok(b"xy".to_vec())));
            assert_eq!(full.next_chunk().await, None);
        });
    }
}
