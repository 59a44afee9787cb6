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

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::body::{BoxError, ResponseBody, boxed};
use super::connection::Activity;

/// The most a watched body hands over at once: HTTP/2's initial window.
pub const SLICE: usize = 64 << 10;

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
pub fn watch(activity: &Arc<Activity>, body: ResponseBody) -> ResponseBody {
    if body.size_hint().upper().is_some_and(|upper| upper <= SLICE as u64) {
        return body;
    }
    let slot = activity.sending().register();
    boxed(Watched { inner: body, pending: None, activity: activity.clone(), slot })
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
    inner: ResponseBody,
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
}
