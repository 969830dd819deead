//! The week simulator's HTML report in a real headless browser (Debian's `chromium` through
//! `chromedriver`, as the status page's test): a short scenario's run is drawn, each
//! account and thread has its lane, and a stretch the ledger recorded — the first time
//! thread 1 waited with no capacity anywhere — is drawn where its instant falls on the
//! time axis. A screenshot goes to `target/browser/sim-report.png`.
//!
//! Fails (does not skip) when chromium or its driver is missing: CI installs them.

use std::path::{Path, PathBuf};

use pooler_sim::ledger::Activity;
use pooler_sim::report;
use pooler_sim::run::run;
use pooler_sim::scenario::Scenario;
use pooler_tests::webdriver::{Browser, target_dir};

#[test]
fn the_simulators_report_draws_what_the_run_recorded() {
    let scenario =
        Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/tests/short.toml"))
            .expect("the short scenario");
    let variant = scenario.variants[0].clone();
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sim-compile-cache");
    let recorded = run(&scenario, &variant, Some(cache)).expect("the run");
    let figures = report::figures(&recorded);
    let html = report::html(
        &scenario,
        std::slice::from_ref(&figures),
        std::slice::from_ref(&recorded),
    );
    let dir = target_dir().join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("sim-report.html");
    std::fs::write(&page, &html).unwrap();

    // Where the first stretch of thread 1 waiting with no capacity must be drawn.
    let (from, _, _) = recorded.ledger.threads[0]
        .segments
        .iter()
        .find(|(_, _, a)| *a == Activity::WaitingWithout)
        .copied()
        .expect("thread 1 waited with no capacity");
    let expected_x = format!("{:.1}", report::x_of(&recorded, from));

    let browser = Browser::start();
    browser.goto(&format!("file://{}", page.display()));
    let lanes = browser.execute(
        "return Array.from(document.querySelectorAll('svg g.lane')).map(g => g.dataset.lane)",
    );
    assert_eq!(
        lanes,
        serde_json::json!(["max-1", "max-2", "thread 1", "thread 2", "thread 3"])
    );
    let drawn = browser.execute(
        "return Array.from(document.querySelectorAll('g[data-lane=\"thread 1\"] rect'))\
         .filter(r => r.getAttribute('fill') === '#9aa0a6').map(r => r.getAttribute('x'))",
    );
    let xs: Vec<&str> = drawn
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(xs.first().copied(), Some(expected_x.as_str()), "{xs:?}");
    // Utilization is drawn for both accounts, and the table has the run's figures.
    let lines = browser
        .execute("return document.querySelectorAll('g[data-lane^=\"max-\"] polyline').length");
    assert_eq!(lines, serde_json::json!(4));
    let row = browser.execute(
        "return Array.from(document.querySelectorAll('table tr')).map(tr => tr.innerText)\
         .find(t => t.startsWith('turns completed'))",
    );
    let expected = format!("{} / {}", figures.turns_completed, figures.turns_demanded);
    assert!(
        row.as_str().is_some_and(|t| t.contains(&expected)),
        "{row} should say {expected}"
    );
    browser.screenshot(&dir.join("sim-report.png"));
}
