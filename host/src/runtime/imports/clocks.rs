//! WASI clocks over the one host clock (`pooler_core::clock`). The wall clock and monotonic
//! clock guests read are the host's, so a manual clock in tests moves the guests' time too;
//! and `monotonic-clock.subscribe-*` pollables wake when that clock reaches their instant,
//! not on tokio's timer (wasmtime-wasi's own implementation sleeps on tokio time, so this
//! module replaces its `wasi:clocks/monotonic-clock` in the linker).
//!
//! Random stays wasmtime-wasi's (the OS generator).

use std::time::Duration;

use pooler_core::clock::SharedClock;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock::{
    self, Duration as WasiDuration, Instant,
};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

/// The host clock as WASI's wall clock.
pub struct WallClock(pub SharedClock);

impl HostWallClock for WallClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.now_ms())
    }
}

/// The host clock as WASI's monotonic clock (`now` only; see [`add_to_linker`] for
/// subscriptions).
pub struct MonotonicClock(pub SharedClock);

impl HostMonotonicClock for MonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.0.monotonic_ns()
    }
}

/// What the monotonic-clock `Host` trait is implemented on.
pub struct ClockView<'a> {
    /// The host clock the store reads time from.
    pub clock: &'a SharedClock,
    /// The store's resource table, where subscribed pollables live.
    pub table: &'a mut ResourceTable,
}

struct ClockImport;
impl HasData for ClockImport {
    type Data<'a> = ClockView<'a>;
}

/// Define `wasi:clocks/monotonic-clock` over the host clock. Call after wasmtime-wasi's
/// `add_to_linker_async`, with shadowing allowed on `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> ClockView<'_>,
) -> wasmtime::Result<()> {
    monotonic_clock::add_to_linker::<T, ClockImport>(linker, view)
}

/// A pollable that is ready once the host clock's monotonic time reaches `at`.
struct Deadline {
    clock: SharedClock,
    at: u64,
    /// Whether the one yield owed by a deadline already past at subscription is still due.
    yield_due: bool,
}

#[async_trait::async_trait]
impl Pollable for Deadline {
    async fn ready(&mut self) {
        if self.clock.monotonic_ns() >= self.at {
            // A deadline already past when subscribed yields once, so a guest polling in a
            // loop with a zero timeout cannot starve the runtime (as wasmtime-wasi does).
            // Only once: `pollable.ready` polls this future a single time, so a deadline
            // that yielded on every check would never read as ready, and a guest that
            // checks `ready` after `poll` said so (wstd does) would spin forever.
            if std::mem::take(&mut self.yield_due) {
                tokio::task::yield_now().await;
            }
            return;
        }
        self.clock.sleep_until_monotonic(self.at).await;
    }
}

impl ClockView<'_> {
    fn subscribe_at(&mut self, at: u64) -> wasmtime::Result<Resource<DynPollable>> {
        let yield_due = self.clock.monotonic_ns() >= at;
        let deadline = self.table.push(Deadline {
            clock: self.clock.clone(),
            at,
            yield_due,
        })?;
        subscribe(self.table, deadline)
    }
}

impl monotonic_clock::Host for ClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<Instant> {
        Ok(self.clock.monotonic_ns())
    }

    fn resolution(&mut self) -> wasmtime::Result<Instant> {
        Ok(1)
    }

    fn subscribe_instant(&mut self, when: Instant) -> wasmtime::Result<Resource<DynPollable>> {
        self.subscribe_at(when)
    }

    fn subscribe_duration(
        &mut self,
        duration: WasiDuration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let at = self.clock.monotonic_ns().saturating_add(duration);
        self.subscribe_at(at)
    }
}
