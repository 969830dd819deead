//! The incoming-HTTP path (the outgoing one is [`crate::runtime::imports::http_out`]): each
//! request to the pool is handed to a fresh instance of the plugin in the account-pool role
//! (`wasi:http/incoming-handler`) and its response streamed back as the guest writes it, the
//! guest running in the request's own task. The host answers for itself
//! (`x-pooler-origin: pool`) when no pool is loaded or the guest fails before responding.
//! The listener is [`crate::operate::server`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::operate::wire::ORIGIN_HEADER;
use crate::runtime::imports::incoming_client::ClientGone;
use crate::runtime::{CallError, Host};

/// A response the host produced.
fn host_response(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<HyperOutgoingBody> {
    let mut response = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(ORIGIN_HEADER, HeaderValue::from_static("pool"));
    if let Ok(value) = HeaderValue::from_str(content_type) {
        headers.insert(CONTENT_TYPE, value);
    }
    response
}

pub(crate) fn error_response(status: StatusCode, message: &str) -> Response<HyperOutgoingBody> {
    let body = serde_json::json!({ "error": { "type": "pooler_error", "message": message } });
    host_response(status, "application/json", body.to_string())
}

/// A guest's call of `wasi:http/incoming-handler.handle`, on its own store.
type GuestCall = Pin<Box<dyn Future<Output = Result<(), CallError>> + Send>>;

/// How a guest's handling of a request first came to something.
enum Head {
    /// It set the response (or an error code) through its out-parameter.
    Set(
        Result<
            Response<HyperOutgoingBody>,
            wasmtime_wasi_http::p2::bindings::http::types::ErrorCode,
        >,
    ),
    /// It returned (or failed) without setting one.
    Finished(Result<(), CallError>),
}

/// A guest call that runs to its end even when the request lets go of it early (the
/// client went away): the rest then runs in a task of its own, as a guest always did, so
/// a guest is never cut off mid-call (an OAuth refresh whose answer is not yet stored, say);
/// only its deadline stops it. Letting go of it before the response ended also tells the
/// guest, through its `incoming-client` import, that its client is gone, so it can stop the
/// request's work (retries, waits, upstream calls) instead of finishing it for nobody.
struct RunToEnd {
    call: Option<GuestCall>,
    plugin: Arc<str>,
    /// What the guest's `incoming-client` import watches.
    client: ClientGone,
    /// The response body reached its end: letting go after that is not the client leaving.
    answered: bool,
}

impl RunToEnd {
    /// Drive the call; Ready once, with its result.
    fn poll_call(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), CallError>> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let done = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(done)
    }

    fn finished(&self) -> bool {
        self.call.is_none()
    }
}

impl Drop for RunToEnd {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        if !self.answered {
            // Before the rest of the call runs on, so the guest sees it at its next look.
            self.client.raise();
        }
        let plugin = self.plugin.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = call.await {
                    tracing::warn!(plugin = &*plugin, error = %e, "the pool failed after its client went away");
                }
            });
        }
    }
}

/// A response body the guest is still writing: each poll also drives the guest, so it
/// runs in the connection's task.
struct GuestDriven {
    body: HyperOutgoingBody,
    guest: RunToEnd,
}

impl Body for GuestDriven {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = self.as_mut().poll_guest_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            // The response ended (an error ends it too): hyper lets go of the body now.
            self.guest.answered = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.guest.finished() && self.body.is_end_stream()
    }
}

impl GuestDriven {
    /// The next frame of the body, driving the guest while it writes it.
    fn poll_guest_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, wasmtime_wasi_http::Error>>> {
        if self.guest.finished() {
            return Pin::new(&mut self.body).poll_frame(cx);
        }
        // While the guest runs, only it writes the body, and only inside this poll: so the
        // body is polled with a waker that does nothing (no self-wake when the guest writes;
        // see `handle`), and the guest, polled with this task's, wakes it for whatever
        // it waits on.
        let mut quiet = TaskContext::from_waker(std::task::Waker::noop());
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(&mut quiet) {
            return Poll::Ready(frame);
        }
        if let Poll::Ready(Err(e)) = self.guest.poll_call(cx) {
            // The head is sent; the client sees the body end where the guest stopped.
            tracing::warn!(plugin = &*self.guest.plugin, error = %e, "the pool failed while writing a response");
        }
        if self.guest.finished() {
            return Pin::new(&mut self.body).poll_frame(cx);
        }
        Pin::new(&mut self.body).poll_frame(&mut quiet)
    }
}

/// [`Host::handle_http`]: hand one HTTP request to a fresh instance of the pool and return
/// its response as soon as the guest sets it; the body streams while the guest keeps
/// writing.
pub(crate) async fn handle<B>(host: &Host, req: Request<B>) -> Response<HyperOutgoingBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<wasmtime_wasi_http::Error>,
{
    const CALL: &str = "wasi:http/incoming-handler.handle";
    let Some(plugin) = host.shared.pool.as_ref() else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "no plugin fills the account-pool role",
        );
    };
    let meta = plugin.meta.clone();
    let mut store = host.new_store(&meta);
    let client = ClientGone::new();
    store.data_mut().incoming_client = client.watch();
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let prepared = (|| -> wasmtime::Result<_> {
        let request = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, req)?;
        let out = store.data_mut().http().new_response_outparam(sender)?;
        Ok((request, out))
    })();
    let (request, out) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, &format!("{e:#}")),
    };
    let (pre, call_meta) = (plugin.pre.http.clone(), meta.clone());
    let guest: GuestCall = Box::pin(async move {
        let result = async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance
                .wasi_http_incoming_handler()
                .call_handle(&mut store, request, out)
                .await
        }
        .await;
        drop(store);
        result.map_err(|e| Host::call_error(&call_meta, CALL, e))
    });
    // The guest runs in this request's own task (no spawn, no hand-over between tasks):
    // here until it sets the response head, then inside the response body, which keeps
    // driving it while it writes the rest.
    let mut guest = RunToEnd {
        call: Some(guest),
        plugin: meta.id.clone(),
        client,
        answered: false,
    };
    // The head is set only while the guest runs, and it runs only inside the poll below:
    // so the receiver is looked at, never polled with this task's waker. A registered
    // waker would be woken by the guest's own `set` within this very poll, and tokio
    // answers such a self-wake by running the task once more after it goes idle,
    // handing it to the other worker (a futex wake and two context switches a request).
    let mut receiver = receiver;
    let head = std::future::poll_fn(|cx| {
        let done = guest.poll_call(cx);
        match (receiver.try_recv(), done) {
            (Ok(head), _) => Poll::Ready(Head::Set(head)),
            // Dropped unset: the guest is finishing (or failed); drive it to the end
            // to learn which.
            (Err(_), Poll::Pending) => Poll::Pending,
            (Err(_), Poll::Ready(done)) => Poll::Ready(Head::Finished(done)),
        }
    })
    .await;
    match head {
        Head::Set(Ok(response)) if guest.finished() => response,
        Head::Set(Ok(response)) => response.map(|body| GuestDriven { body, guest }.boxed_unsync()),
        Head::Set(Err(code)) => {
            tracing::warn!(plugin = &*meta.id, error = ?code, "the pool answered with an error code");
            error_response(
                StatusCode::BAD_GATEWAY,
                &format!("the pool failed the request: {code:?}"),
            )
        }
        Head::Finished(Ok(())) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("plugin `{}` returned without a response", meta.id),
        ),
        Head::Finished(Err(e)) => error_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A guest the request lets go of before it finished (its client went away) is not cut
    /// off: it runs on in a task of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guest_let_go_of_early_runs_to_its_end() {
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let call: GuestCall = Box::pin(async move {
            let _ = wait.await;
            let _ = done.send(());
            Ok(())
        });
        let mut guest = RunToEnd {
            call: Some(call),
            plugin: "account-pool".into(),
            client: ClientGone::new(),
            answered: false,
        };
        let waiting = std::future::poll_fn(|cx| Poll::Ready(guest.poll_call(cx).is_pending()));
        assert!(waiting.await, "the call waits for `go`");
        assert!(!guest.finished());
        drop(guest);
        let _ = go.send(());
        tokio::time::timeout(Duration::from_secs(10), finished)
            .await
            .expect("in time")
            .expect("the call ran to its end after it was let go of");
    }

    /// Letting go of an unfinished call before its response ended (the client went away)
    /// tells the guest: its `incoming-client` view reads gone, already when the rest of the
    /// call runs on. A call that finished, or whose response ended, is not told.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn letting_go_of_an_unfinished_call_tells_the_guest_its_client_is_gone() {
        let client = ClientGone::new();
        let view = client.watch();
        let in_call = client.watch();
        let (seen, saw) = tokio::sync::oneshot::channel();
        let guest = RunToEnd {
            call: Some(Box::pin(async move {
                let _ = seen.send(in_call.gone());
                Ok(())
            })),
            plugin: "account-pool".into(),
            client,
            answered: false,
        };
        assert!(!view.gone());
        drop(guest);
        assert!(view.gone(), "dropping the unfinished call raised the flag");
        let seen = tokio::time::timeout(Duration::from_secs(10), saw)
            .await
            .expect("in time")
            .expect("the call ran on");
        assert!(seen, "the rest of the call saw its client gone");

        // Finished before it was let go of: nobody left.
        let client = ClientGone::new();
        let view = client.watch();
        let mut guest = RunToEnd {
            call: Some(Box::pin(async { Ok(()) })),
            plugin: "account-pool".into(),
            client,
            answered: false,
        };
        let done = std::future::poll_fn(|cx| Poll::Ready(guest.poll_call(cx).is_ready()));
        assert!(done.await);
        drop(guest);
        assert!(!view.gone(), "a finished call is not told its client left");

        // The response ended, the call still finishing: hyper letting go is not a leave.
        let client = ClientGone::new();
        let view = client.watch();
        drop(RunToEnd {
            call: Some(Box::pin(async { Ok(()) })),
            plugin: "account-pool".into(),
            client,
            answered: true,
        });
        assert!(!view.gone(), "an answered request's client did not leave");
    }
}
