//! Where conversations were served, against where the pool keeps them. After each served
//! request the account that served it (the provider model knows) is compared with the
//! conversation's pin as the pool last explained it; when they differ, the pool is asked
//! again (`routing.explain-session`, as `pooler session explain` asks): a pin that now
//! names the serving account is a **re-pin** (the conversation moved), one that still
//! names the old account is a **detour**. Asking only when they differ keeps the
//! measurement off the request path.
//!
//! A conversation idle past the pin lifetime starts afresh: its next pin is not a move.

use std::collections::HashMap;
use std::sync::Mutex;

use pooler_host::runtime::Host;
use pooler_host::runtime::bindings::types::Provider as WitProvider;

use crate::calls;

/// How a served request stood to its conversation's pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// On the pinned account (or the first request of a conversation).
    Home,
    /// On another account; the pin stayed.
    Detour,
    /// On another account, which is now the pin.
    Repin,
}

struct Conversation {
    pin: Option<String>,
    last: u64,
}

/// See the module docs.
pub struct Pins {
    ids: Vec<String>,
    lifetime_ms: u64,
    conversations: Mutex<HashMap<String, Conversation>>,
    /// (when, served how, conversation, account index).
    events: Mutex<Vec<(u64, Served, String, usize)>>,
}

impl Pins {
    /// `ids`: the pool's account id of each model account, by index.
    pub fn new(ids: Vec<String>, lifetime_ms: u64) -> Self {
        Pins {
            ids,
            lifetime_ms,
            conversations: Mutex::new(HashMap::new()),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Account `served` (model index) served a request of `session` at `now`.
    pub async fn served(
        &self,
        host: &Host,
        provider: WitProvider,
        session: &str,
        served: usize,
        now: u64,
    ) {
        let id = &self.ids[served];
        let known = {
            let mut conversations = self.conversations.lock().unwrap_or_else(|e| e.into_inner());
            let c = conversations
                .entry(session.to_owned())
                .or_insert(Conversation {
                    pin: None,
                    last: now,
                });
            let fresh = c.pin.is_none() || now.saturating_sub(c.last) > self.lifetime_ms;
            c.last = now;
            if fresh {
                c.pin = None;
            }
            c.pin.clone()
        };
        let how = match known {
            Some(pin) if &pin == id => Served::Home,
            known => {
                let pin = calls::pinned(host, provider, session).await.ok().flatten();
                let how = match (&known, &pin) {
                    (None, _) => Served::Home,
                    (Some(_), Some(p)) if p == id => Served::Repin,
                    _ => Served::Detour,
                };
                let mut conversations =
                    self.conversations.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = conversations.get_mut(session) {
                    c.pin = pin.or(known);
                }
                how
            }
        };
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push((
            now,
            how,
            session.to_owned(),
            served,
        ));
    }

    pub fn events(&self) -> Vec<(u64, Served, String, usize)> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
