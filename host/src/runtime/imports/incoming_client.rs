//! The `incoming-client` import: whether the client of the HTTP request an instance is
//! handling is still there. wasi:http 0.2 gives a handler no way to learn that its client
//! left before it set the response head, so the host says so here: the server
//! ([`crate::operate::server`]) holds a [`ClientGone`] for each request it hands to the pool and
//! raises it when the request lets go of the guest's call unfinished (the connection
//! closed); the request's store watches it through an [`IncomingClientCtx`]. Stores of
//! every other call watch nothing: their pollables never become ready, `gone` is false.

use tokio::sync::watch;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

use crate::runtime::bindings::pool::pooler::plugins::incoming_client::{self, Host};

/// Raised, once, when the client of one incoming request has gone. Held by the request's
/// side of the server; [`ClientGone::watch`] gives the store's side.
#[derive(Debug)]
pub struct ClientGone(watch::Sender<bool>);

impl ClientGone {
    /// A client that has not gone yet.
    pub fn new() -> Self {
        ClientGone(watch::Sender::new(false))
    }

    /// The client went away: every watcher sees it from now on.
    pub fn raise(&self) {
        self.0.send_replace(true);
    }

    /// Whether [`ClientGone::raise`] was called.
    pub fn raised(&self) -> bool {
        *self.0.borrow()
    }

    /// A store's view of this request's client.
    pub fn watch(&self) -> IncomingClientCtx {
        IncomingClientCtx(Some(self.0.subscribe()))
    }
}

impl Default for ClientGone {
    fn default() -> Self {
        Self::new()
    }
}

/// Per-instance state: the client of the incoming request this store handles, if it
/// handles one.
#[derive(Debug)]
pub struct IncomingClientCtx(Option<watch::Receiver<bool>>);

impl IncomingClientCtx {
    /// A store that handles no incoming request (a plugin call): its client never goes.
    pub fn none() -> Self {
        IncomingClientCtx(None)
    }

    /// Whether the client has gone.
    pub(crate) fn gone(&self) -> bool {
        self.0.as_ref().is_some_and(|rx| *rx.borrow())
    }
}

/// What the `incoming-client` `Host` trait is implemented on.
pub struct IncomingClientView<'a> {
    /// The request's watch on its client (none outside a request).
    pub ctx: &'a IncomingClientCtx,
    /// The store's resource table, where subscribed pollables live.
    pub table: &'a mut ResourceTable,
}

struct IncomingClientImport;
impl HasData for IncomingClientImport {
    type Data<'a> = IncomingClientView<'a>;
}

/// Add the `incoming-client` import to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> IncomingClientView<'_>,
) -> wasmtime::Result<()> {
    incoming_client::add_to_linker::<T, IncomingClientImport>(linker, view)
}

/// A pollable that is ready once the client has gone; never, for a store with no client
/// or once the request's side let go without raising it (the call ended first).
struct Gone(Option<watch::Receiver<bool>>);

#[async_trait::async_trait]
impl Pollable for Gone {
    async fn ready(&mut self) {
        if let Some(rx) = self.0.as_mut()
            && rx.wait_for(|gone| *gone).await.is_ok()
        {
            return;
        }
        std::future::pending::<()>().await;
    }
}

impl Host for IncomingClientView<'_> {
    fn subscribe_gone(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let gone = self.table.push(Gone(self.ctx.0.clone()))?;
        subscribe(self.table, gone)
    }

    fn gone(&mut self) -> wasmtime::Result<bool> {
        Ok(self.ctx.gone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Waker};

    /// Whether `pollable` is ready now (one poll, nothing awaited).
    fn ready_now(pollable: &mut Gone) -> bool {
        let mut ready = std::pin::pin!(pollable.ready());
        ready
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    #[test]
    fn a_watcher_sees_the_client_go_and_a_store_without_one_never_does() {
        let client = ClientGone::new();
        let ctx = client.watch();
        let mut pollable = Gone(ctx.0.clone());
        assert!(!ctx.gone());
        assert!(!ready_now(&mut pollable), "not while the client is there");
        client.raise();
        assert!(ctx.gone() && client.raised());
        assert!(ready_now(&mut pollable), "ready once the client went");
        // Ready stays ready, even after the request's side let go.
        drop(client);
        assert!(ready_now(&mut pollable) && ctx.gone());

        let none = IncomingClientCtx::none();
        assert!(!none.gone());
        assert!(!ready_now(&mut Gone(None)));
        // A request whose call ended lets go without raising: its pollables never resolve.
        let ended = ClientGone::new();
        let mut after = Gone(ended.watch().0);
        drop(ended);
        assert!(!ready_now(&mut after));
    }
}
