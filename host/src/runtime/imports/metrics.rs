//! The `metrics` import: a plugin's counters and histograms go to the host's [`Registry`],
//! served at `GET /metrics`. A call that breaks the
//! interface's rules is dropped, and logged once per name as a warning naming the plugin;
//! the guest never sees an error.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::operate::metrics::{Refused, Registry};
use crate::runtime::bindings::pool::pooler::plugins::metrics::{self, Host};

/// Per-instance state: who is reporting, and where to.
pub struct MetricsCtx {
    plugin: Arc<str>,
    registry: Arc<Registry>,
}

impl MetricsCtx {
    /// The state of one instance of `plugin`, reporting into `registry`.
    pub fn new(plugin: Arc<str>, registry: Arc<Registry>) -> Self {
        MetricsCtx { plugin, registry }
    }

    fn help(&self) -> String {
        format!("Reported by the {} plugin.", self.plugin)
    }

    fn refused(&self, result: Result<(), Refused>) {
        if let Err(refused) = result
            && self.registry.first_refusal(&refused.name)
        {
            tracing::warn!(
                plugin = &*self.plugin,
                metric = %refused.name,
                why = %refused.why,
                "metric dropped (said once per name)"
            );
        }
    }
}

struct MetricsImport;
impl HasData for MetricsImport {
    type Data<'a> = &'a mut MetricsCtx;
}

/// Add the `metrics` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> &mut MetricsCtx,
) -> wasmtime::Result<()> {
    metrics::add_to_linker::<T, MetricsImport>(linker, view)
}

impl Host for &mut MetricsCtx {
    fn counter_add(
        &mut self,
        name: String,
        labels: Vec<(String, String)>,
        delta: u64,
    ) -> wasmtime::Result<()> {
        let result = self
            .registry
            .counter_add(&name, &self.help(), &labels, delta);
        self.refused(result);
        Ok(())
    }

    fn observe(
        &mut self,
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> wasmtime::Result<()> {
        let result = self.registry.observe(&name, &self.help(), &labels, value);
        self.refused(result);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugins_metrics_reach_the_registry_and_a_bad_call_is_dropped() {
        let registry = Arc::new(Registry::new());
        let mut ctx = MetricsCtx::new(Arc::from("account-pool"), registry.clone());
        let mut host = &mut ctx;
        host.counter_add(
            "pooler_pool_requests_total".into(),
            vec![("provider".into(), "claude".into())],
            2,
        )
        .unwrap();
        host.counter_add("bad name".into(), vec![], 1).unwrap();
        host.observe("pooler_pool_added_latency_seconds".into(), vec![], 0.2)
            .unwrap();
        assert_eq!(
            registry.counter("pooler_pool_requests_total", &[("provider", "claude")]),
            2
        );
        let text = registry.render(&[]);
        assert!(
            text.contains("# HELP pooler_pool_requests_total Reported by the account-pool plugin.")
        );
        assert!(
            text.contains("pooler_pool_added_latency_seconds_count 1"),
            "{text}"
        );
        assert!(!text.contains("bad name"));
        // The refusal was logged once; a second one is not.
        assert!(!registry.first_refusal("bad name"));
    }
}
