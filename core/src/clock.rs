//! The one host clock. Real in production, manual in tests; the host also exposes it to
//! guests as the WASI wall and monotonic clocks, so every time-dependent behaviour of host
//! and plugins can be tested without sleeping.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A boxed future, as returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The host clock.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time: unix epoch milliseconds.
    fn now_ms(&self) -> u64;
    /// Monotonic time in nanoseconds since an arbitrary fixed origin. Never goes back.
    fn monotonic_ns(&self) -> u64;
    /// Resolves once `now_ms() >= deadline_ms`.
    fn sleep_until(&self, deadline_ms: u64) -> Sleep;
    /// Resolves once `monotonic_ns() >= deadline_ns`.
    fn sleep_until_monotonic(&self, deadline_ns: u64) -> Sleep;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock: system time and tokio timers.
#[derive(Debug)]
pub struct SystemClock {
    origin: std::time::Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
    fn monotonic_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
    fn sleep_until_monotonic(&self, deadline_ns: u64) -> Sleep {
        let wait = deadline_ns.saturating_sub(self.monotonic_ns());
        Box::pin(tokio::time::sleep(Duration::from_nanos(wait)))
    }
}

/// A clock that moves only when told to. Sleepers wake when [`ManualClock::advance`] or
/// [`ManualClock::set`] moves time past their deadline.
#[derive(Debug)]
pub struct ManualClock {
    /// (wall ms, monotonic ns); monotonic starts at 0 and moves with every advance.
    tx: watch::Sender<(u64, u64)>,
}

impl ManualClock {
    /// A manual clock that reads `start_ms` (unix epoch milliseconds).
    pub fn new(start_ms: u64) -> Arc<Self> {
        let (tx, _rx) = watch::channel((start_ms, 0));
        Arc::new(ManualClock { tx })
    }

    /// Move time forward by `by`, waking every sleeper whose deadline has passed.
    pub fn advance(&self, by: Duration) {
        let ms = by.as_millis() as u64;
        self.tx.send_modify(|(wall, mono)| {
            *wall += ms;
            *mono += ms * 1_000_000;
        });
    }

    /// Move time forward to `at_ms` (no-op if that is not in the future).
    pub fn set(&self, at_ms: u64) {
        let now = self.now_ms();
        if at_ms > now {
            self.advance(Duration::from_millis(at_ms - now));
        }
    }

    fn wait_for(&self, reached: impl Fn((u64, u64)) -> bool + Send + Sync + 'static) -> Sleep {
        let mut rx = self.tx.subscribe();
        Box::pin(async move {
            // `wait_for` returns an error only when the sender is dropped, i.e. the clock is
            // gone; then nothing will ever wake us, and the sleeper is dropped with the host.
            if rx.wait_for(|v| reached(*v)).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.tx.borrow().0
    }
    fn monotonic_ns(&self) -> u64 {
        self.tx.borrow().1
    }
    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        self.wait_for(move |(wall, _)| wall >= deadline_ms)
    }
    fn sleep_until_monotonic(&self, deadline_ns: u64) -> Sleep {
        self.wait_for(move |(_, mono)| mono >= deadline_ns)
    }
}

/// The clock of a tokio runtime whose time is paused (a `start_paused` current-thread
/// runtime): it reads and sleeps on tokio's clock, which such a runtime moves by itself to
/// the next timer whenever every task is idle. This is the week simulator's clock: virtual
/// time goes from one event to the next (a request, a host timer, a window reset) and never
/// waits for real. On a runtime whose time is not paused it is a real clock starting at
/// `start_ms`.
#[derive(Debug)]
pub struct TokioClock {
    start_ms: u64,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `start_ms` (unix epoch milliseconds) now. Must be created inside
    /// the runtime whose clock it follows.
    pub fn new(start_ms: u64) -> Arc<Self> {
        Arc::new(TokioClock {
            start_ms,
            origin: tokio::time::Instant::now(),
        })
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.start_ms + self.origin.elapsed().as_millis() as u64
    }
    fn monotonic_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let after = Duration::from_millis(deadline_ms.saturating_sub(self.start_ms));
        Box::pin(tokio::time::sleep_until(self.origin + after))
    }
    fn sleep_until_monotonic(&self, deadline_ns: u64) -> Sleep {
        Box::pin(tokio::time::sleep_until(
            self.origin + Duration::from_nanos(deadline_ns),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_sleepers_wake_only_when_time_passes_their_deadline() {
        let clock = ManualClock::new(1_000);
        let early = tokio::spawn(clock.sleep_until(1_500));
        let late = tokio::spawn(clock.sleep_until_monotonic(2_000 * 1_000_000));
        tokio::task::yield_now().await;
        assert!(!early.is_finished());
        clock.advance(Duration::from_millis(600));
        early.await.unwrap();
        assert_eq!(clock.now_ms(), 1_600);
        assert!(!late.is_finished());
        clock.set(3_100);
        late.await.unwrap();
        assert_eq!(clock.monotonic_ns(), 2_100 * 1_000_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_on_paused_time_jumps_to_the_next_timer_when_idle() {
        let clock = TokioClock::new(1_000_000);
        let real = std::time::Instant::now();
        clock.sleep_until(1_000_000 + 7 * 24 * 3_600_000).await;
        assert_eq!(clock.now_ms(), 1_000_000 + 7 * 24 * 3_600_000);
        assert!(real.elapsed() < Duration::from_secs(5), "virtual, not real");
        // A deadline before the clock's start is already due.
        clock.sleep_until(5).await;
        clock
            .sleep_until_monotonic(clock.monotonic_ns() + 1_000_000_000)
            .await;
        assert_eq!(clock.now_ms(), 1_000_000 + 7 * 24 * 3_600_000 + 1_000);
    }

    #[tokio::test]
    async fn a_deadline_already_passed_resolves_at_once() {
        let clock = ManualClock::new(5_000);
        clock.sleep_until(10).await;
        clock.set(1); // going back is ignored
        assert_eq!(clock.now_ms(), 5_000);
    }
}
