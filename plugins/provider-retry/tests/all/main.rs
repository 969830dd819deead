//! Provider Retry's engine driven through its public API against an in-memory core: the
//! spec's scenarios, batched passes, observability. One binary, a module per area, the
//! shared harness in `common`.

mod common;

mod batched_pass;
mod observe;
mod scenarios;
