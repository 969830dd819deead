//! A small incremental parser for `text/event-stream` bodies: feed it chunks as they
//! arrive (split anywhere, even inside a line or a `\r\n`), get complete events back.
//! Only `event:` and `data:` matter to the turn driver; `id:`, `retry:` and comments are
//! skipped.

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseParser {
    partial_line: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    has_fields: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes `chunk` and returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &byte in chunk {
            if byte == b'\n' {
                let mut line = std::mem::take(&mut self.partial_line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.line(&String::from_utf8_lossy(&line), &mut out);
            } else {
                self.partial_line.push(byte);
            }
        }
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_fields {
                out.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data).join("\n"),
                });
                self.has_fields = false;
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => {
                self.event = Some(value.to_string());
                self.has_fields = true;
            }
            "data" => {
                self.data.push(value.to_string());
                self.has_fields = true;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_crlf_are_reassembled() {
        let mut p = SseParser::new();
        let mut events = p.push(b"event: message_start\r\ndata: {\"a\":");
        assert!(events.is_empty());
        events.extend(p.push(b"1}\r"));
        events.extend(p.push(b"\n\r\n: comment\n\ndata: x\ndata: y\n\n"));
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: Some("message_start".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: None,
                    data: "x\ny".into()
                },
            ]
        );
    }

    #[test]
    fn an_unterminated_event_is_not_emitted() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: half").is_empty());
        assert!(p.push(b"\n").is_empty());
    }
}
