//! Retention: the core's `history`, `outbox` and `turn_requests` tables would otherwise grow
//! for as long as the data directory lives. [`Core::prune`] deletes what is past its
//! retention and no longer needed, at most [`Retention::batch`] rows per table per call;
//! the host calls it on its prune tick.
//!
//! Never pruned, whatever its age:
//! - **history**: the entries of a chain that still has a live row (its story so far);
//! - **outbox**: an event some subscriber has not acknowledged yet (it is still to be
//!   delivered, at least once), and its delivery records;
//! - **turn requests**: a request not finished (queued or running); a thread's latest
//!   started request (a retry is scheduled against it); a request a live row names (its
//!   failed request or its chain's first); and, on a thread not archived, a request whose
//!   input the provider accepted: those exchanges are the conversation a turn replays.
//!   What goes is the failed attempts whose input never reached the provider, and every
//!   finished request of an archived thread but its latest.
//!
//! The thread rows themselves, the live rows, settings and rate-limit snapshots are never
//! pruned.

use std::time::Duration;

use rusqlite::{Transaction, params};

use crate::error::CoreError;
use crate::model::Timestamp;
use crate::store::{CachedSql, Core};

/// How long each table keeps what it no longer needs; `None`: forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// History entries older than this go (unless their chain has a live row).
    pub history: Option<Duration>,
    /// Outbox events delivered to every subscriber go this long after they were written.
    pub outbox: Option<Duration>,
    /// Finished turn requests go this long after they finished (unless still needed).
    pub turns: Option<Duration>,
    /// The most rows one [`Core::prune`] deletes from each table (at least 1).
    pub batch: usize,
}

/// 30 days of history.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// 7 days of delivered outbox events.
pub const DEFAULT_OUTBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// 90 days of finished turn requests no longer needed.
pub const DEFAULT_TURN_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);
/// 500 rows per table per prune.
pub const DEFAULT_PRUNE_BATCH: usize = 500;

impl Default for Retention {
    fn default() -> Self {
        Retention {
            history: Some(DEFAULT_HISTORY_RETENTION),
            outbox: Some(DEFAULT_OUTBOX_RETENTION),
            turns: Some(DEFAULT_TURN_RETENTION),
            batch: DEFAULT_PRUNE_BATCH,
        }
    }
}

/// What one [`Core::prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub history: usize,
    /// Outbox events (their delivery records went with them).
    pub outbox: usize,
    pub turns: usize,
    /// Some table had more to prune than one batch: call again soon.
    pub more: bool,
}

impl Pruned {
    pub fn total(&self) -> usize {
        self.history + self.outbox + self.turns
    }
}

fn cutoff(now: Timestamp, keep: Option<Duration>) -> Option<Timestamp> {
    let keep = u64::try_from(keep?.as_millis()).unwrap_or(u64::MAX);
    now.checked_sub(keep)
}

fn ids(
    tx: &Transaction<'_>,
    sql: &str,
    cutoff: Timestamp,
    batch: i64,
) -> rusqlite::Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(sql)?;
    stmt.query_map(params![cutoff, batch], |r| r.get(0))?
        .collect()
}

impl Core {
    /// Deletes what is past `retention` at `now` and no longer needed (see the module
    /// docs), at most `retention.batch` rows per table, in one transaction.
    pub fn prune(&self, now: Timestamp, retention: &Retention) -> Result<Pruned, CoreError> {
        let batch = i64::try_from(retention.batch.max(1)).unwrap_or(i64::MAX);
        let full = |n: usize| n as i64 >= batch;
        let pruned = self.write(|tx| -> Result<Pruned, CoreError> {
            let mut pruned = Pruned::default();
            if let Some(cutoff) = cutoff(now, retention.history) {
                let n = tx.exec(
                    "DELETE FROM history WHERE id IN (
                         SELECT h.id FROM history h
                         WHERE h.at < ?1
                           AND NOT EXISTS (SELECT 1 FROM queued_rows q
                                           WHERE q.original_request = h.original_request)
                         ORDER BY h.at LIMIT ?2)",
                    params![cutoff, batch],
                )?;
                pruned.history = n;
                pruned.more |= full(n);
            }
            if let Some(cutoff) = cutoff(now, retention.outbox) {
                let events = ids(
                    tx,
                    "SELECT o.id FROM outbox o
                     WHERE o.created_at < ?1
                       AND NOT EXISTS (
                           SELECT 1 FROM outbox_subscribers s
                           WHERE s.first_event <= o.id
                             AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d
                                             WHERE d.subscriber = s.name AND d.event_id = o.id
                                               AND d.done_at IS NOT NULL))
                     ORDER BY o.created_at LIMIT ?2",
                    cutoff,
                    batch,
                )?;
                for id in &events {
                    tx.exec("DELETE FROM outbox_deliveries WHERE event_id = ?1", [id])?;
                    tx.exec("DELETE FROM outbox WHERE id = ?1", [id])?;
                }
                pruned.outbox = events.len();
                pruned.more |= full(events.len());
            }
            if let Some(cutoff) = cutoff(now, retention.turns) {
                let n = tx.exec(
                    "DELETE FROM turn_requests WHERE rowid IN (
                         SELECT r.rowid FROM turn_requests r JOIN threads t ON t.id = r.thread_id
                         WHERE r.finished_at IS NOT NULL AND r.finished_at < ?1
                           AND (t.archived = 1 OR r.input_accepted = 0)
                           AND r.start_seq < (SELECT MAX(x.start_seq) FROM turn_requests x
                                              WHERE x.thread_id = r.thread_id)
                           AND r.id NOT IN (SELECT failed_request FROM queued_rows)
                           AND r.id NOT IN (SELECT original_request FROM queued_rows)
                         ORDER BY r.finished_at LIMIT ?2)",
                    params![cutoff, batch],
                )?;
                pruned.turns = n;
                pruned.more |= full(n);
            }
            Ok(pruned)
        })?;
        if pruned.total() > 0 {
            tracing::debug!(
                history = pruned.history,
                outbox = pruned.outbox,
                turns = pruned.turns,
                more = pruned.more,
                "pruned the core's tables"
            );
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::model::*;

    const T0: Timestamp = 1_790_000_000_000;
    const DAY: Timestamp = 24 * 3_600_000;
    const SUB: &str = "provider-retry";

    fn outcome(ok: bool, accepted: bool) -> TurnOutcome {
        TurnOutcome {
            result: if ok {
                TurnResult::Succeeded {
                    reply: "pong".into(),
                }
            } else {
                TurnResult::Failed {
                    failure: Failure {
                        category: FailureCategory::RateLimit,
                        provider_code: None,
                        http_status: Some(429),
                        origin: FailureOrigin::Pool,
                        retry_after: None,
                        message: None,
                    },
                    partial_reply: String::new(),
                }
            },
            input_accepted: accepted,
            rate_limits: None,
            agent_session: None,
            input_in_session: false,
        }
    }

    /// Sends `text` on `thread` and ends its turn with `result`; the request's id.
    fn turn(core: &Core, thread: &str, text: &str, result: TurnOutcome) -> String {
        core.send(thread, text).unwrap();
        let plan = core.start_turns().unwrap().remove(0);
        core.record_outcome(&plan.request, &result).unwrap();
        plan.request
    }

    fn turn_ids(core: &Core, thread: &str) -> Vec<String> {
        core.show(thread)
            .unwrap()
            .turns
            .into_iter()
            .map(|t| t.id)
            .collect()
    }

    fn count(core: &Core, table: &str) -> i64 {
        core.read(|c| c.row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0)))
            .unwrap()
    }

    struct World {
        core: Core,
        clock: std::sync::Arc<ManualClock>,
        dir: std::path::PathBuf,
        /// A failed turn with a live retry row.
        waiting: String,
        waiting_turn: String,
        /// ok, failed (retried by a person), ok.
        talk: String,
        talk_turns: Vec<String>,
        /// Archived after two good turns.
        archived: String,
        archived_turns: Vec<String>,
        /// The outbox event left unacknowledged.
        pending_event: EventId,
    }

    fn world() -> World {
        let dir = std::env::temp_dir().join(crate::ids::new_id("pooler-core-retention"));
        let clock = ManualClock::new(T0);
        let core = Core::open(&dir, clock.clone()).unwrap();
        core.register_subscriber(SUB).unwrap();

        let waiting = core.new_thread(Provider::Claude, None, None).unwrap();
        let waiting_turn = turn(&core, &waiting, "one", outcome(false, false));
        core.schedule_retry(&waiting, &waiting_turn, T0 + 365 * DAY, "much later")
            .unwrap();

        let talk = core.new_thread(Provider::Claude, None, None).unwrap();
        let first = turn(&core, &talk, "hello", outcome(true, true));
        let refused = turn(&core, &talk, "again", outcome(false, false));
        core.schedule_retry(&talk, &refused, T0 + DAY, "soon")
            .unwrap();
        let retry = core.send_now(&talk, T0).unwrap();
        core.record_outcome(&retry.request, &outcome(true, true))
            .unwrap();
        let talk_turns = vec![first, refused, retry.request];

        let archived = core.new_thread(Provider::Codex, None, None).unwrap();
        let archived_turns = vec![
            turn(&core, &archived, "a", outcome(true, true)),
            turn(&core, &archived, "b", outcome(true, true)),
        ];
        core.archive(&archived).unwrap();

        let events = core.pending_events(SUB, 100).unwrap();
        assert_eq!(events.len(), 6);
        let pending_event = events[3].id;
        for e in &events {
            if e.id != pending_event {
                core.ack(SUB, e.id).unwrap();
            }
        }
        World {
            core,
            clock,
            dir,
            waiting,
            waiting_turn,
            talk,
            talk_turns,
            archived,
            archived_turns,
            pending_event,
        }
    }

    /// Rows past retention are gone after a prune; the rows still
    /// needed stay, and the queue still works.
    #[test]
    fn a_prune_removes_what_is_past_retention_and_keeps_what_is_needed() {
        let w = world();
        let core = &w.core;
        let retention = Retention::default();
        let before = (
            count(core, "history"),
            count(core, "outbox"),
            count(core, "turn_requests"),
        );

        // Nothing is old enough yet.
        assert_eq!(core.prune(T0 + DAY, &retention).unwrap(), Pruned::default());

        let later = T0 + 100 * DAY;
        let pruned = core.prune(later, &retention).unwrap();
        assert!(!pruned.more, "{pruned:?}");

        // History: the chains without a live row lose theirs; the waiting row's stays.
        let waiting_history = core.show(&w.waiting).unwrap().history;
        assert!(
            waiting_history.iter().any(|h| h.action == "scheduled"),
            "{waiting_history:?}"
        );
        assert!(core.show(&w.talk).unwrap().history.is_empty());
        assert_eq!(
            pruned.history as i64,
            before.0 - waiting_history.len() as i64
        );

        // Outbox: only the unacknowledged event, still pending.
        assert_eq!(count(core, "outbox"), 1);
        assert_eq!(pruned.outbox as i64, before.1 - 1);
        let pending: Vec<EventId> = core
            .pending_events(SUB, 10)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(pending, [w.pending_event]);
        assert_eq!(count(core, "outbox_deliveries"), 0);

        // Turns: the refused attempt of a live thread and the older turn of the archived
        // one go; the conversation, the latest turns and the row's failed turn stay.
        assert_eq!(
            turn_ids(core, &w.waiting),
            std::slice::from_ref(&w.waiting_turn)
        );
        assert_eq!(
            turn_ids(core, &w.talk),
            [w.talk_turns[0].clone(), w.talk_turns[2].clone()]
        );
        assert_eq!(turn_ids(core, &w.archived), [w.archived_turns[1].clone()]);
        assert_eq!(pruned.turns, 2);
        assert_eq!(count(core, "turn_requests"), before.2 - 2);

        // What stayed still works: the waiting row dispatches its retry, and the
        // conversation is replayed whole.
        w.clock.set(later);
        let retry = core.send_now(&w.waiting, later).unwrap();
        assert_eq!(retry.attempt, 2);
        core.record_outcome(&retry.request, &outcome(true, true))
            .unwrap();
        core.send(&w.talk, "more").unwrap();
        let next = core.start_turns().unwrap().remove(0);
        assert_eq!(next.thread, w.talk);
        let replayed: Vec<&str> = next.history.iter().map(|e| e.user.as_str()).collect();
        assert_eq!(replayed, ["hello", "again"]);

        // Once the row is gone, its chain's old history and its old failed turn are no
        // longer needed: the next prune takes them, and nothing of today.
        let again = core.prune(later, &retention).unwrap();
        assert_eq!(
            (again.history, again.outbox, again.turns),
            (1, 0, 1),
            "{again:?}"
        );
        assert_eq!(
            turn_ids(core, &w.waiting),
            std::slice::from_ref(&retry.request)
        );
        drop(w.core);
        std::fs::remove_dir_all(w.dir).unwrap();
    }

    /// One prune deletes at most a batch per table, and says when there is more.
    #[test]
    fn a_prune_is_bounded_by_its_batch() {
        let w = world();
        let retention = Retention {
            batch: 1,
            ..Retention::default()
        };
        let later = T0 + 100 * DAY;
        let mut rounds = 0;
        let mut total = Pruned::default();
        loop {
            let p = w.core.prune(later, &retention).unwrap();
            assert!(p.history <= 1 && p.outbox <= 1 && p.turns <= 1, "{p:?}");
            total.history += p.history;
            total.outbox += p.outbox;
            total.turns += p.turns;
            rounds += 1;
            if !p.more {
                break;
            }
            assert!(rounds < 100);
        }
        assert!(rounds > 1);
        assert_eq!(total.outbox, 5);
        assert_eq!(total.turns, 2);
        drop(w.core);
        std::fs::remove_dir_all(w.dir).unwrap();
    }

    /// `None` keeps a table forever.
    #[test]
    fn no_retention_keeps_everything() {
        let w = world();
        let keep = Retention {
            history: None,
            outbox: None,
            turns: None,
            batch: 10,
        };
        assert_eq!(
            w.core.prune(T0 + 10_000 * DAY, &keep).unwrap(),
            Pruned::default()
        );
        let _ = (&w.talk, &w.archived);
        drop(w.core);
        std::fs::remove_dir_all(w.dir).unwrap();
    }
}
