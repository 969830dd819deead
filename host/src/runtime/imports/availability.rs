//! The `availability` import: "when can the pool serve this thread again?", asked by any
//! plugin that imports it (Provider Retry) and answered by the plugin in the account-pool
//! role, in a fresh instance of its own. The host's runtime is the
//! [`AvailabilitySource`]; this module only carries the call and the caller's id.

use std::pin::Pin;
use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

pub use crate::runtime::bindings::retry::pooler::plugins::availability::AvailabilityQuery;
use crate::runtime::bindings::retry::pooler::plugins::availability::{self, Host};
use crate::runtime::bindings::types::Availability;

/// Answers availability queries (the host runtime, which calls the pool).
pub trait AvailabilitySource: Send + Sync + 'static {
    /// Never fails: an unanswerable query is `unavailable(source-unavailable)`, and a host
    /// with no pool answers `not-routed`.
    fn query(
        &self,
        caller: Arc<str>,
        query: AvailabilityQuery,
    ) -> Pin<Box<dyn Future<Output = Availability> + Send>>;

    /// `query-many`: one answer per query, in order, under the same rules as `query`.
    fn query_many(
        &self,
        caller: Arc<str>,
        queries: Vec<AvailabilityQuery>,
    ) -> Pin<Box<dyn Future<Output = Vec<Availability>> + Send>>;
}

/// Per-instance state: the caller and who answers.
pub struct AvailabilityCtx {
    plugin: Arc<str>,
    source: Arc<dyn AvailabilitySource>,
}

impl AvailabilityCtx {
    /// The state of one instance of `plugin`, whose availability calls `source` answers.
    pub fn new(plugin: Arc<str>, source: Arc<dyn AvailabilitySource>) -> Self {
        AvailabilityCtx { plugin, source }
    }
}

struct AvailabilityImport;
impl HasData for AvailabilityImport {
    type Data<'a> = &'a mut AvailabilityCtx;
}

/// Add the `availability` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> &mut AvailabilityCtx,
) -> wasmtime::Result<()> {
    availability::add_to_linker::<T, AvailabilityImport>(linker, view)
}

impl Host for &mut AvailabilityCtx {
    async fn query(&mut self, query: AvailabilityQuery) -> wasmtime::Result<Availability> {
        Ok(self.source.query(self.plugin.clone(), query).await)
    }

    async fn query_many(
        &mut self,
        queries: Vec<AvailabilityQuery>,
    ) -> wasmtime::Result<Vec<Availability>> {
        Ok(self.source.query_many(self.plugin.clone(), queries).await)
    }
}
