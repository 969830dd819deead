//! The `availability-listener` import: the pool's "my availability may have changed"
//! signal. The call only records the change in the calling instance, coalesced per provider;
//! when the instance's store is dropped — after the plugin's call has returned — the changes
//! go to the host's [`ChangeSink`], which delivers them to every listener. So the host never
//! calls into a plugin from inside that plugin's own call.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};

use crate::runtime::bindings::pool::pooler::plugins::availability_listener::{self, Host};
use crate::runtime::bindings::types::{AvailabilityChange, PluginError};

/// Receives the changes a finished call signalled (the host's delivery queue).
pub trait ChangeSink: Send + Sync + 'static {
    /// Queue the `changes` `from` signalled, for delivery after its call returned.
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
            // `seen` holds each cause once: however long the list a plugin sends, the work
            // per element is bounded by the number of distinct causes.
            let mut seen = Vec::new();
            change.causes.retain(|c| {
                let first = !seen.contains(c);
                if first {
                    seen.push(*c);
                }
                first
            });
            pending.push(change);
            true
        }
    }
}

/// How many signals of one call are logged one by one; the rest are still coalesced (so
/// none is lost: each provider's change is delivered once per call whatever the count), with
/// one warning instead of a line each.
pub const MAX_SIGNALS_LOGGED: u32 = 16;

/// Per-instance state: the changes signalled so far by this call.
pub struct ListenerCtx {
    plugin: Arc<str>,
    pending: Vec<AvailabilityChange>,
    sink: Arc<dyn ChangeSink>,
    signals: u32,
}

impl ListenerCtx {
    /// The state of one instance of `plugin`: its signals go to `sink` when the instance ends.
    pub fn new(plugin: Arc<str>, sink: Arc<dyn ChangeSink>) -> Self {
        ListenerCtx {
            plugin,
            pending: Vec::new(),
            sink,
            signals: 0,
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
        self.signals = self.signals.saturating_add(1);
        if self.signals <= MAX_SIGNALS_LOGGED {
            tracing::info!(plugin = &*self.plugin, provider = ?change.provider, causes = ?change.causes, detected_at = change.detected_at, "availability change signalled");
        } else if self.signals == MAX_SIGNALS_LOGGED + 1 {
            tracing::warn!(
                plugin = &*self.plugin,
                limit = MAX_SIGNALS_LOGGED,
                rule = "at most 16 availability signals of one call are logged",
                "many availability signals in one call: the rest are coalesced without a line each"
            );
        }
        coalesce(&mut self.pending, change);
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::bindings::types::{Availability, ChangeCause, Provider};

    fn change(provider: Provider, causes: &[ChangeCause], at: u64) -> AvailabilityChange {
        AvailabilityChange {
            provider,
            causes: causes.to_vec(),
            earliest: Availability::Ready,
            detected_at: at,
        }
    }

    /// A million copies of one cause: kept once, and in linear time (each element is
    /// compared with the distinct causes seen, not with every earlier element).
    #[test]
    fn a_huge_list_of_causes_coalesces_in_linear_time() {
        use ChangeCause::*;
        let mut causes = vec![AccountAdded; 1_000_000];
        causes.push(HoldEnded);
        let started = std::time::Instant::now();
        let mut pending = Vec::new();
        coalesce(&mut pending, change(Provider::Claude, &causes, 1));
        coalesce(&mut pending, change(Provider::Claude, &causes, 2));
        assert_eq!(pending[0].causes, vec![AccountAdded, HoldEnded]);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
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

    mod properties {
        use super::super::*;
        use crate::runtime::bindings::types::{
            Availability, BlockCause, Blocked, ChangeCause, Provider, UnavailableReason,
        };
        use proptest::prelude::*;

        const CAUSES: [ChangeCause; 13] = [
            ChangeCause::AccountAdded,
            ChangeCause::AccountEnabled,
            ChangeCause::AccountDisabled,
            ChangeCause::AccountRemoved,
            ChangeCause::ErrorCleared,
            ChangeCause::ErrorSet,
            ChangeCause::HoldEnded,
            ChangeCause::ConfigChanged,
            ChangeCause::RoutingChanged,
            ChangeCause::PriorityChanged,
            ChangeCause::EarlierResetObserved,
            ChangeCause::LaterResetObserved,
            ChangeCause::ResetPassed,
        ];

        fn availability() -> impl Strategy<Value = Availability> {
            prop_oneof![
                Just(Availability::NotRouted),
                Just(Availability::Ready),
                any::<u64>().prop_map(|retry_at| Availability::Blocked(Blocked {
                    retry_at,
                    cause: BlockCause::Held
                })),
                Just(Availability::Unavailable(
                    UnavailableReason::SourceUnavailable
                )),
            ]
        }

        fn change() -> impl Strategy<Value = AvailabilityChange> {
            (
                any::<bool>(),
                proptest::collection::vec(0..CAUSES.len(), 0..40),
                availability(),
                any::<u64>(),
            )
                .prop_map(|(claude, causes, earliest, detected_at)| {
                    AvailabilityChange {
                        provider: if claude {
                            Provider::Claude
                        } else {
                            Provider::Codex
                        },
                        causes: causes.into_iter().map(|i| CAUSES[i]).collect(),
                        earliest,
                        detected_at,
                    }
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any sequence of signals a plugin may send in one call: at most one pending
            /// change per provider, each cause once, none of the causes sent lost, the
            /// earliest detection time kept.
            #[test]
            fn any_signals_coalesce_per_provider_without_loss(changes in proptest::collection::vec(change(), 0..64)) {
                let mut pending = Vec::new();
                for c in changes.clone() {
                    coalesce(&mut pending, c);
                }
                prop_assert!(pending.len() <= 2);
                for p in &pending {
                    let sent: Vec<&AvailabilityChange> = changes.iter().filter(|c| c.provider == p.provider).collect();
                    for c in &sent {
                        for cause in &c.causes {
                            prop_assert!(p.causes.contains(cause));
                        }
                    }
                    prop_assert_eq!(p.causes.iter().filter(|c| p.causes.iter().filter(|d| d == c).count() > 1).count(), 0);
                    prop_assert_eq!(p.detected_at, sent.iter().map(|c| c.detected_at).min().unwrap());
                }
            }
        }
    }
}
