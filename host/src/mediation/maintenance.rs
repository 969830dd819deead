//! The host-driven maintenance calls: the pool's `maintenance.on-start(now)` once before the
//! server serves, and `maintenance.on-tick(now)` at start-up and then every
//! `maintenance.interval-s`, timed by the host clock (so a manual clock drives it in tests).
//! [`Host`]'s maintenance methods delegate here.

use std::time::Duration;

use crate::runtime::bindings::types::PluginError;
use crate::runtime::roles::Role;
use crate::runtime::{CallError, Host};

/// [`Host::run_maintenance`]: the pool's tick now and then every `interval`, until the
/// future is dropped.
pub(crate) async fn run(host: Host, interval: Duration) {
    if !host.has_role(Role::AccountPool) || interval.is_zero() {
        return;
    }
    let step = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    loop {
        let now = host.clock().now_ms();
        match host.maintenance_tick(now).await {
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
        host.clock().sleep_until(next).await;
    }
}

/// [`Host::start_pool`]: the pool's `maintenance.on-start`, once, a failure logged.
pub(crate) async fn start(host: &Host) {
    if !host.has_role(Role::AccountPool) {
        return;
    }
    let now = host.clock().now_ms();
    match host.maintenance_start(now).await {
        Ok(Ok(())) => {}
        // Already logged with the plugin id by the call.
        Err(_) => {}
        Ok(Err(e)) => {
            tracing::warn!(plugin = Role::AccountPool.name(), error = ?e, "maintenance start failed")
        }
    }
}

/// [`Host::maintenance_start`]: the pool's `maintenance.on-start(now)`.
pub(crate) async fn on_start(host: &Host, now: u64) -> Result<Result<(), PluginError>, CallError> {
    host.call_pool("maintenance.on-start", move |store, pool| {
        Box::pin(pool.pooler_plugins_maintenance().call_on_start(store, now))
    })
    .await
}

/// [`Host::maintenance_tick`]: the pool's `maintenance.on-tick(now)`.
pub(crate) async fn on_tick(host: &Host, now: u64) -> Result<Result<(), PluginError>, CallError> {
    host.call_pool("maintenance.on-tick", move |store, pool| {
        Box::pin(pool.pooler_plugins_maintenance().call_on_tick(store, now))
    })
    .await
}
