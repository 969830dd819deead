//! The ledger: what each thread is doing at every instant, and whether capacity existed
//! while it waited. A thread is **working** while an agent turn of it runs, **waiting**
//! while a task of it is outstanding (sent, not finished) and no turn runs — its turn
//! failed and a retry is pending, was declined, or waits for a slot — and **idle**
//! otherwise (its person thinking, or off work).
//!
//! Waiting time is split by the oracle ([`Model::can_serve`]): some enabled account could
//! have served the thread's next request — the pool's fault — or none could. The ledger is
//! touched at every change of either side (a turn starts or ends, an answer changes an
//! account, a window resets, the person enables an account), so the split is exact, not
//! sampled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::model::Model;
use crate::scenario::ProviderName;

/// What a thread was doing over a stretch of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Working,
    /// Waiting while some enabled account could have served it.
    WaitingWithCapacity,
    /// Waiting with no capacity anywhere.
    WaitingWithout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Working,
    Waiting,
}

/// One thread's track.
#[derive(Debug, Clone)]
pub struct ThreadTrack {
    pub provider: ProviderName,
    pub family: String,
    state: State,
    /// Turns of it running now (subagents run inside one turn, so 0 or 1).
    running: u32,
    outstanding: bool,
    /// Since when it waits, and whether capacity was missing at some point of that wait.
    waiting: Option<(u64, bool)>,
    pub working_ms: u64,
    pub waiting_with_ms: u64,
    pub waiting_without_ms: u64,
    /// (from, to, what), merged when adjacent.
    pub segments: Vec<(u64, u64, Activity)>,
    pub tasks_sent: u32,
    pub tasks_done: u32,
    /// Turns the core stopped before they returned (the agent's time limit).
    pub turns_cut: u32,
}

/// A person's action, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// `pooler account enable` of a reserve account, because everything else was spent.
    EnableReserve,
    /// `pooler account disable` of the reserve again once another account was ready.
    DisableReserve,
    /// `pooler account login --replace` of an account whose sign-in was lost.
    SignIn,
    /// The person's message sent again to a thread no retry would resume.
    Resend,
    /// A scripted `pooler account enable`/`disable`.
    Scripted,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::EnableReserve => "reserve-enabled",
            Action::DisableReserve => "reserve-disabled",
            Action::SignIn => "sign-in",
            Action::Resend => "resend",
            Action::Scripted => "scripted",
        }
    }
}

struct Inner {
    last: u64,
    threads: Vec<ThreadTrack>,
    /// Which accounts the pool has enabled (the person's doing, so the sim knows).
    enabled: Vec<bool>,
    /// Capacity per (provider, family) as of `last`, and since when it has been there.
    capacity: BTreeMap<(ProviderName, String), (bool, u64)>,
    resume_delays: Vec<u64>,
    actions: BTreeMap<Action, u32>,
}

/// See the module docs.
pub struct Ledger {
    inner: Mutex<Inner>,
    model: OnceLock<Arc<Model>>,
}

impl Ledger {
    pub fn new(start: u64, threads: Vec<(ProviderName, String)>, enabled: Vec<bool>) -> Self {
        Ledger {
            inner: Mutex::new(Inner {
                last: start,
                threads: threads
                    .into_iter()
                    .map(|(provider, family)| ThreadTrack {
                        provider,
                        family,
                        state: State::Idle,
                        running: 0,
                        outstanding: false,
                        waiting: None,
                        working_ms: 0,
                        waiting_with_ms: 0,
                        waiting_without_ms: 0,
                        segments: Vec::new(),
                        tasks_sent: 0,
                        tasks_done: 0,
                        turns_cut: 0,
                    })
                    .collect(),
                enabled,
                capacity: BTreeMap::new(),
                resume_delays: Vec::new(),
                actions: BTreeMap::new(),
            }),
            model: OnceLock::new(),
        }
    }

    /// The model the oracle asks (set once, right after both exist).
    pub fn set_model(&self, model: Arc<Model>) {
        let _ = self.model.set(model);
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Account for the time up to `now`, then look at capacity again.
    pub fn touch(&self, now: u64) {
        let mut inner = self.inner();
        self.advance(&mut inner, now);
    }

    fn advance(&self, inner: &mut Inner, now: u64) {
        let now = now.max(inner.last);
        let from = inner.last;
        let Inner {
            threads, capacity, ..
        } = inner;
        for t in threads.iter_mut() {
            let activity = match t.state {
                State::Idle => None,
                State::Working => Some(Activity::Working),
                State::Waiting => {
                    let cap = capacity
                        .get(&(t.provider, t.family.clone()))
                        .is_some_and(|(c, _)| *c);
                    Some(if cap {
                        Activity::WaitingWithCapacity
                    } else {
                        Activity::WaitingWithout
                    })
                }
            };
            if let Some(activity) = activity
                && now > from
            {
                let dt = now - from;
                match activity {
                    Activity::Working => t.working_ms += dt,
                    Activity::WaitingWithCapacity => t.waiting_with_ms += dt,
                    Activity::WaitingWithout => t.waiting_without_ms += dt,
                }
                match t.segments.last_mut() {
                    Some((_, to, a)) if *to == from && *a == activity => *to = now,
                    _ => t.segments.push((from, now, activity)),
                }
            }
        }
        inner.last = now;
        let Some(model) = self.model.get() else {
            return;
        };
        let wanted: Vec<(ProviderName, String)> = inner
            .threads
            .iter()
            .map(|t| (t.provider, t.family.clone()))
            .collect();
        for key in wanted {
            if inner.capacity.contains_key(&key)
                && !inner.threads.iter().any(|t| t.state == State::Waiting)
            {
                // Nobody waits: capacity matters only when it changes under a waiting
                // thread, so keep the last answer's time; look again when one waits.
                continue;
            }
            let can = model.can_serve(key.0, &key.1, &inner.enabled, now);
            let entry = inner.capacity.entry(key.clone()).or_insert((can, now));
            if entry.0 != can {
                *entry = (can, now);
            }
        }
        for t in inner.threads.iter_mut() {
            if let Some((_, missing)) = &mut t.waiting
                && !inner
                    .capacity
                    .get(&(t.provider, t.family.clone()))
                    .is_some_and(|(c, _)| *c)
            {
                *missing = true;
            }
        }
    }

    /// Re-derive a thread's state after a change, noting a resume's delay.
    fn settle(inner: &mut Inner, thread: usize, now: u64) {
        let t = &mut inner.threads[thread];
        let state = if t.running > 0 {
            State::Working
        } else if t.outstanding {
            State::Waiting
        } else {
            State::Idle
        };
        if state == t.state {
            return;
        }
        if state == State::Waiting {
            let cap = inner
                .capacity
                .get(&(t.provider, t.family.clone()))
                .is_some_and(|(c, _)| *c);
            t.waiting = Some((now, !cap));
        } else if let Some((since, missing)) = t.waiting.take()
            && state == State::Working
            && missing
            && let Some((true, back)) = inner.capacity.get(&(t.provider, t.family.clone()))
        {
            // Resumed after capacity came back: how long after.
            inner
                .resume_delays
                .push(now.saturating_sub((*back).max(since)));
        }
        tracing::debug!(thread, from = ?inner.threads[thread].state, to = ?state, now, "thread");
        inner.threads[thread].state = state;
    }

    fn change(&self, thread: usize, now: u64, f: impl FnOnce(&mut ThreadTrack)) {
        let mut inner = self.inner();
        self.advance(&mut inner, now);
        f(&mut inner.threads[thread]);
        Self::settle(&mut inner, thread, now);
        // The new waiter needs a fresh capacity answer.
        self.advance(&mut inner, now);
    }

    /// The person sent a task.
    pub fn task_sent(&self, thread: usize, now: u64) {
        self.change(thread, now, |t| {
            t.outstanding = true;
            t.tasks_sent += 1;
        });
    }

    /// The thread's turn finished its task.
    pub fn task_done(&self, thread: usize, now: u64) {
        self.change(thread, now, |t| {
            t.outstanding = false;
            t.tasks_done += 1;
        });
    }

    pub fn turn_started(&self, thread: usize, now: u64) {
        self.change(thread, now, |t| t.running += 1);
    }

    pub fn turn_ended(&self, thread: usize, now: u64) {
        self.change(thread, now, |t| t.running = t.running.saturating_sub(1));
    }

    /// The pool's account `idx` was enabled or disabled.
    pub fn set_enabled(&self, idx: usize, on: bool, now: u64) {
        let mut inner = self.inner();
        self.advance(&mut inner, now);
        inner.enabled[idx] = on;
        inner.capacity.clear();
        self.advance(&mut inner, now);
    }

    pub fn enabled(&self) -> Vec<bool> {
        self.inner().enabled.clone()
    }

    /// The core stopped a turn of `thread` before it returned.
    pub fn act_turn_cut(&self, thread: usize) {
        self.inner().threads[thread].turns_cut += 1;
    }

    pub fn act(&self, action: Action) {
        *self.inner().actions.entry(action).or_insert(0) += 1;
    }

    /// Whether the thread has a task outstanding with no turn running.
    pub fn waiting(&self, thread: usize) -> bool {
        self.inner().threads[thread].state == State::Waiting
    }

    /// Tasks the person sent to the thread so far.
    pub fn tasks_sent(&self, thread: usize) -> u32 {
        self.inner().threads[thread].tasks_sent
    }

    /// Whether any thread waits now.
    pub fn anyone_waiting(&self) -> bool {
        self.inner()
            .threads
            .iter()
            .any(|t| t.state == State::Waiting)
    }

    /// Everything recorded, accounted up to `now`.
    pub fn finish(&self, now: u64) -> Finished {
        let mut inner = self.inner();
        self.advance(&mut inner, now);
        Finished {
            threads: inner.threads.clone(),
            resume_delays: inner.resume_delays.clone(),
            actions: inner.actions.clone(),
        }
    }
}

/// What the ledger recorded over a run.
#[derive(Debug, Clone)]
pub struct Finished {
    pub threads: Vec<ThreadTrack>,
    pub resume_delays: Vec<u64>,
    pub actions: BTreeMap<Action, u32>,
}
