//! Turn tasks: each turn runs in its own task, either as a streaming request to the host's
//! own listener with the thread's route token (the built-in driver) or as an agent CLI with
//! the route in its environment, watched at the listener ([`crate::operate::tap`]); a
//! cancel or an archive stops it. The outcome is recorded in the core with its event.

use std::path::PathBuf;
use std::sync::Arc;

use pooler_core::agent::{self, Cli};
use pooler_core::driver;
use pooler_core::{CoreError, EventId, RequestId, Route, TurnOutcome, TurnPlan};
use tokio::sync::watch;

use super::Inner;
use super::loops::closed;
use crate::runtime::Host;

impl Inner {
    /// Runs `plan` in its own task; when it ends, the queue and the outbox are looked at
    /// again (a slot freed, an event was written).
    pub(super) fn spawn_turn(self: &Arc<Self>, plan: TurnPlan) {
        self.signals.modify(|a| a.turns += 1);
        let inner = self.clone();
        tokio::spawn(async move {
            let stop = closed(inner.signals.subscribe());
            let started = inner.now();
            // One line per turn when it ends: what became of it and how long it took.
            let ended = tokio::select! {
                result = inner.run_turn(&plan) => match result {
                    Ok(event) => {
                        tracing::info!(thread = %plan.thread, request = %plan.request, attempt = plan.attempt, event, ms = inner.now().saturating_sub(started), "turn ended");
                        "recorded"
                    }
                    Err(e) => {
                        tracing::error!(thread = %plan.thread, request = %plan.request, error = %e, "turn outcome not recorded");
                        "not-recorded"
                    }
                },
                // The host is stopping: the turn stays running in the database, and the next
                // start records it as interrupted (what a crash would leave).
                _ = stop => {
                    tracing::info!(thread = %plan.thread, request = %plan.request, "turn abandoned: the host is stopping");
                    "abandoned"
                }
            };
            if let Ok(host) = inner.host() {
                let _ = host.metrics().counter_add(
                    "pooler_core_turns_total",
                    "Turns the core ran, by how they ended (recorded, not-recorded, abandoned).",
                    &[("ended", ended)],
                    1,
                );
            }
            inner.signals.modify(|a| {
                a.turns -= 1;
                a.due_dirty = true;
                a.outbox_dirty = true;
            });
        });
    }

    /// Sends the turn to the host's own listener with the thread's route token, reads it to
    /// its end and records the outcome with its event.
    async fn run_turn(&self, plan: &TurnPlan) -> Result<EventId, CoreError> {
        // The base URL is the listener of this run, not the one the route was opened at:
        // the listen address may change between runs, the token does not.
        let route = match (&plan.route, self.endpoint()) {
            (Some(route), Some(base_url)) => Route {
                base_url,
                token: route.token.clone(),
            },
            _ => {
                let outcome = unroutable(if plan.route.is_none() {
                    "the thread has no route through the pool"
                } else {
                    "the host is not listening"
                });
                return self.core.record_outcome(&plan.request, &outcome);
            }
        };
        tracing::info!(thread = %plan.thread, request = %plan.request, attempt = plan.attempt, trigger = %plan.trigger, agent = %plan.agent.agent, "turn started");
        let (stop, mut stopped) = watch::channel(None);
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(plan.thread.clone(), (plan.request.clone(), stop));
        let recorded = match Cli::of(plan.agent.agent) {
            None => {
                tokio::select! {
                    recorded = driver::run_and_record(&self.core, &self.driver, plan, &route) => recorded,
                    why = stop_reason(&mut stopped) => {
                        tracing::info!(thread = %plan.thread, request = %plan.request, reason = %why, "turn stopped");
                        self.core.record_outcome(&plan.request, &stopped_outcome(&why))
                    }
                }
            }
            Some(cli) => self.run_agent_turn(cli, plan, route, &mut stopped).await,
        };
        // The thread's next turn may have started once this one was recorded: its entry
        // stays.
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running
            .get(&plan.thread)
            .is_some_and(|(request, _)| *request == plan.request)
        {
            running.remove(&plan.thread);
        }
        recorded
    }

    /// Stops the turn `thread` is running, if any, for `why`. True when there was one.
    pub(super) fn stop_turn(&self, thread: &str, why: &str) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(thread) {
            Some((_, stop)) => {
                stop.send_replace(Some(why.to_owned()));
                true
            }
            None => false,
        }
    }

    /// Runs an agent CLI for `plan` with the route in its environment, watching the route
    /// at the listener, and records the outcome. A cancel, archiving the thread or the host
    /// stopping kills the agent's process group.
    async fn run_agent_turn(
        &self,
        cli: Cli,
        plan: &TurnPlan,
        route: Route,
        stopped: &mut watch::Receiver<Option<String>>,
    ) -> Result<EventId, CoreError> {
        let host = match self.host() {
            Ok(host) => host,
            Err(e) => {
                return self
                    .core
                    .record_outcome(&plan.request, &unroutable(&e.to_string()));
            }
        };
        let program = match self.options.agents.binary(cli) {
            Ok(program) => program,
            Err(why) => return self.core.record_outcome(&plan.request, &unroutable(&why)),
        };
        let cwd = match self.agent_dir(&host, plan) {
            Ok(cwd) => cwd,
            Err(why) => return self.core.record_outcome(&plan.request, &unroutable(&why)),
        };
        // A first Claude Code turn names its session: the thread's own session id.
        let new_session = (cli == Cli::ClaudeCode && plan.agent_session.is_none())
            .then(|| plan.session_id.clone());
        let mut invocation =
            agent::invocation(cli, plan, &route, &program, &cwd, new_session.as_deref());
        // Noted while it runs, so the next start kills it if this process is killed outright.
        invocation.group_notes = Some(host.data_dir().join(agent::GROUP_NOTES));
        let tap = host.taps().watch(&route.token, plan.provider);
        let limits = &self.options.agents.limits;
        let launched = async {
            match &self.options.agents.launcher {
                None => agent::run(&invocation, cli, limits).await,
                Some(launcher) => {
                    match tokio::time::timeout(limits.time_limit, launcher.launch(&invocation, cli))
                        .await
                    {
                        Ok(ran) => ran,
                        Err(_) => Ok(agent::Run {
                            report: agent::CliReport::default(),
                            status: None,
                            timed_out: true,
                            stderr_tail: String::new(),
                        }),
                    }
                }
            }
        };
        let ran = tokio::select! {
            ran = launched => Ok(ran),
            why = stop_reason(stopped) => Err(why),
        };
        let seen = tap.observation();
        drop(tap);
        let outcome = match ran {
            Ok(Ok(run)) => {
                tracing::info!(thread = %plan.thread, request = %plan.request, agent = %cli.agent(), ok = run.report.ok, requests = seen.requests, timed_out = run.timed_out, "agent turn ended");
                agent::outcome(plan, &run, &seen, new_session.as_deref(), self.now())
            }
            Ok(Err(e)) => unroutable(&format!(
                "the {} agent {} could not be started: {e}",
                cli.agent(),
                program.display()
            )),
            Err(why) => {
                tracing::info!(thread = %plan.thread, request = %plan.request, reason = %why, "agent turn stopped");
                let mut outcome = stopped_outcome(&why);
                outcome.input_in_session = seen.requests > 0;
                outcome.input_accepted = seen.accepted;
                outcome
            }
        };
        self.core
            .record_outcome(&plan.request, &redacted(outcome, &route.token))
    }

    /// The directory an agent runs in: the thread's own, else `DATA_DIR/threads/<id>/`
    /// (created 0700).
    fn agent_dir(&self, host: &Host, plan: &TurnPlan) -> Result<PathBuf, String> {
        if let Some(dir) = &plan.agent.cwd {
            return Ok(PathBuf::from(dir));
        }
        let threads = host.data_dir().join("threads");
        let dir = threads.join(&plan.thread);
        for dir in [&threads, &dir] {
            pooler_core::private_file::create_private_dir(dir)
                .map_err(|e| format!("cannot use the thread's directory {}: {e}", dir.display()))?;
        }
        Ok(dir)
    }
}

/// `outcome` with `token` taken out of its failure message: an agent's error text (the
/// end of its stderr, say) may echo the route token it was given, and the core stores it.
fn redacted(mut outcome: TurnOutcome, token: &str) -> TurnOutcome {
    if let pooler_core::TurnResult::Failed { failure, .. } = &mut outcome.result
        && let Some(message) = failure.message.as_mut()
        && token.len() >= 8
    {
        *message = message.replace(token, "[redacted]");
    }
    outcome
}

/// A running turn's request and the sender that stops it with a reason.
pub(super) type StopHandle = (RequestId, watch::Sender<Option<String>>);

/// Resolves with the reason once the turn is asked to stop.
async fn stop_reason(stopped: &mut watch::Receiver<Option<String>>) -> String {
    let why = stopped
        .wait_for(Option::is_some)
        .await
        .map(|why| why.clone().unwrap_or_default());
    match why {
        Ok(why) => why,
        // The sender lives in the running map until the turn ends.
        Err(_) => std::future::pending().await,
    }
}

/// The outcome of a turn stopped by a person (cancel, archive): a failure of the host's own
/// (`unknown`, origin `transport`), which Provider Retry does not retry.
fn stopped_outcome(why: &str) -> TurnOutcome {
    TurnOutcome::failed(pooler_core::Failure {
        category: pooler_core::FailureCategory::Unknown,
        provider_code: None,
        http_status: None,
        origin: pooler_core::FailureOrigin::Transport,
        retry_after: None,
        message: Some(why.to_string()),
    })
}

/// The outcome of a turn that could not be sent at all.
fn unroutable(why: &str) -> TurnOutcome {
    TurnOutcome::failed(pooler_core::Failure {
        category: pooler_core::FailureCategory::ConnectionFailed,
        provider_code: None,
        http_status: None,
        origin: pooler_core::FailureOrigin::Transport,
        retry_after: None,
        message: Some(why.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_failure_text_never_keeps_the_route_token() {
        let token = "route-token-0123456789";
        let outcome = redacted(
            unroutable(&format!("claude: invalid token {token} (401)")),
            token,
        );
        match outcome.result {
            pooler_core::TurnResult::Failed { failure, .. } => assert_eq!(
                failure.message.as_deref(),
                Some("claude: invalid token [redacted] (401)")
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unroutable_turn_fails_as_a_transport_failure() {
        let outcome = unroutable("no route");
        match outcome.result {
            pooler_core::TurnResult::Failed { failure, .. } => {
                assert_eq!(
                    failure.category,
                    pooler_core::FailureCategory::ConnectionFailed
                );
                assert_eq!(failure.origin, pooler_core::FailureOrigin::Transport);
            }
            other => panic!("{other:?}"),
        }
    }
}
