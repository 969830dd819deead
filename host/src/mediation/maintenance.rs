//! The host-driven maintenance calls: the pool's `maintenance.on-start(now)` once before the
//! server serves, and `maintenance.on-tick(now)` at start-up and then every
//! `maintenance.interval-s`, timed by the host clock (so a manual clock drives it in tests).

use std::time::Duration;

use crate::runtime::bindings::types::PluginError;
use crate::runtime::roles::Role;
use crate::runtime::{CallError, Host};

impl Host {
    /// Call the pool's maintenance tick now and then every `interval`, until the returned
    /// future is dropped. Does nothing without a pool or with a zero interval.
    pub async fn run_maintenance(self, interval: Duration) {
        if !self.has_role(Role::AccountPool) || interval.is_zero() {
            return;
        }
        let step = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        loop {
            let now = self.clock().now_ms();
            match self.maintenance_tick(now).await {
                Ok(Ok(())) => tracing::debug!(
                    plugin = Role::AccountPool.name(),
                    now,
                    "maintenance tick done"
                ),
                // Already logged with the plugin id by the call.
                Err(_) => {}
                Ok(Err(e)) => {
                    tracing::warn!(plugin = Role::AccountPool.name(), error = ?e, "maintenance tick failed")
                }
            }
            let next = now.saturating_add(step);
            self.clock().sleep_until(next).await;
        }
    }

    /// Tell the pool the host started (`maintenance.on-start`), once, before serving: it
    /// drops what calls of a host that stopped held. A failure is logged and the host
    /// serves anyway (the pool only loses that cleanup). Nothing without a pool.
    pub async fn start_pool(&self) {
        if !self.has_role(Role::AccountPool) {
            return;
        }
        let now = self.clock().now_ms();
        match self.maintenance_start(now).await {
            Ok(Ok(())) => {}
            // Already logged with the plugin id by the call.
            Err(_) => {}
            Ok(Err(e)) => {
                tracing::warn!(plugin = Role::AccountPool.name(), error = ?e, "maintenance start failed")
            }
        }
    }

    /// The pool's `maintenance.on-start(now)`: once per start, before the server serves.
    pub async fn maintenance_start(&self, now: u64) -> Result<Result<(), PluginError>, CallError> {
        self.call_pool("maintenance.on-start", move |store, pool| {
            Box::pin(pool.pooler_plugins_maintenance().call_on_start(store, now))
        })
        .await
    }

    /// The pool's `maintenance.on-tick(now)`.
    pub async fn maintenance_tick(&self, now: u64) -> Result<Result<(), PluginError>, CallError> {
        self.call_pool("maintenance.on-tick", move |store, pool| {
            Box::pin(pool.pooler_plugins_maintenance().call_on_tick(store, now))
        })
        .await
    }
}
