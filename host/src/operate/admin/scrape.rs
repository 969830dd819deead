//! `GET /metrics`: the host's metrics ([`crate::operate::metrics::Registry`]) in the
//! Prometheus text format, for a scraper holding the admin token
//! (`Authorization: Bearer <token>`; 401 otherwise, 405 for another method). Served on the
//! pool's listener, intercepted by the server before the proxy. Besides the registry's
//! counters and histograms it has one gauge computed at scrape time,
//! `pooler_accounts{provider,status}`, from the pool's `accounts.list-accounts` (left out
//! when the pool cannot answer; the scrape still succeeds).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use super::{Admin, ApiError, constant_time_eq, json_response};
use crate::operate::metrics::Gauge;
use crate::operate::wire::{AccountView, ProviderName};

/// Where the metrics are served.
pub const METRICS_PATH: &str = "/metrics";

/// The content type of the text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

const STATUSES: [&str; 6] = [
    "ready",
    "near-limit",
    "exhausted",
    "held",
    "error",
    "disabled",
];

impl Admin {
    /// Answer a request for [`METRICS_PATH`] (its head is all it needs: read before any
    /// await, so the answer's future does not hold the request).
    pub fn metrics<B>(
        &self,
        req: &Request<B>,
    ) -> impl Future<Output = Response<HyperOutgoingBody>> + Send + '_ {
        let presented = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let authorized = constant_time_eq(presented.as_bytes(), self.token.as_bytes());
        let get = req.method() == hyper::Method::GET;
        self.scrape(authorized, get)
    }

    async fn scrape(&self, authorized: bool, get: bool) -> Response<HyperOutgoingBody> {
        if !authorized {
            let e = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "/metrics needs `Authorization: Bearer <token>` with the token from DATA_DIR/admin-token",
            );
            return json_response(e.status, &e.to_json());
        }
        if !get {
            let e = ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "/metrics answers GET only",
            );
            return json_response(e.status, &e.to_json());
        }
        let gauges: Vec<Gauge> = self.accounts_gauge().await.into_iter().collect();
        let text = self.host.metrics().render(&gauges);
        let mut response = Response::new(
            Full::new(Bytes::from(text))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
        response
    }

    /// Accounts by provider and status, every status of every provider (0 included).
    async fn accounts_gauge(&self) -> Option<Gauge> {
        let listed = self
            .pool("accounts.list-accounts", move |store, pool| {
                Box::pin(
                    pool.pooler_plugins_accounts()
                        .call_list_accounts(store, None),
                )
            })
            .await;
        let accounts = match listed {
            Ok(Ok(accounts)) => accounts,
            Ok(Err(e)) => {
                tracing::debug!(error = ?e, "no accounts gauge: the pool refused the list");
                return None;
            }
            Err(e) => {
                tracing::debug!(error = %e.message, "no accounts gauge: the pool did not answer");
                return None;
            }
        };
        let views: Vec<AccountView> = accounts.into_iter().map(AccountView::from).collect();
        let mut series = Vec::new();
        for provider in [ProviderName::Claude, ProviderName::Codex] {
            for status in STATUSES {
                let n = views
                    .iter()
                    .filter(|a| a.provider == provider && a.status.as_str() == status)
                    .count();
                series.push((
                    vec![
                        ("provider".to_owned(), provider.as_str().to_owned()),
                        ("status".to_owned(), status.to_owned()),
                    ],
                    n as f64,
                ));
            }
        }
        Some(Gauge {
            name: "pooler_accounts".to_owned(),
            help: "Accounts of the pool by provider and status, at scrape time.".to_owned(),
            series,
        })
    }
}
