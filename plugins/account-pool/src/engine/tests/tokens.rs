//! Token accounting on the request path: a served answer's usage is recorded for the
//! account that served it, the route's thread and the model; nothing else is.

use super::*;
use crate::store::TokenRow;
use crate::tokens::TokenCounts;

const START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":11,\"output_tokens\":1,\"cache_creation_input_tokens\":22,\"cache_read_input_tokens\":33}}}\n\n";
const DELTA: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n";
const END: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":44}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn streamed() -> Reply {
    Reply::Sse(vec![START, DELTA, END], false)
}

fn whole(status: u16) -> Reply {
    Reply::Status(
        status,
        vec![("content-type", "application/json".into())],
        json!({"type": "message", "model": "claude-haiku-4-5", "content": [],
               "usage": {"input_tokens": 5, "output_tokens": 6,
                         "cache_read_input_tokens": 7, "cache_creation_input_tokens": 8}})
        .to_string(),
    )
}

fn totals(p: &Pool, by_thread: bool) -> Vec<TokenRow> {
    p.store().token_totals(0, None, by_thread).unwrap()
}

/// A streamed and a whole answer are each recorded once, with the counts their usage
/// stated, for the serving account, thread `t1` and the model the answer named; the
/// counter `pooler_pool_tokens_total` has them by kind.
#[test]
fn served_answers_are_recorded_by_account_thread_and_model() {
    let p = Pool::abc();
    p.up.push("a", streamed());
    assert_eq!(p.claude(Some("s1")).status, 200);
    p.up.push("a", whole(200));
    assert_eq!(p.claude(Some("s1")).status, 200);
    let a = p.id("a");
    assert_eq!(
        totals(&p, true),
        vec![
            TokenRow {
                provider: Provider::Claude,
                account: a.clone(),
                thread: Some("t1".into()),
                model: Some("claude-haiku-4-5".into()),
                answers: 1,
                counts: TokenCounts {
                    input: 5,
                    output: 6,
                    cache_read: 7,
                    cache_write: 8
                },
            },
            TokenRow {
                provider: Provider::Claude,
                account: a.clone(),
                thread: Some("t1".into()),
                model: Some("claude-sonnet-4-5".into()),
                answers: 1,
                counts: TokenCounts {
                    input: 11,
                    output: 44,
                    cache_read: 33,
                    cache_write: 22
                },
            },
        ]
    );
    let by_account = totals(&p, false);
    assert_eq!(by_account.len(), 1);
    assert_eq!(by_account[0].answers, 2);
    assert_eq!(by_account[0].thread, None);
    let counter = |kind| {
        p.env.metrics.counter(
            "pooler_pool_tokens_total",
            &[("provider", "claude"), ("account", &a), ("kind", kind)],
        )
    };
    assert_eq!(
        [
            counter("input"),
            counter("output"),
            counter("cache_read"),
            counter("cache_write")
        ],
        [16, 50, 40, 30]
    );
}

/// Only the account that served counts: a failed attempt before it and an upstream error
/// passed through (whatever its body says) record nothing.
#[test]
fn failed_and_passed_through_answers_record_nothing() {
    let p = Pool::abc();
    p.up.push("a", status(503));
    p.up.push("a", status(503));
    p.up.push("a", status(503));
    p.up.push("b", streamed());
    assert_eq!(p.claude(Some("s1")).status, 200);
    let rows = totals(&p, false);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].account, p.id("b"));
    p.up.push("a", whole(400));
    p.up.push("b", whole(400));
    assert_eq!(p.claude(Some("s2")).status, 400);
    assert_eq!(
        totals(&p, false)[0].answers,
        1,
        "a 400 is not an answer served"
    );
}

/// The tick drops usage older than the retention; newer usage stays, and totals count
/// from the minute `since` falls in.
#[test]
fn token_usage_is_kept_for_its_retention() {
    let p = Pool::abc();
    p.up.push("a", streamed());
    p.claude(Some("s1"));
    let first = p.env.now();
    p.env.advance(crate::store::TOKEN_RETENTION_MS - 120_000);
    p.up.push("a", streamed());
    p.claude(Some("s1"));
    let store = p.store();
    assert_eq!(store.token_totals(0, None, false).unwrap()[0].answers, 2);
    assert_eq!(
        store.token_totals(p.env.now(), None, false).unwrap()[0].answers,
        1
    );
    assert_eq!(
        store.token_totals(first, Some("t2"), false).unwrap(),
        vec![],
        "another thread's filter"
    );
    p.env.advance(180_000);
    block_on(p.admin().tick(p.env.now())).unwrap();
    assert_eq!(store.token_totals(0, None, false).unwrap()[0].answers, 1);
}
