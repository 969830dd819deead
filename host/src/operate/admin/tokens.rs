//! `/_pooler/tokens`: the token usage of served answers (the pool's `tokens.totals`), for
//! `--json` readers and scripts; `pooler status`, the page and `pooler thread show` get
//! theirs through the overview and the thread's view.
//!
//! | method and path | query | answer |
//! |---|---|---|
//! | `GET /tokens` | `since` (epoch ms, default 0), `thread`, `by` (`account` default, or `thread`) | `{"totals": [total…]}` |

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::operate::wire::TokenTotalView;
use crate::runtime::bindings::pool::exports::pooler::plugins::tokens::{
    TokenGrouping, TokensError,
};

/// Five hours: the window `pooler status` shows beside today.
pub const FIVE_HOURS_MS: u64 = 5 * 3_600_000;

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("GET", []) => {
            let since = match req.query("since") {
                None => 0,
                Some(s) => s.parse().map_err(|_| {
                    ApiError::bad_request(
                        "invalid-since",
                        "since must be a time in epoch milliseconds",
                    )
                })?,
            };
            let by_thread = match req.query("by") {
                None | Some("account") => false,
                Some("thread") => true,
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "invalid-by",
                        "by must be account or thread",
                    ));
                }
            };
            let thread = req.query("thread").map(str::to_owned);
            let totals = totals(admin, since, thread, by_thread).await?;
            Reply::ok(serde_json::json!({ "totals": totals }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

/// The pool's `tokens.totals`, as views.
pub(crate) async fn totals(
    admin: &Admin,
    since: u64,
    thread: Option<String>,
    by_thread: bool,
) -> Result<Vec<TokenTotalView>, ApiError> {
    let grouping = if by_thread {
        TokenGrouping::ByThread
    } else {
        TokenGrouping::ByAccount
    };
    let answer = admin
        .pool("tokens.totals", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_tokens()
                    .call_totals(store, since, thread.as_ref(), grouping)
                    .await
            })
        })
        .await?;
    match answer {
        Ok(rows) => Ok(rows.into_iter().map(TokenTotalView::from).collect()),
        Err(TokensError::InvalidThread(m)) => Err(ApiError::bad_request("invalid-thread", m)),
        Err(TokensError::Storage(m)) => Err(ApiError::new(
            hyper::StatusCode::SERVICE_UNAVAILABLE,
            "storage",
            format!("the pool's database failed: {m}; try again"),
        )),
    }
}
