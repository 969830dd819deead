//! `GET /_pooler/timeline?since=MS`: what the status page's quota chart draws. The pool's
//! quota history (`accounts.quota-history`) of every account from `since` on (default: the
//! last 7 days), the accounts' labels, and the threads' waiting periods from the core's
//! turns. A part that cannot be read is a `problems` entry, as in the overview.
//!
//! ```json
//! {"now": 1700000000000, "since": 1699395200000,
//!  "accounts": [{"id": "…", "label": "…", "provider": "claude"}],
//!  "entries": [{"account": "…", "at": 1699990000000, "kind": "window",
//!               "window": {"name": "5h", "family": null, "utilization": 0.42,
//!                          "resets_at": 1700003600000, "status": "allowed"}},
//!              {"account": "…", "at": …, "kind": "hold", "until": …},
//!              {"account": "…", "at": …, "kind": "error"}],
//!  "waits": [{"thread": "th_1", "provider": "claude", "from": …, "until": null}],
//!  "problems": [{"part": "threads", "message": "…"}]}
//! ```
//!
//! A wait runs from a failed turn's end to the start of the thread's next turn; `until` is
//! null while the thread is still waiting.

use serde_json::{Value, json};

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::operate::timeline::waiting_periods;
use crate::operate::wire::AccountView;
use crate::runtime::bindings::pool::exports::pooler::plugins::accounts::{QuotaEntry, QuotaEvent};

/// The default span: a week's chart.
pub const DEFAULT_SPAN_MS: u64 = 7 * 24 * 3_600_000;

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => {
            let now = admin.host().clock().now_ms();
            let since = match req.query("since") {
                None => now.saturating_sub(DEFAULT_SPAN_MS),
                Some(text) => text.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(
                        "invalid-input",
                        "`since` must be a time in unix epoch milliseconds",
                    )
                })?,
            };
            Reply::ok(timeline(admin, now, since).await)
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

fn entry_json(e: QuotaEntry) -> Value {
    let mut v = json!({"account": e.account, "at": e.at});
    match e.event {
        QuotaEvent::Window(w) => {
            v["kind"] = "window".into();
            v["window"] = json!({
                "name": w.name,
                "family": w.family,
                "utilization": w.utilization,
                "resets_at": w.resets_at,
                "status": w.status,
            });
        }
        QuotaEvent::Hold(until) => {
            v["kind"] = "hold".into();
            v["until"] = until.into();
        }
        QuotaEvent::Error => v["kind"] = "error".into(),
    }
    v
}

async fn timeline(admin: &Admin, now: u64, since: u64) -> Value {
    let mut problems = Vec::new();
    let accounts: Vec<Value> = match admin
        .pool("accounts.list-accounts", move |store, pool| {
            Box::pin(pool.pooler_plugins_accounts().call_list_accounts(store, None))
        })
        .await
        .and_then(|answer| answer.map_err(super::accounts::refused))
    {
        Ok(list) => list
            .into_iter()
            .map(AccountView::from)
            .map(|a| json!({"id": a.id, "label": a.label, "provider": a.provider}))
            .collect(),
        Err(e) => {
            problems.push(json!({"part": "accounts", "message": e.message}));
            Vec::new()
        }
    };
    let entries: Vec<Value> = match admin
        .pool("accounts.quota-history", move |store, pool| {
            Box::pin(
                pool.pooler_plugins_accounts()
                    .call_quota_history(store, None, since),
            )
        })
        .await
        .and_then(|answer| answer.map_err(super::accounts::refused))
    {
        Ok(list) => list.into_iter().map(entry_json).collect(),
        Err(e) => {
            problems.push(json!({"part": "history", "message": e.message}));
            Vec::new()
        }
    };
    let mut waits = Vec::new();
    if let Some(link) = admin.core() {
        let core = link.core();
        match core.list_threads() {
            Ok(threads) => {
                for view in threads.into_iter().filter(|t| !t.info.archived) {
                    let provider = view.info.provider;
                    match core.show(&view.info.id) {
                        Ok(show) => {
                            for (from, until) in waiting_periods(&show.turns, since) {
                                waits.push(json!({
                                    "thread": view.info.id,
                                    "provider": provider,
                                    "from": from,
                                    "until": until,
                                }));
                            }
                        }
                        Err(e) => problems.push(json!({"part": "threads", "message": e.to_string()})),
                    }
                }
            }
            Err(e) => problems.push(json!({"part": "threads", "message": e.to_string()})),
        }
    }
    json!({
        "now": now,
        "since": since,
        "accounts": accounts,
        "entries": entries,
        "waits": waits,
        "problems": problems,
    })
}
