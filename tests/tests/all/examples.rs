//! The examples under `examples/` are built and run here (the Rust embedding host has its
//! own test in `examples/embed-rust/tests/`).

use pooler_core::TurnOutcomeKind;
use pooler_host::runtime::roles::Role;
use pooler_tests::core::CoreSetup;
use pooler_tests::fixtures::EXAMPLE_ALT_PLUGIN;
use pooler_tests::pool::reply;

const SECOND: u64 = 1_000;

/// `examples/alt-plugin`, a fixed-delay Provider Retry built on `plugins/kit`, fills the
/// role by configuration alone: a failed turn gets its fixed delay (45 s, then the 2 min a
/// person set through its `delay` setting), and its retries run through the core.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_plugin_retries_a_failed_turn_after_its_fixed_delay() {
    let h = CoreSetup::new()
        .retry_component(EXAMPLE_ALT_PLUGIN)
        .start()
        .await;
    assert_eq!(
        h.host.plugin_source(Role::ProviderRetry).as_deref(),
        Some(EXAMPLE_ALT_PLUGIN)
    );
    h.upstream.push(reply(429, &[]));
    let thread = h.new_thread().await;
    h.send(&thread, "hello");
    h.settle().await;
    let row = h.row(&thread);
    assert_eq!(
        (row.attempt, row.send_at, row.reason.as_str()),
        (2, h.now() + 45 * SECOND, "fixed-delay retry")
    );

    // Its setting, through the settings export.
    assert_eq!(h.retry_get("delay").await.as_deref(), Some("45s"));
    h.retry_set("delay", "2m").await;
    assert_eq!(h.retry_get("delay").await.as_deref(), Some("2m"));

    // The retry is sent when due and fails again (529): the next one is 2 min later.
    h.upstream.push(reply(529, &[]));
    h.clock.set(row.send_at);
    h.settle().await;
    let next = h.row(&thread);
    assert_eq!(
        (next.attempt, next.send_at),
        (3, row.send_at + 120 * SECOND)
    );
    let turns = h.turns(&thread);
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].outcome, Some(TurnOutcomeKind::Failed));
}

/// The example imports WASI at one version, the contract's, as the two embedded plugins do:
/// Rust's std would otherwise add its own older 0.2 imports beside the kit's.
#[test]
fn the_example_plugin_and_the_embedded_ones_import_wasi_at_the_contracts_version_only() {
    let example = std::fs::read(EXAMPLE_ALT_PLUGIN).unwrap();
    let embedded = [Role::AccountPool, Role::ProviderRetry].map(|role| {
        pooler_host::runtime::embedded::component(role)
            .unwrap()
            .to_vec()
    });
    for (name, bytes) in [("alt-plugin", &example)].into_iter().chain([
        ("account-pool", &embedded[0]),
        ("provider-retry", &embedded[1]),
    ]) {
        let (imports, _) = pooler_host::operate::components::surface(bytes).unwrap();
        let wasi: Vec<&String> = imports.iter().filter(|i| i.starts_with("wasi:")).collect();
        assert!(!wasi.is_empty(), "{name}: {imports:?}");
        let other: Vec<&&String> = wasi.iter().filter(|i| !i.ends_with("@0.2.12")).collect();
        assert!(
            other.is_empty(),
            "{name} imports WASI at another version: {other:?}"
        );
    }
}
