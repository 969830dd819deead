//! `/_pooler/routes…`: a thread's route through the pool, via the pool's `routing` export.
//! Routes are opened at this server's own endpoint (`http://<listen address>`).
//!
//! | method and path                   | body                 | answer |
//! |-----------------------------------|----------------------|--------|
//! | `POST /routes`                    | `{thread, provider}` | 201 `{"route": …}` (holds the token: shown once) |
//! | `GET /routes[?provider=P]`        |                      | `{"routes": [{thread, provider, opened_at}…]}` (no token) |
//! | `GET /routes/{provider}/{thread}` |                      | `{"thread", "provider", "open": bool}` |
//! | `DELETE /routes/{provider}/{thread}` |                   | `{"closed": true, "thread", "provider"}` |
//!
//! A route is `{thread, provider, base_url, token, env: [{name, value}], args, config_lines,
//! opened_at}`. The token is the agent's secret: it is only ever in the answer to `POST`.

use super::{Admin, AdminRequest, ApiError, Reply};
use crate::operate::wire::{ProviderName, RouteSummaryView, RouteView};
use crate::runtime::bindings::pool::exports::pooler::plugins::routing::{
    RoutingError,
};
use crate::runtime::bindings::types::Provider;

/// What the pool's `routing-error` means for a person (shared with `sessions`).
pub(super) fn refused(e: RoutingError, thread: &str, provider: Provider) -> ApiError {
    match e {
        RoutingError::InvalidThread(why) => {
            ApiError::bad_request("invalid-thread", format!("invalid thread id: {why}"))
        }
        RoutingError::InvalidEndpoint(why) => ApiError::internal(
            "invalid-endpoint",
            format!("the pool refused this server's endpoint: {why}"),
        ),
        RoutingError::NoSuchRoute => ApiError::not_found(
            "no-such-route",
            format!(
                "thread `{thread}` has no open {} route",
                ProviderName::from(provider)
            ),
        ),
        RoutingError::InvalidSession(why) => {
            ApiError::bad_request("invalid-session", format!("invalid session: {why}"))
        }
        RoutingError::Storage(why) => ApiError::unavailable(
            "storage",
            format!("the pool's database failed ({why}); try again"),
        ),
    }
}

pub(super) async fn handle(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    match (req.method(), req.rest().as_slice()) {
        ("POST", []) => open(admin, req).await,
        ("GET", []) => list(admin, req).await,
        ("GET", [provider, thread]) => {
            let provider = super::path_provider(provider)?;
            let target = thread.to_string();
            let open = admin
                .pool("routing.has-route", move |store, pool| {
                    Box::pin(async move {
                        pool.pooler_plugins_routing()
                            .call_has_route(store, &target, provider)
                            .await
                    })
                })
                .await?;
            Reply::ok(serde_json::json!({
                "thread": thread,
                "provider": ProviderName::from(provider),
                "open": open,
            }))
        }
        ("DELETE", [provider, thread]) => {
            let provider = super::path_provider(provider)?;
            let target = thread.to_string();
            admin
                .pool("routing.close-route", move |store, pool| {
                    Box::pin(async move {
                        pool.pooler_plugins_routing()
                            .call_close_route(store, &target, provider)
                            .await
                    })
                })
                .await?
                .map_err(|e| refused(e, thread, provider))?;
            Reply::ok(serde_json::json!({
                "closed": true,
                "thread": thread,
                "provider": ProviderName::from(provider),
            }))
        }
        _ => Err(ApiError::no_endpoint(req)),
    }
}

async fn open(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let mut fields = req.fields()?;
    let thread = fields.str("thread")?;
    let provider = fields.provider("provider")?;
    fields.finish()?;
    let endpoint = admin.endpoint().to_owned();
    let target = thread.clone();
    let route = admin
        .pool("routing.open-route", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_open_route(store, &target, provider, &endpoint)
                    .await
            })
        })
        .await?
        .map_err(|e| refused(e, &thread, provider))?;
    Reply::created(serde_json::json!({ "route": RouteView::from(route) }))
}

async fn list(admin: &Admin, req: &AdminRequest) -> Result<Reply, ApiError> {
    let provider = req
        .query("provider")
        .map(super::path_provider)
        .transpose()?;
    let routes = admin
        .pool("routing.list-routes", move |store, pool| {
            Box::pin(async move {
                pool.pooler_plugins_routing()
                    .call_list_routes(store, provider)
                    .await
            })
        })
        .await?
        .map_err(|e| refused(e, "", provider.unwrap_or(Provider::Claude)))?;
    let routes: Vec<RouteSummaryView> = routes.into_iter().map(RouteSummaryView::from).collect();
    Reply::ok(serde_json::json!({ "routes": routes }))
}
