//! Threads and their turns: creating threads, queuing a person's messages, starting turns,
//! recording outcomes (which moves the thread to `idle` / `error` and writes the plugin
//! event to the outbox in the same transaction), reading threads for plugins and people,
//! and recovering turns a crash interrupted.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::error::{CoreError, ThreadsError};
use crate::ids;
use crate::model::*;
use crate::store::{self, Actor, CachedSql, Core, ThreadRow};

/// The input a retry sends when the provider had already accepted the failed input.
pub const CONTINUE_INPUT: &str = "Please continue.";

/// What [`Core::recover`] found and repaired after a start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Rows a crash left claimed; they are back in the queue and pass the gates again.
    pub released_rows: Vec<RowId>,
    /// Turns a crash left running; each is recorded as failed (`connection-failed`,
    /// origin `transport`), with its `turn-failed` event.
    pub interrupted_turns: Vec<RequestId>,
}

fn validate_text(what: &str, text: &str) -> Result<(), CoreError> {
    if text.trim().is_empty() {
        return Err(CoreError::InvalidArgument(format!(
            "{what} must not be empty"
        )));
    }
    Ok(())
}

fn require_thread(conn: &Connection, thread: &str) -> Result<ThreadRow, CoreError> {
    store::load_thread(conn, thread)?.ok_or_else(|| CoreError::NoSuchThread(thread.to_string()))
}

impl Core {
    /// Creates a thread. `route` is the pool's route for it (see `routing.open-route`);
    /// `None` means its turns go straight to the provider. Returns the new thread id.
    pub fn new_thread(
        &self,
        provider: Provider,
        model: Option<&str>,
        route: Option<Route>,
    ) -> Result<ThreadId, CoreError> {
        let id = Self::new_thread_id();
        self.new_thread_with_id(&id, provider, model, route)?;
        Ok(id)
    }

    /// A fresh thread id, for a host that must name the thread before creating it (the
    /// pool's route is opened for the id, then the thread is created with its route).
    pub fn new_thread_id() -> ThreadId {
        ids::new_id("th")
    }

    /// Creates a thread under an id from [`Core::new_thread_id`]. Fails with a storage
    /// error if the id is taken.
    pub fn new_thread_with_id(
        &self,
        id: &str,
        provider: Provider,
        model: Option<&str>,
        route: Option<Route>,
    ) -> Result<(), CoreError> {
        self.new_agent_thread(id, provider, model, route, &AgentSpec::default())
    }

    /// [`Core::new_thread_with_id`] for a thread whose turns `agent` runs. An agent CLI
    /// serves one provider: naming another is refused.
    pub fn new_agent_thread(
        &self,
        id: &str,
        provider: Provider,
        model: Option<&str>,
        route: Option<Route>,
        agent: &AgentSpec,
    ) -> Result<(), CoreError> {
        validate_text("a thread id", id)?;
        if let Some(serves) = agent.agent.provider()
            && serves != provider
        {
            return Err(CoreError::InvalidArgument(format!(
                "the {} agent talks to {serves}, not {provider}",
                agent.agent
            )));
        }
        let args =
            serde_json::to_string(&agent.args).map_err(|e| CoreError::Storage(e.to_string()))?;
        let now = self.now();
        self.write(|tx| {
            tx.exec(
                "INSERT INTO threads (id, provider, model, session_id, route_base_url,
                                      route_token, created_at, updated_at, agent, cwd, agent_args)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10)",
                params![
                    id,
                    provider.as_str(),
                    model,
                    ids::new_session_id(),
                    route.as_ref().map(|r| r.base_url.as_str()),
                    route.as_ref().map(|r| r.token.as_str()),
                    now,
                    agent.agent.as_str(),
                    agent.cwd,
                    args
                ],
            )?;
            Ok::<_, CoreError>(())
        })?;
        tracing::info!(thread = %id, %provider, agent = %agent.agent, routed = route.is_some(), "thread created");
        Ok(())
    }

    /// Replaces (or removes) a thread's pool route.
    pub fn set_route(&self, thread: &str, route: Option<Route>) -> Result<(), CoreError> {
        let now = self.now();
        self.write(|tx| {
            require_thread(tx, thread)?;
            tx.exec(
                "UPDATE threads SET route_base_url = ?2, route_token = ?3, updated_at = ?4
                 WHERE id = ?1",
                params![
                    thread,
                    route.as_ref().map(|r| r.base_url.as_str()),
                    route.as_ref().map(|r| r.token.as_str()),
                    now
                ],
            )?;
            Ok(())
        })
    }

    /// Queues a person's message for the thread. It starts as a turn when the thread is not
    /// running one and a slot is free ([`Core::start_turns`]). Returns its request id.
    pub fn send(&self, thread: &str, text: &str) -> Result<RequestId, CoreError> {
        validate_text("a message", text)?;
        let id = ids::new_id("rq");
        let now = self.now();
        self.write(|tx| {
            let t = require_thread(tx, thread)?;
            if t.archived {
                return Err(CoreError::Archived);
            }
            tx.exec(
                "INSERT INTO turn_requests (id, thread_id, input, trigger, original_request,
                                            attempt, created_at)
                 VALUES (?1, ?2, ?3, 'user', ?1, 1, ?4)",
                params![id, thread, text, now],
            )?;
            Ok(())
        })?;
        Ok(id)
    }

    /// Archives a thread: it runs no further turn, and its live rows are removed (recorded
    /// in the history). A turn already running finishes normally.
    pub fn archive(&self, thread: &str) -> Result<(), CoreError> {
        let now = self.now();
        self.write(|tx| {
            require_thread(tx, thread)?;
            tx.exec(
                "UPDATE threads SET archived = 1, updated_at = ?2 WHERE id = ?1",
                params![thread, now],
            )?;
            for row in store::list_rows(tx, Some(thread))? {
                store::remove_row(tx, now, &row, Actor::Person, "dropped", "thread archived")?;
            }
            Ok(())
        })
    }

    /// Opts a thread out of (or back into) automatic retries. Plugins read it in
    /// `thread-info.retry-opt-out`.
    pub fn set_opt_out(&self, thread: &str, opt_out: bool) -> Result<(), CoreError> {
        let now = self.now();
        self.write(|tx| {
            require_thread(tx, thread)?;
            tx.exec(
                "UPDATE threads SET retry_opt_out = ?2, updated_at = ?3 WHERE id = ?1",
                params![thread, opt_out, now],
            )?;
            Ok(())
        })
    }

    /// `threads.get-thread`: a thread as plugins see it.
    pub fn get_thread(&self, thread: &str) -> Result<ThreadInfo, ThreadsError> {
        self.read(|c| {
            store::load_thread_info(c, thread)?
                .ok_or_else(|| ThreadsError::NoSuchThread(thread.to_string()))
        })
    }

    /// `threads.get-threads`: each thread as [`Core::get_thread`] reads it, one answer per
    /// id in order, all read in one transaction (one instant).
    pub fn get_threads(&self, threads: &[&str]) -> Vec<Result<ThreadInfo, ThreadsError>> {
        let read = self.read(|c| {
            let tx = c.unchecked_transaction()?;
            let infos = threads
                .iter()
                .map(|thread| {
                    store::load_thread_info(&tx, thread)?
                        .ok_or_else(|| ThreadsError::NoSuchThread(thread.to_string()))
                })
                .collect();
            tx.finish()?;
            Ok::<_, ThreadsError>(infos)
        });
        read.unwrap_or_else(|e| vec![Err(e); threads.len()])
    }

    /// Every thread (archived ones included), oldest first.
    pub fn list_threads(&self) -> Result<Vec<ThreadView>, CoreError> {
        self.read(|c| {
            store::all_threads(c)?
                .iter()
                .map(|t| view(c, t))
                .collect::<Result<_, _>>()
        })
    }

    /// A thread with its turns (attempt numbers and outcomes), live rows and queue history.
    pub fn show(&self, thread: &str) -> Result<ThreadShow, CoreError> {
        self.read(|c| {
            let t = require_thread(c, thread)?;
            Ok(ThreadShow {
                thread: view(c, &t)?,
                turns: store::turn_records(c, thread)?,
                rows: store::list_rows(c, Some(thread))?,
                history: store::history(c, thread)?,
            })
        })
    }

    /// The thread's route, for the host's turn driver. Kept out of every view: it holds the
    /// route token.
    pub fn route(&self, thread: &str) -> Result<Option<Route>, CoreError> {
        self.read(|c| Ok(require_thread(c, thread)?.route))
    }

    /// Starts queued person messages as turns, oldest first, one per thread, on threads that
    /// are neither archived nor running a turn, while the concurrency limit has room.
    /// Returns the turns to run now.
    pub fn start_turns(&self) -> Result<Vec<TurnPlan>, CoreError> {
        let now = self.now();
        // Durable: the turns are sent to the provider next (a pass that starts nothing
        // commits nothing, and syncs nothing).
        self.write_durable(|tx| {
            let limit = store::concurrency_limit(tx)?;
            let mut free = limit.saturating_sub(store::busy_slots(tx)?);
            let mut plans = Vec::new();
            if free == 0 {
                return Ok(plans);
            }
            let candidates: Vec<(String, String)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT r.id, r.thread_id FROM turn_requests r
                     JOIN threads t ON t.id = r.thread_id
                     WHERE r.started_at IS NULL AND t.archived = 0 AND t.status != 'active'
                       AND r.rowid = (SELECT MIN(q.rowid) FROM turn_requests q
                                      WHERE q.thread_id = r.thread_id AND q.started_at IS NULL)
                       AND NOT EXISTS (SELECT 1 FROM queued_rows w
                                       WHERE w.thread_id = r.thread_id
                                         AND w.wait_state = 'claimed')
                     ORDER BY r.created_at, r.rowid",
                )?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?
            };
            for (request, thread) in candidates {
                if free == 0 {
                    break;
                }
                plans.push(start_request(tx, &thread, &request, now)?);
                free -= 1;
            }
            Ok(plans)
        })
    }

    /// Notes that the provider began answering the running turn `request`, so a crash from
    /// here on still reports `input-accepted` truthfully.
    pub fn mark_input_accepted(&self, request: &str) -> Result<(), CoreError> {
        self.write(|tx| {
            let n = tx.exec(
                "UPDATE turn_requests SET input_accepted = 1
                 WHERE id = ?1 AND started_at IS NOT NULL AND finished_at IS NULL",
                [request],
            )?;
            if n == 0 {
                return Err(CoreError::NotRunning(request.to_string()));
            }
            Ok(())
        })
    }

    /// Records how the running turn `request` ended. In one transaction: the request's
    /// outcome, the thread's status (`idle` or `error`), the provider's rate-limit snapshot
    /// (when the response carried one) and the `turn-succeeded` / `turn-failed` event in the
    /// outbox. Returns the event id.
    pub fn record_outcome(
        &self,
        request: &str,
        outcome: &TurnOutcome,
    ) -> Result<EventId, CoreError> {
        let now = self.now();
        let event = self.write(|tx| finish_turn(tx, request, outcome, now))?;
        Ok(event)
    }

    /// Repairs what a crash left behind. Call once after [`Core::open`], before the first
    /// [`Core::claim_due`]:
    /// - rows left `claimed` go back to the queue (their dispatch never committed, since
    ///   dispatch deletes the row in the transaction that creates the turn), so each is
    ///   gated and dispatched exactly once;
    /// - turns left running are recorded as failed with a `turn-failed` event: the process
    ///   that held their connection is gone, and whether the provider finished is unknown.
    pub fn recover(&self) -> Result<RecoveryReport, CoreError> {
        let now = self.now();
        self.write(|tx| {
            let mut report = RecoveryReport::default();
            let claimed: Vec<(RowId, String, String, Timestamp)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, thread_id, original_request, send_at FROM queued_rows
                     WHERE wait_state = 'claimed' ORDER BY id",
                )?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<Result<_, _>>()?
            };
            for (row, thread, original, send_at) in claimed {
                tx.exec(
                    "UPDATE queued_rows SET wait_state = 'time', claim_gen = claim_gen + 1,
                            claimed_at = NULL, updated_at = ?2 WHERE id = ?1",
                    params![row, now],
                )?;
                store::add_history(
                    tx,
                    now,
                    &thread,
                    Some(row),
                    Some(&original),
                    Actor::Core,
                    "released",
                    Some(send_at),
                    Some("claimed when the host stopped; gated again"),
                )?;
                report.released_rows.push(row);
            }
            let running: Vec<(String, bool)> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, input_accepted FROM turn_requests
                     WHERE started_at IS NOT NULL AND finished_at IS NULL ORDER BY start_seq",
                )?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?
            };
            for (request, input_accepted) in running {
                let outcome = TurnOutcome {
                    result: TurnResult::Failed {
                        failure: Failure {
                            category: FailureCategory::ConnectionFailed,
                            provider_code: None,
                            http_status: None,
                            origin: FailureOrigin::Transport,
                            retry_after: None,
                            message: Some("the host stopped while the turn was running".into()),
                        },
                        partial_reply: String::new(),
                    },
                    input_accepted,
                    rate_limits: None,
                    agent_session: None,
                    input_in_session: false,
                };
                finish_turn(tx, &request, &outcome, now)?;
                report.interrupted_turns.push(request);
            }
            if !report.released_rows.is_empty() || !report.interrupted_turns.is_empty() {
                tracing::warn!(
                    released_rows = report.released_rows.len(),
                    interrupted_turns = report.interrupted_turns.len(),
                    "recovered state left by a stopped host"
                );
            }
            Ok(report)
        })
    }
}

fn view(conn: &Connection, t: &ThreadRow) -> Result<ThreadView, CoreError> {
    Ok(ThreadView {
        info: store::load_thread_info(conn, &t.id)?
            .ok_or_else(|| CoreError::NoSuchThread(t.id.clone()))?,
        session_id: t.session_id.clone(),
        created_at: t.created_at,
        agent: t.agent.agent,
        agent_session: t.agent_session.clone(),
        cwd: t.agent.cwd.clone(),
    })
}

/// Marks an existing unstarted request started and the thread active; builds the plan.
pub(crate) fn start_request(
    tx: &Transaction<'_>,
    thread: &str,
    request: &str,
    now: Timestamp,
) -> Result<TurnPlan, CoreError> {
    let t = require_thread(tx, thread)?;
    let history = store::exchanges(tx, thread)?;
    let seq: i64 = tx.row(
        "SELECT COALESCE(MAX(start_seq), 0) + 1 FROM turn_requests WHERE thread_id = ?1",
        [thread],
        |r| r.get(0),
    )?;
    tx.exec(
        "UPDATE turn_requests SET start_seq = ?2, started_at = ?3 WHERE id = ?1",
        params![request, seq, now],
    )?;
    tx.exec(
        "UPDATE threads SET status = 'active', updated_at = ?2 WHERE id = ?1",
        params![thread, now],
    )?;
    let (input, attempt, original_request, trigger): (String, u32, String, String) = tx.row(
        "SELECT input, attempt, original_request, trigger FROM turn_requests WHERE id = ?1",
        [request],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    Ok(TurnPlan {
        request: request.to_string(),
        thread: thread.to_string(),
        provider: t.provider,
        model: t.model,
        session_id: t.session_id,
        input,
        attempt,
        original_request,
        trigger: TurnTrigger::parse(&trigger).unwrap_or(TurnTrigger::User),
        route: t.route,
        history,
        agent: t.agent,
        agent_session: t.agent_session,
    })
}

fn finish_turn(
    tx: &Transaction<'_>,
    request: &str,
    outcome: &TurnOutcome,
    now: Timestamp,
) -> Result<EventId, CoreError> {
    let req = store::load_request(tx, request)?
        .ok_or_else(|| CoreError::NoSuchRequest(request.to_string()))?;
    if req.started_at.is_none() || req.finished_at.is_some() {
        return Err(CoreError::NotRunning(request.to_string()));
    }
    let thread = require_thread(tx, &req.thread)?;
    // Acceptance noted during the turn stays true even if the driver's report lost it.
    let input_accepted = outcome.input_accepted || req.input_accepted;
    if let Some(session) = outcome.agent_session.as_deref().filter(|s| !s.is_empty())
        && thread.agent_session.as_deref() != Some(session)
    {
        tx.exec(
            "UPDATE threads SET agent_session = ?2 WHERE id = ?1",
            params![thread.id, session],
        )?;
    }
    if outcome.input_in_session {
        tx.exec(
            "UPDATE turn_requests SET in_agent_session = 1 WHERE id = ?1",
            [request],
        )?;
    }

    if let Some(snapshot) = &outcome.rate_limits {
        tx.exec(
            "INSERT INTO rate_limits (provider, snapshot, observed_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (provider) DO UPDATE
                SET snapshot = excluded.snapshot, observed_at = excluded.observed_at
                WHERE excluded.observed_at >= rate_limits.observed_at",
            params![
                thread.provider.as_str(),
                serde_json::to_string(snapshot).map_err(|e| CoreError::Storage(e.to_string()))?,
                snapshot.observed_at
            ],
        )?;
    }

    let event = match &outcome.result {
        TurnResult::Succeeded { reply } => {
            tx.exec(
                "UPDATE turn_requests SET finished_at = ?2, outcome = 'ok', reply = ?3,
                        input_accepted = 1
                 WHERE id = ?1",
                params![request, now, reply],
            )?;
            set_status(tx, &thread.id, ThreadStatus::Idle, now)?;
            PluginEvent::TurnSucceeded(TurnSucceededEvent {
                thread: thread.id.clone(),
                provider: thread.provider,
                request: req.id.clone(),
                original_request: req.original_request.clone(),
                attempt: req.attempt,
                succeeded_at: now,
            })
        }
        TurnResult::Failed {
            failure,
            partial_reply,
        } => {
            let failure_json =
                serde_json::to_string(failure).map_err(|e| CoreError::Storage(e.to_string()))?;
            tx.exec(
                "UPDATE turn_requests SET finished_at = ?2, outcome = 'failed', reply = ?3,
                        input_accepted = ?4, failure = ?5
                 WHERE id = ?1",
                params![
                    request,
                    now,
                    (!partial_reply.is_empty()).then_some(partial_reply.as_str()),
                    input_accepted,
                    failure_json
                ],
            )?;
            set_status(tx, &thread.id, ThreadStatus::Error, now)?;
            // T0 is the failure of the chain's attempt 1: a chain exists only because it
            // failed, so its finish time is the chain's first failure.
            let chain_started_at: Timestamp = if req.original_request == req.id {
                now
            } else {
                tx.row(
                    "SELECT finished_at FROM turn_requests WHERE id = ?1",
                    [&req.original_request],
                    |r| r.get::<_, Option<Timestamp>>(0),
                )
                .optional()?
                .flatten()
                .unwrap_or(now)
            };
            let rate_limits: Option<RateLimitSnapshot> = tx
                .row(
                    "SELECT snapshot FROM rate_limits WHERE provider = ?1",
                    [thread.provider.as_str()],
                    |r| r.get::<_, String>(0),
                )
                .optional()?
                .and_then(|s| serde_json::from_str(&s).ok());
            PluginEvent::TurnFailed(TurnFailedEvent {
                thread: thread.id.clone(),
                provider: thread.provider,
                model: thread.model.clone(),
                failed_request: req.id.clone(),
                original_request: req.original_request.clone(),
                attempt: req.attempt,
                failed_at: now,
                chain_started_at,
                input_accepted,
                routed_by_pool: thread.route.is_some(),
                rate_limits,
                failure: Some(failure.clone()),
            })
        }
    };
    let event_id = crate::outbox::append(tx, &req.id, &event, now)?;
    tracing::info!(
        thread = %thread.id,
        request = %req.id,
        attempt = req.attempt,
        event = event.kind(),
        "turn finished"
    );
    Ok(event_id)
}

fn set_status(
    tx: &Transaction<'_>,
    thread: &str,
    status: ThreadStatus,
    now: Timestamp,
) -> rusqlite::Result<()> {
    tx.exec(
        "UPDATE threads SET status = ?2, updated_at = ?3 WHERE id = ?1",
        params![thread, status.as_str(), now],
    )?;
    Ok(())
}
