//! The HTTP/1 parser's refusals as RFC 9457 problems.
//!
//! hyper answers a request head it cannot parse (a DEL byte in a header,
//! two `Content-Length`s, over 100 header fields, an overlong target) by
//! itself, before any service sees a request: a bare `400`, `414` or `431`
//! with no body, and it offers no hook to change that. Every other error
//! is `application/problem+json`, so a client's error handling should not
//! need a second path for these. [`Refusals`] wraps a connection's I/O and
//! swaps that exact answer for a problem document as it is written.
//!
//! It knows hyper's answer by its bytes — a status line of one of the
//! three, then exactly `connection: close`, `content-length: 0` and
//! `date`, and nothing else in the write — and by one more fact: no
//! response of the service's own is waiting to be written. The service
//! marks each response it returns ([`Activity::answered`]); the next write
//! carries that response's head and is left alone, so an upstream's own
//! bare `400` passed through to a client that asked to close is never
//! rewritten. The common path pays one atomic swap and a length check per
//! write.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connection::Activity;

/// Prefix of every problem `type` the process produces.
pub const TYPE_PREFIX: &str = "urn:idemgate:problem:";

/// The statuses hyper answers unparseable heads with, and the problem each
/// becomes: (status line, type slug, title, detail).
const REFUSALS: [(&str, &str, &str, &str); 3] = [
    (
        "400 Bad Request",
        "malformed-request",
        "Malformed request",
        "The request head is not valid HTTP/1.1 (a forbidden byte, a repeated Content-Length, a malformed line). It was not forwarded, and the connection is closed.",
    ),
    (
        "414 URI Too Long",
        "uri-too-long",
        "URI too long",
        "The request target is longer than the HTTP parser accepts. It was not forwarded, and the connection is closed.",
    ),
    (
        "431 Request Header Fields Too Large",
        "headers-too-large",
        "Request headers too large",
        "The request has more header fields, or more header bytes, than the HTTP parser accepts. It was not forwarded, and the connection is closed.",
    ),
];

/// A connection's I/O with hyper's bare refusals rewritten as problems.
pub struct Refusals<I> {
    inner: I,
    activity: Arc<Activity>,
    /// A problem being written in place of hyper's answer.
    replacement: Option<Replacement>,
}

struct Replacement {
    bytes: Vec<u8>,
    written: usize,
    /// What hyper is told was written: the length of its own answer.
    reported: usize,
}

impl<I> Refusals<I> {
    /// Wraps `inner`; `activity` is the connection's, marked by its service.
    pub fn new(inner: I, activity: Arc<Activity>) -> Self {
        Self { inner, activity, replacement: None }
    }
}

impl<I: AsyncWrite + Unpin> Refusals<I> {
    /// Writes what is left of the replacement, then reports hyper's
    /// answer as written.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some(replacement) = &mut self.replacement {
            if replacement.written == replacement.bytes.len() {
                let reported = replacement.reported;
                self.replacement = None;
                return Poll::Ready(Ok(reported));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &replacement.bytes[replacement.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            replacement.written += n;
        }
        Poll::Ready(Ok(0))
    }

    /// Starts a replacement when `buf` is hyper's own refusal.
    fn intercept(&mut self, buf: &[u8]) -> bool {
        // The swap comes first: a write after the service answered carries
        // that answer, whatever its bytes.
        if self.activity.take_answered() || buf.len() > MAX_REFUSAL_LEN {
            return false;
        }
        let Some(bytes) = problem_for(buf) else { return false };
        self.replacement = Some(Replacement { bytes, written: 0, reported: buf.len() });
        true
    }
}

/// The longest answer hyper writes for a refusal.
const MAX_REFUSAL_LEN: usize = 128;

/// The problem response for hyper's refusal `written`, or `None` when
/// `written` is anything else.
fn problem_for(written: &[u8]) -> Option<Vec<u8>> {
    let rest = written.strip_prefix(b"HTTP/1.1 ")?;
    let (status, slug, title, detail) = REFUSALS.iter().find(|(status, ..)| rest.starts_with(status.as_bytes()))?;
    let rest = rest[status.len()..].strip_prefix(b"\r\nconnection: close\r\ncontent-length: 0\r\ndate: ")?;
    let date = rest.strip_suffix(b"\r\n\r\n")?;
    if date.len() != 29 || date.contains(&b'\r') {
        return None;
    }
    let code: u16 = status[..3].parse().ok()?;
    let body = serde_json::json!({
        "type": format!("{TYPE_PREFIX}{slug}"),
        "title": title,
        "status": code,
        "detail": detail,
    })
    .to_string();
    let mut bytes = Vec::with_capacity(256 + body.len());
    bytes.extend_from_slice(b"HTTP/1.1 ");
    bytes.extend_from_slice(status.as_bytes());
    bytes.extend_from_slice(
        b"\r\nconnection: close\r\ncontent-type: application/problem+json\r\ncache-control: no-store\r\n",
    );
    bytes.extend_from_slice(format!("content-length: {}\r\ndate: ", body.len()).as_bytes());
    bytes.extend_from_slice(date);
    bytes.extend_from_slice(b"\r\n\r\n");
    bytes.extend_from_slice(body.as_bytes());
    Some(bytes)
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Refusals<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacement.is_some() || this.intercept(buf) {
            return this.poll_replacement(cx);
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut filled = bufs.iter().filter(|buf| !buf.is_empty());
        let only = match (filled.next(), filled.next()) {
            (Some(only), None) => Some(&**only),
            _ => None,
        };
        if this.replacement.is_some() || only.is_some_and(|buf| this.intercept(buf)) {
            return this.poll_replacement(cx);
        }
        // A write of several parts carries a head and its body: the
        // service's answer, never hyper's refusal.
        if only.is_none() {
            this.activity.take_answered();
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Refusals<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &str = "Thu, 03 Dec 2026 10:29:20 GMT";

    fn hypers(status: &str) -> Vec<u8> {
        format!("HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n").into_bytes()
    }

    #[test]
    fn each_of_hypers_refusals_becomes_its_problem() {
        for (status, slug, ..) in REFUSALS {
            let problem = String::from_utf8(problem_for(&hypers(status)).unwrap()).unwrap();
            let (head, body) = problem.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{head}");
            assert!(head.contains("content-type: application/problem+json") && head.contains(DATE), "{head}");
            assert!(head.contains(&format!("content-length: {}\r\n", body.len())), "{head}");
            let body: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(body["type"], format!("{TYPE_PREFIX}{slug}"));
            assert_eq!(body["status"].as_u64().unwrap(), status[..3].parse::<u64>().unwrap());
        }
    }

    #[test]
    fn anything_else_is_left_alone() {
        assert!(problem_for(&hypers("404 Not Found")).is_none());
        let with_type = format!(
            "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ncontent-type: text/plain\r\ndate: {DATE}\r\n\r\n"
        );
        assert!(problem_for(with_type.as_bytes()).is_none());
        let mut with_body = hypers("400 Bad Request");
        with_body.extend_from_slice(b"x");
        assert!(problem_for(&with_body).is_none());
        assert!(problem_for(b"HTTP/1.1 400 Bad Request\r\n").is_none());
    }
}
