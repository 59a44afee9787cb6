//! Where messages go: the [`Publisher`] trait and the HTTP publisher.
//!
//! A publisher makes one delivery attempt and reports its [`Delivery`]; it
//! never retries by itself and never touches the database. The relay turns
//! the attempt into a completion, a scheduled retry or a dead row. Other
//! sinks (a queue, a webhook signer) implement the same trait.
//!
//! [`HttpPublisher`] sends each destination's configured method, URL and
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

pub mod target;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use bytes::BytesMut;
use http::HeaderValue;
use http::header::{DATE, RETRY_AFTER};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::claim::Claimed;
use super::retry::{Class, classify_status, parse_retry_after};
use crate::config::DEFAULT_MAX_CONNECTIONS;
use crate::config::{DEFAULT_POOL_IDLE_TIMEOUT, DestinationConfig, Scrubber};
use crate::escape::printable;
use crate::http::client::{Upstream, UpstreamBody};
pub use target::Target;

/// Bytes of a failed response's body kept for `last_error`.
pub const MAX_ERROR_BODY: usize = 512;

/// Characters of a reason kept, escapes included.
const MAX_REASON: usize = 1024;

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The destination accepted it.
    Delivered,
    /// It did not; `class` says whether a retry can help.
    Failed {
        /// [`Class::Retry`] or [`Class::Reject`].
        class: Class,
        /// The destination's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// For `last_error` and logs.
        reason: String,
    },
}

/// Something that can attempt to deliver a claimed message.
pub trait Publisher: Send + Sync + 'static {
    /// One attempt. Must finish within a bounded time (the relay renews the
    /// row's lease meanwhile, but never forever).
    fn publish(&self, message: &Claimed) -> impl Future<Output = Delivery> + Send;
}

/// Why an [`HttpPublisher`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A destination's fields do not make a request, or its `ca_file`
    /// cannot be read.
    #[error("destinations.{name}: {reason}")]
    Invalid {
        /// The destination.
        name: String,
        /// What is wrong, naming the field.
        reason: String,
    },
}

struct HttpDestination {
    target: Target,
    timeout: Duration,
    client: Upstream,
}

/// Publishes to HTTP destinations configured by name.
pub struct HttpPublisher {
    destinations: HashMap<String, HttpDestination>,
    scrubber: Scrubber,
}

impl HttpPublisher {
    /// Builds one pooled client per destination. Everything a destination
    /// can get wrong fails here, before any row is claimed: `check-config`
    /// builds the same publisher.
    pub fn new(configs: &BTreeMap<String, DestinationConfig>) -> Result<Self, PublisherError> {
        let mut destinations = HashMap::new();
        for (name, config) in configs {
            let invalid = |reason: String| PublisherError::Invalid { name: name.clone(), reason };
            let target = Target::from_config(config).map_err(invalid)?;
            // The URI has no user info left, so neither has any error naming it.
            let client = Upstream::new(
                &target.uri,
                config.ca_file.as_deref(),
                DEFAULT_MAX_CONNECTIONS,
                DEFAULT_POOL_IDLE_TIMEOUT,
            )
            .map_err(|e| invalid(format!("ca_file: {e}")))?;
            destinations.insert(name.clone(), HttpDestination { target, timeout: config.timeout.0, client });
        }
        Ok(Self { destinations, scrubber: Scrubber::of_destinations(configs.values()) })
    }

    /// Scrubs failure reasons with `scrubber` (the whole config's,
    /// [`crate::config::Config::scrubber`]) instead of with the
    /// destinations' secrets alone.
    pub fn with_scrubber(mut self, scrubber: Scrubber) -> Self {
        self.scrubber = scrubber;
        self
    }

    /// A failed attempt, its reason scrubbed of every configured secret
    /// and made printable: formed here, once, it is what `last_error`, the
    /// admin API and the log line all show.
    fn failed(&self, class: Class, retry_after: Option<Duration>, reason: &str) -> Delivery {
        Delivery::Failed { class, retry_after, reason: printable(&self.scrubber.scrub(reason), MAX_REASON) }
    }
}

impl Publisher for HttpPublisher {
    async fn publish(&self, message: &Claimed) -> Delivery {
        let Some(destination) = self.destinations.get(&message.destination) else {
            let reason = format!("no destination named {:?} is configured", message.destination);
            return self.failed(Class::Reject, None, &reason);
        };
        let request = match destination.target.request(message) {
            Ok(request) => request,
            Err(reason) => return self.failed(Class::Reject, None, &reason),
        };
        let deadline = Instant::now() + destination.timeout;
        let sent = tokio::time::timeout_at(deadline, destination.client.send(request, destination.timeout)).await;
        let response = match sent {
            Err(_) => {
                let reason = format!("no response within {:?}", destination.timeout);
                return self.failed(Class::Retry, None, &reason);
            }
            Ok(Err(e)) => return self.failed(Class::Retry, None, &e.to_string()),
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        let header = |name| response.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
        let retry_after = header(RETRY_AFTER).and_then(|v| parse_retry_after(v, header(DATE)));
        let class = classify_status(status);
        let keep = if class == Class::Delivered { 0 } else { MAX_ERROR_BODY };
        let (kept, ending) = read_body(response.into_body(), keep, deadline).await;
        if class == Class::Delivered {
            if let Some(ending) = ending {
                tracing::debug!(destination = %message.destination, trace_id = message.trace_id(), status, ending, "delivered: the body of a 2xx broke off");
            }
            return Delivery::Delivered;
        }
        // A secret the cut went through would escape the scrubbing whole.
        let kept = if kept.len() >= MAX_ERROR_BODY { self.scrubber.trim_cut(&kept) } else { &kept[..] };
        let mut reason = format!("HTTP {status}: {}", String::from_utf8_lossy(kept));
        if let Some(ending) = ending {
            reason.push_str(&format!(" ({ending})"));
        }
        self.failed(class, retry_after, &reason)
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
