//! Responses a client does not read.
//!
//! A response body sits in memory until the client takes it, and an HTTP/2
//! client that opens a hundred streams and never widens its flow-control
//! window holds a hundred responses (measured before this: +231 MiB for 99
//! replays of 1 MiB, connection open, for as long as the client liked). So:
//!
//! - a body larger than one [`SLICE`] is handed to hyper a slice at a time
//!   (the slices share its one allocation), so hyper's HTTP/2 send buffer
//!   takes at most about a slice per stream and the rest stays with the
//!   body, where [`Sending`] can see it waiting;
//! - [`Sending`] keeps, per body still being sent, when it last handed a
//!   slice over; [`Sending::stalled`] resolves once one of them has waited
//!   `send_timeout`, and the listener then drops the connection, freeing
//!   every response on it. The gateway settles a record before it answers,
//!   so dropping a response never unsettles one: a retry replays it.
//!
//! Bodies of one slice or less are not watched: a stream holds at most a
//! slice, `max_streams_per_connection` slices a connection, and the idle
//! timeout closes a connection that does nothing else.
//!
//! Dropping the connection after `send_timeout` bounds for how long, not
//! how much: measured, 10 connections each holding 100 unread answers of
//! 1 MiB took 877 MiB to 1.7 GiB until then. So a connection also has a
//! **budget** of bytes for the settled answers it holds
//! (`connection_response_budget`): an answer marked [`Settled`] by the
//! gateway — a replay, or a first answer whose record is completed with
//! it — takes its size from the budget until it is sent or dropped, and
//! one that finds too little left is dropped at once and answered
//! `503 connection-busy` with `Retry-After` by the gateway
//! ([`ResponseBudget::charge`], so its log and metrics say so): its record
//! holds it, so the retry replays it. An answer larger than the whole budget may take all
//! of it. Answers that are not settled — streamed, unguarded, or whose
//! record could not be completed — never get a `503` here: replacing them
//! would tell a client that an effect did not happen when it did.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::body::{BoxError, BoxedBody, boxed};
use super::connection::Activity;

/// The most a watched body hands over at once: HTTP/2's initial window.
pub const SLICE: usize = 64 << 10;

/// Marks a response whose record holds it (a replay, or a first answer
/// completed with it): a retry would replay it, so it may be answered
/// `503 connection-busy` instead when its connection's budget is spent.
/// Set through [`mark_settled`].
#[derive(Debug, Clone, Copy)]
pub struct Settled;

/// Marks `response` [`Settled`] when the budget can concern it: a body
/// larger than a slice. Smaller ones are never charged, and marking them
/// would cost every replay an allocation (a response's first extension).
pub fn mark_settled(response: &mut Response<BoxedBody>) {
    if response.body().size_hint().exact().is_some_and(|size| size > SLICE as u64) {
        response.extensions_mut().insert(Settled);
    }
}

/// The response bodies of one connection still being sent.
#[derive(Debug, Default)]
pub struct Sending {
    /// Per slot, when its body last handed a slice over (`None`: free).
    slots: Mutex<Vec<Option<Instant>>>,
    /// A body started: the watcher has something to watch.
    started: Notify,
}

/// Watches `body` in its connection's [`Sending`] when it is larger than
/// a slice (or of unknown size).
pub fn watch(activity: &Arc<Activity>, body: BoxedBody) -> BoxedBody {
    if body.size_hint().upper().is_some_and(|upper| upper <= SLICE as u64) {
        return body;
    }
    let slot = activity.sending().register();
    boxed(Watched { inner: body, pending: None, activity: activity.clone(), slot })
}

/// A connection's budget of bytes for the [`Settled`] answers it holds
/// for its client (`connection_response_budget`), in KiB. Clones share it.
#[derive(Debug, Clone)]
pub struct ResponseBudget {
    permits: Arc<Semaphore>,
    total_kib: u32,
}

impl ResponseBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Self {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).min(Semaphore::MAX_PERMITS as u32);
        Self { permits: Arc::new(Semaphore::new(kib as usize)), total_kib: kib }
    }

    /// `response` charged to the budget until its body is sent or dropped,
    /// when it is [`Settled`] and larger than a slice; `None`, the response
    /// dropped, when too little of the budget is left. Anything else passes
    /// untouched. An answer larger than the whole budget may take all of it.
    pub fn charge(&self, response: Response<BoxedBody>) -> Option<Response<BoxedBody>> {
        let size = match response.body().size_hint().exact() {
            Some(size) if size > SLICE as u64 && response.extensions().get::<Settled>().is_some() => size,
            _ => return Some(response),
        };
        let kib = u32::try_from(size.div_ceil(1024)).unwrap_or(u32::MAX).min(self.total_kib);
        let permit = self.permits.clone().try_acquire_many_owned(kib).ok()?;
        Some(response.map(|body| boxed(Charged { inner: body, _permit: permit })))
    }
}

/// A body holding its share of a [`ResponseBudget`] until it is dropped.
struct Charged {
    inner: BoxedBody,
    _permit: OwnedSemaphorePermit,
}

impl Body for Charged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Sending {
    /// Takes a slot for a body that starts now.
    fn register(&self) -> usize {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Some(Instant::now());
            match slots.iter().position(Option::is_none) {
                Some(free) => {
                    slots[free] = now;
                    free
                }
                None => {
                    slots.push(now);
                    slots.len() - 1
                }
            }
        };
        self.started.notify_one();
        slot
    }

    /// Resolves once a body has waited `limit` since it last handed a
    /// slice over.
    pub async fn stalled(&self, limit: Duration) {
        loop {
            let oldest = self.slots.lock().unwrap_or_else(PoisonError::into_inner).iter().flatten().min().copied();
            match oldest {
                Some(since) if since + limit <= Instant::now() => return,
                Some(since) => tokio::time::sleep_until(since + limit).await,
                None => self.started.notified().await,
            }
        }
    }

    fn set(&self, slot: usize, value: Option<Instant>) {
        if let Some(entry) = self.slots.lock().unwrap_or_else(PoisonError::into_inner).get_mut(slot) {
            *entry = value;
        }
    }
}

/// A body handed over a slice at a time, its progress noted in [`Sending`].
struct Watched {
    inner: BoxedBody,
    /// The rest of a frame larger than a slice.
    pending: Option<Bytes>,
    activity: Arc<Activity>,
    slot: usize,
}

impl Watched {
    fn slice(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > SLICE {
            self.pending = Some(data.split_off(SLICE));
        }
        self.activity.sending().set(self.slot, Some(Instant::now()));
        Frame::data(data)
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(pending) = this.pending.take() {
            return Poll::Ready(Some(Ok(this.slice(pending))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(this.slice(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let extra = self.pending.as_ref().map_or(0, |p| p.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(extra));
        }
        hint.set_lower(inner.lower().saturating_add(extra));
        hint
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.activity.sending().set(self.slot, None);
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::http::body::full;

    #[tokio::test(start_paused = true)]
    async fn a_large_body_is_handed_over_in_slices_and_its_wait_is_watched() {
        let activity = Arc::new(Activity::new());
        let sending = activity.sending();
        let small = watch(&activity, full(vec![b'x'; SLICE]));
        assert_eq!(small.collect().await.unwrap().to_bytes().len(), SLICE, "a slice or less is not watched");
        let mut large = watch(&activity, full(vec![b'y'; 3 * SLICE + 1]));
        let first = large.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), SLICE);
        // The client reads nothing more: the watcher fires after the limit.
        let started = Instant::now();
        sending.stalled(Duration::from_secs(30)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        let mut rest = 0;
        while let Some(frame) = large.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= SLICE);
            rest += data.len();
        }
        assert_eq!(rest, 2 * SLICE + 1);
        drop(large);
        assert!(sending.slots.lock().unwrap().iter().all(Option::is_none), "a dropped body frees its slot");
    }

    fn settled(bytes: usize) -> Response<BoxedBody> {
        let mut response = Response::new(full(vec![b'z'; bytes]));
        response.extensions_mut().insert(Settled);
        response
    }

    #[test]
    fn settled_answers_past_the_budget_are_refused_and_give_it_back_when_dropped() {
        let budget = ResponseBudget::new(4 * SLICE as u64);
        let first = budget.charge(settled(2 * SLICE)).expect("within the budget");
        let second = budget.charge(settled(2 * SLICE)).expect("within the budget");
        assert!(budget.charge(settled(2 * SLICE)).is_none(), "the budget is spent");
        assert!(budget.charge(settled(SLICE)).is_some(), "a slice or less is not charged");
        assert!(
            budget.charge(Response::new(full(vec![b'u'; 2 * SLICE]))).is_some(),
            "an unsettled answer is never refused"
        );
        drop(first);
        assert!(budget.charge(settled(2 * SLICE)).is_some(), "a dropped answer gives its share back");
        drop(second);
        assert!(budget.charge(settled(16 * SLICE)).is_some(), "an answer larger than the budget may take all of it");
    }
}
