//! Token accounting through the real pool in the real host: what each served answer's
//! `usage` reported (the strict fake's numbers) is what the pool's `tokens.totals` says, per
//! account, thread and model, for a streamed and a whole answer of both providers; and the
//! prompt cache as accounts see it: a conversation that stays pinned reads its cache, one
//! moved by a lasting refusal writes it again on its new account.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pooler_host::operate::wire::{
    ProviderName, TokenCountsView as TokenCounts, TokenTotalView as TokenTotal,
};
use pooler_host::runtime::bindings::types::Provider;
use pooler_tests::pool::{Pool, PoolSetup, THREAD, api_key, five_hour_rejected, oauth, reply};
use pooler_tests::provider::{PromptCache, Usage, claude, codex};

fn counts(answers: u64, u: Usage) -> TokenCounts {
    TokenCounts {
        answers,
        input: u.input,
        output: u.output,
        cache_read: u.cache_read,
        cache_write: u.cache_write,
    }
}

fn sum(a: Usage, b: Usage) -> Usage {
    Usage {
        input: a.input + b.input,
        output: a.output + b.output,
        cache_read: a.cache_read + b.cache_read,
        cache_write: a.cache_write + b.cache_write,
    }
}

/// The totals of thread `t1` on account `letter`, for `model`.
fn row(pool: &Pool, letter: &str, model: &str, answers: u64, u: Usage) -> TokenTotal {
    TokenTotal {
        provider: ProviderName::from(pool.provider),
        account: pool.id(letter),
        thread: Some(THREAD.to_owned()),
        model: Some(model.to_owned()),
        counts: counts(answers, u),
    }
}

/// Claude: a streamed answer (usage in `message_start` and `message_delta`) and a whole
/// one (the body's `usage`) are counted exactly as the fake reported them, on the account
/// that served them, for the route's thread and the model the answer named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_tokens_match_the_usage_of_streamed_and_whole_answers() {
    let pool = Pool::claude().await;
    let streamed = Usage {
        input: 17,
        output: 230,
        cache_read: 41_000,
        cache_write: 1_200,
    };
    pool.upstream.push(claude::message_with("hello", streamed));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("message_delta"), "{}", answer.body);
    assert_eq!(
        pool.tokens(true).await,
        [row(&pool, "A", "claude-sonnet-4-5", 1, streamed)]
    );

    let whole = Usage {
        input: 3,
        output: 9,
        cache_read: 500,
        cache_write: 0,
    };
    pool.upstream.push(claude::message_body("hi", whole));
    let answer = pool.send(pool.messages("S")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        pool.tokens(true).await,
        [row(
            &pool,
            "A",
            "claude-sonnet-4-5",
            2,
            sum(streamed, whole)
        )]
    );

    // The same counts at `GET /metrics`, by kind.
    let token = pool.host.admin_token().unwrap();
    let scrape = hyper::Request::builder()
        .method("GET")
        .uri(format!("{}/metrics", pool.url))
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let text = pool.send(scrape).await.body;
    let total = sum(streamed, whole);
    let a = pool.id("A");
    for (kind, n) in [
        ("input", total.input),
        ("output", total.output),
        ("cache_read", total.cache_read),
        ("cache_write", total.cache_write),
    ] {
        let line = format!(
            "pooler_pool_tokens_total{{account=\"{a}\",kind=\"{kind}\",provider=\"claude\"}} {n}\n"
        );
        assert!(text.contains(&line), "{line} in {text}");
    }
}

/// Codex: a streamed answer (`response.completed`) and a whole one, whose `input_tokens`
/// include the cached ones: counted as cache reads, not as fresh input. (The Codex backend
/// refuses a request that does not stream, as the strict fake does; the whole answer is
/// the one an upstream gives in JSON all the same, read from its body's `usage`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_tokens_match_the_usage_of_streamed_and_whole_answers() {
    let pool = PoolSetup::new(Provider::Codex)
        .account(oauth(Provider::Codex, "A", None))
        .account(oauth(Provider::Codex, "B", None))
        .start()
        .await;
    let request = || {
        let mut request = pool.request(
            "POST",
            "/v1/responses",
            serde_json::json!({"model": "gpt-5-codex", "input": [], "stream": true,
                               "store": false, "prompt_cache_key": "S"})
            .to_string(),
        );
        request
            .headers_mut()
            .insert("session-id", "S".parse().unwrap());
        request
    };
    let streamed = Usage {
        input: 120,
        output: 64,
        cache_read: 9_000,
        cache_write: 0,
    };
    pool.upstream.push(codex::response_with("pong", streamed));
    let answer = pool.send(request()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        pool.tokens(true).await,
        [row(&pool, "A", "gpt-5-codex", 1, streamed)]
    );

    let whole = Usage {
        input: 7,
        output: 2,
        cache_read: 0,
        cache_write: 0,
    };
    pool.upstream.push(codex::response_body("pong", whole));
    let answer = pool.send(request()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        pool.tokens(true).await,
        [row(&pool, "A", "gpt-5-codex", 2, sum(streamed, whole))]
    );
}

/// The prompt cache per account: S's first answer on A writes its prompt to A's cache and
/// its second reads it (the pin keeps S on A); A's shared window is then refused (a
/// lasting refusal), S moves to B and writes its prompt to B's cache, then reads it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_conversation_reads_its_cache_and_a_moved_one_writes_it_on_its_new_account() {
    let pool = Pool::claude().await;
    let cache = Arc::new(PromptCache::default());
    let refuse_a = Arc::new(AtomicBool::new(false));
    let a_key = api_key("A");
    let reset = pool.now() + 3_600_000;
    pool.upstream.set_responder(Some({
        let (cache, refuse_a) = (cache.clone(), refuse_a.clone());
        Arc::new(move |request| {
            if !request.path.starts_with("/v1/messages") {
                return None;
            }
            if refuse_a.load(Ordering::SeqCst) && request.header("x-api-key") == Some(&a_key) {
                return Some(reply(429, &five_hour_rejected(Some(reset))));
            }
            Some(claude::message_with(
                "ok",
                cache.usage(request, 20_000, 12, 80),
            ))
        })
    }));
    let send = async || {
        let answer = pool.send(pool.messages("S")).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    };
    let write = Usage {
        input: 12,
        output: 80,
        cache_read: 0,
        cache_write: 19_988,
    };
    let read = Usage {
        input: 12,
        output: 80,
        cache_read: 19_988,
        cache_write: 0,
    };

    send().await;
    send().await;
    assert_eq!(pool.seen(), ["A", "A"]);
    let on_a = counts(2, sum(write, read));
    let by_account = pool.tokens(false).await;
    assert_eq!(by_account.len(), 1, "{by_account:?}");
    assert_eq!(by_account[0].account, pool.id("A"));
    assert_eq!(
        by_account[0].counts, on_a,
        "the pinned conversation read A's cache"
    );

    refuse_a.store(true, Ordering::SeqCst);
    send().await;
    send().await;
    assert_eq!(pool.seen(), ["A", "A", "A", "B", "B"]);
    assert_eq!(pool.pinned("S").await.as_deref(), Some("B"));
    let by_account = pool.tokens(false).await;
    let totals: Vec<(String, TokenCounts)> = by_account
        .into_iter()
        .map(|t| (pool.letter_of(&t.account), t.counts))
        .collect();
    let mut want = vec![
        ("A".to_owned(), on_a),
        ("B".to_owned(), counts(2, sum(write, read))),
    ];
    want.sort_by_key(|x| pool.id(&x.0));
    assert_eq!(
        totals, want,
        "the refused attempt on A counts nothing; the moved conversation wrote B's cache once"
    );
}
