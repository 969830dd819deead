//! A host for tests: fixture (or plugin) components in chosen roles, a manual clock, a
//! temporary data directory, a fake `threads` service, and optionally the HTTP server on an
//! ephemeral loopback port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pooler_core::clock::{Clock, ManualClock, SharedClock, Sleep};
use pooler_host::config::Config;
use pooler_host::operate::server::Server;
use pooler_host::operate::wire::ADMIN_TOKEN_FILE;
use pooler_host::runtime::roles::Role;
use pooler_host::runtime::{Host, HostOptions};
use tempfile::TempDir;
use tokio::sync::{oneshot, watch};

use crate::fixtures::COMPILE_CACHE;
use crate::threads::FakeThreads;

/// The manual clock's start: 2026-01-01T00:00:00Z.
pub const START_MS: u64 = 1_767_225_600_000;

/// How to set up a [`TestHost`].
#[derive(Default)]
pub struct Setup {
    roles: Vec<(Role, String, String)>,
    extra: String,
}

impl Setup {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fill `role` with the component at `path`; `settings` are more lines of its
    /// `[plugins.<role>]` table (e.g. `deadline-ms = 500`).
    pub fn role(mut self, role: Role, path: impl AsRef<Path>, settings: &str) -> Self {
        let source = path.as_ref().display().to_string();
        self.roles.push((role, source, settings.to_string()));
        self
    }

    /// Fill `role` with the plugin embedded in the `pooler` binary (the real Account Pooler
    /// or Provider Retry). A role named neither here nor by [`Setup::role`] stays empty.
    pub fn embedded(mut self, role: Role, settings: &str) -> Self {
        self.roles
            .push((role, "embedded".to_string(), settings.to_string()));
        self
    }

    /// More configuration text (other tables).
    pub fn config(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self.extra.push('\n');
        self
    }

    /// The configuration file this setup describes.
    pub fn toml(&self) -> String {
        let mut text = self.extra.clone();
        for role in Role::ALL {
            let (source, settings) = self
                .roles
                .iter()
                .find(|(r, _, _)| *r == role)
                .map_or(("none", ""), |(_, source, settings)| {
                    (source.as_str(), settings.as_str())
                });
            text.push_str(&format!(
                "[plugins.{}]\ncomponent = {source:?}\n{settings}\n",
                role.name(),
            ));
        }
        text
    }

    /// Start the host (inside a tokio runtime).
    pub fn start(self) -> anyhow::Result<TestHost> {
        // Before the host exists, so no line it logs is missed by a test that looks later.
        crate::logs::logs();
        let data = tempfile::tempdir()?;
        let clock = ManualClock::new(START_MS);
        let sleepers = Arc::new(Sleepers::default());
        let threads = Arc::new(FakeThreads::default());
        let config = Config::parse(&self.toml())?;
        let host = start_host(&config, &data, &clock, &sleepers, &threads)?;
        Ok(TestHost {
            host,
            clock,
            sleepers,
            threads,
            config,
            data,
            server: None,
        })
    }
}

fn start_host(
    config: &Config,
    data: &TempDir,
    clock: &Arc<ManualClock>,
    sleepers: &Arc<Sleepers>,
    threads: &Arc<FakeThreads>,
) -> anyhow::Result<Host> {
    let watched: SharedClock = Arc::new(WatchedClock {
        clock: clock.clone(),
        sleepers: sleepers.clone(),
    });
    Host::new(HostOptions {
        config: config.clone(),
        data_dir: data.path().to_path_buf(),
        clock: watched,
        threads: threads.clone(),
        cache_dir: Some(PathBuf::from(COMPILE_CACHE)),
        seed: None,
    })
}

/// The deadlines (monotonic ns) of everything sleeping on the manual clock right now.
#[derive(Default)]
pub struct Sleepers {
    next_id: std::sync::atomic::AtomicU64,
    pending: watch::Sender<Vec<(u64, u64)>>,
}

/// Removes its sleeper from [`Sleepers`] when the sleep ends or is dropped.
struct Asleep {
    sleepers: Arc<Sleepers>,
    id: u64,
}

impl Drop for Asleep {
    fn drop(&mut self) {
        self.sleepers
            .pending
            .send_modify(|p| p.retain(|(id, _)| *id != self.id));
    }
}

impl Sleepers {
    fn enter(self: &Arc<Self>, deadline_ns: u64) -> Asleep {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.pending.send_modify(|p| p.push((id, deadline_ns)));
        Asleep {
            sleepers: self.clone(),
            id,
        }
    }
}

/// The manual clock as the host (and so every guest) sees it: the same time, and every
/// sleeper recorded with its deadline so a test can move time to exactly when the next one
/// wakes, instead of guessing.
struct WatchedClock {
    clock: Arc<ManualClock>,
    sleepers: Arc<Sleepers>,
}

impl Clock for WatchedClock {
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
    fn monotonic_ns(&self) -> u64 {
        self.clock.monotonic_ns()
    }
    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let ahead_ns = deadline_ms.saturating_sub(self.clock.now_ms()) * 1_000_000;
        let asleep = self.sleepers.enter(self.clock.monotonic_ns() + ahead_ns);
        let sleep = self.clock.sleep_until(deadline_ms);
        Box::pin(async move {
            sleep.await;
            drop(asleep);
        })
    }
    fn sleep_until_monotonic(&self, deadline_ns: u64) -> Sleep {
        let asleep = self.sleepers.enter(deadline_ns);
        let sleep = self.clock.sleep_until_monotonic(deadline_ns);
        Box::pin(async move {
            sleep.await;
            drop(asleep);
        })
    }
}

/// A running test host.
pub struct TestHost {
    pub host: Host,
    pub clock: Arc<ManualClock>,
    sleepers: Arc<Sleepers>,
    pub threads: Arc<FakeThreads>,
    config: Config,
    pub data: TempDir,
    server: Option<RunningServer>,
}

struct RunningServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestHost {
    /// Serve HTTP on an ephemeral loopback port; returns `http://127.0.0.1:<port>`.
    pub async fn serve(&mut self) -> anyhow::Result<String> {
        let server = Server::bind(self.host.clone(), "127.0.0.1:0".parse()?).await?;
        let addr = server.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        self.server = Some(RunningServer {
            addr,
            stop: Some(stop),
            task,
        });
        Ok(format!("http://{addr}"))
    }

    /// Stop the server and the host, and start them again on the same data directory,
    /// configuration and clock (as a restarted `pooler serve` would); returns the new URL
    /// when the server was running, else `None`.
    pub async fn restart(&mut self) -> anyhow::Result<Option<String>> {
        let serving = self.server.is_some();
        self.stop_server().await?;
        self.host = start_host(
            &self.config,
            &self.data,
            &self.clock,
            &self.sleepers,
            &self.threads,
        )?;
        Ok(if serving {
            Some(self.serve().await?)
        } else {
            None
        })
    }

    /// Like [`TestHost::restart`], with the configuration `setup` describes instead (a
    /// `pooler serve` restarted after its configuration file changed).
    pub async fn restart_as(&mut self, setup: Setup) -> anyhow::Result<Option<String>> {
        self.config = Config::parse(&setup.toml())?;
        self.restart().await
    }

    /// How long until the next sleeper on the host clock wakes (a guest's backoff or wait,
    /// the maintenance loop), once something sleeps past now. Waits (for real, at most
    /// `limit`) until something does; `None` if nothing did.
    pub async fn next_wake(&self, limit: std::time::Duration) -> Option<std::time::Duration> {
        self.next_wake_within(std::time::Duration::MAX, limit).await
    }

    /// Like [`TestHost::next_wake`], for a sleeper that wakes within `longest` of now: the
    /// soonest one, once there is one (a longer sleep meanwhile is left to its own time).
    pub async fn next_wake_within(
        &self,
        longest: std::time::Duration,
        limit: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let longest = u64::try_from(longest.as_nanos()).unwrap_or(u64::MAX);
        let mut rx = self.sleepers.pending.subscribe();
        let clock = self.clock.clone();
        let ahead = move |pending: &Vec<(u64, u64)>| {
            let now = clock.monotonic_ns();
            pending
                .iter()
                .map(|(_, at)| *at)
                .filter(|at| *at > now)
                .min()
                .map(|at| at - now)
        };
        let due = |p: &Vec<(u64, u64)>| ahead(p).is_some_and(|ns| ns <= longest);
        let found = tokio::time::timeout(limit, rx.wait_for(due))
            .await
            .ok()?
            .ok()?
            .clone();
        ahead(&found).map(|ns| std::time::Duration::from_millis(ns.div_ceil(1_000_000)))
    }

    /// Wait until something sleeps on the host clock, then move the clock to exactly when
    /// it wakes. Returns how far the clock moved (`None` if nothing slept within `limit`).
    pub async fn sleep_through(&self, limit: std::time::Duration) -> Option<std::time::Duration> {
        let wake = self.next_wake(limit).await?;
        self.clock.advance(wake);
        Some(wake)
    }

    pub fn addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|s| s.addr)
    }

    /// The admin token the server wrote.
    pub fn admin_token(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(
            self.data.path().join(ADMIN_TOKEN_FILE),
        )?)
    }

    /// Stop the server (draining in-flight requests) and wait for it.
    pub async fn stop_server(&mut self) -> anyhow::Result<()> {
        if let Some(mut server) = self.server.take() {
            if let Some(stop) = server.stop.take() {
                let _ = stop.send(());
            }
            server.task.await??;
        }
        Ok(())
    }

    /// A plugin's setting (the fixtures keep their observations there).
    pub async fn setting(&self, role: Role, key: &str) -> Option<String> {
        let key = key.to_string();
        match role {
            Role::AccountPool => self
                .host
                .call_pool("settings.get-setting", move |store, pool| {
                    Box::pin(async move {
                        pool.pooler_plugins_settings()
                            .call_get_setting(store, &key)
                            .await
                    })
                })
                .await
                .ok()?
                .ok()
                .map(|s| s.value),
            Role::ProviderRetry => self
                .host
                .call_retry("settings.get-setting", move |store, retry| {
                    Box::pin(async move {
                        retry
                            .pooler_plugins_settings()
                            .call_get_setting(store, &key)
                            .await
                    })
                })
                .await
                .ok()?
                .ok()
                .map(|s| s.value),
        }
    }

    /// Set a plugin's setting.
    pub async fn set_setting(&self, role: Role, key: &str, value: &str) -> anyhow::Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        let stored = match role {
            Role::AccountPool => self
                .host
                .call_pool("settings.set-setting", move |store, pool| {
                    Box::pin(async move {
                        pool.pooler_plugins_settings()
                            .call_set_setting(store, &key, &value)
                            .await
                    })
                })
                .await?
                .is_ok(),
            Role::ProviderRetry => self
                .host
                .call_retry("settings.set-setting", move |store, retry| {
                    Box::pin(async move {
                        retry
                            .pooler_plugins_settings()
                            .call_set_setting(store, &key, &value)
                            .await
                    })
                })
                .await?
                .is_ok(),
        };
        anyhow::ensure!(stored, "the plugin refused the setting");
        Ok(())
    }
}

/// The one file called `name` anywhere under `dir` (a test fails if there is not exactly
/// one): how tests find a plugin's database without knowing the host's layout.
pub fn find_file(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == name) {
                found.push(path);
            }
        }
    }
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}
