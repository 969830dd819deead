//! The host's configuration: one optional TOML file. Every table refuses unknown keys (the
//! error names the key), so a typo never silently falls back to a default.
//!
//! ```toml
//! [server]
//! listen = "127.0.0.1:8787"
//! max-body-bytes = 33554432
//! max-header-bytes = 65536             # a larger request head gets 431 (8192 to 1048576)
//! body-read-timeout-ms = 10000         # a request body silent this long gets 408
//! compile-cache = "/var/cache/pooler"   # else $POOLER_CACHE_DIR, else ~/.cache/pooler
//!
//! [plugins.account-pool]
//! component = "embedded"          # or "none", or a path to a .wasm component
//! allowed-hosts = ["api.anthropic.com", "chatgpt.com"]
//! deadline-ms = 10000
//! memory-mib = 64
//! error-body-timeout-ms = 10000   # a failed answer's body may stall this long
//!
//! [maintenance]
//! interval-s = 10
//!
//! [core]
//! concurrency-limit = 4           # turns at once; stored in the core database
//! retry-tick-s = 10               # Provider Retry's on-tick interval (0: never)
//! turn-idle-timeout-s = 300       # silence after which a running turn fails
//! claim-lease-s = 300             # a due row whose verdict was not recorded is gated again
//!
//! [core.retention]                # what the core keeps once it is no longer needed (0: forever)
//! history-days = 30               # queue history (a chain with a live row keeps its own)
//! outbox-days = 7                 # events every subscriber acknowledged
//! turn-days = 90                  # finished turns not part of a live conversation
//! prune-interval-s = 60           # host-clock seconds between prune ticks (0: never prune)
//! prune-batch = 500               # most rows per table one tick deletes
//!
//! [agents]
//! claude-code = "/usr/local/bin/claude"   # else $POOLER_CLAUDE_CODE_BIN, else `claude` on PATH
//! codex = "/usr/local/bin/codex"          # else $POOLER_CODEX_BIN, else `codex` on PATH
//! turn-time-limit-s = 1800                # an agent turn's process is killed after this
//!
//! [alerts]                                # when the pool needs a person (docs/alerts.md)
//! webhook = "https://hooks.slack.com/services/…"   # POSTed one document per window
//! format = "slack"                        # json (default) | slack | ntfy
//! command = ["apprise", "-t", "{title}", "-b", "{body}", "mailto://…"]  # no shell
//! command-timeout-s = 30                  # the command is killed after this
//! coalesce-s = 30                         # alerts within this window go out together
//! check-interval-s = 30                   # how often accounts and threads are looked at
//! allowed-hosts = ["hooks.slack.com"]     # default: the webhook's own scheme, host, port
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::runtime::roles::Role;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// `[server]`: the HTTP listener.
    #[serde(default)]
    pub server: ServerConfig,
    /// Per-role plugin settings, keyed by role name (`account-pool`, `provider-retry`).
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginConfig>,
    /// `[maintenance]`: the host-driven periodic calls.
    #[serde(default)]
    pub maintenance: MaintenanceConfig,
    /// `[core]`: the threads, turns and retry queue the host plays.
    #[serde(default)]
    pub core: CoreConfig,
    /// `[agents]`: the agent CLIs that run agent threads' turns.
    #[serde(default)]
    pub agents: AgentsConfig,
    /// `[alerts]`: when and how a person is told the pool needs them.
    #[serde(default)]
    pub alerts: AlertsConfig,
}

/// `[alerts]`: telling a person when the pool needs them (`docs/alerts.md`). The log and
/// `/metrics` always get every alert; a webhook and a command only when set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AlertsConfig {
    /// An http(s) URL each window's alerts are POSTed to. It may hold a secret (Slack's
    /// and ntfy's URLs are their only credential): it is shown only as its origin.
    #[serde(default)]
    pub webhook: Option<String>,
    /// The webhook body's shape.
    #[serde(default)]
    pub format: crate::mediation::alerts::format::Format,
    /// A program and its arguments, run once per window with `{title}`, `{body}`, `{kind}`
    /// … replaced (each argument stays one argument: no shell) and the same values in
    /// `POOLER_ALERT_*` variables.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Real seconds the command may run before it is killed.
    #[serde(default = "default_command_timeout_s")]
    pub command_timeout_s: u64,
    /// Host-clock seconds alerts are gathered before one delivery (0: at once); an
    /// episode that starts and ends within it is not sent.
    #[serde(default = "default_coalesce_s")]
    pub coalesce_s: u64,
    /// Host-clock seconds between looks at the accounts and threads (0: only after the
    /// pool signals an availability change).
    #[serde(default = "default_check_interval_s")]
    pub check_interval_s: u64,
    /// Where the webhook may be sent (entries as in `[plugins.*] allowed-hosts`); default:
    /// the webhook URL's own scheme, host and port.
    #[serde(default)]
    pub allowed_hosts: Option<Vec<String>>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            webhook: None,
            format: Default::default(),
            command: None,
            command_timeout_s: default_command_timeout_s(),
            coalesce_s: default_coalesce_s(),
            check_interval_s: default_check_interval_s(),
            allowed_hosts: None,
        }
    }
}

fn default_command_timeout_s() -> u64 {
    30
}
fn default_coalesce_s() -> u64 {
    30
}
fn default_check_interval_s() -> u64 {
    30
}

impl AlertsConfig {
    /// Whether any delivery besides the log and `/metrics` is set.
    pub fn delivers(&self) -> bool {
        self.webhook.is_some() || self.command.is_some()
    }

    /// The webhook as a person may see it: its origin only (the path may be a secret).
    pub fn webhook_shown(&self) -> Option<String> {
        self.webhook.as_deref().map(|url| {
            crate::runtime::imports::http_out::allow::Origin::of_url(url)
                .map_or_else(|| "(set)".to_string(), |o| format!("{o}/…"))
        })
    }

    /// The hosts the webhook may reach.
    pub fn allowed_hosts(&self) -> Vec<String> {
        match (&self.allowed_hosts, &self.webhook) {
            (Some(hosts), _) => hosts.clone(),
            (None, Some(url)) => crate::runtime::imports::http_out::allow::Origin::of_url(url)
                .map(|o| vec![o.to_string()])
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        if let Some(url) = &self.webhook {
            // The value is not repeated: it may be a secret.
            if crate::runtime::imports::http_out::allow::Origin::of_url(url).is_none()
                || crate::runtime::imports::http_out::allow::AllowList::check_value(url).is_err()
                || !url.trim().to_ascii_lowercase().starts_with("http")
            {
                bail!(
                    "alerts.webhook must be an absolute https:// URL (plain http:// only to loopback)"
                );
            }
        }
        if let Some(command) = &self.command {
            if command.first().is_none_or(|p| p.trim().is_empty()) {
                bail!(
                    "alerts.command must name a program first, e.g. [\"apprise\", \"-b\", \"{{body}}\", URL]"
                );
            }
            for arg in command {
                if let Some(name) =
                    crate::mediation::alerts::format::unknown_placeholders(arg).first()
                {
                    bail!(
                        "alerts.command has an unknown placeholder `{{{name}}}` (known: {})",
                        crate::mediation::alerts::format::PLACEHOLDERS
                            .map(|p| format!("{{{p}}}"))
                            .join(", ")
                    );
                }
            }
        }
        if self.command_timeout_s == 0 {
            bail!("alerts.command-timeout-s must be positive");
        }
        for host in self.allowed_hosts.iter().flatten() {
            if let Err(e) = crate::runtime::imports::http_out::allow::parse_entry(host) {
                bail!("alerts.allowed-hosts: {e}");
            }
        }
        Ok(())
    }
}

/// `[agents]`: the agent CLIs that run agent threads' turns.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentsConfig {
    /// The Claude Code binary. Else `POOLER_CLAUDE_CODE_BIN`, else `claude` on `PATH`.
    #[serde(default)]
    pub claude_code: Option<PathBuf>,
    /// The Codex CLI binary. Else `POOLER_CODEX_BIN`, else `codex` on `PATH`.
    #[serde(default)]
    pub codex: Option<PathBuf>,
    /// Real seconds an agent turn may run before its process group is killed (the turn
    /// then fails and may be retried).
    #[serde(default = "default_turn_time_limit_s")]
    pub turn_time_limit_s: u64,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            claude_code: None,
            codex: None,
            turn_time_limit_s: default_turn_time_limit_s(),
        }
    }
}

fn default_turn_time_limit_s() -> u64 {
    30 * 60
}

/// `[core]`: the threads, turns and retry queue the host plays.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CoreConfig {
    /// How many turns run at once. When set, stored in the core database at start (the
    /// core keeps the last value, default 4).
    #[serde(default)]
    pub concurrency_limit: Option<u32>,
    /// Seconds of host-clock time between calls to Provider Retry's `scheduler.on-tick`
    /// (0: never).
    #[serde(default = "default_interval_s")]
    pub retry_tick_s: u64,
    /// Seconds of silence (no response head, no stream bytes) after which a turn fails.
    #[serde(default = "default_turn_idle_timeout_s")]
    pub turn_idle_timeout_s: u64,
    /// Seconds of host-clock time a due row may stay claimed for its dispatch gate. A
    /// verdict the core could not record (a failed postpone or drop) leaves the row claimed;
    /// after this long it is released and gated again (never dispatched twice). At least
    /// twice the provider-retry plugin's `deadline-ms` is used whatever is set here, so a
    /// gate still running never loses its claim ([`Config::claim_lease`]).
    #[serde(default = "default_claim_lease_s")]
    pub claim_lease_s: u64,
    /// `[core.retention]`: how long the core keeps what it no longer needs.
    #[serde(default)]
    pub retention: RetentionConfig,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            concurrency_limit: None,
            retry_tick_s: default_interval_s(),
            turn_idle_timeout_s: default_turn_idle_timeout_s(),
            claim_lease_s: default_claim_lease_s(),
            retention: RetentionConfig::default(),
        }
    }
}

fn default_claim_lease_s() -> u64 {
    pooler_core::DEFAULT_CLAIM_LEASE_MS / 1000
}

/// `[core.retention]`: the core's prune tick (see `pooler_core::retention`). Each `*-days`
/// of 0 keeps that table forever; what is still needed (an undelivered event, the history
/// of a chain with a live row, a thread's conversation and latest turn) is never pruned.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RetentionConfig {
    /// Days the retry queue's history is kept.
    #[serde(default = "default_history_days")]
    pub history_days: u64,
    /// Days an outbox event is kept after it was written, once every subscriber
    /// acknowledged it.
    #[serde(default = "default_outbox_days")]
    pub outbox_days: u64,
    /// Days a finished turn request no longer needed is kept.
    #[serde(default = "default_turn_days")]
    pub turn_days: u64,
    /// Host-clock seconds between prune ticks (0: never prune).
    #[serde(default = "default_prune_interval_s")]
    pub prune_interval_s: u64,
    /// The most rows of each table one tick deletes (at least 1).
    #[serde(default = "default_prune_batch")]
    pub prune_batch: usize,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            history_days: default_history_days(),
            outbox_days: default_outbox_days(),
            turn_days: default_turn_days(),
            prune_interval_s: default_prune_interval_s(),
            prune_batch: default_prune_batch(),
        }
    }
}

impl RetentionConfig {
    /// The core's retention settings.
    pub fn retention(&self) -> pooler_core::retention::Retention {
        let days =
            |d: u64| (d > 0).then(|| std::time::Duration::from_secs(d.saturating_mul(86_400)));
        pooler_core::retention::Retention {
            history: days(self.history_days),
            outbox: days(self.outbox_days),
            turns: days(self.turn_days),
            batch: self.prune_batch.max(1),
        }
    }
}

fn default_history_days() -> u64 {
    30
}
fn default_outbox_days() -> u64 {
    7
}
fn default_turn_days() -> u64 {
    90
}
fn default_prune_interval_s() -> u64 {
    60
}
fn default_prune_batch() -> usize {
    pooler_core::retention::DEFAULT_PRUNE_BATCH
}

fn default_turn_idle_timeout_s() -> u64 {
    300
}

/// The accepted range of `server.max-header-bytes`: hyper's smallest read buffer, and a
/// megabyte (no agent sends a head near that).
pub const MIN_HEADER_BYTES: usize = 8 << 10;
/// The upper end of the accepted range of `server.max-header-bytes` (see [`MIN_HEADER_BYTES`]).
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// `[server]`: the HTTP listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServerConfig {
    /// Where to listen. Loopback by default: the proxy holds credentials.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Largest request body accepted; larger ones get 413 from the host.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: u64,
    /// Largest number of request headers accepted.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Largest request head (request line and headers) accepted, in bytes; a larger one gets
    /// 431 and the connection closes. Also the listener's read buffer.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// The longest a request body may go without a byte arriving, in milliseconds; then the
    /// host answers 408 and closes the connection.
    #[serde(default = "default_body_read_timeout_ms")]
    pub body_read_timeout_ms: u64,
    /// How long in-flight requests may take to finish after SIGINT/SIGTERM.
    #[serde(default = "default_drain_ms")]
    pub drain_ms: u64,
    /// Where compiled components are kept, shared by every data directory (see
    /// `pooler serve --help`); `None`: `$POOLER_CACHE_DIR`, else the platform's cache
    /// directory.
    #[serde(default)]
    pub compile_cache: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            max_body_bytes: default_max_body(),
            max_headers: default_max_headers(),
            max_header_bytes: default_max_header_bytes(),
            body_read_timeout_ms: default_body_read_timeout_ms(),
            drain_ms: default_drain_ms(),
            compile_cache: None,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8787))
}
fn default_max_body() -> u64 {
    32 << 20
}
fn default_max_headers() -> usize {
    100
}
fn default_max_header_bytes() -> usize {
    64 << 10
}
fn default_body_read_timeout_ms() -> u64 {
    10_000
}
fn default_drain_ms() -> u64 {
    10_000
}

/// Where a role's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource {
    /// The component built into the binary (none for a role without an embedded default).
    Embedded,
    /// A component file.
    File(PathBuf),
    /// No plugin fills the role (e.g. run the pool without Provider Retry).
    None,
}

impl<'de> Deserialize<'de> for ComponentSource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "embedded" => ComponentSource::Embedded,
            "none" => ComponentSource::None,
            "" => return Err(serde::de::Error::custom("component path is empty")),
            path => ComponentSource::File(PathBuf::from(path)),
        })
    }
}

/// The hosts the account-pool role may reach when its table names none: the Anthropic API
/// and OAuth token endpoint, the ChatGPT (Codex) backend and the OpenAI token endpoint.
pub const DEFAULT_POOL_HOSTS: [&str; 4] = [
    "api.anthropic.com",
    "console.anthropic.com",
    "chatgpt.com",
    "auth.openai.com",
];

/// `[plugins.<role>]`: one plugin's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PluginConfig {
    /// The component: `embedded` (the default), `none`, or a path to a component file.
    #[serde(default = "default_component")]
    pub component: ComponentSource,
    /// Where the plugin may send HTTP requests: `host` (https on 443; a loopback host on
    /// any port, http or https), `host:port` (https; http too on loopback) or
    /// `https://host[:port]` / `http://host[:port]` (plain http only to loopback); see
    /// [`crate::runtime::imports::http_out::allow::parse_entry`]. Default: the real
    /// provider endpoints for the account-pool role ([`DEFAULT_POOL_HOSTS`]), none for
    /// other roles. The origins of URL settings a person sets through the admin API are
    /// added.
    #[serde(default)]
    pub allowed_hosts: Option<Vec<String>>,
    /// The longest a call into the plugin may run (CPU time for HTTP requests, which may
    /// stream for long while waiting on upstream; wall time for other calls).
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u64,
    /// The plugin's memory cap per instance.
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    /// How long the body of a non-2xx answer to the plugin's outgoing HTTP request may go
    /// without a byte before it fails (the guest's own between-bytes timeout, if shorter,
    /// still applies). Such a body is a short error document that comes with its head; one
    /// that stalls must not hold the plugin for the long limit a model's stream needs.
    #[serde(default = "default_error_body_timeout_ms")]
    pub error_body_timeout_ms: u64,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            component: default_component(),
            allowed_hosts: None,
            deadline_ms: default_deadline_ms(),
            memory_mib: default_memory_mib(),
            error_body_timeout_ms: default_error_body_timeout_ms(),
        }
    }
}

fn default_component() -> ComponentSource {
    ComponentSource::Embedded
}
fn default_deadline_ms() -> u64 {
    10_000
}
fn default_memory_mib() -> u64 {
    64
}
fn default_error_body_timeout_ms() -> u64 {
    10_000
}

/// `[maintenance]`: the host-driven periodic calls.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MaintenanceConfig {
    /// Seconds between calls to the pool's `maintenance.on-tick` (0: never).
    #[serde(default = "default_interval_s")]
    pub interval_s: u64,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval_s: default_interval_s(),
        }
    }
}

fn default_interval_s() -> u64 {
    10
}

impl Config {
    /// Parse a configuration from TOML text.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let config: Config =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        config.validate()?;
        Ok(config)
    }

    /// Read and parse a configuration file; a missing file is an error.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
        Config::parse(&text)
            .with_context(|| format!("invalid configuration file {}", path.display()))
    }

    /// The settings of `role` (defaults when the file has no table for it).
    pub fn plugin(&self, role: Role) -> PluginConfig {
        self.plugins.get(role.name()).cloned().unwrap_or_default()
    }

    /// The claim lease the core uses: `core.claim-lease-s`, but at least twice the
    /// provider-retry plugin's deadline (its `before-dispatch` is what a claim waits for).
    pub fn claim_lease(&self) -> std::time::Duration {
        let configured = std::time::Duration::from_secs(self.core.claim_lease_s);
        let gate = std::time::Duration::from_millis(
            self.plugin(Role::ProviderRetry)
                .deadline_ms
                .saturating_mul(2),
        );
        configured.max(gate)
    }

    /// The hosts `role` may reach per the configuration (before any admin grant).
    pub fn allowed_hosts(&self, role: Role) -> Vec<String> {
        match self.plugin(role).allowed_hosts {
            Some(hosts) => hosts,
            None if role == Role::AccountPool => {
                DEFAULT_POOL_HOSTS.iter().map(|h| h.to_string()).collect()
            }
            None => Vec::new(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        for (name, plugin) in &self.plugins {
            if Role::from_name(name).is_none() {
                bail!(
                    "unknown plugin role `{name}` in [plugins] (known roles: {})",
                    Role::ALL.map(Role::name).join(", ")
                );
            }
            if plugin.memory_mib == 0 || plugin.memory_mib > 4096 {
                bail!("plugins.{name}.memory-mib must be between 1 and 4096");
            }
            if plugin.deadline_ms == 0 {
                bail!("plugins.{name}.deadline-ms must be positive");
            }
            if plugin.error_body_timeout_ms == 0 {
                bail!("plugins.{name}.error-body-timeout-ms must be positive");
            }
            for host in plugin.allowed_hosts.iter().flatten() {
                if let Err(e) = crate::runtime::imports::http_out::allow::parse_entry(host) {
                    bail!("plugins.{name}.allowed-hosts: {e}");
                }
            }
        }
        if self.core.concurrency_limit == Some(0) {
            bail!("core.concurrency-limit must be at least 1");
        }
        if self.core.retention.prune_batch == 0 {
            bail!("core.retention.prune-batch must be at least 1");
        }
        if self.core.claim_lease_s == 0 {
            bail!("core.claim-lease-s must be positive");
        }
        if self.core.turn_idle_timeout_s == 0 {
            bail!("core.turn-idle-timeout-s must be positive");
        }
        if self.server.max_body_bytes == 0 {
            bail!("server.max-body-bytes must be positive");
        }
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&self.server.max_header_bytes) {
            bail!("server.max-header-bytes must be from {MIN_HEADER_BYTES} to {MAX_HEADER_BYTES}");
        }
        if self.server.body_read_timeout_ms == 0 {
            bail!("server.body-read-timeout-ms must be positive");
        }
        if self.agents.turn_time_limit_s == 0 {
            bail!("agents.turn-time-limit-s must be positive");
        }
        self.alerts.validate()?;
        for (key, path) in [
            ("claude-code", &self.agents.claude_code),
            ("codex", &self.agents.codex),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                bail!("agents.{key} is empty: give the path of the binary, or leave it out");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.server.listen, default_listen());
        assert_eq!(config.server.max_body_bytes, 32 << 20);
        let pool = config.plugin(Role::AccountPool);
        assert_eq!(pool.component, ComponentSource::Embedded);
        assert!(pool.allowed_hosts.is_none());
        assert_eq!(
            config.allowed_hosts(Role::AccountPool),
            DEFAULT_POOL_HOSTS.map(String::from)
        );
        assert!(config.allowed_hosts(Role::ProviderRetry).is_empty());
        assert_eq!(pool.memory_mib, 64);
        assert_eq!(pool.error_body_timeout_ms, 10_000);
    }

    #[test]
    fn a_plugin_s_limits_must_be_positive() {
        for key in ["deadline-ms", "error-body-timeout-ms", "memory-mib"] {
            let err = Config::parse(&format!("[plugins.account-pool]\n{key} = 0\n")).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("plugins.account-pool.{key}")),
                "{key}: {err}"
            );
        }
        let config =
            Config::parse("[plugins.account-pool]\nerror-body-timeout-ms = 250\n").unwrap();
        assert_eq!(config.plugin(Role::AccountPool).error_body_timeout_ms, 250);
    }

    /// The head cap and the body's read timeout are `[server]` settings, validated by name.
    #[test]
    fn the_head_cap_and_body_timeout_are_server_settings() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.server.max_header_bytes, 64 << 10);
        assert_eq!(config.server.body_read_timeout_ms, 10_000);
        let config =
            Config::parse("[server]\nmax-header-bytes = 8192\nbody-read-timeout-ms = 250\n")
                .unwrap();
        assert_eq!(
            (
                config.server.max_header_bytes,
                config.server.body_read_timeout_ms
            ),
            (8192, 250)
        );
        for bad in [
            "max-header-bytes = 8191",
            "max-header-bytes = 1048577",
            "body-read-timeout-ms = 0",
        ] {
            let key = bad.split(' ').next().unwrap();
            let err = Config::parse(&format!("[server]\n{bad}\n")).unwrap_err();
            assert!(format!("{err:#}").contains(key), "{bad}: {err:#}");
        }
    }

    #[test]
    fn the_compile_cache_is_a_server_setting() {
        assert_eq!(Config::parse("").unwrap().server.compile_cache, None);
        let config = Config::parse("[server]\ncompile-cache = \"/var/cache/pooler\"\n").unwrap();
        assert_eq!(
            config.server.compile_cache.as_deref(),
            Some(std::path::Path::new("/var/cache/pooler"))
        );
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = Config::parse("[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
        let err = Config::parse("[plugins.account-pool]\ndeadline = 3\n").unwrap_err();
        assert!(err.to_string().contains("deadline"), "{err}");
        let err = Config::parse("[plugins.acount-pool]\n").unwrap_err();
        assert!(err.to_string().contains("acount-pool"), "{err}");
    }

    #[test]
    fn the_agents_table_names_binaries_and_a_positive_time_limit() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.agents.turn_time_limit_s, 1800);
        assert_eq!(config.agents.claude_code, None);
        let config =
            Config::parse("[agents]\nclaude-code = \"/opt/claude\"\nturn-time-limit-s = 60\n")
                .unwrap();
        assert_eq!(
            config.agents.claude_code,
            Some(PathBuf::from("/opt/claude"))
        );
        assert_eq!(config.agents.turn_time_limit_s, 60);
        for bad in ["turn-time-limit-s = 0", "codex = \"\"", "claud = \"x\""] {
            let err = Config::parse(&format!("[agents]\n{bad}\n")).unwrap_err();
            assert!(
                err.to_string().contains("agents") || err.to_string().contains("claud"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn retention_and_the_claim_lease_have_defaults_and_are_checked() {
        let config = Config::parse("").unwrap();
        let retention = config.core.retention.retention();
        assert_eq!(retention, pooler_core::retention::Retention::default());
        assert_eq!(config.core.retention.prune_interval_s, 60);
        assert_eq!(config.claim_lease(), std::time::Duration::from_secs(300));

        let config = Config::parse(
            "[core]\nclaim-lease-s = 1\n[core.retention]\nhistory-days = 0\noutbox-days = 2\nprune-batch = 7\n",
        )
        .unwrap();
        let retention = config.core.retention.retention();
        assert_eq!(retention.history, None, "0 keeps forever");
        assert_eq!(
            retention.outbox,
            Some(std::time::Duration::from_secs(2 * 86_400))
        );
        assert_eq!(retention.batch, 7);
        // A lease shorter than the gate's deadline would void a running gate's claim.
        assert_eq!(config.claim_lease(), std::time::Duration::from_secs(20));

        for (toml, key) in [
            ("[core]\nclaim-lease-s = 0\n", "claim-lease-s"),
            ("[core.retention]\nprune-batch = 0\n", "prune-batch"),
            ("[core.retention]\nhistory-day = 3\n", "history-day"),
        ] {
            let err = Config::parse(toml).unwrap_err();
            assert!(format!("{err:#}").contains(key), "{toml}: {err:#}");
        }
    }

    #[test]
    fn the_alerts_table_is_checked_by_name_and_hides_the_webhook_path() {
        let config = Config::parse("").unwrap();
        assert!(!config.alerts.delivers());
        assert_eq!(config.alerts.coalesce_s, 30);
        let config = Config::parse(
            "[alerts]\nwebhook = \"https://hooks.example/services/T0/B0/SECRETPART\"\nformat = \"slack\"\ncommand = [\"apprise\", \"-t\", \"{title}\"]\ncoalesce-s = 0\n",
        )
        .unwrap();
        assert!(config.alerts.delivers());
        assert_eq!(
            config.alerts.format,
            crate::mediation::alerts::format::Format::Slack
        );
        let shown = config.alerts.webhook_shown().unwrap();
        assert!(!shown.contains("SECRETPART"), "{shown}");
        assert_eq!(
            config.alerts.allowed_hosts(),
            vec!["https://hooks.example:443"]
        );
        for (bad, named) in [
            (
                "webhook = \"http://example.com/SECRETPART\"",
                "alerts.webhook",
            ),
            ("webhook = \"not a url SECRETPART\"", "alerts.webhook"),
            ("command = []", "alerts.command"),
            ("command = [\"x\", \"{tittle}\"]", "tittle"),
            ("format = \"teams\"", "teams"),
            ("command-timeout-s = 0", "command-timeout-s"),
            ("webhok = \"x\"", "webhok"),
        ] {
            let err = format!(
                "{:#}",
                Config::parse(&format!("[alerts]\n{bad}\n")).unwrap_err()
            );
            assert!(err.contains(named), "{bad}: {err}");
            assert!(!err.contains("SECRETPART"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_role_can_point_at_a_file() {
        let config = Config::parse(
            "[plugins.provider-retry]\ncomponent = \"/x/retry.wasm\"\nallowed-hosts = [\"127.0.0.1\"]\n",
        )
        .unwrap();
        let retry = config.plugin(Role::ProviderRetry);
        assert_eq!(
            retry.component,
            ComponentSource::File("/x/retry.wasm".into())
        );
        assert_eq!(retry.allowed_hosts, Some(vec!["127.0.0.1".to_string()]));
    }
}
