//! The `pooler` binary and the host library driven from outside: the CLI, crash safety,
//! secrets. One binary, a module per area, the shared harness in `support`.

mod support;

mod cli;
mod cli_accounts;
mod cli_alerts;
mod cli_cache;
mod cli_components;
mod cli_data_dir;
mod cli_pool;
mod cli_retry;
mod cli_serve_lock;
mod cli_status;
mod cli_thread;
mod core_kill;
mod crash;
mod crash_pass;
mod secrets;
