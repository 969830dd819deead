//! The host's command-line tests run the real `pooler` binary through the shared test
//! support's harness ([`pooler_tests::served`]), which this names the binary for, and use its
//! blocking raw-socket fakes.

// Each test file uses part of this module.
#![allow(dead_code)]

pub use pooler_tests::served::{
    add_api_key, add_api_key_with, core_db, databases_intact, eventually, integrity_check,
    plugin_db, read_only, text,
};

/// This package's `pooler` binary.
pub struct Pooler;

impl pooler_tests::served::Binary for Pooler {
    const PATH: &'static str = env!("CARGO_BIN_EXE_pooler");
}

/// A running `pooler serve` of this package's binary.
pub type Served = pooler_tests::served::Served<Pooler>;
/// A killed or stopped one, kept for a restart.
pub type Stopped = pooler_tests::served::Stopped<Pooler>;

/// The blocking raw-socket helpers the fakes and requests of these tests use: the shared
/// test support's, which every test crate reaches.
pub use pooler_tests::raw::blocking::{
    RawRequest, claude_refusal, http, rate_limited_claude, read_request, receiver, serve_each,
    strict_claude, write_rate_limited,
};
