//! The `availability-listener` import: the pool's "my availability may have changed"
//! signal. The call only records the change in the calling instance, coalesced per provider;
//! when the instance's store is dropped — after the plugin's call has returned — the changes
//! go to the host's [`ChangeSink`], which delivers them to every listener. So the host never
//! calls into a plugin from inside that plugin's own call.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::bindings::pool::pooler::plugins::availability_listener::{self, Host};
use crate::bindings::types::{AvailabilityChange, PluginError};

/// Receives the changes a finished call signalled (the host's delivery queue).
pub trait ChangeSink: Send + Sync + 'static {
    fn enqueue(&self, from: &str, changes: Vec<AvailabilityChange>);
}

/// Merge `change` into `pending`: one entry per provider, causes unioned in first-seen
/// order, the first detection time kept, the newest `earliest` hint kept.
pub fn coalesce(pending: &mut Vec<AvailabilityChange>, change: AvailabilityChange) -> bool {
    match pending.iter_mut().find(|p| p.provider == change.provider) {
        Some(existing) => {
            for cause in change.causes {
                if !existing.causes.contains(&cause) {
                    existing.causes.push(cause);
                }
            }
            existing.earliest = change.earliest;
            existing.detected_at = existing.detected_at.min(change.detected_at);
            false
        }
        None => {
            let mut change = change;
            let mut seen = Vec::with_capacity(change.causes.len());
            change.causes.retain(|c| {
                let first = !seen.contains(c);
                seen.push(*c);
                first
            });
            pending.push(change);
            true
        }
    }
}

/// Per-instance state: the changes signalled so far by this call.
pub struct ListenerCtx {
    plugin: Arc<str>,
    pending: Vec<AvailabilityChange>,
    sink: Arc<dyn ChangeSink>,
}

impl ListenerCtx {
    pub fn new(plugin: Arc<str>, sink: Arc<dyn ChangeSink>) -> Self {
        ListenerCtx {
            plugin,
            pending: Vec::new(),
            sink,
        }
    }
}

impl Drop for ListenerCtx {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            self.sink
                .enqueue(&self.plugin, std::mem::take(&mut self.pending));
        }
    }
}

struct ListenerImport;
impl HasData for ListenerImport {
    type Data<'a> = &'a mut ListenerCtx;
}

/// Add the `availability-listener` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> &mut ListenerCtx,
) -> wasmtime::Result<()> {
    availability_listener::add_to_linker::<T, ListenerImport>(linker, view)
}

impl Host for &mut ListenerCtx {
    fn availability_changed(
        &mut self,
        change: AvailabilityChange,
    ) -> wasmtime::Result<Result<(), PluginError>> {
        tracing::info!(plugin = &*self.plugin, provider = ?change.provider, causes = ?change.causes, "availability change signalled");
        coalesce(&mut self.pending, change);
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::types::{Availability, ChangeCause, Provider};

    fn change(provider: Provider, causes: &[ChangeCause], at: u64) -> AvailabilityChange {
        AvailabilityChange {
            provider,
            causes: causes.to_vec(),
            earliest: Availability::Ready,
            detected_at: at,
        }
    }

    #[test]
    fn changes_coalesce_per_provider_in_first_seen_order() {
        use ChangeCause::*;
        let mut pending = Vec::new();
        assert!(coalesce(
            &mut pending,
            change(Provider::Claude, &[AccountAdded, AccountAdded], 5)
        ));
        assert!(coalesce(
            &mut pending,
            change(Provider::Codex, &[ErrorSet], 6)
        ));
        assert!(!coalesce(
            &mut pending,
            change(Provider::Claude, &[HoldEnded, AccountAdded], 7)
        ));
        assert_eq!(pending.len(), 2);
        assert_eq!(pending[0].causes, vec![AccountAdded, HoldEnded]);
        assert_eq!(pending[0].detected_at, 5);
        assert_eq!(pending[1].causes, vec![ErrorSet]);
    }
}
