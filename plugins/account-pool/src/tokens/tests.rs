use super::*;
use serde_json::json;

fn sse(events: &[(&str, serde_json::Value)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in events {
        out.extend(format!("event: {name}\ndata: {data}\n\n").into_bytes());
    }
    out
}

/// Feed `bytes` cut at every `step` bytes and finish.
fn meter(provider: Provider, is_sse: bool, bytes: &[u8], step: usize) -> (Option<Tally>, Meter) {
    let mut m = Meter::new(provider, is_sse);
    for piece in bytes.chunks(step.max(1)) {
        m.push(piece);
    }
    (m.finish(), m)
}

fn claude_stream() -> Vec<u8> {
    sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message",
                "model": "claude-sonnet-4-5", "content": [],
                "usage": {"input_tokens": 12, "output_tokens": 1,
                          "cache_creation_input_tokens": 300, "cache_read_input_tokens": 4000}}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "\"usage\": {\"output_tokens\": 999}"}}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": 57}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ])
}

/// Every cut of a Messages stream gives the same counts: message_start's input and cache
/// counts, message_delta's cumulative output; text that looks like usage is not read.
#[test]
fn a_messages_stream_is_counted_whatever_its_chunks() {
    let bytes = claude_stream();
    for step in [1, 2, 3, 7, 64, bytes.len()] {
        let (tally, _) = meter(Provider::Claude, true, &bytes, step);
        assert_eq!(
            tally,
            Some(Tally {
                model: Some("claude-sonnet-4-5".into()),
                counts: TokenCounts {
                    input: 12,
                    output: 57,
                    cache_read: 4000,
                    cache_write: 300
                }
            }),
            "cut every {step} bytes"
        );
    }
}

/// A `message_delta` that reports input and cache counts too (cumulative) replaces
/// message_start's; CRLF line ends and events without an `event:` line are read alike.
#[test]
fn later_cumulative_counts_replace_earlier_ones_and_crlf_is_read() {
    let text = "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-opus-4\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1,\"cache_read_input_tokens\":0}}}\r\n\r\n\
                event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":5,\"output_tokens\":9,\"cache_read_input_tokens\":70,\"cache_creation_input_tokens\":2}}\r\n\r\n";
    let (tally, _) = meter(Provider::Claude, true, text.as_bytes(), 5);
    assert_eq!(
        tally.unwrap(),
        Tally {
            model: Some("claude-opus-4".into()),
            counts: TokenCounts {
                input: 5,
                output: 9,
                cache_read: 70,
                cache_write: 2
            }
        }
    );
}

fn codex_completed(usage: serde_json::Value, padding: usize) -> serde_json::Value {
    json!({"type": "response.completed", "response": {"id": "r", "model": "gpt-5-codex",
        "instructions": "x".repeat(padding),
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "usage"}]}],
        "usage": usage, "user": null, "metadata": {}}})
}

/// A Responses stream: `response.completed`'s usage, cached input counted as cache reads
/// and taken out of the fresh input.
#[test]
fn a_responses_stream_counts_cached_input_as_cache_reads() {
    let usage = json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 800},
                       "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 10},
                       "total_tokens": 1040});
    let bytes = sse(&[
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": "r"}}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "delta": "hi"}),
        ),
        ("response.completed", codex_completed(usage, 10)),
    ]);
    for step in [1, 13, bytes.len()] {
        let (tally, _) = meter(Provider::Codex, true, &bytes, step);
        assert_eq!(
            tally,
            Some(Tally {
                model: Some("gpt-5-codex".into()),
                counts: TokenCounts {
                    input: 200,
                    output: 40,
                    cache_read: 800,
                    cache_write: 0
                }
            })
        );
    }
}

/// A `response.completed` far larger than what is kept (long instructions and output)
/// still gives its usage, from the kept tail, and the meter's memory stays bounded.
#[test]
fn a_huge_completed_event_is_read_from_its_kept_end() {
    let usage = json!({"input_tokens": 50_000, "input_tokens_details": {"cached_tokens": 49_000},
                       "output_tokens": 700});
    let bytes = sse(&[(
        "response.completed",
        codex_completed(usage, 3 * CAPTURE_LIMIT),
    )]);
    let mut m = Meter::new(Provider::Codex, true);
    let mut most = 0;
    for piece in bytes.chunks(4096) {
        m.push(piece);
        let held = m.data.bytes.capacity() + m.data.tail.as_ref().map_or(0, Vec::capacity);
        most = most.max(held);
    }
    assert!(most <= CAPTURE_LIMIT + 2 * TAIL_KEEP, "held {most} bytes");
    assert_eq!(
        m.finish().unwrap(),
        Tally {
            model: Some("gpt-5-codex".into()),
            counts: TokenCounts {
                input: 1000,
                output: 700,
                cache_read: 49_000,
                cache_write: 0
            }
        }
    );
}

/// Whole (non-streamed) bodies of both APIs.
#[test]
fn whole_bodies_are_read_at_their_end() {
    let claude = json!({"id": "m", "type": "message", "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 5,
                  "cache_creation_input_tokens": 6}})
    .to_string();
    let (tally, _) = meter(Provider::Claude, false, claude.as_bytes(), 10);
    assert_eq!(
        tally.unwrap().counts,
        TokenCounts {
            input: 3,
            output: 4,
            cache_read: 5,
            cache_write: 6
        }
    );
    let codex = json!({"id": "r", "object": "response", "model": "gpt-5",
        "output": [], "usage": {"input_tokens": 30, "input_tokens_details": null,
                                 "output_tokens": 2}})
    .to_string();
    let (tally, _) = meter(Provider::Codex, false, codex.as_bytes(), 7);
    assert_eq!(
        tally.unwrap(),
        Tally {
            model: Some("gpt-5".into()),
            counts: TokenCounts {
                input: 30,
                output: 2,
                cache_read: 0,
                cache_write: 0
            }
        }
    );
}

/// Events that cannot carry usage are skipped without being kept, and an answer without
/// usage (or not JSON) reports nothing.
#[test]
fn other_events_are_not_kept_and_no_usage_is_none() {
    let mut m = Meter::new(Provider::Claude, true);
    m.push(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":");
    assert!(m.data.is_empty(), "a delta's data is not kept");
    m.push(b"{\"text\":\"x\"}}\n\n");
    assert_eq!(m.finish(), None);
    assert_eq!(meter(Provider::Codex, false, b"not json", 3).0, None);
    assert_eq!(
        meter(Provider::Claude, false, b"{\"input_tokens\":7}", 3).0,
        None
    );
    // A model name that is not plausible is not recorded; the counts are.
    let body = json!({"model": "a\u{7}b", "usage": {"input_tokens": 1}}).to_string();
    let tally = meter(Provider::Claude, false, body.as_bytes(), 100)
        .0
        .unwrap();
    assert_eq!(tally.model, None);
    assert_eq!(tally.counts.input, 1);
}

/// A stream cut short after `message_start` still reports the input it was billed for.
#[test]
fn a_stream_cut_short_reports_what_came() {
    let bytes = claude_stream();
    let cut = bytes
        .windows(13)
        .position(|w| w == b"event: ping\nd")
        .unwrap();
    let (tally, _) = meter(Provider::Claude, true, &bytes[..cut], 9);
    let counts = tally.unwrap().counts;
    assert_eq!(
        (counts.input, counts.output, counts.cache_read),
        (12, 1, 4000)
    );
}
