//! How the link runs: [`CoreOptions`] (the retry tick, the concurrency limit, the turn
//! driver, the claim lease, retention) and [`AgentOptions`] (where the agent CLIs are and how long a turn may run), from
//! the host configuration's `[core]` and `[agents]` tables.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use pooler_core::agent::{AgentLimits, Cli, Launcher};
use pooler_core::driver::DriverConfig;
use pooler_core::retention::Retention;

use crate::config::{AgentsConfig, CoreConfig};

/// How the link runs.
#[derive(Debug, Clone)]
pub struct CoreOptions {
    /// Provider Retry's `on-tick` interval in host time (zero: never).
    pub retry_tick: Duration,
    /// Stored as the core's concurrency limit at open, when set.
    pub concurrency_limit: Option<u32>,
    /// The turn driver's settings.
    pub driver: DriverConfig,
    /// The agent CLIs of agent threads.
    pub agents: AgentOptions,
    /// How long a due row may stay claimed ([`pooler_core::Core::set_claim_lease`]).
    pub claim_lease: Duration,
    /// What the prune tick deletes ([`pooler_core::Core::prune`]).
    pub retention: Retention,
    /// Host time between prune ticks (zero: never).
    pub prune_interval: Duration,
}

/// Where the agent CLIs are and how long a turn may run.
#[derive(Clone, Default)]
pub struct AgentOptions {
    /// Claude Code's binary from the configuration (else `POOLER_CLAUDE_CODE_BIN`, else
    /// `claude` on `PATH`).
    pub claude_code: Option<PathBuf>,
    /// Codex's binary from the configuration (else `POOLER_CODEX_BIN`, else `codex`).
    pub codex: Option<PathBuf>,
    /// The bounds of one turn: its time limit and the longest output line read.
    pub limits: AgentLimits,
    /// Runs the agents' turns in place of operating-system processes (the week simulator's
    /// models of the CLIs); `None` starts the binaries. With one, no binary is looked for.
    pub launcher: Option<Arc<dyn Launcher>>,
}

impl std::fmt::Debug for AgentOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentOptions")
            .field("claude_code", &self.claude_code)
            .field("codex", &self.codex)
            .field("limits", &self.limits)
            .field("launcher", &self.launcher.as_ref().map(|_| "in-process"))
            .finish()
    }
}

impl AgentOptions {
    /// The options `[agents]` sets: the binaries and the turn time limit; no launcher.
    pub fn from_config(config: &AgentsConfig) -> Self {
        AgentOptions {
            claude_code: config.claude_code.clone(),
            codex: config.codex.clone(),
            limits: AgentLimits {
                time_limit: Duration::from_secs(config.turn_time_limit_s),
                ..AgentLimits::default()
            },
            launcher: None,
        }
    }

    /// The binary of `cli`: the configuration's, else the environment variable's, else the
    /// usual name on `PATH`. An error names where it looked.
    pub fn binary(&self, cli: Cli) -> Result<PathBuf, String> {
        let (configured, var, name) = match cli {
            Cli::ClaudeCode => (&self.claude_code, "POOLER_CLAUDE_CODE_BIN", "claude"),
            Cli::Codex => (&self.codex, "POOLER_CODEX_BIN", "codex"),
        };
        if self.launcher.is_some() {
            // The launcher plays the CLI: the name only shows in the invocation.
            return Ok(configured.clone().unwrap_or_else(|| PathBuf::from(name)));
        }
        let agent = cli.agent();
        let executable = |p: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if let Some(path) = configured {
            return if executable(path) {
                Ok(path.clone())
            } else {
                Err(format!(
                    "the {agent} binary {} ([agents] in the configuration) is not an executable file",
                    path.display()
                ))
            };
        }
        if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(path);
            return if executable(&path) {
                Ok(path)
            } else {
                Err(format!(
                    "the {agent} binary {} (${var}) is not an executable file",
                    path.display()
                ))
            };
        }
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| executable(p))
            .ok_or_else(|| {
                format!(
                    "no {agent} binary: `{name}` is not on PATH; install it, or name it in \
                     [agents] of the configuration or in ${var}"
                )
            })
    }
}

impl CoreOptions {
    /// The options `[core]` sets; `agents` stays at its default ([`AgentOptions::from_config`]).
    pub fn from_config(config: &CoreConfig) -> Self {
        CoreOptions {
            retry_tick: Duration::from_secs(config.retry_tick_s),
            concurrency_limit: config.concurrency_limit,
            driver: DriverConfig {
                idle_timeout: Duration::from_secs(config.turn_idle_timeout_s),
                ..DriverConfig::default()
            },
            agents: AgentOptions::default(),
            claim_lease: Duration::from_secs(config.claim_lease_s.max(1)),
            retention: config.retention.retention(),
            prune_interval: Duration::from_secs(config.retention.prune_interval_s),
        }
    }

    /// [`CoreOptions::from_config`] plus the `[agents]` table and the plugins' deadlines
    /// (the claim lease outlasts the retry plugin's gate).
    pub fn from_host_config(config: &crate::config::Config) -> Self {
        CoreOptions {
            agents: AgentOptions::from_config(&config.agents),
            claim_lease: config.claim_lease(),
            ..CoreOptions::from_config(&config.core)
        }
    }
}

impl Default for CoreOptions {
    fn default() -> Self {
        CoreOptions::from_config(&CoreConfig::default())
    }
}
