//! A capture of the host's `tracing` events, so a test can wait for a log line and check its
//! fields. Installed once per test binary as the global subscriber.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One captured event.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub target: String,
    pub level: Level,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// The captured events of this test binary.
#[derive(Default)]
pub struct Logs {
    lines: Mutex<Vec<LogLine>>,
    added: Notify,
    /// Set by [`Logs::stop_capturing`]: lines are no longer kept.
    stopped: std::sync::atomic::AtomicBool,
}

impl Logs {
    /// A copy of every line captured so far.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lines.lock().unwrap().clone()
    }

    /// How many lines are captured.
    pub fn len(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// Whether no line is captured.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stop keeping lines, for good, in this test binary, and forget those kept: a long run
    /// (the soak) that reads none of them keeps the capture (every line of every crate,
    /// hundreds a request) out of the memory it measures, allocations and all.
    pub fn stop_capturing(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self.lines.lock().unwrap() = Vec::new();
    }

    /// Wait (at most `timeout`, a safety net) for a line matching `pred`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&LogLine) -> bool,
    ) -> Option<LogLine> {
        let wait = async {
            loop {
                let added = self.added.notified();
                if let Some(line) = self.lines.lock().unwrap().iter().find(|l| pred(l)).cloned() {
                    return line;
                }
                added.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.ok()
    }
}

struct Capture(Arc<Logs>);

#[derive(Default)]
struct Fields {
    message: String,
    fields: BTreeMap<String, String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields
                .insert(field.name().to_string(), format!("{value:?}"));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields
                .insert(field.name().to_string(), value.to_string());
        }
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if self.0.stopped.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.0.lines.lock().unwrap().push(LogLine {
            target: event.metadata().target().to_string(),
            level: *event.metadata().level(),
            message: fields.message,
            fields: fields.fields,
        });
        self.0.added.notify_waiters();
    }
}

/// The capture, installed on first use. A line logged before that is not captured, so the
/// harnesses (`PoolSetup::start`, `CoreSetup::start`, `harness::Setup::start`) install it before
/// they start a host.
pub fn logs() -> Arc<Logs> {
    static LOGS: OnceLock<Arc<Logs>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Logs::default());
        let subscriber = tracing_subscriber::registry().with(Capture(logs.clone()));
        // Another subscriber may already be installed by the test binary; then lines are
        // simply not captured and tests that need them fail loudly.
        let _ = tracing::subscriber::set_global_default(subscriber);
        logs
    })
    .clone()
}
