//! A host for tests: fixture (or plugin) components in chosen roles, a manual clock, a
//! temporary data directory, a fake `threads` service, and optionally the HTTP server on an
//! ephemeral loopback port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pooler_core::clock::ManualClock;
use pooler_host::config::Config;
use pooler_host::roles::Role;
use pooler_host::runtime::{Host, HostOptions};
use pooler_host::server::{ADMIN_TOKEN_FILE, Server};
use tempfile::TempDir;
use tokio::sync::oneshot;

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
        let data = tempfile::tempdir()?;
        let clock = ManualClock::new(START_MS);
        let threads = Arc::new(FakeThreads::default());
        let config = Config::parse(&self.toml())?;
        let host = Host::new(HostOptions {
            config,
            data_dir: data.path().to_path_buf(),
            clock: clock.clone(),
            threads: threads.clone(),
            cache_dir: Some(PathBuf::from(COMPILE_CACHE)),
        })?;
        Ok(TestHost {
            host,
            clock,
            threads,
            data,
            server: None,
        })
    }
}

/// A running test host.
pub struct TestHost {
    pub host: Host,
    pub clock: Arc<ManualClock>,
    pub threads: Arc<FakeThreads>,
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
