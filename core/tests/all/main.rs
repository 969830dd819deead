//! The core driven through its public API: the queue, turns and the agent driver. One
//! binary, a module per area, the shared harness in `common`.

mod common;

mod driver;
mod queue;
mod turns;
