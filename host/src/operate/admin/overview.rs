//! `GET /_pooler/overview`: the pool at a glance ([`crate::operate::wire::overview::Overview`]), for
//! `pooler status` and the status page. One call gathers the pool's accounts
//! (`accounts.list-accounts`), the core's threads and live rows, Provider Retry's open
//! candidates (`retry-admin.status`) and the pool's availability answer for each thread
//! (`availability.query-many`, asked as the `admin` caller), the pins per account
//! (`routing.list-sessions`), each provider's routing strategy (`settings.list-settings`)
//! and each account's token usage today and in the last five hours (`tokens.totals`, "today"
//! from the local midnight of `?utc_offset_s=`, seconds east of UTC). A part that cannot be read is a
//! `problems` entry with its message, never a failed answer: in an incident the rest of the
//! screen is what a person needs.

use std::collections::BTreeMap;

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::operate::wire::overview::{Overview, Problem, RowOverview, ThreadOverview, summarize};
use crate::operate::wire::{AccountTokensView, AccountView, CandidateView, ProviderName};
use crate::runtime::bindings::retry::pooler::plugins::availability::AvailabilityQuery;
use crate::runtime::bindings::types::Provider;

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => {
            let offset = match req.query("utc_offset_s") {
                None => 0,
                Some(s) => s
                    .parse::<i32>()
                    .ok()
                    .filter(|o| o.abs() <= 14 * 3600)
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid-utc-offset",
                            "utc_offset_s must be seconds east of UTC, within ±14 hours",
                        )
                    })?,
            };
            Reply::ok(overview(admin, offset).await)
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

fn problem(part: &str, message: impl Into<String>) -> Problem {
    Problem {
        part: part.to_owned(),
        message: message.into(),
    }
}

/// Gather the snapshot (see the module docs).
pub(super) async fn overview(admin: &Admin, utc_offset_s: i32) -> Overview {
    let now = admin.host().clock().now_ms();
    let mut problems = Vec::new();

    let accounts: Vec<AccountView> = match admin
        .pool("accounts.list-accounts", move |store, pool| {
            Box::pin(pool.pooler_plugins_accounts().call_list_accounts(store, None))
        })
        .await
        .and_then(|answer| answer.map_err(super::accounts::refused))
    {
        Ok(accounts) => accounts.into_iter().map(AccountView::from).collect(),
        Err(e) => {
            problems.push(problem("accounts", e.message));
            Vec::new()
        }
    };
    let mut pinned_sessions = BTreeMap::new();
    match admin
        .pool("routing.list-sessions", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_list_sessions(store, None, None)
                    .await
            })
        })
        .await
        .and_then(|answer| answer.map_err(|e| super::routes::refused(e, "", Provider::Claude)))
    {
        Ok(sessions) => {
            for s in sessions.into_iter().filter(|s| !s.provisional) {
                *pinned_sessions.entry(s.account).or_insert(0) += 1;
            }
        }
        Err(e) => problems.push(problem("sessions", e.message)),
    }
    let today = crate::operate::wire::overview::day_start(now, utc_offset_s);
    let mut tokens: BTreeMap<String, AccountTokensView> = BTreeMap::new();
    let five_hours_ago = now.saturating_sub(super::tokens::FIVE_HOURS_MS);
    for (since, last_5h) in [(today, false), (five_hours_ago, true)] {
        match super::tokens::totals(admin, since, None, false).await {
            Ok(totals) => {
                for t in totals {
                    let entry = tokens.entry(t.account).or_default();
                    *(if last_5h {
                        &mut entry.last_5h
                    } else {
                        &mut entry.today
                    }) = t.counts;
                }
            }
            Err(e) => {
                problems.push(problem("tokens", e.message));
                break;
            }
        }
    }
    // The routing strategy per provider: a settings read that fails costs only that word.
    let settings = admin
        .pool("settings.list-settings", |store, pool| {
            Box::pin(pool.pooler_plugins_settings().call_list_settings(store))
        })
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let providers = [ProviderName::Claude, ProviderName::Codex]
        .into_iter()
        .map(|p| {
            let key = format!("{}-strategy", p.as_str());
            let mut summary = summarize(p, &accounts);
            summary.strategy = settings
                .iter()
                .find(|s| s.key == key)
                .map(|s| s.value.clone());
            summary
        })
        .collect();

    let candidates: Vec<CandidateView> = match admin
        .retry("retry-admin.status", move |store, retry| {
            Box::pin(async move {
                retry
                    .pooler_plugins_retry_admin()
                    .call_status(store, None)
                    .await
            })
        })
        .await
        .and_then(|answer| answer.map_err(super::retry::refused))
    {
        Ok(candidates) => candidates
            .into_iter()
            .map(super::convert::candidate_view)
            .collect(),
        Err(e) => {
            problems.push(problem("retries", e.message));
            Vec::new()
        }
    };

    let mut threads = Vec::new();
    match admin.core() {
        None => problems.push(problem(
            "threads",
            "this host runs without a core: no threads",
        )),
        Some(link) => {
            let core = link.core();
            match (core.list_threads(), core.list_rows(None)) {
                (Ok(list), Ok(rows)) => {
                    for view in list.into_iter().filter(|t| !t.info.archived) {
                        let id = view.info.id.clone();
                        let row = rows.iter().find(|r| r.thread == id).map(|r| RowOverview {
                            id: r.id,
                            send_at: r.send_at,
                            attempt: r.attempt,
                            reason: r.reason.clone(),
                            waiting_for_slot: r.waiting_for_slot,
                        });
                        threads.push((
                            view.info.latest_request.clone(),
                            ThreadOverview {
                                retry: candidates.iter().find(|c| c.thread == id).cloned(),
                                id,
                                provider: view.info.provider,
                                model: view.info.model.clone(),
                                agent: view.agent.as_str().to_owned(),
                                status: view.info.status.as_str().to_owned(),
                                retry_opt_out: view.info.retry_opt_out,
                                input_queued: view.info.input_queued,
                                created_at: view.created_at,
                                availability: None,
                                row,
                            },
                        ));
                    }
                }
                (Err(e), _) => problems.push(problem("threads", e.to_string())),
                (_, Err(e)) => problems.push(problem("threads", e.to_string())),
            }
        }
    }

    // The pool's own answer per thread, in one call.
    if !threads.is_empty() {
        let queries = threads
            .iter()
            .map(|(request, t)| AvailabilityQuery {
                thread: t.id.clone(),
                provider: t.provider.into(),
                request: request.clone(),
                model: t.model.clone(),
            })
            .collect();
        let answers = admin
            .host()
            .query_availability_many("admin", queries)
            .await;
        for ((_, thread), answer) in threads.iter_mut().zip(answers) {
            thread.availability = Some(super::convert::availability_view(answer));
        }
    }

    Overview {
        now,
        providers,
        accounts,
        threads: threads.into_iter().map(|(_, t)| t).collect(),
        pinned_sessions,
        tokens,
        tokens_today_since: today,
        problems,
    }
}
