//! Mediation between plugins: what passes from one plugin to another goes through the host.

pub mod alerts;
pub mod core_link;
pub(crate) mod maintenance;
pub mod mediator;
