//! The link's loops (due, outbox, tick) and the one `watch` value ([`Activity`]) that wakes
//! them and tells when the link is idle; see the module docs of [`super`] for what each loop
//! does. A pass's work is in [`super::dispatch`] and [`super::outbox`].

use std::sync::Arc;

use pooler_core::Timestamp;
use tokio::sync::watch;

use super::{Inner, SUBSCRIBER};
use crate::runtime::roles::Role;

/// What the loops are doing; also their wake-up channel.
#[derive(Debug, Clone, Default)]
pub(crate) struct Activity {
    /// The host's listener is known (turns can be sent).
    pub(super) listening: bool,
    /// `on-start` was called and the first due check may run.
    pub(super) started: bool,
    pub(super) due_dirty: bool,
    pub(super) due_busy: bool,
    /// When the due loop wakes by itself (the earliest future send time).
    pub(super) due_next: Option<Timestamp>,
    pub(super) outbox_dirty: bool,
    pub(super) outbox_busy: bool,
    /// When the outbox loop wakes by itself (the next redelivery).
    pub(super) outbox_next: Option<Timestamp>,
    pub(super) tick_busy: bool,
    /// When the next `on-tick` is due.
    pub(super) tick_next: Option<Timestamp>,
    pub(super) prune_busy: bool,
    /// When the next prune tick is due.
    pub(super) prune_next: Option<Timestamp>,
    /// Turn tasks running in this process.
    pub(super) turns: usize,
    /// Loop tasks still running (they end after `closed`).
    pub(super) loops: usize,
    pub(super) closed: bool,
}

impl Activity {
    /// Nothing to do at `now`: started, no pass pending or running, no turn running, and
    /// no timer of a loop already due (the clock may have moved past one that has not
    /// fired yet).
    pub(super) fn idle_at(&self, now: Timestamp) -> bool {
        let later = |t: Option<Timestamp>| t.is_none_or(|t| t > now);
        self.started
            && !self.due_dirty
            && !self.due_busy
            && !self.outbox_dirty
            && !self.outbox_busy
            && !self.tick_busy
            && !self.prune_busy
            && self.turns == 0
            && later(self.due_next)
            && later(self.outbox_next)
            && later(self.tick_next)
            && later(self.prune_next)
    }
}

/// The wake-up handle shared by the link and the `threads` service.
pub(crate) struct Signals(pub(super) watch::Sender<Activity>);

impl Signals {
    pub(super) fn modify(&self, f: impl FnOnce(&mut Activity)) {
        self.0.send_modify(f);
    }

    /// The queue changed: the due loop looks again.
    pub(crate) fn due(&self) {
        self.modify(|a| a.due_dirty = true);
    }

    /// A row was scheduled or moved to `send_at`: the due loop looks again, unless its armed
    /// timer fires no later than that anyway (then the pass at that timer sees the row).
    /// One availability change can move thousands of rows; each used to wake the loop for a
    /// pass over the queue.
    pub(crate) fn due_at(&self, send_at: Timestamp) {
        self.0.send_if_modified(|a| {
            let armed_in_time = !a.due_busy && a.due_next.is_some_and(|next| next <= send_at);
            if a.due_dirty || armed_in_time {
                return false;
            }
            a.due_dirty = true;
            true
        });
    }

    pub(super) fn outbox(&self) {
        self.modify(|a| a.outbox_dirty = true);
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Activity> {
        self.0.subscribe()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.0.borrow().closed
    }
}

/// Counts a loop task as running until dropped (when the task ends, however it ends).
struct LoopGuard(Arc<Signals>);

impl LoopGuard {
    fn new(signals: &Arc<Signals>) -> Self {
        signals.modify(|a| a.loops += 1);
        LoopGuard(signals.clone())
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        self.0.modify(|a| a.loops -= 1);
    }
}

/// Spawns a loop task, counted as running from now (so a shutdown right after attach still
/// waits for it) until it ends.
pub(super) fn spawn_loop(inner: &Arc<Inner>, task: impl Future<Output = ()> + Send + 'static) {
    let guard = LoopGuard::new(&inner.signals);
    tokio::spawn(async move {
        let _running = guard;
        task.await;
    });
}

/// Resolves when the link closes.
pub(super) async fn closed(mut rx: watch::Receiver<Activity>) {
    let _ = rx.wait_for(|a| a.closed).await;
}

/// Waits until `pred` holds; false when the link closed first.
async fn wait_until(rx: &mut watch::Receiver<Activity>, pred: impl Fn(&Activity) -> bool) -> bool {
    match rx.wait_for(|a| a.closed || pred(a)).await {
        Ok(a) => !a.closed,
        Err(_) => false,
    }
}

pub(super) async fn due_loop(inner: Arc<Inner>) {
    let mut rx = inner.signals.subscribe();
    // Turns go through the listener, so nothing is dispatched before it exists.
    if !wait_until(&mut rx, |a| a.listening).await {
        return;
    }
    // The contract: on-start before the first due check.
    inner.on_start().await;
    inner.signals.modify(|a| {
        a.started = true;
        a.due_dirty = true;
        a.outbox_dirty = true;
    });
    let clock = inner.core.clock().clone();
    // When the last pass began (the first pass is already asked for by `due_dirty`).
    let mut passed_at = clock.now_ms();
    loop {
        // A send time the last pass already saw belongs to a row that was not claimable
        // (its thread runs a turn); the turn's end pokes the loop, so it is not slept for.
        // A later one is, even if the clock has passed it since (a timer for the past
        // fires at once): filtering by the current time would strand a row that came due
        // between the pass and this line.
        let next = match inner.core.next_due_at() {
            Ok(next) => next.filter(|t| *t > passed_at),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the queue; looking again in 60 s");
                Some(clock.now_ms() + 60_000)
            }
        };
        // `due_busy` stays set from the pass until its timer is armed here: in between,
        // `settled` must not see an idle loop while a future row exists (a clock moved past
        // that row would then go unnoticed by a test waiting for it).
        inner.signals.modify(|a| {
            a.due_next = next;
            a.due_busy = false;
        });
        let timer = async {
            match next {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            woke = wait_until(&mut rx, |a| a.due_dirty) => if !woke { return },
            _ = timer => {}
        }
        // Both may be ready at once (a clock move and a shutdown): closing wins.
        if inner.signals.is_closed() {
            return;
        }
        inner.signals.modify(|a| {
            a.due_dirty = false;
            a.due_busy = true;
            a.due_next = None;
        });
        passed_at = clock.now_ms();
        if let Ok(host) = inner.host() {
            inner.due_pass(&host).await;
        }
        // `due_busy` is cleared when the next timer is armed, at the top of the loop.
    }
}

pub(super) async fn outbox_loop(inner: Arc<Inner>) {
    let mut rx = inner.signals.subscribe();
    if !wait_until(&mut rx, |a| a.started).await {
        return;
    }
    let clock = inner.core.clock().clone();
    let mut next_retry: Option<Timestamp> = None;
    loop {
        inner.signals.modify(|a| a.outbox_next = next_retry);
        let timer = async {
            match next_retry {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            woke = wait_until(&mut rx, |a| a.outbox_dirty) => if !woke { return },
            _ = timer => {}
        }
        if inner.signals.is_closed() {
            return;
        }
        inner.signals.modify(|a| {
            a.outbox_dirty = false;
            a.outbox_busy = true;
            a.outbox_next = None;
        });
        next_retry = match inner.host() {
            Ok(host) if host.has_role(Role::ProviderRetry) => inner.outbox_pass(&host).await,
            _ => None,
        };
        inner.signals.modify(|a| {
            a.outbox_busy = false;
            // Armed in the same step, so `settled` never sees an idle loop that still has a
            // redelivery to wait for.
            a.outbox_next = next_retry;
            // An immediate redelivery is due now: look again at once.
            if next_retry.is_some_and(|at| at <= clock.now_ms()) {
                a.outbox_dirty = true;
            }
        });
    }
}

pub(super) async fn tick_loop(inner: Arc<Inner>) {
    let step = u64::try_from(inner.options.retry_tick.as_millis()).unwrap_or(u64::MAX);
    let mut rx = inner.signals.subscribe();
    if step == 0 || !wait_until(&mut rx, |a| a.started).await {
        return;
    }
    if inner
        .host()
        .map_or(true, |host| !host.has_role(Role::ProviderRetry))
    {
        return;
    }
    let clock = inner.core.clock().clone();
    let mut next = clock.now_ms().saturating_add(step);
    loop {
        inner.signals.modify(|a| a.tick_next = Some(next));
        tokio::select! {
            _ = clock.sleep_until(next) => {}
            _ = closed(inner.signals.subscribe()) => return,
        }
        if inner.signals.is_closed() {
            return;
        }
        let Ok(host) = inner.host() else { return };
        inner.signals.modify(|a| a.tick_busy = true);
        let now = clock.now_ms();
        let answer = host
            .call_retry("scheduler.on-tick", move |store, retry| {
                Box::pin(retry.pooler_plugins_scheduler().call_on_tick(store, now))
            })
            .await;
        drop(host);
        inner.signals.modify(|a| a.tick_busy = false);
        match answer {
            Ok(Ok(())) => tracing::debug!(plugin = SUBSCRIBER, now, "on-tick done"),
            Ok(Err(e)) => {
                tracing::warn!(plugin = SUBSCRIBER, error = ?e, "on-tick answered an error")
            }
            Err(_) => {} // logged by the runtime
        }
        // The next tick is one interval after this one was due; a clock that jumped far
        // ahead gets one tick, not a burst.
        next = next.saturating_add(step).max(now.saturating_add(1));
    }
}

/// The core's retention: one [`pooler_core::Core::prune`] every prune interval of host
/// time, from one interval after start. A tick that found more than one batch runs the
/// next at once (after yielding), so a backlog drains in batches without holding the core's
/// connection for long.
pub(super) async fn prune_loop(inner: Arc<Inner>) {
    let step = u64::try_from(inner.options.prune_interval.as_millis()).unwrap_or(u64::MAX);
    let mut rx = inner.signals.subscribe();
    if step == 0 || !wait_until(&mut rx, |a| a.started).await {
        return;
    }
    let clock = inner.core.clock().clone();
    let mut next = clock.now_ms().saturating_add(step);
    loop {
        inner.signals.modify(|a| a.prune_next = Some(next));
        tokio::select! {
            _ = clock.sleep_until(next) => {}
            _ = closed(inner.signals.subscribe()) => return,
        }
        if inner.signals.is_closed() {
            return;
        }
        inner.signals.modify(|a| a.prune_busy = true);
        let now = clock.now_ms();
        let more = match inner.core.prune(now, &inner.options.retention) {
            Ok(pruned) => {
                if pruned.total() > 0 {
                    tracing::info!(
                        history = pruned.history,
                        outbox = pruned.outbox,
                        turns = pruned.turns,
                        "pruned core rows past their retention"
                    );
                }
                pruned.more
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot prune the core database; trying at the next tick");
                false
            }
        };
        if more {
            // Armed for now, in the same step that clears busy: `settled` waits for it.
            inner.signals.modify(|a| {
                a.prune_busy = false;
                a.prune_next = Some(now);
            });
            tokio::task::yield_now().await;
            next = now;
            continue;
        }
        inner.signals.modify(|a| a.prune_busy = false);
        next = next.saturating_add(step).max(now.saturating_add(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_needs_start_no_pending_or_running_work_and_no_due_timer() {
        let now = 1_000;
        let mut a = Activity::default();
        assert!(!a.idle_at(now), "not started");
        a.started = true;
        a.due_next = Some(now + 1);
        a.outbox_next = Some(now + 1);
        a.tick_next = Some(now + 1);
        a.prune_next = Some(now + 1);
        assert!(a.idle_at(now));
        for set in [
            |a: &mut Activity| a.due_dirty = true,
            |a: &mut Activity| a.due_busy = true,
            |a: &mut Activity| a.outbox_dirty = true,
            |a: &mut Activity| a.outbox_busy = true,
            |a: &mut Activity| a.tick_busy = true,
            |a: &mut Activity| a.turns = 1,
            |a: &mut Activity| a.due_next = Some(1_000),
            |a: &mut Activity| a.outbox_next = Some(999),
            |a: &mut Activity| a.tick_next = Some(1_000),
            |a: &mut Activity| a.prune_busy = true,
            |a: &mut Activity| a.prune_next = Some(1_000),
        ] {
            let mut b = a.clone();
            set(&mut b);
            assert!(!b.idle_at(now), "{b:?}");
        }
    }

    /// A row scheduled or moved wakes the due loop only when its armed timer would fire
    /// too late for it, or when no timer is armed (idle with no future row, or a pass
    /// running that may already have read the queue).
    #[test]
    fn a_row_wakes_the_due_loop_only_before_its_armed_timer() {
        let signals = Signals(watch::Sender::new(Activity::default()));
        let mut rx = signals.0.subscribe();
        let armed = |next: Option<Timestamp>, busy: bool| {
            signals.modify(|a| {
                a.due_next = next;
                a.due_busy = busy;
                a.due_dirty = false;
            });
        };
        let woke = |rx: &mut watch::Receiver<Activity>| {
            let changed = rx.has_changed().unwrap();
            let dirty = rx.borrow_and_update().due_dirty;
            assert_eq!(
                changed, dirty,
                "a watcher is notified exactly when the loop must look"
            );
            dirty
        };
        armed(Some(5_000), false);
        rx.borrow_and_update();
        signals.due_at(5_000);
        assert!(!woke(&mut rx), "the timer at 5 s sees a row at 5 s");
        signals.due_at(9_000);
        assert!(!woke(&mut rx), "nor one later");
        signals.due_at(4_999);
        assert!(woke(&mut rx), "an earlier row wakes the loop");
        signals.due_at(1_000);
        assert!(
            !rx.has_changed().unwrap(),
            "already woken: no second notification"
        );
        armed(None, false);
        rx.borrow_and_update();
        signals.due_at(9_000);
        assert!(woke(&mut rx), "no timer armed: the loop sleeps until woken");
        armed(Some(5_000), true);
        rx.borrow_and_update();
        signals.due_at(9_000);
        assert!(
            woke(&mut rx),
            "a pass is running and may have read the queue already"
        );
    }
}
