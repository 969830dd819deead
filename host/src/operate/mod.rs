//! The operator's surface: the listener, the admin API, the incoming-HTTP driver, and what
//! they show (metrics, overview, timeline, logs).

pub mod admin;
pub mod components;
pub mod http_in;
pub mod logging;
pub mod metrics;
pub mod server;
pub mod tap;
pub mod timeline;
pub mod wire;
