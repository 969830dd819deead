//! Shared fixtures of the core's integration tests: a core on a temporary data directory and
//! the manual clock, and shortcuts that drive a thread into the states the tests start from.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pooler_core::clock::{ManualClock, SharedClock};
use pooler_core::*;

/// 2026-09-21T12:53:20Z.
pub const T0: Timestamp = 1_790_000_000_000;

/// A data directory removed when the test ends.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        TempDir(std::env::temp_dir().join(ids::new_id("pooler-core-test")))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Fixture {
    pub core: Core,
    pub clock: Arc<ManualClock>,
    pub dir: TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = TempDir::new();
        let clock = ManualClock::new(T0);
        let core = Core::open(dir.path(), clock.clone() as SharedClock).unwrap();
        Fixture { core, clock, dir }
    }

    /// Another connection to the same database file, as a second process would have.
    pub fn second_connection(&self) -> Core {
        Core::open(self.dir.path(), self.clock.clone() as SharedClock).unwrap()
    }

    /// Drops the core without any cleanup (as a crash would) and opens it again.
    pub fn restart(self) -> Fixture {
        let Fixture { core, clock, dir } = self;
        drop(core);
        let core = Core::open(dir.path(), clock.clone() as SharedClock).unwrap();
        Fixture { core, clock, dir }
    }

    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance(std::time::Duration::from_millis(ms));
    }

    pub fn now(&self) -> Timestamp {
        use pooler_core::clock::Clock;
        self.clock.now_ms()
    }

    /// A thread with one started turn for `text`; returns (thread, plan).
    pub fn running_thread(&self, provider: Provider, text: &str) -> (ThreadId, TurnPlan) {
        let thread = self
            .core
            .new_thread(provider, Some("model-x"), Some(route()))
            .unwrap();
        self.core.send(&thread, text).unwrap();
        let plan = self
            .core
            .start_turns()
            .unwrap()
            .into_iter()
            .find(|p| p.thread == thread)
            .expect("the new message starts");
        (thread, plan)
    }

    /// A thread whose first turn failed with a 429; returns (thread, failed request).
    pub fn failed_thread(&self, text: &str) -> (ThreadId, RequestId) {
        let (thread, plan) = self.running_thread(Provider::Claude, text);
        self.fail(&plan.request, false);
        (thread, plan.request)
    }

    pub fn fail(&self, request: &str, input_accepted: bool) -> EventId {
        self.core
            .record_outcome(request, &failed_outcome(input_accepted))
            .unwrap()
    }

    pub fn succeed(&self, request: &str) -> EventId {
        self.core
            .record_outcome(
                request,
                &TurnOutcome {
                    result: TurnResult::Succeeded {
                        reply: "done".into(),
                    },
                    input_accepted: true,
                    rate_limits: None,
                    agent_session: None,
                    input_in_session: false,
                },
            )
            .unwrap()
    }
}

pub fn route() -> Route {
    Route {
        base_url: "http://127.0.0.1:9".into(),
        token: "secret-route-token".into(),
    }
}

pub fn rate_limit_failure() -> Failure {
    Failure {
        category: FailureCategory::RateLimit,
        provider_code: Some("rate_limit_error".into()),
        http_status: Some(429),
        origin: FailureOrigin::Pool,
        retry_after: Some(T0 + 60_000),
        message: Some("all accounts blocked".into()),
    }
}

pub fn failed_outcome(input_accepted: bool) -> TurnOutcome {
    TurnOutcome {
        result: TurnResult::Failed {
            failure: rate_limit_failure(),
            partial_reply: if input_accepted {
                "partial".into()
            } else {
                String::new()
            },
        },
        input_accepted,
        rate_limits: None,
        agent_session: None,
        input_in_session: false,
    }
}
