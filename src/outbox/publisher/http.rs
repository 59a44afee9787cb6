//! `kind = "http"`: each message an HTTP request.
//!
//! An [`HttpDestination`] sends each destination's configured method, URL and
//! headers, the message's own headers, `Content-Type: application/json`
//! (unless set), the payload as the body, and always
//! `Idempotency-Key: <derived key>` (set last, so nothing overrides it);
//! [`target`] says what makes up a request and which headers are refused.
//! It reuses the gateway's pooled hyper + rustls client.
//!
//! **The status decides.** A `2xx` response head means the destination
//! acted, so the attempt is [`Delivery::Delivered`] even when its body then
//! breaks off or stalls past the timeout: counting it as a failure would
//! publish the effect again (to a destination that may not deduplicate)
//! and finally bury a row whose effect happened. Likewise a `422` stays a
//! rejection whatever its body does. Only an exchange that ends before a
//! response head — refused, reset, timed out — is a transport failure
//! (retried under the same key).
//!
//! The destination timeout bounds the whole exchange, response body
//! included. A success's body is drained (so its connection can be
//! reused) and dropped; at most [`MAX_ERROR_BODY`] bytes of a failure's
//! body are kept for `last_error` and the log, and, like every other text
//! that reaches either, they are [`printable`]: a destination cannot
//! forge a log line. Every failure reason is scrubbed of the config's
//! secrets ([`Scrubber`]) where it is formed, before it reaches either: a
//! destination that echoes the headers it was sent (its own token among
//! them) does not make the relay store or print that token.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::BytesMut;
use http::HeaderValue;
use http::header::{DATE, RETRY_AFTER};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::super::claim::Claimed;
use super::super::retry::{classify_status, is_delivered, parse_retry_after};
use super::target::TargetError;
use super::{Delivery, Destination, MAX_ERROR_BODY, Target};
use crate::config::{DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_IDLE_TIMEOUT, DestinationConfig, Scrubber};
use crate::http::client::{Upstream, UpstreamBody};

/// Why an HTTP destination cannot be built; names the field.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Its URL, method or headers.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Its client (the `ca_file`).
    #[error("ca_file: {0}")]
    CaFile(#[source] crate::http::client::ClientError),
}

/// An HTTP destination: its request template and its pooled client.
pub struct HttpDestination {
    target: Target,
    timeout: Duration,
    client: Upstream,
}

impl HttpDestination {
    /// Checks the destination's URL, method and headers and builds its
    /// client; the error names the field.
    pub fn new(config: &DestinationConfig) -> Result<Self, HttpError> {
        let target = Target::from_config(config)?;
        // The URI has no user info left, so neither has any error naming it.
        let client =
            Upstream::new(&target.uri, config.ca_file.as_deref(), DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_IDLE_TIMEOUT)
                .map_err(HttpError::CaFile)?;
        Ok(Self { target, timeout: config.timeout.0, client })
    }

    async fn attempt(&self, message: &Claimed, scrubber: &Scrubber) -> Delivery {
        let request = match self.target.request(message) {
            Ok(request) => request,
            Err(reason) => return Delivery::reject(reason.to_string()),
        };
        let deadline = Instant::now() + self.timeout;
        let sent = tokio::time::timeout_at(deadline, self.client.send(request, self.timeout)).await;
        let response = match sent {
            Err(_) => return Delivery::retry(format!("no response within {:?}", self.timeout)),
            Ok(Err(e)) => return Delivery::retry(e.to_string()),
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        let header = |name| response.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
        let retry_after = header(RETRY_AFTER).and_then(|v| parse_retry_after(v, header(DATE)));
        // A success's body is only drained; a failure's first bytes are its reason.
        let delivered = is_delivered(status);
        let keep = if delivered { 0 } else { MAX_ERROR_BODY };
        let (kept, ending) = read_body(response.into_body(), keep, deadline).await;
        if delivered {
            if let Some(ending) = ending {
                tracing::debug!(destination = %message.destination, trace_id = message.trace_id(), status, ending, "delivered: the body of a 2xx broke off");
            }
            return Delivery::Delivered;
        }
        // A secret the cut went through would escape the scrubbing whole.
        let kept = if kept.len() >= MAX_ERROR_BODY { scrubber.trim_cut(&kept) } else { &kept[..] };
        let mut reason = format!("HTTP {status}: {}", String::from_utf8_lossy(kept));
        if let Some(ending) = ending {
            reason.push_str(&format!(" ({ending})"));
        }
        classify_status(status, retry_after, reason)
    }
}

impl Destination for HttpDestination {
    fn publish<'a>(
        &'a self,
        message: &'a Claimed,
        scrubber: &'a Scrubber,
    ) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.attempt(message, scrubber))
    }
}

/// Reads a response body until its end, keeping its first `keep` bytes; a
/// body with more is not read further (its connection then closes). The
/// second value says how the body ended, if not with its last byte.
async fn read_body(mut body: UpstreamBody, keep: usize, deadline: Instant) -> (BytesMut, Option<String>) {
    let mut kept = BytesMut::new();
    let ending = tokio::time::timeout_at(deadline, async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("the body broke off: {e}"))?;
            if let Ok(data) = frame.into_data() {
                let room = keep.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..data.len().min(room)]);
                if keep > 0 && data.len() >= room {
                    return Ok(());
                }
            }
        }
        Ok::<_, String>(())
    })
    .await;
    match ending {
        Ok(Ok(())) => (kept, None),
        Ok(Err(broken)) => (kept, Some(broken)),
        Err(_) => (kept, Some("the body did not end within the timeout".into())),
    }
}
