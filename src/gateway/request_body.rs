//! Reading client request bodies under limits of size, time and memory.
//!
//! A guarded body is read whole before anything touches the store (the
//! fingerprint covers it), so it is bounded three ways: at most
//! `max_request_body` bytes, received within `request_body_timeout`, and
//! buffered only while the client's connection has room in its
//! [`BodyBudget`] — one HTTP/2 connection with a hundred stalled streams
//! holds at most its budget, not a hundred bodies. A passthrough body
//! streams to the upstream; [`Paced`] ends it when the client pauses longer
//! than `request_body_timeout` between two chunks.
//!
//! A body that is refused for its size is not simply dropped: closing a
//! socket with unread data makes the kernel answer the uploader with a
//! reset, which can destroy the `413` before the client reads it. [`linger`]
//! keeps reading (and discarding) for a bounded time instead, as nginx's
//! lingering close does, so the `413` arrives.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long a refused upload is read and discarded at most (nginx's `lingering_time`).
pub const LINGER_TOTAL: Duration = Duration::from_secs(30);
/// The longest pause in a refused upload before the connection is closed
/// anyway (nginx's `lingering_timeout`).
pub const LINGER_IDLE: Duration = Duration::from_secs(5);

/// Why a guarded body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// More than the limit arrived (or was declared).
    #[error("the request body is larger than {0} bytes")]
    TooLarge(u64),
    /// The body did not arrive whole within the time allowed.
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    /// The client's stream broke off or was malformed.
    #[error("the request body broke off: {0}")]
    Broken(#[source] hyper::Error),
}

/// The request-body bytes one client connection may hold buffered at once.
#[derive(Debug, Clone)]
pub struct BodyBudget(Arc<Semaphore>);

impl BodyBudget {
    /// A budget of `bytes` (clamped to what a semaphore can count).
    pub fn new(bytes: u64) -> Self {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX).clamp(1, Semaphore::MAX_PERMITS);
        Self(Arc::new(Semaphore::new(bytes)))
    }

    /// Bytes not held by any body right now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// A whole guarded body and its share of the connection's budget, given
/// back when this is dropped (when the request is done with it).
#[derive(Debug)]
pub struct BufferedBody {
    /// The bytes.
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

/// Reads a guarded body whole: at most `limit` bytes, by `deadline`, each
/// chunk admitted only when the connection's budget has room for it.
/// On [`BodyError::TooLarge`] the caller still owns `body`, for [`linger`].
pub async fn read_whole(
    body: &mut Incoming,
    limit: u64,
    budget: &BodyBudget,
    timeout: Duration,
) -> Result<BufferedBody, BodyError> {
    let deadline = Instant::now() + timeout;
    let mut buffer = BytesMut::new();
    let mut held: Option<OwnedSemaphorePermit> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::TimedOut(timeout)),
            Ok(None) => break,
            Ok(Some(frame)) => frame.map_err(BodyError::Broken)?,
        };
        let Ok(data) = frame.into_data() else { continue };
        if buffer.len() as u64 + data.len() as u64 > limit {
            return Err(BodyError::TooLarge(limit));
        }
        if data.is_empty() {
            continue;
        }
        // `limit` never exceeds the budget (config checks it), so a body
        // under the limit always fits once other streams give theirs back.
        let wanted = u32::try_from(data.len()).map_err(|_| BodyError::TooLarge(limit))?;
        let permit = tokio::time::timeout_at(deadline, budget.0.clone().acquire_many_owned(wanted))
            .await
            .map_err(|_| BodyError::TimedOut(timeout))?
            .map_err(|_| BodyError::TimedOut(timeout))?;
        match &mut held {
            Some(held) => held.merge(permit),
            None => held = Some(permit),
        }
        buffer.extend_from_slice(&data);
    }
    Ok(BufferedBody { bytes: buffer.freeze(), _held: held })
}

/// Reads and discards the rest of a refused upload in the background, for
/// at most [`LINGER_TOTAL`] and never waiting more than [`LINGER_IDLE`] for
/// a chunk, so the client can finish sending and read the answer.
pub fn linger(mut body: Incoming) {
    tokio::spawn(async move {
        let until = Instant::now() + LINGER_TOTAL;
        while Instant::now() < until {
            let next = Instant::now() + LINGER_IDLE;
            match tokio::time::timeout_at(next.min(until), body.frame()).await {
                Ok(Some(Ok(_))) => {}
                _ => return,
            }
        }
    });
}

/// A streamed request body that fails when the client pauses longer than
/// `idle` between two chunks, so a stalled upload cannot hold an upstream
/// connection (and a client connection) for ever.
pub struct Paced<B> {
    inner: B,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<B> Paced<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, idle: Duration) -> Self {
        Self { inner, idle, timer: Box::pin(tokio::time::sleep(idle)) }
    }
}

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<super::body::BoxError>,
{
    type Data = Bytes;
    type Error = super::body::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let idle = this.idle;
                this.timer.as_mut().reset(Instant::now() + idle);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    Poll::Ready(Some(Err(
                        format!("the client paused its request body for more than {:?}", this.idle).into()
                    )))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
