//! The first event of a served event stream, read before the response head goes to the
//! client: whether the stream opens with a failure the pool can still act on (spec §4). A
//! 200 stream whose first event is an overload or a rate limit has delivered nothing, so
//! the pool treats it like the status it stands for instead of relaying a failed stream.
//!
//! What each provider sends first, and where the shapes come from:
//! - Claude (Messages API): `message_start`, or in its place an `error` event,
//!   `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` — the
//!   API's streaming documentation ("error events": the 529 of a non-streamed request).
//!   `rate_limit_error` (429) and `api_error` (500) in that place are assumed by the same
//!   rule: an error type stands for its documented status. `ping` carries nothing and is
//!   read past.
//! - Codex (Responses API): `response.created` and `response.in_progress` announce the
//!   response and carry no output, and a failure comes after them: `response.failed` with
//!   `response.error.code` (a `rate_limit_exceeded` recorded from the service at sequence
//!   number 3 is in the Codex CLI's own tests; `server_is_overloaded` and `slow_down` are
//!   the codes the CLI and the core's classifier read as an overload), or an `error` event
//!   `{"type":"error","code":…,"message":…}` (the core's classifier's shape, assumed).
//!
//! Any other first event — content, or a failure retrying cannot mend — is relayed.

use crate::model::Provider;
use serde_json::Value;

/// The longest message kept from a failure event, in bytes.
const MESSAGE_LIMIT: usize = 1024;

/// What the first event of a stream says, as far as it has arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No event that decides yet (nothing whole, or only events that carry nothing).
    Undecided,
    /// The stream opens with the answer itself (or a failure left to the client): relay it.
    Relay,
    /// The stream opens with this failure: nothing was delivered yet.
    Failed(OpeningFailure),
}

/// A failure a stream opened with, as the HTTP answer it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpeningFailure {
    /// 429 for a rate limit, 529 (Claude) or 503 (Codex) for an overload, 500 for a server
    /// error: the status the outcome table then decides by.
    pub status: u16,
    /// The provider's code (`overloaded_error`, `rate_limit_exceeded`).
    pub code: String,
    /// The provider's message, at most 1 KiB, as sent (the credential is not taken out here).
    pub message: Option<String>,
}

/// Reads a stream's bytes as they arrive, up to its first event that decides. The bytes are
/// the caller's (it holds them to relay them later); this keeps only where it stands and
/// the event being read.
#[derive(Debug)]
pub struct FirstEvent {
    provider: Provider,
    /// Where the next unread line starts.
    pos: usize,
    /// How far past `pos` no line end was found (the search resumes there).
    searched: usize,
    /// The event being read: its `event:` name and its `data:` lines.
    name: String,
    data: String,
    has_data: bool,
}

impl FirstEvent {
    pub fn new(provider: Provider) -> Self {
        FirstEvent {
            provider,
            pos: 0,
            searched: 0,
            name: String::new(),
            data: String::new(),
            has_data: false,
        }
    }

    /// Read on in `held`: every byte of the stream so far (what the last call saw, and
    /// more). Returns what the first event that decides says, once it is whole.
    pub fn advance(&mut self, held: &[u8]) -> Verdict {
        while let Some((end, next)) = self.next_line(held) {
            let line = &held[self.pos..end];
            self.pos = next;
            self.searched = next;
            if line.is_empty() {
                let verdict = self.dispatch();
                if verdict != Verdict::Undecided {
                    return verdict;
                }
            } else {
                self.field(line);
            }
        }
        Verdict::Undecided
    }

    /// The end of the line at `pos` and where the next one starts, once both are certain
    /// (a `\r` last in `held` may be the first half of `\r\n`).
    fn next_line(&mut self, held: &[u8]) -> Option<(usize, usize)> {
        let from = self.searched.max(self.pos);
        let Some(at) = held
            .get(from..)?
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
        else {
            self.searched = held.len();
            return None;
        };
        let end = from + at;
        if held[end] == b'\n' {
            return Some((end, end + 1));
        }
        match held.get(end + 1) {
            None => {
                self.searched = end;
                None
            }
            Some(b'\n') => Some((end, end + 2)),
            Some(_) => Some((end, end + 1)),
        }
    }

    /// One field line of the event being read (comments and unknown fields are skipped).
    fn field(&mut self, line: &[u8]) {
        if line.first() == Some(&b':') {
            return;
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match name {
            b"event" => self.name = String::from_utf8_lossy(value).into_owned(),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&String::from_utf8_lossy(value));
                self.has_data = true;
            }
            _ => {}
        }
    }

    /// A blank line ends the event: what it says. One without data is no event (as a
    /// browser's EventSource reads it).
    fn dispatch(&mut self) -> Verdict {
        let name = std::mem::take(&mut self.name);
        let data = std::mem::take(&mut self.data);
        if !std::mem::replace(&mut self.has_data, false) {
            return Verdict::Undecided;
        }
        let mut json: Option<Value> = None;
        let kind = if name.is_empty() {
            json = serde_json::from_str(&data).ok();
            json.as_ref()
                .and_then(|j| j.get("type"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        } else {
            name
        };
        let failure = |json: Option<Value>| {
            let json = json.or_else(|| serde_json::from_str(&data).ok());
            let failure = json.and_then(|j| match self.provider {
                Provider::Claude => claude_failure(&j),
                Provider::Codex => codex_failure(&j),
            });
            failure.map_or(Verdict::Relay, Verdict::Failed)
        };
        match (self.provider, kind.as_str()) {
            (Provider::Claude, "ping") => Verdict::Undecided,
            (Provider::Claude, "error") => failure(json),
            (Provider::Codex, "response.created" | "response.in_progress" | "response.queued") => {
                Verdict::Undecided
            }
            (Provider::Codex, "response.failed" | "error") => failure(json),
            _ => Verdict::Relay,
        }
    }
}

/// A Messages API `error` event the pool acts on: `{"type":"error","error":{"type","message"}}`.
fn claude_failure(event: &Value) -> Option<OpeningFailure> {
    let error = event.get("error")?;
    let code = error.get("type")?.as_str()?;
    let status = match code {
        "overloaded_error" => 529,
        "rate_limit_error" => 429,
        "api_error" => 500,
        _ => return None,
    };
    Some(OpeningFailure {
        status,
        code: code.to_owned(),
        message: message(error),
    })
}

/// A Responses API failure the pool acts on: `response.failed` (`response.error`), or an
/// `error` event (its `error` object, or the event itself), by `code` (else `type`).
fn codex_failure(event: &Value) -> Option<OpeningFailure> {
    let error = event
        .pointer("/response/error")
        .filter(|e| e.is_object())
        .or_else(|| event.get("error").filter(|e| e.is_object()))
        .unwrap_or(event);
    let code = ["code", "type"].iter().find_map(|k| {
        error
            .get(*k)
            .and_then(Value::as_str)
            .filter(|c| *c != "error")
    })?;
    let status = match code {
        "rate_limit_exceeded" | "usage_limit_reached" => 429,
        "server_is_overloaded" | "slow_down" => 503,
        "server_error" => 500,
        _ => return None,
    };
    Some(OpeningFailure {
        status,
        code: code.to_owned(),
        message: message(error),
    })
}

fn message(error: &Value) -> Option<String> {
    let text = error.get("message")?.as_str()?.trim();
    let mut end = text.len().min(MESSAGE_LIMIT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (end > 0).then(|| text[..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"details\":null,\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    const RATE_LIMITED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Number of requests has exceeded your rate limit.\"}}\n\n";
    const MESSAGE_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[]}}\n\n";
    const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
    const CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n";
    const IN_PROGRESS: &str = "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n";
    const FAILED_RATE: &str = "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"failed\",\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"Rate limit reached. Please try again in 11.054s.\"}}}\n\n";
    const ITEM_ADDED: &str = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"content\":[]}}\n\n";

    fn failed(status: u16, code: &str, message: &str) -> Verdict {
        Verdict::Failed(OpeningFailure {
            status,
            code: code.into(),
            message: Some(message.into()),
        })
    }

    /// The verdict on `stream` fed as the bytes up to `cut`, then the rest; the same bytes
    /// whole must say the same, and so must the first part followed by every single byte.
    fn verdicts(provider: Provider, stream: &[u8]) -> Vec<Verdict> {
        let mut seen = Vec::new();
        for cut in 0..=stream.len() {
            let mut scan = FirstEvent::new(provider);
            let first = scan.advance(&stream[..cut]);
            let verdict = if first == Verdict::Undecided {
                scan.advance(stream)
            } else {
                first
            };
            seen.push(verdict);
        }
        // Byte by byte.
        let mut scan = FirstEvent::new(provider);
        let mut verdict = Verdict::Undecided;
        for end in 1..=stream.len() {
            verdict = scan.advance(&stream[..end]);
            if verdict != Verdict::Undecided {
                break;
            }
        }
        seen.push(verdict);
        seen
    }

    /// Every split of `stream` says `want`.
    fn assert_every_split(provider: Provider, stream: &str, want: &Verdict) {
        for (cut, got) in verdicts(provider, stream.as_bytes()).iter().enumerate() {
            assert_eq!(got, want, "cut at {cut} of {stream:?}");
        }
    }

    #[test]
    fn a_claude_stream_opening_with_an_overload_fails_as_529_at_every_split() {
        let want = failed(529, "overloaded_error", "Overloaded");
        assert_every_split(Provider::Claude, OVERLOADED, &want);
        // A ping first carries nothing; CRLF and CR line ends read the same.
        assert_every_split(Provider::Claude, &format!("{PING}{OVERLOADED}"), &want);
        assert_every_split(Provider::Claude, &OVERLOADED.replace('\n', "\r\n"), &want);
        // A lone `\r` ends a line once the next byte shows it is not half of `\r\n`.
        let cr = format!(
            "{}{}",
            OVERLOADED.replace('\n', "\r"),
            PING.replace('\n', "\r")
        );
        assert_every_split(Provider::Claude, &cr, &want);
        // The type in the data alone names the event too.
        let bare = OVERLOADED.strip_prefix("event: error\n").unwrap();
        assert_every_split(Provider::Claude, bare, &want);
        // A comment (a keep-alive) first, and the data in two lines (joined by a line break).
        let joined = ": keep-alive\n\nevent: error\ndata: {\"type\":\"error\",\ndata: \"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_every_split(Provider::Claude, joined, &want);
    }

    #[test]
    fn a_claude_stream_opening_with_a_rate_limit_fails_as_429() {
        assert_every_split(
            Provider::Claude,
            RATE_LIMITED,
            &failed(
                429,
                "rate_limit_error",
                "Number of requests has exceeded your rate limit.",
            ),
        );
        let api = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}\n\n";
        assert_every_split(
            Provider::Claude,
            api,
            &failed(500, "api_error", "Internal server error"),
        );
    }

    #[test]
    fn a_claude_stream_opening_with_its_message_is_relayed() {
        // The answer's first event decides at once: what follows is not waited for.
        assert_every_split(Provider::Claude, MESSAGE_START, &Verdict::Relay);
        assert_every_split(
            Provider::Claude,
            &format!("{MESSAGE_START}{OVERLOADED}"),
            &Verdict::Relay,
        );
        // A failure retrying cannot mend is the client's.
        let invalid = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"bad\"}}\n\n";
        assert_every_split(Provider::Claude, invalid, &Verdict::Relay);
        // Something that is not an event of the API at all.
        assert_every_split(Provider::Claude, "data: hello\n\n", &Verdict::Relay);
    }

    #[test]
    fn nothing_decides_before_a_whole_event() {
        for partial in [
            "",
            ": comment\n\n",
            "event: error\n",
            "event: error\ndata: {\"type\":\"error\"",
            // Its blank line not yet certain: `\r` may be the start of `\r\n`.
            "event: error\r\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\r\n\r",
            PING,
            // An event without data is no event.
            "event: message_start\n\n",
        ] {
            assert_eq!(
                FirstEvent::new(Provider::Claude).advance(partial.as_bytes()),
                Verdict::Undecided,
                "{partial:?}"
            );
        }
    }

    #[test]
    fn a_codex_stream_failing_after_its_announcement_fails_at_every_split() {
        let stream = format!("{CREATED}{IN_PROGRESS}{FAILED_RATE}");
        assert_every_split(
            Provider::Codex,
            &stream,
            &failed(
                429,
                "rate_limit_exceeded",
                "Rate limit reached. Please try again in 11.054s.",
            ),
        );
        let overloaded = "data: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"error\":{\"code\":\"server_is_overloaded\",\"message\":\"Our servers are currently overloaded.\"}}}\n\n";
        assert_every_split(
            Provider::Codex,
            &format!("{CREATED}{overloaded}"),
            &failed(
                503,
                "server_is_overloaded",
                "Our servers are currently overloaded.",
            ),
        );
        let error = "event: error\ndata: {\"type\":\"error\",\"code\":\"slow_down\",\"message\":\"Slow down.\"}\n\n";
        assert_every_split(
            Provider::Codex,
            error,
            &failed(503, "slow_down", "Slow down."),
        );
    }

    #[test]
    fn a_codex_stream_with_output_or_another_failure_is_relayed() {
        assert_every_split(
            Provider::Codex,
            &format!("{CREATED}{IN_PROGRESS}{ITEM_ADDED}{FAILED_RATE}"),
            &Verdict::Relay,
        );
        let context = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"too long\"}}}\n\n";
        assert_every_split(
            Provider::Codex,
            &format!("{CREATED}{context}"),
            &Verdict::Relay,
        );
        assert_eq!(
            FirstEvent::new(Provider::Codex).advance(format!("{CREATED}{IN_PROGRESS}").as_bytes()),
            Verdict::Undecided,
            "the announcement alone decides nothing"
        );
        // The other provider's first events are not skipped.
        assert_every_split(Provider::Codex, PING, &Verdict::Relay);
        assert_every_split(Provider::Claude, CREATED, &Verdict::Relay);
    }

    #[test]
    fn a_long_message_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MESSAGE_LIMIT);
        let event = format!(
            "event: error\ndata: {}\n\n",
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": long}})
        );
        let Verdict::Failed(f) = FirstEvent::new(Provider::Claude).advance(event.as_bytes()) else {
            panic!("an overload");
        };
        let message = f.message.unwrap();
        assert!(message.len() <= MESSAGE_LIMIT && message.len() >= MESSAGE_LIMIT - 1);
        assert!(message.chars().all(|c| c == 'é'));
    }
}
