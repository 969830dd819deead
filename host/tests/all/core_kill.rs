//! Exactly-once dispatch across a crash: a real `pooler serve` process is killed (SIGKILL)
//! after the due loop claimed a retry row and while its `before-dispatch` gate runs, then
//! started again on the same data directory. The row must be gated again and dispatched
//! once: one turn request for attempt 2, never two, never none.
//!
//! The process runs on the real clock, so this test polls the databases (with a limit)
//! instead of moving a manual clock.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pooler_core::clock::{Clock, SystemClock};
use pooler_core::{
    Core, Failure, FailureCategory, FailureOrigin, Provider, Route, TurnOutcome, TurnResult,
};
use rusqlite::OptionalExtension;
use support::{Served, read_only};

const LIMIT: Duration = Duration::from_secs(60);

/// Poll `check` until it returns `Some`, at most [`LIMIT`].
fn eventually<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    support::eventually(what, LIMIT, check)
}

fn fixture_dir(data: &Path) -> PathBuf {
    data.join("plugins").join("provider-retry")
}

/// A key of the fixture retry plugin's table (its own database file).
fn fixture_key(data: &Path, key: &str) -> Option<String> {
    let path = fixture_dir(data).join("fixture.sqlite3");
    if !path.exists() {
        return None;
    }
    read_only(&path)
        .query_row("SELECT value FROM kv WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .ok()
        .flatten()
}

/// (wait state of the thread's row, if any; the thread's turn requests as (attempt,
/// outcome)).
fn core_state(data: &Path, thread: &str) -> (Option<String>, Vec<(u32, Option<String>)>) {
    let conn = read_only(&data.join(pooler_core::db::FILE_NAME));
    let row = conn
        .query_row(
            "SELECT wait_state FROM queued_rows WHERE thread_id = ?1",
            [thread],
            |r| r.get(0),
        )
        .optional()
        .unwrap();
    let mut stmt = conn
        .prepare("SELECT attempt, outcome FROM turn_requests WHERE thread_id = ?1 ORDER BY rowid")
        .unwrap();
    let turns = stmt
        .query_map([thread], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (row, turns)
}

#[test]
fn a_host_killed_between_claim_and_dispatch_dispatches_the_row_exactly_once_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();

    // A thread whose first turn failed, with a retry row due now — as a previous run of
    // the host would have left it. Its route token is one the pool never issued, so the
    // retry, sent through the host's listener, is refused by the pool itself.
    let clock = Arc::new(SystemClock::new());
    let (thread, failed) = {
        let core = Core::open(&data, clock.clone()).unwrap();
        let route = Route {
            base_url: "http://127.0.0.1:9".into(),
            token: "not-a-token-the-pool-issued".into(),
        };
        let thread = core
            .new_thread(Provider::Claude, None, Some(route))
            .unwrap();
        let failed = core.send(&thread, "hello").unwrap();
        let plans = core.start_turns().unwrap();
        assert_eq!(plans.len(), 1);
        let outcome = TurnOutcome {
            result: TurnResult::Failed {
                failure: Failure {
                    category: FailureCategory::Internal,
                    provider_code: None,
                    http_status: Some(500),
                    origin: FailureOrigin::Provider,
                    retry_after: None,
                    message: None,
                },
                partial_reply: String::new(),
            },
            input_accepted: false,
            rate_limits: None,
            agent_session: None,
            input_in_session: false,
        };
        core.record_outcome(&failed, &outcome).unwrap();
        core.schedule_retry(&thread, &failed, clock.now_ms(), "retry now")
            .unwrap();
        (thread, failed)
    };
    assert_eq!(
        core_state(&data, &thread),
        (Some("time".into()), vec![(1, Some("failed".into()))])
    );

    // The fixture's gate blocks the first time it is asked (after switching itself to
    // `proceed` for the next run); it schedules nothing itself.
    {
        let db =
            pooler_host::runtime::imports::sqlite::open(&fixture_dir(&data), "fixture").unwrap();
        db.execute_batch(
            "CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO kv VALUES ('verdict', 'hang-once'), ('schedule', 'off');",
        )
        .unwrap();
    }
    let config = format!(
        "[plugins.provider-retry]\ncomponent = {:?}\ndeadline-ms = 600000\n\n[maintenance]\ninterval-s = 0\n",
        pooler_tests::fixtures::RETRY
    );

    // Run 1: the row is claimed and its gate hangs; the process is killed right there.
    let first = Served::start_in(dir, &config);
    eventually("the gate to be asked", || {
        (fixture_key(&data, "verdict").as_deref() == Some("proceed")).then_some(())
    });
    let (row, turns) = core_state(&data, &thread);
    assert_eq!(
        row.as_deref(),
        Some("claimed"),
        "claimed while its gate runs"
    );
    assert_eq!(turns.len(), 1, "not dispatched yet");
    let stopped = first.kill();
    support::integrity_check(&data);
    assert_eq!(
        core_state(&data, &thread).0.as_deref(),
        Some("claimed"),
        "the kill left the claim behind"
    );

    // Run 2: the claim is released, the row gated again and dispatched once.
    let second = stopped.restart();
    let turns = eventually("the retry to finish", || {
        let (row, turns) = core_state(&data, &thread);
        (row.is_none() && turns.len() == 2 && turns[1].1.is_some()).then_some(turns)
    });
    assert_eq!(
        turns,
        vec![(1, Some("failed".into())), (2, Some("failed".into()))]
    );
    assert_eq!(
        fixture_key(&data, "calls").as_deref(),
        Some("start\ncheck\nstart\ncheck")
    );
    // The directory stays while the data is read below.
    let _stopped = second.kill();
    support::integrity_check(&data);

    // What the core recorded: released after the crash, dispatched once; the retry went
    // through the listener and the pool refused the unknown token itself.
    let core = Core::open(&data, clock).unwrap();
    let show = core.show(&thread).unwrap();
    let actions: Vec<&str> = show.history.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["scheduled", "released", "dispatched"], "{show:?}");
    let retry = &show.turns[1];
    assert_eq!(
        (retry.attempt, retry.original_request.as_str()),
        (2, failed.as_str())
    );
    let failure = retry.failure.as_ref().unwrap();
    assert_eq!(failure.origin, FailureOrigin::Pool, "{failure:?}");
    assert_eq!(
        failure.category,
        FailureCategory::Unauthorized,
        "{failure:?}"
    );
}
