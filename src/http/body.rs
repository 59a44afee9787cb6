//! Body types shared by the gateway's requests and responses.
//!
//! Everything is boxed into one [`BoxedBody`] type so that stored
//! replays, problems, streamed upstream bodies and a response whose head
//! was buffered but whose tail still streams can all be returned by one
//! service, and so that a request forwarded upstream (streamed from its
//! client, or read whole by the guard) has one type too.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// The error type of boxed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the gateway returns and of every request it
/// forwards (named for neither: it is both).
pub type BoxedBody = BoxBody<Bytes, BoxError>;

/// A complete body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> BoxedBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// Boxes any body whose error converts.
pub fn boxed<B>(body: B) -> BoxedBody
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// A body whose first bytes were already read (to try to store them) and
/// whose rest still streams from the upstream.
pub struct Prefixed<B> {
    prefix: Option<Bytes>,
    rest: B,
}

impl<B> Prefixed<B> {
    /// `prefix`, then whatever `rest` still yields.
    pub fn new(prefix: Bytes, rest: B) -> Self {
        Self { prefix: Some(prefix).filter(|p| !p.is_empty()), rest }
    }
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let extra = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        // Upper first: `set_lower` asserts lower <= upper.
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(extra));
        }
        hint.set_lower(rest.lower().saturating_add(extra));
        hint
    }
}
