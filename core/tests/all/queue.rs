//! The retry queue as plugins and the host's due loop use it: the WIT `threads` semantics,
//! the concurrency gate, the before-dispatch verdicts, send-now, and exactly-once dispatch
//! across restarts.

use crate::common;

use std::sync::{Arc, Barrier};

use common::*;
use pooler_core::*;

#[test]
fn schedule_retry_creates_one_row_with_the_next_attempt_for_the_latest_failed_request() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 5_000, "Rate limited")
        .unwrap();
    assert_eq!(row.thread, thread);
    assert_eq!(row.kind, RowKind::Retry);
    assert_eq!(row.failed_request, failed);
    assert_eq!(row.original_request, failed);
    assert_eq!(row.attempt, 2);
    assert_eq!(row.send_at, T0 + 5_000);
    assert_eq!(row.reason, "Rate limited");
    assert!(!row.waiting_for_slot);
    assert_eq!(f.core.list_rows(Some(&thread)).unwrap(), vec![row]);
}

#[test]
fn schedule_retry_is_refused_unless_the_thread_is_in_error() {
    let f = Fixture::new();
    let (thread, plan) = f.running_thread(Provider::Claude, "hi");
    // Active.
    assert_eq!(
        f.core.schedule_retry(&thread, &plan.request, T0, "r"),
        Err(ThreadsError::NoFailedTurn)
    );
    // Idle after success.
    f.succeed(&plan.request);
    assert_eq!(
        f.core.schedule_retry(&thread, &plan.request, T0, "r"),
        Err(ThreadsError::NoFailedTurn)
    );
}

#[test]
fn schedule_retry_is_refused_for_a_request_that_is_not_the_latest() {
    let f = Fixture::new();
    let (thread, first) = f.failed_thread("one");
    f.core.send(&thread, "two").unwrap();
    let second = f.core.start_turns().unwrap().remove(0);
    f.fail(&second.request, false);
    assert_eq!(
        f.core.schedule_retry(&thread, &first, T0, "r"),
        Err(ThreadsError::NoFailedTurn)
    );
    assert!(
        f.core
            .schedule_retry(&thread, &second.request, T0, "r")
            .is_ok()
    );
}

#[test]
fn schedule_retry_names_a_missing_or_archived_thread() {
    let f = Fixture::new();
    assert_eq!(
        f.core.schedule_retry("th_nope", "rq_nope", T0, "r"),
        Err(ThreadsError::NoSuchThread("th_nope".into()))
    );
    let (thread, failed) = f.failed_thread("x");
    f.core.archive(&thread).unwrap();
    assert_eq!(
        f.core.schedule_retry(&thread, &failed, T0, "r"),
        Err(ThreadsError::Archived)
    );
}

#[test]
fn schedule_retry_is_refused_while_the_chain_has_a_live_row() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 5_000, "first")
        .unwrap();
    assert_eq!(
        f.core
            .schedule_retry(&thread, &failed, T0 + 9_000, "second"),
        Err(ThreadsError::AlreadyQueued(row.id))
    );
    assert_eq!(f.core.list_rows(None).unwrap().len(), 1);
}

#[test]
fn schedule_retry_is_refused_while_the_row_is_claimed_for_dispatch() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0, "first")
        .unwrap();
    let claims = f.core.claim_due(f.now()).unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(
        f.core.schedule_retry(&thread, &failed, T0, "again"),
        Err(ThreadsError::AlreadyQueued(row.id))
    );
}

#[test]
fn reason_must_be_one_to_two_hundred_characters() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    assert!(matches!(
        f.core.schedule_retry(&thread, &failed, T0, ""),
        Err(ThreadsError::InvalidArgument(_))
    ));
    assert!(matches!(
        f.core
            .schedule_retry(&thread, &failed, T0, &"x".repeat(201)),
        Err(ThreadsError::InvalidArgument(_))
    ));
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0, &"é".repeat(200))
        .unwrap();
    assert!(matches!(
        f.core.reschedule(&thread, row.id, T0, ""),
        Err(ThreadsError::InvalidArgument(_))
    ));
}

/// PR-12: concurrent schedule attempts for one chain → one row, the others refused.
#[test]
fn concurrent_schedule_attempts_on_separate_connections_create_exactly_one_row() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    const RACERS: usize = 8;
    let barrier = Arc::new(Barrier::new(RACERS));
    let cores: Vec<Core> = (0..RACERS).map(|_| f.second_connection()).collect();
    let results: Vec<Result<QueuedRow, ThreadsError>> = std::thread::scope(|s| {
        let handles: Vec<_> = cores
            .iter()
            .enumerate()
            .map(|(i, core)| {
                let barrier = barrier.clone();
                let (thread, failed) = (&thread, &failed);
                s.spawn(move || {
                    barrier.wait();
                    core.schedule_retry(thread, failed, T0 + i as u64, "race")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<&QueuedRow> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0].id;
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e, &ThreadsError::AlreadyQueued(winner));
        }
    }
    assert_eq!(f.core.list_rows(None).unwrap().len(), 1);
}

#[test]
fn reschedule_moves_the_row_without_spending_an_attempt_or_creating_a_row() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 7_200_000, "blocked")
        .unwrap();
    let earlier = f
        .core
        .reschedule(&thread, row.id, T0 + 30_000, "account enabled")
        .unwrap();
    assert_eq!(
        (earlier.id, earlier.attempt, earlier.send_at),
        (row.id, 2, T0 + 30_000)
    );
    assert_eq!(earlier.reason, "account enabled");
    let later = f
        .core
        .reschedule(&thread, row.id, T0 + 9_000_000, "later reset")
        .unwrap();
    assert_eq!((later.id, later.attempt), (row.id, 2));
    assert_eq!(f.core.list_rows(None).unwrap(), vec![later]);
    let show = f.core.show(&thread).unwrap();
    assert_eq!(show.turns.len(), 1, "no turn request was created");
}

/// `reschedule-many`: each move as `reschedule` makes it, answers in order; a refused move
/// (unknown row, bad reason) changes nothing and does not stop the others; all in one
/// commit, seen by another connection.
#[test]
fn reschedule_many_moves_each_row_and_refuses_only_the_bad_moves() {
    let f = Fixture::new();
    let rows: Vec<QueuedRow> = ["one", "two"]
        .iter()
        .map(|text| {
            let (thread, failed) = f.failed_thread(text);
            f.core
                .schedule_retry(&thread, &failed, T0 + 7_200_000, "blocked")
                .unwrap()
        })
        .collect();
    let mv = |row: &QueuedRow, send_at: Timestamp, reason: &str| RowMove {
        thread: row.thread.clone(),
        row: row.id,
        send_at,
        reason: reason.into(),
    };
    let answers = f.core.reschedule_many(&[
        mv(&rows[0], T0 + 30_000, "account enabled"),
        RowMove {
            thread: rows[0].thread.clone(),
            row: 42,
            send_at: T0,
            reason: "gone".into(),
        },
        mv(&rows[1], T0 + 40_000, ""),
        mv(&rows[1], T0 + 50_000, "account enabled"),
    ]);
    assert_eq!(answers.len(), 4);
    let moved = answers[0].clone().unwrap();
    assert_eq!(
        (
            moved.id,
            moved.attempt,
            moved.send_at,
            moved.reason.as_str()
        ),
        (rows[0].id, 2, T0 + 30_000, "account enabled")
    );
    assert_eq!(answers[1], Err(ThreadsError::NoSuchRow(42)));
    assert!(matches!(answers[2], Err(ThreadsError::InvalidArgument(_))));
    assert_eq!(answers[3].clone().unwrap().send_at, T0 + 50_000);
    let other = f.second_connection();
    let stored = other.list_rows(None).unwrap();
    assert_eq!(
        stored,
        vec![answers[0].clone().unwrap(), answers[3].clone().unwrap()],
        "what was answered is what is stored"
    );
    assert!(f.core.reschedule_many(&[]).is_empty());
}

/// `get-threads`: each thread as `get-thread` reads it, in order, unknown ids refused.
#[test]
fn get_threads_answers_each_thread_in_order() {
    let f = Fixture::new();
    let (failed, _) = f.failed_thread("one");
    let (running, _) = f.running_thread(Provider::Claude, "two");
    let answers = f.core.get_threads(&[&running, "th_unknown", &failed]);
    assert_eq!(
        answers,
        vec![
            f.core.get_thread(&running),
            Err(ThreadsError::NoSuchThread("th_unknown".into())),
            f.core.get_thread(&failed),
        ]
    );
    assert_eq!(answers[0].as_ref().unwrap().status, ThreadStatus::Active);
    assert_eq!(answers[2].as_ref().unwrap().status, ThreadStatus::Error);
}

/// `get-thread` (one statement) and the thread list (several) describe a thread alike, in
/// every state: error with a queued message, active, idle without a route.
#[test]
fn get_thread_agrees_with_the_thread_list() {
    let f = Fixture::new();
    let (running, _) = f.running_thread(Provider::Codex, "two");
    let (failed, _) = f.failed_thread("one");
    f.core.send(&failed, "queued while in error").unwrap();
    let bare = f.core.new_thread(Provider::Claude, None, None).unwrap();
    let listed = f.core.list_threads().unwrap();
    assert_eq!(listed.len(), 3);
    for view in listed {
        assert_eq!(f.core.get_thread(&view.info.id).unwrap(), view.info);
    }
    let info = f.core.get_thread(&failed).unwrap();
    assert!(
        info.input_queued && info.routed_by_pool && info.latest_request.is_some(),
        "{info:?}"
    );
    assert_eq!(
        f.core.get_thread(&running).unwrap().status,
        ThreadStatus::Active
    );
    let info = f.core.get_thread(&bare).unwrap();
    assert!(!info.routed_by_pool && info.latest_request.is_none() && !info.input_queued);
}

#[test]
fn reschedule_and_cancel_of_an_unknown_row_are_refused() {
    let f = Fixture::new();
    let (thread, _) = f.failed_thread("hello");
    assert_eq!(
        f.core.reschedule(&thread, 42, T0, "r"),
        Err(ThreadsError::NoSuchRow(42))
    );
    assert_eq!(
        f.core.cancel(&thread, 42, "r"),
        Err(ThreadsError::NoSuchRow(42))
    );
}

/// Two failed threads, each with a live row: (thread a, its row, thread b, its row). B's
/// row is due now, a's in two hours.
fn two_threads_with_rows(f: &Fixture) -> (ThreadId, QueuedRow, ThreadId, QueuedRow) {
    let (a, fa) = f.failed_thread("a");
    let (b, fb) = f.failed_thread("b");
    let row_a = f
        .core
        .schedule_retry(&a, &fa, T0 + 7_200_000, "blocked")
        .unwrap();
    let row_b = f.core.schedule_retry(&b, &fb, T0, "due").unwrap();
    (a, row_a, b, row_b)
}

/// The actions of thread `thread`'s history, oldest first.
fn actions(f: &Fixture, thread: &str) -> Vec<String> {
    let show = f.core.show(thread).unwrap();
    show.history.into_iter().map(|e| e.action).collect()
}

/// A caller naming thread a cannot move or cancel b's row, by
/// `reschedule`, `reschedule-many` or `cancel`. Each is refused naming the owner, and b's
/// row keeps its send time, reason and claim (its dispatch still goes through).
#[test]
fn a_row_of_another_thread_is_neither_moved_nor_cancelled() {
    let f = Fixture::new();
    let (a, _, b, row_b) = two_threads_with_rows(&f);
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    assert_eq!(claim.row.id, row_b.id);
    let history_b = actions(&f, &b);
    let foreign = ThreadsError::RowOfOtherThread {
        row: row_b.id,
        owner: b.clone(),
    };

    assert_eq!(
        f.core.reschedule(&a, row_b.id, T0 + 99_000, "hijack"),
        Err(foreign.clone())
    );
    assert_eq!(
        f.core.reschedule_many(&[RowMove {
            thread: a.clone(),
            row: row_b.id,
            send_at: T0 + 99_000,
            reason: "hijack".into(),
        }]),
        vec![Err(foreign.clone())]
    );
    assert_eq!(f.core.cancel(&a, row_b.id, "hijack"), Err(foreign));
    // A thread that does not exist owns no row either.
    assert_eq!(
        f.core.cancel("th_nope", row_b.id, "hijack"),
        Err(ThreadsError::RowOfOtherThread {
            row: row_b.id,
            owner: b.clone(),
        })
    );

    let stored = f.second_connection().list_rows(Some(&b)).unwrap();
    assert_eq!(stored, vec![row_b.clone()], "b's row as it was");
    assert_eq!(actions(&f, &b), history_b, "nothing written to b's history");
    assert!(
        !actions(&f, &a)
            .iter()
            .any(|a| a == "rescheduled" || a == "cancelled"),
        "{:?}",
        actions(&f, &a)
    );
    f.core.dispatch(&claim).expect("b's claim is still valid");
}

/// A `reschedule-many` mixing a move of the caller's own row and one of another thread's:
/// the own move commits, the foreign one is refused and b's row is untouched.
#[test]
fn reschedule_many_commits_the_own_move_and_refuses_the_foreign_one() {
    let f = Fixture::new();
    let (a, row_a, b, row_b) = two_threads_with_rows(&f);
    let answers = f.core.reschedule_many(&[
        RowMove {
            thread: a.clone(),
            row: row_a.id,
            send_at: T0 + 30_000,
            reason: "account enabled".into(),
        },
        RowMove {
            thread: a.clone(),
            row: row_b.id,
            send_at: T0 + 99_000,
            reason: "hijack".into(),
        },
    ]);
    let moved = answers[0].clone().unwrap();
    assert_eq!(
        (moved.id, moved.send_at, moved.reason.as_str()),
        (row_a.id, T0 + 30_000, "account enabled")
    );
    assert_eq!(
        answers[1],
        Err(ThreadsError::RowOfOtherThread {
            row: row_b.id,
            owner: b.clone(),
        })
    );
    let other = f.second_connection();
    assert_eq!(other.list_rows(Some(&a)).unwrap(), vec![moved]);
    assert_eq!(other.list_rows(Some(&b)).unwrap(), vec![row_b]);
    assert!(!actions(&f, &b).iter().any(|a| a == "rescheduled"));
}

#[test]
fn cancel_removes_the_row_and_frees_the_chain() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    f.core.cancel(&thread, row.id, "stale").unwrap();
    assert!(f.core.list_rows(None).unwrap().is_empty());
    assert!(f.core.claim_due(T0 + 1).unwrap().is_empty());
    let again = f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    assert!(again.id > row.id, "row ids are never reused");
}

#[test]
fn list_rows_is_ordered_by_send_time_and_checks_the_thread() {
    let f = Fixture::new();
    let (a, fa) = f.failed_thread("a");
    let (b, fb) = f.failed_thread("b");
    let late = f.core.schedule_retry(&a, &fa, T0 + 900, "r").unwrap();
    let early = f.core.schedule_retry(&b, &fb, T0 + 100, "r").unwrap();
    let ids: Vec<RowId> = f
        .core
        .list_rows(None)
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, vec![early.id, late.id]);
    assert_eq!(
        f.core.list_rows(Some("th_missing")),
        Err(ThreadsError::NoSuchThread("th_missing".into()))
    );
}

#[test]
fn claim_due_returns_only_rows_whose_time_has_come() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core
        .schedule_retry(&thread, &failed, T0 + 10_000, "r")
        .unwrap();
    assert_eq!(f.core.next_due_at().unwrap(), Some(T0 + 10_000));
    assert!(f.core.claim_due(T0 + 9_999).unwrap().is_empty());
    let claims = f.core.claim_due(T0 + 10_000).unwrap();
    assert_eq!(claims.len(), 1);
    assert!(
        f.core.claim_due(T0 + 10_000).unwrap().is_empty(),
        "a claimed row is not claimed twice"
    );
}

#[test]
fn dispatch_creates_the_next_attempt_with_the_original_input_and_deletes_the_row() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("write the parser");
    let row = f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    assert_eq!(claim.row.id, row.id);
    let plan = f.core.dispatch(&claim).unwrap();
    assert_eq!(plan.attempt, 2);
    assert_eq!(plan.original_request, failed);
    assert_eq!(plan.input, "write the parser");
    assert_eq!(plan.trigger, TurnTrigger::Retry);
    assert!(plan.history.is_empty(), "the failed input was not accepted");
    assert!(f.core.list_rows(None).unwrap().is_empty());
    let info = f.core.get_thread(&thread).unwrap();
    assert_eq!(info.status, ThreadStatus::Active);
    assert_eq!(info.latest_request.as_deref(), Some(plan.request.as_str()));
    // The same claim cannot dispatch twice.
    assert_eq!(f.core.dispatch(&claim), Err(CoreError::ClaimLost(row.id)));
    let turns = f.core.show(&thread).unwrap().turns;
    assert_eq!(turns.len(), 2);
}

#[test]
fn dispatch_sends_please_continue_when_the_provider_had_accepted_the_input() {
    let f = Fixture::new();
    let (thread, plan) = f.running_thread(Provider::Codex, "refactor it");
    f.fail(&plan.request, true);
    f.core
        .schedule_retry(&thread, &plan.request, T0, "r")
        .unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    let retry = f.core.dispatch(&claim).unwrap();
    assert_eq!(retry.input, CONTINUE_INPUT);
    assert_eq!(
        retry.history,
        vec![Exchange {
            user: "refactor it".into(),
            assistant: "partial".into()
        }],
        "the model sees what it had begun"
    );
}

/// An agent CLI keeps a refused input in its session: the retry resumes that session with
/// a continuation, never the input again, and the thread keeps the agent's session id.
#[test]
fn an_agent_retry_continues_the_session_that_holds_the_refused_input() {
    let f = Fixture::new();
    let spec = AgentSpec {
        agent: Agent::ClaudeCode,
        cwd: Some("/work/repo".into()),
        args: vec!["--verbose".into()],
    };
    assert!(matches!(
        f.core
            .new_agent_thread("th_wrong", Provider::Codex, None, Some(route()), &spec),
        Err(CoreError::InvalidArgument(_))
    ));
    f.core
        .new_agent_thread("th_agent", Provider::Claude, None, Some(route()), &spec)
        .unwrap();
    f.core.send("th_agent", "fix the build").unwrap();
    let first = f.core.start_turns().unwrap().remove(0);
    assert_eq!(first.agent, spec);
    assert_eq!(first.agent_session, None, "a first turn starts a session");
    let mut refused = failed_outcome(false);
    refused.agent_session = Some("sess-1".into());
    refused.input_in_session = true;
    f.core.record_outcome(&first.request, &refused).unwrap();
    let view = f.core.show("th_agent").unwrap().thread;
    assert_eq!(view.agent, Agent::ClaudeCode);
    assert_eq!(view.agent_session.as_deref(), Some("sess-1"));
    assert_eq!(view.cwd.as_deref(), Some("/work/repo"));

    f.core
        .schedule_retry("th_agent", &first.request, T0, "r")
        .unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    let retry = f.core.dispatch(&claim).unwrap();
    assert_eq!(
        retry.input, CONTINUE_INPUT,
        "the input is in the session already"
    );
    assert_eq!(retry.agent_session.as_deref(), Some("sess-1"));
    assert_eq!(retry.attempt, 2);
}

#[test]
fn a_retry_of_a_retry_points_at_the_original_with_the_next_attempt() {
    let f = Fixture::new();
    let (thread, original) = f.failed_thread("hello");
    f.core.schedule_retry(&thread, &original, T0, "r").unwrap();
    let second = f
        .core
        .dispatch(&f.core.claim_due(f.now()).unwrap().remove(0))
        .unwrap();
    f.fail(&second.request, false);
    let row = f
        .core
        .schedule_retry(&thread, &second.request, T0, "r")
        .unwrap();
    assert_eq!(row.attempt, 3);
    assert_eq!(row.original_request, original);
    assert_eq!(row.failed_request, second.request);
    let third = f
        .core
        .dispatch(&f.core.claim_due(f.now()).unwrap().remove(0))
        .unwrap();
    assert_eq!(
        (third.attempt, third.original_request.as_str()),
        (3, original.as_str())
    );
    assert_eq!(third.input, "hello");
}

/// PR-11: a full concurrency limit holds a due row until a slot frees.
#[test]
fn a_full_concurrency_limit_holds_a_due_row_until_a_slot_frees() {
    let f = Fixture::new();
    f.core.set_concurrency_limit(1).unwrap();
    let (thread, failed) = f.failed_thread("retry me");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 1_000, "r")
        .unwrap();
    let (_busy, running) = f.running_thread(Provider::Claude, "long task");
    f.advance_ms(2_000);
    assert!(f.core.claim_due(f.now()).unwrap().is_empty());
    let waiting = f.core.list_rows(None).unwrap();
    assert_eq!(waiting.len(), 1, "the row is kept");
    assert!(waiting[0].waiting_for_slot);
    assert_eq!(waiting[0].attempt, 2);
    f.succeed(&running.request);
    let claims = f.core.claim_due(f.now()).unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].row.id, row.id);
    let plan = f.core.dispatch(&claims[0]).unwrap();
    assert_eq!(plan.attempt, 2);
}

#[test]
fn claimed_rows_take_slots_so_one_pass_never_exceeds_the_limit() {
    let f = Fixture::new();
    f.core.set_concurrency_limit(2).unwrap();
    for i in 0..3 {
        let (thread, failed) = f.failed_thread(&format!("t{i}"));
        f.core
            .schedule_retry(&thread, &failed, T0 + i, "r")
            .unwrap();
    }
    let first = f.core.claim_due(T0 + 10).unwrap();
    assert_eq!(first.len(), 2);
    assert!(f.core.claim_due(T0 + 10).unwrap().is_empty());
    let rows = f.core.list_rows(None).unwrap();
    assert_eq!(rows.iter().filter(|r| r.waiting_for_slot).count(), 1);
}

#[test]
fn a_thread_running_a_turn_does_not_get_its_row_claimed() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("old");
    f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    f.core.send(&thread, "new message").unwrap();
    let plan = f.core.start_turns().unwrap().remove(0);
    assert_eq!(plan.input, "new message");
    assert!(f.core.claim_due(T0 + 1).unwrap().is_empty());
    assert_eq!(
        f.core.list_rows(None).unwrap().len(),
        1,
        "the plugin decides whether it is stale"
    );
}

/// PR-9: wait-until postpones without an attempt.
#[test]
fn postpone_moves_the_claimed_row_without_spending_an_attempt() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    let moved = f
        .core
        .postpone(&claim, T0 + 3_600_000, "pool still blocked")
        .unwrap();
    assert_eq!((moved.send_at, moved.attempt), (T0 + 3_600_000, 2));
    assert_eq!(f.core.dispatch(&claim), Err(CoreError::ClaimLost(moved.id)));
    assert!(f.core.claim_due(T0 + 3_599_999).unwrap().is_empty());
    let again = f.core.claim_due(T0 + 3_600_000).unwrap();
    assert_eq!(again[0].row.attempt, 2);
    assert_eq!(f.core.show(&thread).unwrap().turns.len(), 1);
}

#[test]
fn drop_row_removes_the_claimed_row_without_a_turn() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    f.core
        .drop_row(&claim, "stale: the thread moved on")
        .unwrap();
    assert!(f.core.list_rows(None).unwrap().is_empty());
    assert_eq!(f.core.show(&thread).unwrap().turns.len(), 1);
    let history = f.core.show(&thread).unwrap().history;
    let last = history.last().unwrap();
    assert_eq!(last.action, "dropped");
    assert_eq!(last.detail.as_deref(), Some("stale: the thread moved on"));
}

#[test]
fn a_reschedule_during_the_gate_voids_the_claim() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    f.core
        .reschedule(&thread, row.id, T0 + 60_000, "later")
        .unwrap();
    assert_eq!(f.core.dispatch(&claim), Err(CoreError::ClaimLost(row.id)));
    assert_eq!(f.core.list_rows(None).unwrap()[0].send_at, T0 + 60_000);
}

/// A row claimed when the host died was never dispatched (dispatch deletes it): it is
/// released on start, gated again and dispatched exactly once.
#[test]
fn a_row_claimed_when_the_host_crashed_is_released_on_start_and_dispatched_once() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let stale_claim = f.core.claim_due(f.now()).unwrap().remove(0);
    let f = f.restart();
    let report = f.core.recover().unwrap();
    assert_eq!(report.released_rows, vec![row.id]);
    assert!(report.interrupted_turns.is_empty());
    assert_eq!(
        f.core.dispatch(&stale_claim),
        Err(CoreError::ClaimLost(row.id))
    );
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    let plan = f.core.dispatch(&claim).unwrap();
    assert_eq!(plan.attempt, 2);
    assert!(f.core.claim_due(f.now() + 1).unwrap().is_empty());
    let retries: Vec<_> = f
        .core
        .show(&thread)
        .unwrap()
        .turns
        .into_iter()
        .filter(|t| t.attempt == 2)
        .collect();
    assert_eq!(retries.len(), 1);
}

/// A dispatch that committed before the crash is not repeated: the row is gone, and the
/// turn it started is reported failed so the plugin can decide again.
#[test]
fn a_dispatch_committed_before_a_crash_is_not_repeated() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let plan = f
        .core
        .dispatch(&f.core.claim_due(f.now()).unwrap().remove(0))
        .unwrap();
    let f = f.restart();
    let report = f.core.recover().unwrap();
    assert!(report.released_rows.is_empty());
    assert_eq!(report.interrupted_turns, vec![plan.request.clone()]);
    assert!(f.core.claim_due(f.now() + 1).unwrap().is_empty());
    let show = f.core.show(&thread).unwrap();
    assert_eq!(show.thread.info.status, ThreadStatus::Error);
    assert_eq!(show.turns.len(), 2);
    let interrupted = &show.turns[1];
    assert_eq!(interrupted.outcome, Some(TurnOutcomeKind::Failed));
    let failure = interrupted.failure.as_ref().unwrap();
    assert_eq!(
        (failure.category, failure.origin),
        (FailureCategory::ConnectionFailed, FailureOrigin::Transport)
    );
    // The plugin can retry the interrupted attempt: attempt 3 of the same chain.
    let row = f
        .core
        .schedule_retry(&thread, &plan.request, T0, "r")
        .unwrap();
    assert_eq!((row.attempt, row.original_request), (3, failed));
}

#[test]
fn archiving_a_thread_removes_its_waiting_row() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core
        .schedule_retry(&thread, &failed, T0 + 1_000, "r")
        .unwrap();
    f.core.archive(&thread).unwrap();
    f.advance_ms(5_000);
    assert!(f.core.claim_due(f.now()).unwrap().is_empty());
    assert!(f.core.list_rows(None).unwrap().is_empty());
    assert_eq!(
        f.core.show(&thread).unwrap().turns.len(),
        1,
        "no turn was dispatched"
    );
    assert_eq!(f.core.send(&thread, "more"), Err(CoreError::Archived));
}

#[test]
fn a_thread_archived_during_the_gate_is_not_dispatched() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    f.core.archive(&thread).unwrap();
    assert!(f.core.dispatch(&claim).is_err());
    assert_eq!(f.core.show(&thread).unwrap().turns.len(), 1);
}

/// PR-19: send-now by a person bypasses the gates and is recorded.
#[test]
fn send_now_bypasses_time_and_limit_and_is_recorded() {
    let f = Fixture::new();
    f.core.set_concurrency_limit(1).unwrap();
    let (thread, failed) = f.failed_thread("hello");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 7_200_000, "blocked")
        .unwrap();
    let (_other, _running) = f.running_thread(Provider::Codex, "busy");
    let plan = f.core.send_now(&thread, f.now()).unwrap();
    assert_eq!((plan.attempt, plan.trigger), (2, TurnTrigger::SendNow));
    assert!(f.core.list_rows(None).unwrap().is_empty());
    let entry = f.core.show(&thread).unwrap().history.pop().unwrap();
    assert_eq!(
        (entry.actor.as_str(), entry.action.as_str()),
        ("person", "send-now")
    );
    assert_eq!(entry.row, Some(row.id));
}

#[test]
fn send_now_without_a_pending_retry_is_refused() {
    let f = Fixture::new();
    let (thread, _) = f.failed_thread("hello");
    assert_eq!(
        f.core.send_now(&thread, f.now()),
        Err(CoreError::NoPendingRetry(thread.clone()))
    );
}

#[test]
fn send_now_voids_a_claim_the_host_holds() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let row = f.core.schedule_retry(&thread, &failed, T0, "r").unwrap();
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    f.core.send_now(&thread, f.now()).unwrap();
    assert_eq!(f.core.dispatch(&claim), Err(CoreError::ClaimLost(row.id)));
    assert_eq!(
        f.core.show(&thread).unwrap().turns.len(),
        2,
        "one dispatch, not two"
    );
}

#[test]
fn restart_keeps_rows_attempts_and_the_limit() {
    let f = Fixture::new();
    f.core.set_concurrency_limit(3).unwrap();
    let (thread, failed) = f.failed_thread("hello");
    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 60_000, "r")
        .unwrap();
    let f = f.restart();
    f.core.recover().unwrap();
    assert_eq!(f.core.list_rows(None).unwrap(), vec![row]);
    assert_eq!(f.core.concurrency_limit().unwrap(), 3);
    let info = f.core.get_thread(&thread).unwrap();
    assert_eq!(info.status, ThreadStatus::Error);
    assert_eq!(info.latest_request, Some(failed));
}

/// The queue's bookkeeping (`schedule-retry`, `reschedule`, `cancel`) commits
/// without a sync of its own; the commits that start a turn (a person's message, a
/// dispatched row, send-now) are synced, so a power loss cannot send a turn twice.
#[test]
fn only_the_commits_that_start_a_turn_are_synced_one_by_one() {
    let f = Fixture::new();
    let (thread, failed) = f.failed_thread("hello");
    let started = f.core.durable_commits();
    assert!(started >= 1, "starting the first turn was durable");

    let row = f
        .core
        .schedule_retry(&thread, &failed, T0 + 7_200_000, "blocked")
        .unwrap();
    for i in 0..10 {
        f.core
            .reschedule(&thread, row.id, T0 + 60_000 + i, "account enabled")
            .unwrap();
    }
    assert!(f.core.claim_due(f.now()).unwrap().is_empty());
    assert_eq!(
        f.core.durable_commits(),
        started,
        "bookkeeping is not synced commit by commit"
    );

    f.advance_ms(60_100);
    let claim = f.core.claim_due(f.now()).unwrap().remove(0);
    f.core.dispatch(&claim).unwrap();
    assert_eq!(
        f.core.durable_commits(),
        started + 1,
        "a dispatch is synced"
    );

    let (other, other_failed) = f.failed_thread("two");
    let before = f.core.durable_commits();
    f.core
        .schedule_retry(&other, &other_failed, T0 + 7_200_000, "blocked")
        .unwrap();
    f.core.send_now(&other, f.now()).unwrap();
    assert_eq!(f.core.durable_commits(), before + 1, "a send-now is synced");
}

/// The core runs `synchronous=NORMAL`: a crash of the process (here: `abort` in a child
/// process, no cleanup, no checkpoint) still loses no commit that returned.
#[test]
fn commits_survive_a_crash_of_the_process() {
    const CHILD: &str = "POOLER_CORE_CRASH_CHILD";
    if let Ok(dir) = std::env::var(CHILD) {
        let clock = pooler_core::clock::ManualClock::new(T0);
        let core = Core::open(&dir, clock as pooler_core::clock::SharedClock).unwrap();
        let thread = core
            .new_thread(Provider::Claude, None, Some(route()))
            .unwrap();
        core.send(&thread, "hello").unwrap();
        let plan = core.start_turns().unwrap().remove(0);
        core.record_outcome(&plan.request, &failed_outcome(false))
            .unwrap();
        let row = core
            .schedule_retry(&thread, &plan.request, T0 + 7_200_000, "blocked")
            .unwrap();
        core.reschedule(&thread, row.id, T0 + 42_000, "account enabled")
            .unwrap();
        std::process::abort();
    }
    let dir = TempDir::new();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            // The test's name in this binary: its module path without the crate's.
            &format!(
                "{}::commits_survive_a_crash_of_the_process",
                module_path!().split_once("::").map_or("", |(_, m)| m)
            ),
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child crashed");
    assert!(
        dir.path().join("core.sqlite3-wal").exists(),
        "the crash left the WAL unmerged"
    );
    let clock = pooler_core::clock::ManualClock::new(T0);
    let core = Core::open(dir.path(), clock as pooler_core::clock::SharedClock).unwrap();
    let rows = core.list_rows(None).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].send_at, rows[0].attempt), (T0 + 42_000, 2));
    assert_eq!(rows[0].reason, "account enabled");
}
