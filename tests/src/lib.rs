//! Support for the host's integration tests (and later the plugins' scenario tests): the
//! fixture components, a test host on a manual clock with a temporary data directory, a
//! scripted fake upstream HTTP server on 127.0.0.1, a small HTTP client, a fake `threads`
//! service and a capture of the host's log lines.

pub mod agents;
pub mod bench;
pub mod client;
pub mod core;
pub mod exports;
pub mod harness;
pub mod logs;
pub mod pool;
pub mod raw;
pub mod served;
pub mod threads;
pub mod webdriver;

/// The strict fake provider's contracts and reply shapes (shared with the week simulator).
pub mod provider {
    pub use pooler_fake_provider::contract::*;
}

/// The scripted fake upstream server (shared with the week simulator).
pub mod upstream {
    pub use pooler_fake_provider::server::*;
}

/// Paths of the fixture components built by `build.rs`.
pub mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));
}
