//! The core that the reference host plays for the plugins: threads, turn requests, the
//! durable retry queue, the plugin-event outbox, failure classification and the turn driver.
//! Plain Rust over rusqlite and hyper; no WebAssembly here. The host wires it to plugins.

pub mod clock;
