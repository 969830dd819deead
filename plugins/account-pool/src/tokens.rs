//! Token accounting: the `usage` a served answer reports, read as its bytes pass to the
//! client ([`Meter`]), in a fixed amount of memory and without holding a byte back.
//!
//! Where the providers report it: the Messages API in a stream's `message_start`
//! (`message.usage`) and `message_delta` (`usage`, cumulative counts), and in a whole
//! body's `usage`; the Responses API in `response.completed` (also `response.incomplete`
//! and `response.failed`, which are billed too) as `response.usage`, and in a whole body's
//! `usage`. The two count cached input differently: Anthropic's `input_tokens` leaves out
//! the cache's reads and writes, OpenAI's includes its `cached_tokens`. [`TokenCounts`]
//! holds them apart the same way for both: `input` is the input neither read from nor
//! written to the cache.

use serde::Deserialize;

use crate::model::Provider;

/// The most of one event's data (or of a whole body) kept to read its `usage` from. Past
/// it only its start and its end are kept ([`Capture`]).
pub const CAPTURE_LIMIT: usize = 256 << 10;
/// What is kept of the start of data past [`CAPTURE_LIMIT`] (its `type` and `model`).
const HEAD_KEEP: usize = 4 << 10;
/// What is kept of the end of data past [`CAPTURE_LIMIT`] (the Responses API writes
/// `usage` near the end of a response, after its output and tools).
const TAIL_KEEP: usize = 16 << 10;
/// The longest model name recorded; a longer one (or one with control characters) is
/// recorded as unknown.
pub const MODEL_MAX: usize = 128;

/// Tokens of one or more answers, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Input tokens neither read from nor written to the prompt cache.
    pub input: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache (Anthropic reports them; OpenAI does not).
    pub cache_write: u64,
}

impl TokenCounts {
    /// Every input token: fresh, read from the cache and written to it.
    pub fn all_input(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }

    pub fn is_zero(&self) -> bool {
        *self == TokenCounts::default()
    }

    /// The kinds with their metric label, in a fixed order.
    pub fn kinds(&self) -> [(&'static str, u64); 4] {
        [
            ("input", self.input),
            ("output", self.output),
            ("cache_read", self.cache_read),
            ("cache_write", self.cache_write),
        ]
    }
}

/// What one answer reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    /// The model that answered, as the answer names it (None: not named, or not a
    /// plausible name).
    pub model: Option<String>,
    pub counts: TokenCounts,
}

/// A `usage` object of either API (absent or null fields read as not reported).
#[derive(Debug, Default, Deserialize)]
struct Usage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    input_tokens_details: Option<InputDetails>,
}

#[derive(Debug, Default, Deserialize)]
struct InputDetails {
    cached_tokens: Option<u64>,
}

/// What is read of an object that may carry `usage` and `model`.
#[derive(Debug, Default, Deserialize)]
struct Carrier {
    #[serde(default)]
    model: Option<serde_json::Value>,
    #[serde(default)]
    usage: Option<Usage>,
}

/// What is read of an event's data or a whole body.
#[derive(Debug, Default, Deserialize)]
struct Doc {
    #[serde(rename = "type", default)]
    kind: Option<serde_json::Value>,
    #[serde(default)]
    model: Option<serde_json::Value>,
    #[serde(default)]
    usage: Option<Usage>,
    /// Messages `message_start`.
    #[serde(default)]
    message: Option<Carrier>,
    /// Responses `response.*`.
    #[serde(default)]
    response: Option<Carrier>,
}

/// Bytes kept of one piece of data, bounded: all of it up to [`CAPTURE_LIMIT`], then its
/// first [`HEAD_KEEP`] and last [`TAIL_KEEP`] bytes.
#[derive(Debug, Default)]
struct Capture {
    bytes: Vec<u8>,
    /// Past the limit: `bytes` is the head, this the tail (at most twice [`TAIL_KEEP`]
    /// between trims).
    tail: Option<Vec<u8>>,
}

impl Capture {
    fn push(&mut self, more: &[u8]) {
        if let Some(tail) = &mut self.tail {
            keep_end(tail, more);
            return;
        }
        let need = self.bytes.len() + more.len();
        if need <= CAPTURE_LIMIT {
            // Grown by hand so the capacity never passes the limit (doubling would).
            if need > self.bytes.capacity() {
                let target = (self.bytes.capacity() * 2).clamp(need, CAPTURE_LIMIT);
                self.bytes.reserve_exact(target - self.bytes.len());
            }
            self.bytes.extend_from_slice(more);
            return;
        }
        let mut tail = Vec::with_capacity(2 * TAIL_KEEP);
        let head = HEAD_KEEP.min(self.bytes.len());
        let from_held = TAIL_KEEP.saturating_sub(more.len());
        let start = self.bytes.len().saturating_sub(from_held).max(head);
        tail.extend_from_slice(&self.bytes[start..]);
        keep_end(&mut tail, more);
        self.bytes.truncate(head);
        self.bytes.shrink_to_fit();
        self.tail = Some(tail);
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.tail.is_none()
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.tail = None;
    }

    /// Read what was kept: the whole document when it was all kept, else `usage` from the
    /// tail and `type` and `model` from the head.
    fn read(&self) -> Option<Doc> {
        let Some(tail) = &self.tail else {
            return serde_json::from_slice(&self.bytes).ok();
        };
        let usage = last_value_of(tail, b"usage").and_then(first_value::<Usage>)?;
        // Where the API put the member: at the start (as OpenAI writes a response) or
        // late in its end.
        let text = |key: &[u8]| {
            first_value_of(&self.bytes, key)
                .or_else(|| last_value_of(tail, key))
                .and_then(first_value::<serde_json::Value>)
        };
        Some(Doc {
            kind: text(b"type"),
            model: text(b"model"),
            usage: Some(usage),
            message: None,
            response: None,
        })
    }
}

/// Append `more` to `tail`, keeping at most twice [`TAIL_KEEP`] bytes and at least the last
/// [`TAIL_KEEP`] of them.
fn keep_end(tail: &mut Vec<u8>, more: &[u8]) {
    if more.len() >= TAIL_KEEP {
        tail.clear();
        tail.extend_from_slice(&more[more.len() - TAIL_KEEP..]);
        return;
    }
    if tail.len() + more.len() > 2 * TAIL_KEEP {
        tail.drain(..tail.len() + more.len() - TAIL_KEEP);
    }
    tail.extend_from_slice(more);
}

/// The first JSON value of `bytes` (what follows it is not read).
fn first_value<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Option<T> {
    serde_json::Deserializer::from_slice(bytes)
        .into_iter::<T>()
        .next()?
        .ok()
}

/// Where the value of the member `"key":` starts, at its first or last place. A quote in
/// a JSON string is escaped, so `"key"` followed by a colon is a member name wherever it
/// stands; a name of a nested object is found as well, which the callers allow for.
fn value_of(bytes: &[u8], key: &[u8], last: bool) -> Option<usize> {
    let mut needle = Vec::with_capacity(key.len() + 2);
    needle.push(b'"');
    needle.extend_from_slice(key);
    needle.push(b'"');
    let starts = (0..bytes.len().saturating_sub(needle.len() - 1))
        .filter(|&i| bytes[i..].starts_with(&needle) && (i == 0 || bytes[i - 1] != b'\\'));
    let colon_after = |i: usize| {
        let mut j = i + needle.len();
        while bytes.get(j).is_some_and(u8::is_ascii_whitespace) {
            j += 1;
        }
        (bytes.get(j) == Some(&b':')).then_some(j + 1)
    };
    if last {
        starts.rev().find_map(colon_after)
    } else {
        starts.into_iter().find_map(colon_after)
    }
}

fn first_value_of<'b>(bytes: &'b [u8], key: &[u8]) -> Option<&'b [u8]> {
    value_of(bytes, key, false).map(|i| &bytes[i..])
}

fn last_value_of<'b>(bytes: &'b [u8], key: &[u8]) -> Option<&'b [u8]> {
    value_of(bytes, key, true).map(|i| &bytes[i..])
}

/// A model name worth recording: a string of at most [`MODEL_MAX`] characters, none of
/// them a control character.
fn model_name(v: Option<&serde_json::Value>) -> Option<String> {
    let s = v?.as_str()?.trim();
    (!s.is_empty() && s.chars().count() <= MODEL_MAX && !s.chars().any(char::is_control))
        .then(|| s.to_owned())
}

/// Where a line of an event stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Reading the field name (its bytes so far in `field`).
    Field,
    /// In a `data` line's value, kept.
    Data,
    /// In an `event` line's value, kept (bounded) in `event`.
    Event,
    /// In any other line, or a value not worth keeping: skipped to its end.
    Skip,
}

/// Reads `usage` from an answer's bytes as they pass, keeping at most one event's data
/// ([`CAPTURE_LIMIT`], then a bounded head and tail). An event stream's events are read
/// one by one, and only those that may carry usage are kept; a whole body is kept
/// (bounded) and read at its end.
#[derive(Debug)]
pub struct Meter {
    provider: Provider,
    sse: bool,
    line: Line,
    /// The field name of the current line, up to its colon (at most 6 bytes kept).
    field: Vec<u8>,
    /// Whether the next byte of a value is its first (an SSE value drops one leading space).
    value_start: bool,
    /// The current event's `event` name (bounded).
    event: Vec<u8>,
    /// Whether the current event has had a data line yet (the next one joins with `\n`).
    has_data: bool,
    /// The current event's data, or the whole body.
    data: Capture,
    /// What the answer reported so far.
    counts: Usage,
    model: Option<String>,
    found: bool,
}

impl Meter {
    /// A meter of an answer of `provider`, an event stream when `sse`.
    pub fn new(provider: Provider, sse: bool) -> Self {
        Meter {
            provider,
            sse,
            line: Line::Field,
            field: Vec::new(),
            value_start: false,
            event: Vec::new(),
            has_data: false,
            data: Capture::default(),
            counts: Usage::default(),
            model: None,
            found: false,
        }
    }

    /// Read the next bytes given to the client.
    pub fn push(&mut self, chunk: &[u8]) {
        if !self.sse {
            self.data.push(chunk);
            return;
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            match self.line {
                Line::Field => {
                    let b = rest[0];
                    rest = &rest[1..];
                    match b {
                        b'\n' => self.end_line(),
                        b':' => {
                            self.line = match self.field.as_slice() {
                                b"data" if self.wanted() => Line::Data,
                                b"event" => Line::Event,
                                _ => Line::Skip,
                            };
                            self.value_start = true;
                        }
                        _ if self.field.len() < 6 => self.field.push(b),
                        _ => self.line = Line::Skip,
                    }
                }
                Line::Data | Line::Event | Line::Skip => {
                    let end = rest.iter().position(|&b| b == b'\n');
                    let (mut value, after) = match end {
                        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                        None => (rest, None),
                    };
                    if self.value_start && !value.is_empty() {
                        if value[0] == b' ' {
                            value = &value[1..];
                        }
                        self.value_start = false;
                        if self.line == Line::Data && self.has_data {
                            self.data.push(b"\n");
                        }
                    }
                    match self.line {
                        Line::Data => self.data.push(value),
                        Line::Event if self.event.len() + value.len() <= 64 => {
                            self.event.extend_from_slice(value)
                        }
                        Line::Event => self.line = Line::Skip,
                        _ => {}
                    }
                    match after {
                        Some(after) => {
                            rest = after;
                            self.end_line();
                        }
                        None => rest = &[],
                    }
                }
            }
        }
    }

    /// Whether the current event may carry usage, by its `event` name (an event without
    /// one is read to find out).
    fn wanted(&self) -> bool {
        let name = self.event.strip_suffix(b"\r").unwrap_or(&self.event);
        name.is_empty() || is_usage_event(self.provider, name)
    }

    fn end_line(&mut self) {
        let blank = self.line == Line::Field && matches!(self.field.as_slice(), [] | [b'\r']);
        if self.line == Line::Data {
            self.has_data = true;
        }
        self.line = Line::Field;
        self.field.clear();
        self.value_start = false;
        if blank {
            self.end_event();
        }
    }

    fn end_event(&mut self) {
        if !self.data.is_empty()
            && let Some(mut doc) = self.data.read()
        {
            // The event's name stands for its type when the data's was not kept.
            let name = self.event.strip_suffix(b"\r").unwrap_or(&self.event);
            if doc.kind.is_none() && !name.is_empty() {
                doc.kind = Some(String::from_utf8_lossy(name).into_owned().into());
            }
            self.take(doc);
        }
        self.data.clear();
        self.event.clear();
        self.has_data = false;
    }

    /// Take what one event (or body) reported.
    fn take(&mut self, doc: Doc) {
        let kind = doc.kind.as_ref().and_then(|k| k.as_str()).unwrap_or("");
        let (usage, model) = if !self.sse {
            (doc.usage, doc.model)
        } else {
            match (self.provider, kind) {
                (Provider::Claude, "message_start") => match doc.message {
                    Some(m) => (m.usage.or(doc.usage), m.model.or(doc.model)),
                    // Only the tail of a huge one was kept: its usage is the message's.
                    None => (doc.usage, doc.model),
                },
                (Provider::Claude, "message_delta") => (doc.usage, None),
                (Provider::Codex, k) if is_usage_event(Provider::Codex, k.as_bytes()) => {
                    match doc.response {
                        Some(r) => (r.usage, r.model),
                        None => (doc.usage, doc.model),
                    }
                }
                _ => (None, None),
            }
        };
        if let Some(name) = model_name(model.as_ref()) {
            self.model = Some(name);
        }
        let Some(u) = usage else {
            return;
        };
        self.found = true;
        // Counts are cumulative: a later report of a field replaces the earlier one.
        let c = &mut self.counts;
        c.input_tokens = u.input_tokens.or(c.input_tokens);
        c.output_tokens = u.output_tokens.or(c.output_tokens);
        c.cache_read_input_tokens = u.cache_read_input_tokens.or(c.cache_read_input_tokens);
        c.cache_creation_input_tokens = u
            .cache_creation_input_tokens
            .or(c.cache_creation_input_tokens);
        if let Some(d) = u.input_tokens_details {
            let cached = d.cached_tokens.or(c
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens));
            c.input_tokens_details = Some(InputDetails {
                cached_tokens: cached,
            });
        }
    }

    /// What the answer reported, once its bytes are through (or as far as they went): None
    /// when it reported no usage. A whole body is read here; an event stream's last event
    /// is read even without its closing blank line.
    pub fn finish(&mut self) -> Option<Tally> {
        if !self.sse {
            if let Some(doc) = self.data.read() {
                self.take(doc);
            }
            self.data.clear();
        } else if self.line == Line::Data || self.has_data {
            self.end_line();
            self.end_event();
        }
        if !self.found {
            return None;
        }
        let u = &self.counts;
        let counts = match self.provider {
            Provider::Claude => TokenCounts {
                input: u.input_tokens.unwrap_or(0),
                output: u.output_tokens.unwrap_or(0),
                cache_read: u.cache_read_input_tokens.unwrap_or(0),
                cache_write: u.cache_creation_input_tokens.unwrap_or(0),
            },
            Provider::Codex => {
                let cached = u
                    .input_tokens_details
                    .as_ref()
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0);
                let input = u.input_tokens.unwrap_or(0);
                TokenCounts {
                    input: input.saturating_sub(cached),
                    output: u.output_tokens.unwrap_or(0),
                    cache_read: cached.min(input),
                    cache_write: u.cache_creation_input_tokens.unwrap_or(0),
                }
            }
        };
        self.found = false;
        Some(Tally {
            model: self.model.take(),
            counts,
        })
    }
}

/// Whether an event of this name may carry usage.
fn is_usage_event(provider: Provider, name: &[u8]) -> bool {
    match provider {
        Provider::Claude => matches!(name, b"message_start" | b"message_delta"),
        Provider::Codex => matches!(
            name,
            b"response.completed" | b"response.incomplete" | b"response.failed"
        ),
    }
}

#[cfg(test)]
mod tests;
