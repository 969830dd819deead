//! A small incremental parser for `text/event-stream` bodies: feed it chunks as they
//! arrive (split anywhere, even inside a line or a `\r\n`), get complete events back.
//! Only `event:` and `data:` matter to the turn driver; `id:`, `retry:` and comments are
//! skipped. Lines end with `\n` (an `\r` before it is removed).
//!
//! Its memory is bounded: an event (its `event:` and `data:` values and the line being
//! read) may hold at most `max_event_bytes` ([`DEFAULT_MAX_EVENT_BYTES`] unless told
//! otherwise). An event past the limit is dropped whole: its bytes are discarded as they
//! arrive, up to the blank line that ends it, and it is counted in
//! [`SseParser::dropped`]. The next event is read normally. A stream whose final event is
//! dropped so ends without one, which the turn driver reports as a failed turn.

/// The default bound of one event's bytes: 8 MiB, far above any provider event (a
/// `response.completed` repeats the whole reply, a few hundred KiB at most).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 << 20;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Incremental SSE parser.
#[derive(Debug)]
pub struct SseParser {
    partial_line: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    /// Bytes held by `event` and `data` (each data line counts one more, for its `\n`).
    held: usize,
    has_fields: bool,
    max_event_bytes: usize,
    /// The line being read passed the limit: its bytes are skipped up to its end.
    skipping_line: bool,
    /// The event being read passed the limit: it is dropped at its end.
    oversized: bool,
    dropped: u64,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser bounded by [`DEFAULT_MAX_EVENT_BYTES`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that drops any event of more than `max_event_bytes` bytes (at least 1).
    pub fn with_limit(max_event_bytes: usize) -> Self {
        SseParser {
            partial_line: Vec::new(),
            event: None,
            data: Vec::new(),
            held: 0,
            has_fields: false,
            max_event_bytes: max_event_bytes.max(1),
            skipping_line: false,
            oversized: false,
            dropped: 0,
        }
    }

    /// Events dropped so far for passing the limit.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes the parser holds now (the partial line's buffer and the event's fields): never
    /// much more than the limit.
    pub fn buffered_bytes(&self) -> usize {
        self.partial_line.capacity() + self.held
    }

    /// Consumes `chunk` and returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while !rest.is_empty() {
            let (piece, ended) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = &rest[(piece.len() + usize::from(ended))..];
            if !self.skipping_line {
                if self.partial_line.len() + piece.len() + self.held > self.max_event_bytes {
                    // Past the limit: free what the line held, skip the rest of it, and
                    // drop its event.
                    self.partial_line = Vec::new();
                    self.skipping_line = true;
                    self.oversize();
                } else {
                    self.partial_line.extend_from_slice(piece);
                }
            }
            if ended {
                if self.skipping_line {
                    // The skipped line ends; the event it was part of goes on, dropped.
                    self.skipping_line = false;
                    continue;
                }
                let mut line = std::mem::take(&mut self.partial_line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.line(&String::from_utf8_lossy(&line), &mut out);
            }
        }
        out
    }

    /// The event being read passed the limit: what it held is freed, and it is dropped at
    /// its end.
    fn oversize(&mut self) {
        if !self.oversized {
            tracing::warn!(
                limit = self.max_event_bytes,
                "a server-sent event passed the size limit; it is dropped"
            );
        }
        self.oversized = true;
        self.event = None;
        self.data = Vec::new();
        self.held = 0;
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.oversized {
                self.oversized = false;
                self.has_fields = false;
                self.dropped += 1;
            } else if self.has_fields {
                out.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data).join("\n"),
                });
                self.has_fields = false;
                self.held = 0;
            }
            return;
        }
        if self.oversized || line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => {
                let before = self.event.as_ref().map_or(0, String::len);
                self.held = self.held - before + value.len();
                self.event = Some(value.to_string());
                self.has_fields = true;
            }
            "data" => {
                self.held += value.len() + 1;
                self.data.push(value.to_string());
                self.has_fields = true;
            }
            _ => {}
        }
        if self.held > self.max_event_bytes {
            self.oversize();
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

    /// A line that never ends must not grow the parser's memory; the
    /// event it is part of is dropped, and the stream goes on.
    #[test]
    fn a_huge_line_is_dropped_without_holding_its_bytes() {
        let limit = 64 * 1024;
        let mut p = SseParser::with_limit(limit);
        assert!(p.push(b"event: message_start\ndata: {\"a\":").is_empty());
        let chunk = vec![b'a'; 64 * 1024];
        let mut most = 0;
        for _ in 0..256 {
            // 16 MiB in all, without a newline.
            assert!(p.push(&chunk).is_empty());
            most = most.max(p.buffered_bytes());
        }
        assert!(
            most <= 2 * limit,
            "the parser held {most} bytes for a {limit}-byte limit"
        );
        let events = p.push(b"}\ndata: more\n\nevent: ping\ndata: ok\n\n");
        assert_eq!(
            events,
            vec![SseEvent {
                event: Some("ping".into()),
                data: "ok".into()
            }],
            "the oversized event is dropped, the next one read"
        );
        assert_eq!(p.dropped(), 1);
    }

    /// Many data lines, each under the limit, add up past it: the event is dropped too.
    #[test]
    fn an_event_of_many_lines_past_the_limit_is_dropped() {
        let mut p = SseParser::with_limit(1_000);
        let mut most = 0;
        for _ in 0..10_000 {
            assert!(p.push(b"data: 0123456789\n").is_empty());
            most = most.max(p.buffered_bytes());
        }
        assert!(most <= 2_000, "held {most} bytes");
        assert!(p.push(b"\n").is_empty());
        assert_eq!(p.dropped(), 1);
        let under = format!("data: {}\n\n", "x".repeat(900));
        assert_eq!(
            p.push(under.as_bytes()).len(),
            1,
            "an event under the limit"
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Events as a well-behaved server writes them: field values without line breaks.
        fn value() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop_oneof![
                    Just('a'),
                    Just(' '),
                    Just(':'),
                    Just('{'),
                    Just('"'),
                    Just('é'),
                    Just('😀'),
                    any::<char>().prop_filter("no line break", |c| *c != '\n' && *c != '\r'),
                ],
                0..12,
            )
            .prop_map(|c| c.into_iter().collect())
        }

        fn event() -> impl Strategy<Value = (Option<String>, Vec<String>)> {
            (
                prop::option::of(value()),
                prop::collection::vec(value(), 1..4),
            )
        }

        fn write(events: &[(Option<String>, Vec<String>)], crlf: bool) -> Vec<u8> {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut out = String::new();
            for (name, data) in events {
                out.push_str(&format!(": a comment{nl}"));
                if let Some(name) = name {
                    out.push_str(&format!("event: {name}{nl}"));
                }
                for line in data {
                    out.push_str(&format!("data: {line}{nl}"));
                }
                out.push_str(&format!("id: 7{nl}{nl}"));
            }
            out.into_bytes()
        }

        /// Cuts `bytes` at the given points (taken modulo its length).
        fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
            let mut points: Vec<usize> = cuts
                .iter()
                .map(|c| {
                    if bytes.is_empty() {
                        0
                    } else {
                        c % (bytes.len() + 1)
                    }
                })
                .collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for p in points {
                chunks.push(bytes[at..p].to_vec());
                at = p;
            }
            chunks.push(bytes[at..].to_vec());
            chunks
        }

        fn parse_chunks(limit: usize, chunks: &[Vec<u8>]) -> (Vec<SseEvent>, u64) {
            let mut p = SseParser::with_limit(limit);
            let events = chunks.iter().flat_map(|c| p.push(c)).collect();
            (events, p.dropped())
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                failure_persistence: Some(Box::new(
                    proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
                )),
                ..ProptestConfig::default()
            })]

            /// Any split of a stream into chunks gives the events one chunk gives, for any
            /// bytes (and any limit, dropped events included); and it never panics.
            #[test]
            fn any_split_gives_the_same_events(
                bytes in prop::collection::vec(
                    prop_oneof![
                        Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '), Just(b'd'),
                        Just(b'a'), Just(b't'), Just(b'e'), any::<u8>(),
                    ],
                    0..400,
                ),
                cuts in prop::collection::vec(any::<usize>(), 0..12),
                limit in prop_oneof![Just(DEFAULT_MAX_EVENT_BYTES), 1usize..64],
            ) {
                let whole = parse_chunks(limit, std::slice::from_ref(&bytes));
                let split = parse_chunks(limit, &split(&bytes, &cuts));
                prop_assert_eq!(whole, split);
                let bytewise: Vec<Vec<u8>> = bytes.iter().map(|b| vec![*b]).collect();
                prop_assert_eq!(parse_chunks(limit, std::slice::from_ref(&bytes)), parse_chunks(limit, &bytewise));
            }

            /// Written events are read back as written, whatever the split and line ends.
            #[test]
            fn written_events_are_read_back(
                events in prop::collection::vec(event(), 0..6),
                crlf in any::<bool>(),
                cuts in prop::collection::vec(any::<usize>(), 0..12),
            ) {
                let bytes = write(&events, crlf);
                let (read, dropped) = parse_chunks(DEFAULT_MAX_EVENT_BYTES, &split(&bytes, &cuts));
                let expected: Vec<SseEvent> = events
                    .iter()
                    .map(|(name, data)| SseEvent { event: name.clone(), data: data.join("\n") })
                    .collect();
                prop_assert_eq!(read, expected);
                prop_assert_eq!(dropped, 0);
            }

            /// Whatever arrives, the parser holds no more than about its limit.
            #[test]
            fn memory_stays_bounded(
                chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..2_000), 0..20),
                limit in 1usize..512,
            ) {
                let mut p = SseParser::with_limit(limit);
                for c in &chunks {
                    let _ = p.push(c);
                    // The line buffer may keep the capacity of a line under the limit.
                    prop_assert!(p.buffered_bytes() <= 2 * limit + 64, "{} for {}", p.buffered_bytes(), limit);
                }
            }
        }
    }
}
