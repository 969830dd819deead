//! Route taps: what the host's listener answered on one route while an agent CLI's turn
//! runs. The agent's requests go through the listener to the pool like any client's; the
//! core watches the thread's route token for the length of the turn, and the listener
//! records each answer on that route — the head (status, `x-pooler-origin`, `Retry-After`,
//! rate-limit headers), the start of a failed answer's body, and how a stream ended — into
//! a [`pooler_core::agent::Observation`]. The turn's failure description is made from it,
//! exactly as the HTTP driver makes one from its own requests; the CLI's text is not a
//! contract.
//!
//! A route token is a secret: it is a key of an in-memory map here, never logged. With no
//! turn watched, a request costs one atomic load.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::HeaderMap;
use hyper::body::{Body, Frame};
use pooler_core::agent::{Observation, Observed};
use pooler_core::clock::SharedClock;
use pooler_core::driver::{StreamEnd, StreamWatch};
use pooler_core::{Provider, ratelimit};

/// The most of a failed answer's body kept for its classification.
const MAX_ERROR_BODY: usize = 64 * 1024;

struct Watched {
    provider: Provider,
    seen: Arc<Mutex<Observation>>,
}

/// The routes being watched, by route token.
#[derive(Default)]
pub struct Taps {
    watched: Mutex<HashMap<String, Watched>>,
    count: AtomicUsize,
}

/// A route watched for one turn; dropping it stops the watch.
pub struct Tap {
    taps: Arc<Taps>,
    token: String,
    seen: Arc<Mutex<Observation>>,
}

impl Tap {
    /// What the listener saw on the route so far.
    pub fn observation(&self) -> Observation {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let mut watched = self.taps.watched.lock().unwrap_or_else(|e| e.into_inner());
        // A newer watch of the same route (a later turn) stays.
        if watched
            .get(&self.token)
            .is_some_and(|w| Arc::ptr_eq(&w.seen, &self.seen))
        {
            watched.remove(&self.token);
            self.taps.count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Taps {
    /// Watch the route of `token` (a `provider` route) until the returned tap is dropped.
    pub fn watch(self: &Arc<Self>, token: &str, provider: Provider) -> Tap {
        let seen = Arc::new(Mutex::new(Observation::default()));
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let before = watched.insert(
            token.to_owned(),
            Watched {
                provider,
                seen: seen.clone(),
            },
        );
        if before.is_none() {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
        Tap {
            taps: self.clone(),
            token: token.to_owned(),
            seen,
        }
    }

    /// The watch of the route a request with `headers` names (its `Authorization: Bearer`
    /// or `x-api-key` token), if that route is watched.
    pub fn find(&self, headers: &HeaderMap) -> Option<Recorder> {
        if self.count.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        [bearer, key]
            .into_iter()
            .flatten()
            .find_map(|token| watched.get(token.trim()))
            .map(|w| Recorder {
                provider: w.provider,
                seen: w.seen.clone(),
            })
    }
}

/// Records one answer on a watched route.
pub struct Recorder {
    provider: Provider,
    seen: Arc<Mutex<Observation>>,
}

impl Recorder {
    /// The answer's head was sent: a new latest answer. Returns the body to send instead
    /// of `body`, which records what passes.
    pub fn head<B>(
        self,
        status: u16,
        headers: &HeaderMap,
        clock: &SharedClock,
        body: B,
    ) -> TappedBody<B> {
        let now = clock.now_ms();
        let event_stream = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let ok = (200..300).contains(&status);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.requests += 1;
            if let Some(snapshot) = ratelimit::snapshot_from_headers(self.provider, headers, now) {
                seen.rate_limits = Some(snapshot);
            }
            seen.last = Some(Observed {
                status,
                headers: headers.clone(),
                error_body: Vec::new(),
                stream: if ok && !event_stream {
                    StreamEnd::Completed
                } else {
                    StreamEnd::Open
                },
                finished: false,
            });
        }
        TappedBody {
            inner: body,
            watch: (ok && event_stream).then(|| StreamWatch::new(self.provider, headers.clone())),
            keep_error_body: !ok,
            clock: clock.clone(),
            seen: self.seen,
        }
    }
}

/// A response body that records what passes through it into its route's observation.
pub struct TappedBody<B> {
    inner: B,
    watch: Option<StreamWatch>,
    keep_error_body: bool,
    clock: SharedClock,
    seen: Arc<Mutex<Observation>>,
}

impl<B> TappedBody<B> {
    fn record(&mut self, data: Option<&Bytes>) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut accepted = seen.accepted;
        if let Some(last) = seen.last.as_mut() {
            match data {
                Some(data) => {
                    if let Some(watch) = self.watch.as_mut() {
                        watch.push(data, self.clock.now_ms());
                        accepted |= watch.accepted();
                        last.stream = watch.end().clone();
                    } else if self.keep_error_body {
                        let room = MAX_ERROR_BODY.saturating_sub(last.error_body.len());
                        last.error_body
                            .extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
                None => last.finished = true,
            }
        }
        seen.accepted = accepted;
    }
}

impl<B> Body for TappedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.record(Some(&data));
                }
            }
            Poll::Ready(None) => self.record(None),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use pooler_core::FailureCategory;
    use pooler_core::clock::ManualClock;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(
                hyper::header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[tokio::test]
    async fn a_watched_route_records_its_answers_and_others_pass_untouched() {
        let taps = Arc::new(Taps::default());
        let clock: SharedClock = ManualClock::new(1_700_000_000_000);
        assert!(
            taps.find(&headers(&[("authorization", "Bearer tok")]))
                .is_none()
        );
        let tap = taps.watch("tok", Provider::Claude);
        assert!(
            taps.find(&headers(&[("authorization", "Bearer other")]))
                .is_none()
        );

        // A pool 429: head and body recorded.
        let h = headers(&[
            ("content-type", "application/json"),
            ("x-pooler-origin", "pool"),
            ("retry-after", "60"),
        ]);
        let recorder = taps
            .find(&headers(&[("authorization", "Bearer tok")]))
            .unwrap();
        let body = recorder.head(
            429,
            &h,
            &clock,
            Full::new(Bytes::from_static(b"{\"type\":\"error\"}")),
        );
        body.collect().await.unwrap();
        let seen = tap.observation();
        assert_eq!(seen.requests, 1);
        let last = seen.last.unwrap();
        assert_eq!((last.status, last.finished), (429, true));
        assert_eq!(last.error_body, b"{\"type\":\"error\"}");

        // Then a stream through x-api-key that fails mid-way.
        let sse = b"event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let recorder = taps.find(&headers(&[("x-api-key", "tok")])).unwrap();
        let body = recorder.head(
            200,
            &headers(&[("content-type", "text/event-stream")]),
            &clock,
            Full::new(Bytes::from_static(sse)),
        );
        body.collect().await.unwrap();
        let seen = tap.observation();
        assert_eq!(seen.requests, 2);
        assert!(seen.accepted, "message_start arrived");
        match seen.last.unwrap().stream {
            StreamEnd::Failed(f) => assert_eq!(f.category, FailureCategory::Overloaded),
            other => panic!("{other:?}"),
        }

        drop(tap);
        assert!(
            taps.find(&headers(&[("authorization", "Bearer tok")]))
                .is_none()
        );
        assert_eq!(taps.count.load(Ordering::SeqCst), 0);
    }
}
