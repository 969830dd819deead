//! A re-evaluation pass works in chunks: per chunk of candidates it reads the threads with
//! one `get-threads`, asks the pool with one `query-many` and moves the rows with one
//! `reschedule-many` (one availability change may concern 10,000 rows). These
//! tests pin the call pattern and what happens when part of a batch fails.

use crate::common;

use common::*;
use provider_retry::engine::PASS_CHUNK;
use provider_retry::types::{
    Availability, AvailabilityChange, ChangeCause, PluginError, Provider, TurnFailedEvent,
};

/// A pooled turn of `thread` failed with the pool's 429 while the pool is blocked for 2 h.
fn pending(w: &World, thread: &str) -> TurnFailedEvent {
    w.pool.set(blocked(T + 2 * H));
    let e = w.first_failure(thread, &format!("{thread}_req"), Some(pool_429()), true);
    w.engine().turn_failed(&e).expect("turn-failed handled");
    e
}

fn enabled(w: &World) -> Result<provider_retry::PassSummary, PluginError> {
    w.engine().availability_changed(&AvailabilityChange {
        provider: Provider::Claude,
        causes: vec![ChangeCause::AccountEnabled],
        earliest: Availability::Ready,
        detected_at: w.clock.0.get(),
    })
}

fn threads(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("thr_{i:04}")).collect()
}

#[test]
fn a_pass_makes_three_calls_per_chunk_not_three_per_row() {
    let w = World::new();
    let threads = threads(PASS_CHUNK + 4);
    for t in &threads {
        pending(&w, t);
    }
    w.core.batches.borrow_mut().clear();
    w.pool.batches.borrow_mut().clear();
    w.clock.advance(M);
    w.pool.set(Availability::Ready);

    let summary = enabled(&w).expect("pass");

    assert_eq!(summary.examined, PASS_CHUNK + 4);
    assert_eq!(summary.moved, PASS_CHUNK + 4);
    assert_eq!(
        *w.core.batches.borrow(),
        [
            format!("get-threads {PASS_CHUNK}"),
            format!("reschedule-many {PASS_CHUNK}"),
            "get-threads 4".to_string(),
            "reschedule-many 4".to_string(),
        ]
    );
    assert_eq!(*w.pool.batches.borrow(), [PASS_CHUNK, 4]);
    let now = w.clock.0.get();
    for t in &threads {
        let row = w.only_row(t);
        assert!(
            row.send_at >= now + 15 * S && row.send_at < now + 45 * S,
            "{t}: {row:?}"
        );
        let candidate = &w.engine().status(Some(t)).expect("status")[0];
        assert_eq!(
            candidate.send_at,
            Some(row.send_at),
            "the plugin records the move"
        );
    }
}

#[test]
fn one_refused_move_does_not_stop_the_others() {
    let w = World::new();
    let threads = threads(3);
    for t in &threads {
        pending(&w, t);
    }
    let rows: Vec<_> = threads.iter().map(|t| w.only_row(t)).collect();
    // Row 1 left the core behind the plugin's back (dispatched); row 2 cannot be written.
    w.core.take_row(rows[1].id);
    w.core.broken_row.set(Some(rows[2].id));
    w.clock.advance(M);
    w.pool.set(Availability::Ready);

    let result = enabled(&w);

    assert!(
        matches!(result, Err(PluginError::Dependency(ref m)) if m.contains("unwritable")),
        "the failed candidate is reported: {result:?}"
    );
    let now = w.clock.0.get();
    assert!(w.only_row(&threads[0]).send_at < now + 45 * S, "moved");
    let status = |t: &str| w.engine().status(Some(t)).expect("status");
    assert!(status(&threads[1]).is_empty(), "closed: its row is gone");
    assert_eq!(
        status(&threads[2])[0].send_at,
        Some(rows[2].send_at),
        "left as it was, for the next pass"
    );
    assert_eq!(w.only_row(&threads[2]).send_at, rows[2].send_at);

    w.core.broken_row.set(None);
    let summary = enabled(&w).expect("the next pass");
    assert_eq!((summary.examined, summary.moved), (2, 1));
    let moved = w.only_row(&threads[2]).send_at;
    assert!(moved < now + 45 * S);
    assert_eq!(status(&threads[2])[0].send_at, Some(moved));
}

#[test]
fn a_slow_answer_for_a_chunk_is_source_unavailable_for_all_of_it() {
    let w = World::new();
    let threads = threads(3);
    for t in &threads {
        pending(&w, t);
    }
    let before: Vec<_> = threads.iter().map(|t| w.only_row(t)).collect();
    w.core.batches.borrow_mut().clear();
    *w.pool.script.borrow_mut() = PoolScript::Slow(Availability::Ready, 6 * S);

    let summary = enabled(&w).expect("pass");

    assert_eq!((summary.examined, summary.moved), (3, 0));
    assert_eq!(*w.pool.batches.borrow().last().unwrap(), 3, "one query");
    assert_eq!(
        *w.core.batches.borrow(),
        ["get-threads 3"],
        "nothing to move"
    );
    for (t, b) in threads.iter().zip(&before) {
        assert_eq!(w.only_row(t).send_at, b.send_at);
    }
    let slow = w
        .log
        .0
        .borrow()
        .iter()
        .filter(|(_, line)| line.starts_with("availability answer too slow"))
        .count();
    assert_eq!(slow, 1, "one line for the chunk");
}

/// A pass that finds nothing new (a tick over rows the pool still blocks) writes nothing:
/// no chain record, no history line, no core call.
#[test]
fn a_pass_that_changes_nothing_writes_nothing() {
    let w = World::new();
    let threads = threads(5);
    for t in &threads {
        pending(&w, t);
    }
    w.clock.advance(M);
    enabled(&w).expect("first pass");
    w.db.executed.borrow_mut().clear();
    w.core.batches.borrow_mut().clear();

    let summary = enabled(&w).expect("second pass");

    assert_eq!((summary.examined, summary.moved), (5, 0));
    let writes: Vec<String> =
        w.db.executed
            .borrow()
            .iter()
            .filter(|sql| !sql.contains("SAVEPOINT") && !sql.starts_with("RELEASE"))
            .cloned()
            .collect();
    assert!(writes.is_empty(), "{writes:?}");
    assert_eq!(*w.core.batches.borrow(), ["get-threads 5"]);
}

/// The plugin's record of a chain names row 1, but the core's queue was
/// reset behind its back and row 1 is now another thread's. The pass's `reschedule-many`
/// names each row's thread: the stale chain's move is refused (`no-such-row`) and the chain
/// closed (its cancel refused too), the other thread's move in the same batch commits, and
/// its row is moved only once, by its own chain.
#[test]
fn a_stale_chain_whose_row_id_is_now_another_threads_row_does_not_move_it() {
    let w = World::new();
    pending(&w, "thr_a");
    let stale = w.only_row("thr_a");
    // The core forgets the row and its ids start again: thread b gets row `stale.id`.
    w.core.take_row(stale.id);
    w.core.next_row.set(stale.id - 1);
    pending(&w, "thr_b");
    let row_b = w.only_row("thr_b");
    assert_eq!(row_b.id, stale.id, "the id is reused");
    w.core.batches.borrow_mut().clear();
    w.clock.advance(M);
    w.pool.set(Availability::Ready);

    let summary = enabled(&w).expect("pass");

    assert_eq!(
        *w.core.batches.borrow(),
        ["get-threads 2", "reschedule-many 2"]
    );
    // The move, then closing the chain's cancel of its row: both name thread a, both
    // refused (a row id alone would have moved b's row, then cancelled it).
    assert_eq!(
        *w.core.foreign.borrow(),
        vec![format!("thr_a → {} of thr_b", row_b.id); 2],
        "the stale chain's move and cancel named thread a and were refused"
    );
    assert_eq!((summary.examined, summary.moved), (2, 1));
    let status = |t: &str| w.engine().status(Some(t)).expect("status");
    assert!(status("thr_a").is_empty(), "closed: no row of its own");
    let now = w.clock.0.get();
    let moved = w.only_row("thr_b");
    assert!(moved.send_at < now + 45 * S, "{moved:?}");
    assert_eq!(status("thr_b")[0].send_at, Some(moved.send_at));
    assert_eq!(
        w.core.calls_matching("reschedule"),
        1,
        "one move reached the core"
    );
    assert_eq!(
        w.core.calls_matching("cancel"),
        0,
        "b's row was not cancelled"
    );
    w.core.foreign.borrow_mut().clear();
}
