//! The week simulator: the real `pooler` host library with its embedded Account Pooler and
//! Provider Retry and the real core, driven through days of agent work on a virtual clock
//! against a stateful model of the providers, to measure how well a pool of accounts is
//! spent. Only the provider ([`model`]) and the agents ([`agent`]) are modelled; every
//! decision — routing, pins, failover, retries, re-evaluation, dispatch — is the product's.
//!
//! - [`scenario`]: the scenario files;
//! - [`workload`]: each thread's tasks and requests, drawn up front;
//! - [`model`]: accounts, windows, headers, 429s, incidents, OAuth; and the oracle;
//! - [`agent`]: Claude Code and Codex CLI as in-process launchers of the core;
//! - [`ledger`], [`pins`]: what threads did and where conversations were served;
//! - [`run`]: one scenario under one variant; [`report`]: the figures, table, JSON, HTML.

pub mod agent;
pub mod calls;
pub mod ledger;
pub mod model;
pub mod pins;
pub mod report;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod workload;
