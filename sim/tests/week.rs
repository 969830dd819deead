//! The simulator end to end: the real host, pool, core and Provider Retry through six
//! virtual hours (`short.toml`), in a few seconds. The figures of a fixed seed are exact and
//! repeat byte for byte; a variant that leaves threads stuck after capacity returned is
//! flagged as waiting while capacity existed, so the measurement is shown able to fail.

use std::path::{Path, PathBuf};

use pooler_sim::report::{self, Figures};
use pooler_sim::run::{Recorded, run};
use pooler_sim::scenario::Scenario;

fn scenario() -> Scenario {
    Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/short.toml")).unwrap()
}

fn cache() -> Option<PathBuf> {
    Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sim-compile-cache"))
}

fn simulate(name: &str) -> (Recorded, Figures) {
    let s = scenario();
    let variant = s.variants.iter().find(|v| v.name == name).unwrap().clone();
    let recorded = run(&s, &variant, cache()).unwrap();
    let figures = report::figures(&recorded);
    (recorded, figures)
}

/// Six hours on two small accounts under the pool's defaults: both 5-hour windows run out,
/// the threads wait with no capacity anywhere, and resume once the first window resets,
/// Provider Retry's reset buffer and jitter after it. Every figure is exact for this seed
/// (a change of routing or retry behaviour changes them: read the diff, then update).
#[test]
fn six_hours_on_two_small_accounts_give_these_exact_figures_every_time() {
    let (recorded, f) = simulate("defaults");
    assert_eq!((f.turns_completed, f.turns_demanded), (40, 140));
    assert_eq!(f.requests_served, 415);
    assert_eq!(f.tokens_served, 15_880_788);
    assert_eq!(f.cache_read_share, 0.7759);
    assert_eq!(f.working_thread_hours, 2.871);
    assert_eq!(f.waiting_with_capacity_thread_hours, 0.024);
    assert_eq!(f.waiting_without_capacity_thread_hours, 12.652);
    assert_eq!(
        (
            f.resume_delay_s.count,
            f.resume_delay_s.p50,
            f.resume_delay_s.max
        ),
        (3, 22.661, 42.145)
    );
    // Soonest-reset (the default) spreads the three conversations; when both accounts are
    // spent and the first resets, it is the only one that can serve: all three move there.
    assert_eq!((f.conversations, f.repins, f.detours, f.herd), (3, 5, 0, 3));
    assert_eq!(
        f.herd_at_hour, 5.514,
        "the minute after the first window's reset"
    );
    assert_eq!(f.home_share, 0.988);
    assert_eq!((f.refused_429, f.refused_529, f.errors_5xx), (0, 0, 6));
    assert_eq!(f.failed_turn_chains, 6);
    assert_eq!(f.retries_per_failed_turn_max, 1);
    assert!(f.retries_per_failed_turn_max < f.attempt_cap);
    assert_eq!(f.person_actions_needed, 0);
    // No weekly window resets in six hours: both accounts' weeks are left, less what the
    // run spent of them.
    assert_eq!(
        (f.weekly_expired_unused, f.weekly_left_at_end),
        (0.0, 1.9259)
    );
    // The picture has a lane per account and per thread, drawn from what was recorded.
    let html = report::html(
        &scenario(),
        std::slice::from_ref(&f),
        std::slice::from_ref(&recorded),
    );
    assert_eq!(html.matches("<svg").count(), 1);
    assert!(html.contains(">max-1</text>") && html.contains(">max-2</text>"));
    assert_eq!(html.matches("\">thread ").count(), 3);
    assert!(
        html.contains("fill=\"#9aa0a6\""),
        "a waiting-without-capacity stretch is drawn"
    );
}

/// The same scenario and seed give the same figures, byte for byte.
#[test]
fn a_seed_repeats_byte_for_byte() {
    let s = scenario();
    let variant = s.variants[0].clone();
    let a = report::figures(&run(&s, &variant, cache()).unwrap());
    let b = report::figures(&run(&s, &variant, cache()).unwrap());
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
}

/// One attempt per turn: when the window resets, no retry resumes the threads, and the
/// simulator says they waited while capacity existed — three threads, the last hour.
#[test]
fn threads_left_stuck_after_capacity_returned_are_the_pools_fault() {
    let (_, f) = simulate("no-retries");
    assert_eq!(f.waiting_with_capacity_thread_hours, 3.0);
    assert_eq!(f.resume_delay_s.count, 0, "nothing resumed");
    assert_eq!(f.retries_per_failed_turn_max, 0);
    assert_eq!(f.turns_completed, 19);
}
