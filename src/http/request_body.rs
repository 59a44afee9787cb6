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

/// Reads a guarded body whole: at most `limit` bytes, within `timeout`,
/// each chunk admitted only when the connection's budget (if any) has room
/// for it. On [`BodyError::TooLarge`] the caller still owns `body`, for
/// [`linger`].
pub async fn read_whole(
    body: &mut Incoming,
    limit: u64,
    budget: Option<&BodyBudget>,
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
        let Some(budget) = budget.filter(|_| !data.is_empty()) else {
            buffer.extend_from_slice(&data);
            continue;
        };
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
/// connection (and a client connection) for ever. The timer exists only
/// while the body is waiting: a body that arrives with its head costs none.
pub struct Paced<B> {
    inner: B,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> Paced<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, idle: Duration) -> Self {
        Self { inner, idle, timer: None }
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
                this.timer = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                        "the client paused its request body for more than {idle:?}"
                    )
                    .into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncWriteExt, DuplexStream};
    use tokio::sync::mpsc;

    type Event = (&'static str, Result<usize, String>);

    /// A real HTTP/1.1 connection over an in-memory pipe whose handler
    /// reads the body with `read_whole` under `budget` and reports.
    fn connection(name: &'static str, budget: &BodyBudget, events: &mpsc::UnboundedSender<Event>) -> DuplexStream {
        let (client, server) = tokio::io::duplex(64 << 10);
        let (budget, events) = (budget.clone(), events.clone());
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (budget, events) = (budget.clone(), events.clone());
            async move {
                let mut body = request.into_body();
                let read = read_whole(&mut body, 1000, Some(&budget), Duration::from_secs(5)).await;
                let _ = events.send((name, read.map(|b| b.bytes.len()).map_err(|e| e.to_string())));
                Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        });
        tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), service));
        client
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waits_for_budget_that_a_stalled_body_holds_until_that_one_times_out() {
        let budget = BodyBudget::new(150);
        let (events, mut seen) = mpsc::unbounded_channel();
        let mut stalled = connection("stalled", &budget, &events);
        stalled.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 200\r\n\r\n").await.unwrap();
        stalled.write_all(&[b'x'; 100]).await.unwrap();
        for _ in 0..10_000 {
            if budget.available() == 50 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(budget.available(), 50, "the stalled body's first 100 bytes are held");
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut whole = connection("whole", &budget, &events);
        whole.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n").await.unwrap();
        whole.write_all(&[b'y'; 100]).await.unwrap();
        let first = seen.recv().await.unwrap();
        assert_eq!(first.0, "stalled", "the whole body could not be buffered beside the stalled one: {first:?}");
        assert!(first.1.unwrap_err().contains("did not arrive"));
        assert_eq!(seen.recv().await.unwrap(), ("whole", Ok(100)));
    }
}
