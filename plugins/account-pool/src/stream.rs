//! Streaming pass-through. Once response headers have gone to the client nothing is
//! retried; if the upstream body breaks mid-way, a `text/event-stream` response gets an
//! SSE `error` event and ends cleanly, any other body ends with an error.

use crate::model::Provider;

/// A response body that arrives in chunks.
#[allow(async_fn_in_trait)]
pub trait BodyStream {
    /// The next chunk; None at the end; an error when the stream broke.
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, String>>;
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
/// into a final SSE `error` event.
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
        }
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
        std::mem::replace(&mut self.done, true)
    }

    /// Whether the relayed body is an event stream.
    pub fn is_sse(&self) -> bool {
        self.sse
    }

    /// The next chunk for the client.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, String>> {
        if self.done {
            return None;
        }
        match self.inner.next_chunk().await {
            Some(Ok(chunk)) => {
                if !chunk.is_empty() {
                    self.at_boundary = chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n");
                }
                Some(Ok(chunk))
            }
            None => {
                self.done = true;
                None
            }
            Some(Err(e)) => {
                self.done = true;
                if self.sse {
                    let mut event = if self.at_boundary {
                        Vec::new()
                    } else {
                        b"\n\n".to_vec()
                    };
                    let message = format!(
                        "The {} stream was interrupted: {e}",
                        self.provider.upstream_name()
                    );
                    event.extend(sse_error_event(self.provider, &message));
                    Some(Ok(event))
                } else {
                    Some(Err(e))
                }
            }
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
