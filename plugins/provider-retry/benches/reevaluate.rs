//! How long one `availability-changed` takes to re-evaluate N pending rows, natively, with
//! the fake core and pool of the tests (so this is the plugin's own cost: SQLite, policy,
//! history; the host benchmark measures the same through the component boundary).
//! Prints the time for 1,000 and 10,000 rows and the growth factor between them.

#[path = "../tests/all/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use provider_retry::types::{Availability, AvailabilityChange, ChangeCause, Provider};

fn run(n: usize) -> (std::time::Duration, usize) {
    let w = World::new();
    w.pool.set(blocked(T + 2 * H));
    for i in 0..n {
        let thread = format!("thr_{i}");
        let e = w.first_failure(&thread, &format!("req_{i}"), Some(pool_429()), true);
        w.engine().turn_failed(&e).expect("scheduled");
    }
    w.clock.advance(M);
    w.pool.set(Availability::Ready);
    let started = Instant::now();
    let summary = w
        .engine()
        .availability_changed(&AvailabilityChange {
            provider: Provider::Claude,
            causes: vec![ChangeCause::AccountEnabled],
            earliest: Availability::Ready,
            detected_at: T + M,
        })
        .expect("pass");
    (started.elapsed(), summary.moved)
}

fn main() {
    let (small, moved_small) = run(1_000);
    let (large, moved_large) = run(10_000);
    println!("re-evaluate 1000 rows: {small:?} ({moved_small} moved)");
    println!("re-evaluate 10000 rows: {large:?} ({moved_large} moved)");
    println!(
        "growth 1000 → 10000: {:.1}× (linear would be 10×)",
        large.as_secs_f64() / small.as_secs_f64()
    );
}
