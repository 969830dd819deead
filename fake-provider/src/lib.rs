//! The strict fake provider, shared by the integration tests and the week simulator:
//!
//! - [`contract`]: what the real Anthropic Messages API and ChatGPT Codex backend refuse
//!   (each rule says whether it is observed, documented or assumed), and replies shaped like
//!   their answers (error envelopes, unified rate-limit headers, SSE streams);
//! - [`server`]: a real HTTP/1.1 server on 127.0.0.1 that answers from a script or a
//!   responder, enforcing a contract first when asked to.

pub mod contract;
pub mod server;
