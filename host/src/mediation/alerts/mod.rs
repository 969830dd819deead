//! Alerts: telling a person when the pool needs them, instead of waiting for them to look.
//! This module owns the episodes ([`model`]), the delivery shapes ([`format`](mod@format)), the
//! delivery task (below) and the watcher that finds the conditions through the WIT
//! (`watch`: the pool's account list, Provider Retry's open candidates, the core's
//! threads, the pool's serving notices).
//!
//! Nothing on a request path waits for an alert: conditions are found by the watcher's own
//! task, an alert is queued in memory, and one task delivers each coalescing window's
//! alerts (the webhook through the host's outbound client and an allow-list, then the
//! command), retrying with backoff on the host clock.

pub mod format;
pub mod model;
pub(crate) mod watch;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pooler_core::clock::SharedClock;
use tokio::sync::{Notify, watch as tokio_watch};

use crate::config::AlertsConfig;
use crate::runtime::imports::http_out::allow::AllowList;
use crate::runtime::imports::http_out::client::OutgoingClient;
use format::Delivery;
use model::{Alert, AlertKind, AlertState, Episodes};

/// Attempts per delivery channel before a window's alerts are given up (logged).
const ATTEMPTS: u32 = 5;
/// The first pause between attempts; it doubles.
const FIRST_BACKOFF_MS: u64 = 1_000;
/// How long a webhook may take to answer (real time: it is a network wait).
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// The alerts of one host.
pub struct Alerts {
    config: AlertsConfig,
    clock: SharedClock,
    metrics: Arc<crate::operate::metrics::Registry>,
    client: OutgoingClient,
    allow: AllowList,
    pub(crate) episodes: Mutex<Episodes>,
    pub(crate) threads: Mutex<watch::Tracked>,
    queue: Mutex<Vec<Alert>>,
    wake: Notify,
    /// A look at the accounts and threads is wanted (an availability change was delivered).
    pub(crate) look: Notify,
    /// Held for a whole look: two at once could apply an older reading after a newer one
    /// and announce an episode again that had just ended.
    pub(crate) looking: tokio::sync::Mutex<()>,
    /// Deliveries finished (sent or given up), for tests and `alerts test`.
    finished: tokio_watch::Sender<u64>,
    /// Alerts queued and not yet finished.
    outstanding: tokio_watch::Sender<usize>,
}

/// What one delivery channel did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// `webhook` or `command`.
    pub via: &'static str,
    /// Whether the delivery went through.
    pub ok: bool,
    /// The HTTP status or exit status, or why it failed; never the URL (it may be secret).
    pub detail: String,
    /// How many tries were made; 0 when the channel could not be tried at all.
    pub attempts: u32,
}

impl Alerts {
    /// Alerts as `config` sets them: webhooks go out through `client`, only to the hosts
    /// [`AlertsConfig::allowed_hosts`] names; counts go to `metrics`.
    pub fn new(
        config: AlertsConfig,
        clock: SharedClock,
        metrics: Arc<crate::operate::metrics::Registry>,
        client: OutgoingClient,
    ) -> Self {
        let allow = AllowList::new(&config.allowed_hosts());
        Alerts {
            config,
            clock,
            metrics,
            client,
            allow,
            episodes: Mutex::default(),
            threads: Mutex::default(),
            queue: Mutex::default(),
            wake: Notify::new(),
            look: Notify::new(),
            looking: tokio::sync::Mutex::new(()),
            finished: tokio_watch::Sender::new(0),
            outstanding: tokio_watch::Sender::new(0),
        }
    }

    /// The `[alerts]` configuration the alerts were built with.
    pub fn config(&self) -> &AlertsConfig {
        &self.config
    }

    /// Announce `alerts`: the log and `/metrics` at once, the webhook and command through
    /// the delivery queue. Never waits.
    pub fn emit(&self, alerts: Vec<Alert>) {
        if alerts.is_empty() {
            return;
        }
        for alert in &alerts {
            let c = &alert.condition;
            let state = match alert.state {
                AlertState::Firing => "firing",
                AlertState::Resolved => "resolved",
            };
            match alert.state {
                AlertState::Firing => tracing::warn!(
                    kind = c.kind.name(), state, subject = %c.subject,
                    provider = c.provider.as_deref(), account = c.account.as_deref(),
                    thread = c.thread.as_deref(), until = c.until, reason = c.reason.as_deref(),
                    "alert: {}", alert.line()
                ),
                AlertState::Resolved => tracing::info!(
                    kind = c.kind.name(), state, subject = %c.subject,
                    provider = c.provider.as_deref(), account = c.account.as_deref(),
                    thread = c.thread.as_deref(), since = alert.since,
                    "alert: {}", alert.line()
                ),
            }
            if alert.state == AlertState::Firing {
                let _ = self.metrics.counter_add(
                    "pooler_alerts_total",
                    "Alerts raised (episodes started), by kind.",
                    &[("kind", c.kind.name())],
                    1,
                );
            }
        }
        if !self.config.delivers() {
            return;
        }
        let count = alerts.len();
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(alerts);
        self.outstanding.send_modify(|n| *n += count);
        self.wake.notify_one();
    }

    /// Resolves once every alert queued so far was delivered or given up.
    pub async fn settled(&self) {
        let mut rx = self.outstanding.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// The open episodes.
    pub fn open(&self) -> Vec<Alert> {
        self.episodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open_alerts()
    }

    /// Send a test alert through every channel at once (no coalescing, one attempt each),
    /// answering what each did.
    pub async fn test(&self) -> Vec<Outcome> {
        let mut condition = model::Condition::new(AlertKind::Test, "test");
        condition.reason = Some("sent by `pooler alerts test`".into());
        let now = self.clock.now_ms();
        let alert = Alert {
            condition,
            state: AlertState::Firing,
            at: now,
            since: now,
        };
        self.emit_log_only(&alert);
        let delivery = Delivery {
            alerts: vec![alert],
            sent_at: now,
        };
        self.send(&delivery, 1).await
    }

    fn emit_log_only(&self, alert: &Alert) {
        tracing::info!(
            kind = alert.condition.kind.name(),
            "alert: {}",
            alert.line()
        );
        let _ = self.metrics.counter_add(
            "pooler_alerts_total",
            "Alerts raised (episodes started), by kind.",
            &[("kind", alert.condition.kind.name())],
            1,
        );
    }

    /// Deliver through each configured channel, up to `attempts` times each.
    async fn send(&self, delivery: &Delivery, attempts: u32) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        if let Some(url) = &self.config.webhook {
            // A refusal by the allow-list is lasting: no attempt, no retry.
            let outcome = match self.allowed(url) {
                Ok(uri) => {
                    self.with_retries("webhook", attempts, || self.post(uri.clone(), delivery))
                        .await
                }
                Err(detail) => Outcome {
                    via: "webhook",
                    ok: false,
                    detail,
                    attempts: 0,
                },
            };
            outcomes.push(outcome);
        }
        if let Some(template) = &self.config.command {
            outcomes.push(
                self.with_retries("command", attempts, || self.run(template, delivery))
                    .await,
            );
        }
        for o in &outcomes {
            let outcome = if o.ok { "sent" } else { "failed" };
            let _ = self.metrics.counter_add(
                "pooler_alert_deliveries_total",
                "Alert deliveries (one per coalescing window and channel), by channel and outcome.",
                &[("via", o.via), ("outcome", outcome)],
                1,
            );
            if o.ok {
                tracing::debug!(via = o.via, attempts = o.attempts, "alerts delivered");
            } else {
                tracing::warn!(via = o.via, attempts = o.attempts, detail = %o.detail, "alerts not delivered; given up");
            }
        }
        outcomes
    }

    async fn with_retries<F, Fut>(&self, via: &'static str, attempts: u32, f: F) -> Outcome
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<String, String>>,
    {
        let mut backoff = FIRST_BACKOFF_MS;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match f().await {
                Ok(detail) => {
                    return Outcome {
                        via,
                        ok: true,
                        detail,
                        attempts: attempt,
                    };
                }
                Err(detail) if attempt >= attempts => {
                    return Outcome {
                        via,
                        ok: false,
                        detail,
                        attempts: attempt,
                    };
                }
                Err(detail) => {
                    tracing::info!(via, attempt, %detail, retry_in_ms = backoff, "alert delivery failed; will retry");
                    let at = self.clock.now_ms().saturating_add(backoff);
                    self.clock.sleep_until(at).await;
                    backoff = backoff.saturating_mul(2);
                }
            }
        }
    }

    /// The webhook's URL, if the allow-list lets it be sent to.
    fn allowed(&self, url: &str) -> Result<hyper::Uri, String> {
        let uri: hyper::Uri = url
            .trim()
            .parse()
            .map_err(|_| "the webhook is not a URL".to_string())?;
        self.allow
            .check(&uri)
            .map_err(|rule| format!("the webhook is refused: {rule} ([alerts] allowed-hosts)"))?;
        Ok(uri)
    }

    /// POST the delivery to the webhook (already checked by [`Self::allowed`]). `Ok` with
    /// the status for a 2xx answer.
    async fn post(&self, uri: hyper::Uri, delivery: &Delivery) -> Result<String, String> {
        let (body, headers) = delivery.webhook(self.config.format);
        let mut request = hyper::Request::post(uri);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .header("user-agent", concat!("pooler/", env!("CARGO_PKG_VERSION")))
            .body(Bytes::from(body))
            .map_err(|e| format!("cannot build the webhook request: {e}"))?;
        let status = tokio::time::timeout(WEBHOOK_TIMEOUT, self.client.send_bytes(request))
            .await
            .map_err(|_| format!("no answer within {} s", WEBHOOK_TIMEOUT.as_secs()))?
            // A transport error's text names the host at most, never the path.
            .map_err(|e| format!("not sent: {e}"))?;
        if (200..300).contains(&status) {
            Ok(format!("HTTP {status}"))
        } else {
            Err(format!("HTTP {status}"))
        }
    }

    /// Run the command with the delivery's arguments and environment, no shell, no stdin,
    /// within the time limit.
    async fn run(&self, template: &[String], delivery: &Delivery) -> Result<String, String> {
        let argv = delivery.argv(template);
        let Some((program, args)) = argv.split_first() else {
            return Err("no program".into());
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(delivery.env())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run `{program}`: {e}"))?;
        let limit = Duration::from_secs(self.config.command_timeout_s);
        match tokio::time::timeout(limit, child.wait_with_output()).await {
            Err(_) => Err(format!(
                "`{program}` ran past {} s and was killed",
                limit.as_secs()
            )),
            Ok(Err(e)) => Err(format!("`{program}` failed: {e}")),
            Ok(Ok(out)) if out.status.success() => Ok(out.status.to_string()),
            // Not its words: a notifier may quote the service URL (and its token) it failed
            // on, which the command line holds.
            Ok(Ok(out)) => Err(format!("`{program}` {}", out.status)),
        }
    }

    /// The delivery task: gathers a window's alerts, then sends them; runs until `stop`.
    pub(crate) async fn run_deliveries(self: Arc<Self>, stop: tokio_watch::Receiver<bool>) {
        let mut stop = stop;
        loop {
            // Wait for a first alert.
            loop {
                if *stop.borrow() {
                    return;
                }
                if !self
                    .queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty()
                {
                    break;
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = stop.changed() => {}
                }
            }
            if self.config.coalesce_s > 0 {
                let at = self
                    .clock
                    .now_ms()
                    .saturating_add(self.config.coalesce_s.saturating_mul(1000));
                tokio::select! {
                    _ = self.clock.sleep_until(at) => {}
                    _ = stop.changed() => return,
                }
            }
            let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
            let count = batch.len();
            let alerts = model::coalesce(batch);
            if !alerts.is_empty() {
                let delivery = Delivery {
                    alerts,
                    sent_at: self.clock.now_ms(),
                };
                tokio::select! {
                    _ = self.send(&delivery, ATTEMPTS) => {}
                    _ = stop.changed() => return,
                }
            }
            self.outstanding
                .send_modify(|n| *n = n.saturating_sub(count));
            self.finished.send_modify(|n| *n += 1);
        }
    }
}
