//! The status page (`/_pooler/page`) in a real headless browser: Debian's `chromium`, driven
//! through `chromedriver` over the WebDriver protocol ([`pooler_tests::webdriver`]).
//!
//! The host runs with its core on the manual clock, the real Account Pooler in front of a
//! scripted fake upstream and the real Provider Retry. Two Claude accounts: A, held by a 429
//! with `Retry-After: 3600`, and B, disabled and last-resort (the page shows it, and each
//! provider's routing strategy). A thread's turn failed on that 429, so Provider
//! Retry holds a retry row at the end of A's hold. The browser signs in with a one-time link
//! (as `pooler page` prints), sees both accounts and the waiting thread, clicks "Enable" on
//! B: the server moves the row to within a minute (checked on the server's state), and the
//! page shows the earlier time. Then "Send now" sends the retry, served by B, whose tokens
//! the page then shows. A screenshot
//! of the page with the moved retry is written to `target/browser/status-page.png`, and
//! one with B's tokens to `target/browser/status-page-tokens.png`.
//!
//! The manual clock never moves: nothing is sent by time. The only waits are for the
//! browser's own work (its requests, the page's 2 s refresh), bounded.
//!
//! A second test: text from outside (an account's label, an upstream's refusal) shows on
//! the page written out visibly (`\u{202e}`, `\x1b`), never raw, and without the key the
//! refusal echoed.
//!
//! Fails (does not skip) when chromium or its driver is missing: CI installs them.

use std::time::Duration;

use pooler_core::{ThreadStatus, TurnTrigger};
use pooler_host::runtime::bindings::pool::exports::pooler::plugins::accounts::{
    Credential, NewAccount,
};
use pooler_host::runtime::bindings::types::Provider;
use pooler_tests::core::{API_KEY, CoreSetup, success};
use pooler_tests::pool::reply;
use pooler_tests::provider::claude;
use pooler_tests::webdriver::{Browser, target_dir};
use serde_json::json;

const SECOND: u64 = 1_000;
/// The default reset buffer and jitter bound of Provider Retry.
const BUFFER: u64 = 15 * SECOND;
const JITTER: u64 = 30 * SECOND;
/// How long the browser may take for what it does at once (a safety net).
const BROWSER: Duration = Duration::from_secs(30);

/// Run blocking WebDriver calls on this multi-threaded runtime's worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_pool_and_enabling_an_account_moves_the_retry_earlier() {
    let h = CoreSetup::new().real_retry().start().await;
    let a = h.accounts().await[0].id.clone();
    let b = h.add_claude_key("sk-ant-api03-key-b").await.id;
    h.disable_account(&b).await;
    // B is the spare: last-resort, for when A cannot serve.
    let (status, answer) = h
        .admin(
            "PUT",
            &format!("accounts/{b}/options"),
            json!({"last_resort": true}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["account"]["last_resort"], true, "{answer}");
    h.settle().await;

    // The thread's turn fails with a 429 that holds A for an hour; B is disabled.
    h.upstream
        .push(reply(429, &[("retry-after".to_owned(), "3600".to_owned())]));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    h.settle().await;
    assert_eq!(h.upstream.received()[0].header("x-api-key"), Some(API_KEY));
    assert_eq!(
        h.core().get_thread(&thread).unwrap().status,
        ThreadStatus::Error
    );
    let row = h.row(&thread);
    let held_until = h.now() + 3_600 * SECOND;
    assert!(
        (held_until..held_until + BUFFER + JITTER).contains(&row.send_at),
        "a row at the end of A's hold: {} for {held_until}",
        row.send_at
    );

    // Sign in with a one-time link, as `pooler page` prints it.
    let (status, minted) = h.admin("POST", "page/login-codes", json!({})).await;
    assert_eq!(status, 201, "{minted}");
    let link = minted["url"].as_str().unwrap().to_owned();
    assert!(
        link.starts_with(&format!("{}/_pooler/page/login?code=", h.url)),
        "{link}"
    );

    let browser = blocking(Browser::start);
    let page = format!("{}/_pooler/page", h.url);
    let account_row = |id: &str| format!("tr[data-account=\"{id}\"]");
    let retry_cell = format!("tr[data-thread=\"{thread}\"] td.retry");
    let shown = blocking(|| {
        browser.goto(&link);
        assert_eq!(browser.url(), page, "the link leads to the page");
        // Both accounts and the waiting thread, with its retry at the row's time.
        browser.wait_for("both accounts and the thread's retry", BROWSER, |b| {
            let accounts = b.find_all("#accounts tr[data-account]").len();
            let at = b.attribute(&retry_cell, "data-send-at")?;
            (accounts == 2).then_some(at)
        })
    });
    assert_eq!(shown, row.send_at.to_string());
    blocking(|| {
        assert_eq!(
            browser
                .attribute(&account_row(&a), "data-status")
                .as_deref(),
            Some("held")
        );
        assert_eq!(
            browser
                .attribute(&account_row(&b), "data-status")
                .as_deref(),
            Some("disabled")
        );
        let a_text = browser.text(&account_row(&a)).unwrap();
        assert!(a_text.contains("held after a rate limit"), "{a_text}");
        let thread_text = browser
            .text(&format!("tr[data-thread=\"{thread}\"]"))
            .unwrap();
        assert!(thread_text.contains("error"), "{thread_text}");
        assert!(thread_text.contains("attempt 2 at "), "{thread_text}");
        assert!(thread_text.contains("(in 1 h)"), "{thread_text}");
        let provider = browser.text("[data-provider=\"claude\"]").unwrap();
        assert!(provider.contains("blocked (held)"), "{provider}");
        assert!(
            provider.contains("new conversations: soonest-reset"),
            "{provider}"
        );
        let b_text = browser.text(&account_row(&b)).unwrap();
        assert!(b_text.contains("last-resort"), "{b_text}");
    });

    // Enable B from the page.
    let enabled_at = h.now();
    blocking(|| {
        browser.click(&format!(
            "{} button[data-action=\"enable\"]",
            account_row(&b)
        ))
    });
    // The server: B enabled, the same row moved to within a minute, attempt unchanged.
    h.wait_for("enabling B from the page to move the row earlier", |h| {
        h.core()
            .list_rows(Some(&thread))
            .is_ok_and(|rows| rows.first().is_some_and(|r| r.send_at < row.send_at))
    })
    .await;
    h.settle().await;
    let moved = h.row(&thread);
    assert_eq!((moved.id, moved.attempt), (row.id, 2));
    assert!(
        (enabled_at + BUFFER..enabled_at + BUFFER + JITTER).contains(&moved.send_at),
        "moved to {} (enabled at {enabled_at})",
        moved.send_at
    );
    assert!(h.accounts().await.iter().any(|x| x.id == b && x.enabled));

    // The page shows the earlier time and B serving.
    let moved_at = moved.send_at.to_string();
    blocking(|| {
        browser.wait_for("the page to show the moved retry", BROWSER, |br| {
            (br.attribute(&retry_cell, "data-send-at")? == moved_at
                && br.attribute(&account_row(&b), "data-status")? == "ready")
                .then_some(())
        });
        let cell = browser.text(&retry_cell).unwrap();
        assert!(cell.contains("(in "), "{cell}");
        assert!(!cell.contains("h)"), "due within the minute: {cell}");
        assert!(browser.text("#notice").unwrap().contains("enabled"));
        let shot = target_dir().join("browser").join("status-page.png");
        browser.screenshot(&shot);
        assert!(std::fs::metadata(&shot).unwrap().len() > 1_000);
    });

    // "Send now" sends the retry at once, served by B; the page shows the thread idle.
    h.upstream.push(success("served by B"));
    blocking(|| {
        browser.click(&format!(
            "tr[data-thread=\"{thread}\"] button[data-action=\"send-now\"]"
        ))
    });
    // Until the turn has finished, not just started: a started turn's request may not have
    // reached the upstream yet (seen under load: the last request was still A's 429).
    h.wait_for("the retry to be sent and answered", |h| {
        h.turns(&thread)
            .get(1)
            .is_some_and(|t| t.finished_at.is_some())
            && h.core()
                .list_rows(Some(&thread))
                .is_ok_and(|r| r.is_empty())
    })
    .await;
    h.settle().await;
    let turns = h.turns(&thread);
    assert_eq!(turns[1].trigger, TurnTrigger::SendNow);
    assert_eq!(
        h.upstream.received().last().unwrap().header("x-api-key"),
        Some("sk-ant-api03-key-b")
    );
    blocking(|| {
        browser.wait_for("the thread to be idle on the page", BROWSER, |br| {
            (br.attribute(&format!("tr[data-thread=\"{thread}\"]"), "data-status")? == "idle")
                .then_some(())
        })
    });
    // The served retry pinned the thread's session to B: the page counts it on B's row.
    blocking(|| {
        browser.wait_for("B's pinned session on the page", BROWSER, |br| {
            (br.text(&format!("tr[data-account=\"{b}\"] td.pins"))? == "1").then_some(())
        })
    });
    assert_eq!(
        browser
            .text(&format!("tr[data-account=\"{a}\"] td.pins"))
            .as_deref(),
        Some("0")
    );
    // B's answer reported its usage (the fake's 10 input and 5 output tokens): the page
    // shows B's tokens today; A, whose only answer was a 429, has none.
    blocking(|| {
        browser.wait_for("B's tokens on the page", BROWSER, |br| {
            br.text(&format!("tr[data-account=\"{b}\"] td.tokens"))?
                .starts_with("in 10 · out 5 · cache read 0 · write 0")
                .then_some(())
        })
    });
    assert_eq!(
        browser
            .text(&format!("tr[data-account=\"{a}\"] td.tokens"))
            .as_deref(),
        Some("—")
    );
    let shot = target_dir().join("browser").join("status-page-tokens.png");
    blocking(|| browser.screenshot(&shot));
    drop(browser);
}

/// An account labelled with a bidi override and a zero-width space, whose key the upstream
/// refuses with a message that echoes the key and carries terminal escapes (an OSC title,
/// a screen clear, a C1 CSI): the page's row shows each of them written out, and the key
/// nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_text_shows_escaped_on_the_page_and_without_the_echoed_key() {
    const KEY: &str = "sk-ant-api03-Pg5tR8yU1iO4pA7sECHO";
    let h = CoreSetup::new().without_account().start().await;
    let a = h
        .add_account(NewAccount {
            provider: Provider::Claude,
            credential: Credential::ApiKey(KEY.into()),
            label: Some("ops\u{202e}gnp.exe\u{200b}".into()),
            priority: None,
            options: None,
        })
        .await
        .id;
    h.upstream.push(claude::error(
        401,
        "authentication_error",
        &format!("invalid x-api-key {KEY} \u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m"),
    ));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    h.settle().await;
    assert!(h.accounts().await[0].error.is_some(), "the key was refused");

    let (status, minted) = h.admin("POST", "page/login-codes", json!({})).await;
    assert_eq!(status, 201, "{minted}");
    let link = minted["url"].as_str().unwrap().to_owned();
    let browser = blocking(Browser::start);
    let row = format!("tr[data-account=\"{a}\"]");
    let text = blocking(|| {
        browser.goto(&link);
        browser.wait_for("the account in error", BROWSER, |b| {
            (b.attribute(&row, "data-status")? == "error").then(|| b.text(&row))?
        })
    });
    for written_out in [
        "ops\\u{202e}gnp.exe\\u{200b}",
        "invalid x-api-key [redacted] \\x1b]0;pwned\\x07\\x1b[2J\\x9b31m",
    ] {
        assert!(text.contains(written_out), "`{written_out}` in {text:?}");
    }
    for raw in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\u{200b}'] {
        assert!(!text.contains(raw), "{raw:?} raw in {text:?}");
    }
    let secret = &KEY["sk-ant-api03-".len()..];
    for i in 0..=secret.len() - 12 {
        assert!(
            !text.contains(&secret[i..i + 12]),
            "a piece of the key in {text:?}"
        );
    }
    drop(browser);
}

/// The quota timeline: one account whose answers state its 5-hour and
/// weekly utilization, observed at known instants on the manual clock, then a long 429 that
/// holds it and leaves the thread waiting (40 minutes before the page is read). The page draws the known 5-hour observation at
/// the place the day's scale gives it (the scale checked against the server's clock, not
/// only read from the page), the 5-hour reset that passed, the hold and the thread's open
/// wait; and over the week, the same observation at the week's place. Screenshots are
/// written to `target/browser/quota-timeline.png` (and `quota-timeline-week.png`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_timeline_draws_a_known_observation_at_its_place() {
    const HOUR: u64 = 3_600 * SECOND;
    let h = CoreSetup::new().real_retry().start().await;
    let a = h.accounts().await[0].id.clone();
    let first = h.now();
    let reset = first + 150 * 60 * SECOND;
    let with_quota = |five: &str, week: &str| {
        success("ok")
            .header("anthropic-ratelimit-unified-5h-utilization", five)
            .header("anthropic-ratelimit-unified-5h-status", "allowed")
            .header(
                "anthropic-ratelimit-unified-5h-reset",
                &(reset / 1_000).to_string(),
            )
            .header("anthropic-ratelimit-unified-7d-utilization", week)
            .header("anthropic-ratelimit-unified-7d-status", "allowed")
    };
    let thread = h.new_thread().await;
    h.upstream.push(with_quota("0.30", "0.12"));
    h.send(&thread, "one");
    h.settle().await;
    // The known observation: two hours later, the 5-hour window at 65 %.
    h.clock.set(first + 2 * HOUR);
    let known = h.now();
    h.upstream.push(with_quota("0.65", "0.20"));
    h.send(&thread, "two");
    h.settle().await;
    // An hour on, a long 429 holds the account and the thread waits (its retry is due at
    // the hold's end); the page is read 40 minutes into the hold.
    let failed_at = known + HOUR;
    h.clock.set(failed_at);
    h.upstream
        .push(reply(429, &[("retry-after".to_owned(), "3600".to_owned())]));
    h.send(&thread, "three");
    h.settle().await;
    h.clock.set(failed_at + 40 * 60 * SECOND);
    h.settle().await;
    let now = h.now();

    // The server's answer has the observation, the hold and the open wait.
    let (status, timeline) = h.admin("GET", "timeline", json!({})).await;
    assert_eq!(status, 200, "{timeline}");
    let entries = timeline["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(|e| e["at"] == known
            && e["window"]["name"] == "5h"
            && e["window"]["utilization"] == 0.65),
        "{timeline}"
    );
    assert!(
        entries
            .iter()
            .any(|e| e["kind"] == "hold" && e["until"] == failed_at + HOUR),
        "{timeline}"
    );
    assert!(
        timeline["waits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["thread"] == thread.as_str() && w["until"].is_null()),
        "{timeline}"
    );

    let (status, minted) = h.admin("POST", "page/login-codes", json!({})).await;
    assert_eq!(status, 201, "{minted}");
    let link = minted["url"].as_str().unwrap().to_owned();
    let browser = blocking(Browser::start);
    let chart = format!("#timeline .chart[data-account=\"{a}\"] svg");
    let dot = format!("{chart} circle.sample[data-window=\"5h\"][data-at=\"{known}\"]");
    let (cx, cy) = blocking(|| {
        browser.goto(&link);
        browser.wait_for("the known observation in the chart", BROWSER, |b| {
            let cx: f64 = b.attribute(&dot, "cx")?.parse().ok()?;
            let cy: f64 = b.attribute(&dot, "cy")?.parse().ok()?;
            Some((cx, cy))
        })
    });
    // The day's scale: from 24 h before the server's now to its now, over the plot area.
    let scale = |name: &str| -> f64 {
        blocking(|| browser.attribute(&chart, name))
            .unwrap_or_else(|| panic!("{name} on the chart"))
            .parse()
            .unwrap()
    };
    assert_eq!(scale("data-to") as u64, now);
    assert_eq!(scale("data-from") as u64, now - 24 * HOUR);
    let (x0, x1, y0, y1) = (
        scale("data-x0"),
        scale("data-x1"),
        scale("data-y0"),
        scale("data-y1"),
    );
    assert!(
        x1 - x0 > 500.0 && y1 - y0 > 50.0,
        "a plot area: {x0}..{x1}, {y0}..{y1}"
    );
    // 100 minutes before now of a 24-hour span; 65 % up.
    let want_x = x0 + (x1 - x0) * (24.0 * 60.0 - 100.0) / (24.0 * 60.0);
    let want_y = y0 + (y1 - y0) * (1.0 - 0.65);
    assert!((cx - want_x).abs() < 0.6, "x {cx}, want {want_x}");
    assert!((cy - want_y).abs() < 0.6, "y {cy}, want {want_y}");
    // The earlier observation sits two hours left of it, lower (30 %).
    let earlier = format!("{chart} circle.sample[data-window=\"5h\"][data-at=\"{first}\"]");
    let earlier_x: f64 = blocking(|| browser.attribute(&earlier, "cx"))
        .unwrap()
        .parse()
        .unwrap();
    assert!((cx - earlier_x - (x1 - x0) * 2.0 / 24.0).abs() < 0.6);
    blocking(|| {
        // The weekly window's samples, the 5-hour reset that passed, the hold, the wait.
        assert_eq!(
            browser
                .find_all(&format!("{chart} circle.sample[data-window=\"7d\"]"))
                .len(),
            2
        );
        assert!(
            browser
                .attribute(&format!("{chart} line.reset[data-at=\"{reset}\"]"), "x1")
                .is_some(),
            "the reset is marked"
        );
        assert_eq!(
            browser
                .attribute(&format!("{chart} rect.hold"), "data-until")
                .as_deref(),
            Some((failed_at + HOUR).to_string().as_str())
        );
        assert!(
            browser
                .attribute(
                    &format!("#timeline-waits rect.wait[data-thread=\"{thread}\"]"),
                    "x"
                )
                .is_some(),
            "the thread's wait is drawn"
        );
        browser.execute("document.getElementById('timeline-section').scrollIntoView()");
        let shot = target_dir().join("browser").join("quota-timeline.png");
        browser.screenshot(&shot);
        assert!(std::fs::metadata(&shot).unwrap().len() > 1_000);
        // The week: the same observation, 100 minutes before now of seven days.
        browser.click(".timeline-controls button[data-span=\"week\"]");
        let week_x: f64 = browser.wait_for("the week's chart", BROWSER, |b| {
            (b.attribute(&chart, "data-from")? == (now - 7 * 24 * HOUR).to_string())
                .then(|| b.attribute(&dot, "cx")?.parse().ok())?
        });
        let want = x0 + (x1 - x0) * (7.0 * 24.0 * 60.0 - 100.0) / (7.0 * 24.0 * 60.0);
        assert!((week_x - want).abs() < 0.6, "x {week_x}, want {want}");
        let shot = target_dir().join("browser").join("quota-timeline-week.png");
        browser.screenshot(&shot);
        assert!(std::fs::metadata(&shot).unwrap().len() > 1_000);
    });
    drop(browser);
}
