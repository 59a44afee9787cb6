//! Where messages go: the [`Publisher`] trait and the HTTP publisher.
//!
//! A publisher makes one delivery attempt and reports its [`Attempt`]; it
//! never retries by itself and never touches the database. The relay turns
//! the attempt into a completion, a scheduled retry or a dead row. Other
//! sinks (a queue, a webhook signer) implement the same trait.
//!
//! [`HttpPublisher`] sends each destination's configured method, URL and
//! headers, the message's own headers, `Content-Type: application/json`
//! (unless set), the payload as the body, and always
//! `Idempotency-Key: <derived key>` (set last, so nothing overrides it). It
//! reuses the gateway's pooled hyper + rustls client. The destination
//! timeout bounds the whole exchange, response body included; at most
//! [`MAX_ERROR_BODY`] bytes of a failed response are read for the log.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_TYPE, DATE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::BodyExt;

use super::claim::Claimed;
use super::retry::{Class, classify_status, parse_retry_after};
use crate::config::{DEFAULT_POOL_IDLE_TIMEOUT, DestinationConfig};
use crate::gateway::body::full;
use crate::gateway::upstream::{DEFAULT_MAX_CONNECTIONS, Upstream};
use crate::idempotency::key::IDEMPOTENCY_KEY;

/// Bytes of a failed response's body kept for `last_error`.
pub const MAX_ERROR_BODY: usize = 512;

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
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
    fn publish(&self, message: &Claimed) -> impl Future<Output = Attempt> + Send;
}

/// Why an [`HttpPublisher`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A destination's fields do not make a request.
    #[error("destination {name:?}: {reason}")]
    Invalid {
        /// The destination.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

struct HttpDestination {
    uri: Uri,
    method: Method,
    headers: HeaderMap,
    timeout: Duration,
    client: Upstream,
}

/// Publishes to HTTP destinations configured by name.
pub struct HttpPublisher {
    destinations: HashMap<String, HttpDestination>,
}

impl HttpPublisher {
    /// Builds one pooled client per destination.
    pub fn new(configs: &BTreeMap<String, DestinationConfig>) -> Result<Self, PublisherError> {
        let mut destinations = HashMap::new();
        for (name, config) in configs {
            let invalid = |reason: String| PublisherError::Invalid { name: name.clone(), reason };
            let uri: Uri = config.url.parse().map_err(|e| invalid(format!("url: {e}")))?;
            let method = Method::from_bytes(config.method.as_bytes()).map_err(|e| invalid(format!("method: {e}")))?;
            let mut headers = HeaderMap::new();
            for (header, value) in &config.headers {
                let header = HeaderName::from_bytes(header.as_bytes()).map_err(|e| invalid(e.to_string()))?;
                let value = HeaderValue::from_str(value).map_err(|e| invalid(e.to_string()))?;
                headers.append(header, value);
            }
            let client =
                Upstream::new(&uri, config.ca_file.as_deref(), DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_IDLE_TIMEOUT)
                    .map_err(invalid)?;
            destinations
                .insert(name.clone(), HttpDestination { uri, method, headers, timeout: config.timeout.0, client });
        }
        Ok(Self { destinations })
    }

    fn request(
        destination: &HttpDestination,
        message: &Claimed,
    ) -> Result<Request<crate::gateway::body::ResponseBody>, String> {
        let mut request = Request::builder().method(destination.method.clone()).uri(destination.uri.clone());
        let headers = request.headers_mut().ok_or("invalid destination")?;
        headers.extend(destination.headers.clone());
        for (name, value) in &message.headers {
            let name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("message header {name:?} is invalid"))?;
            let value =
                HeaderValue::from_str(value).map_err(|_| format!("message header {name} has an invalid value"))?;
            headers.insert(name, value);
        }
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let key = HeaderValue::from_str(&message.derived_key).map_err(|_| "derived key is not a header value")?;
        headers.insert(&IDEMPOTENCY_KEY, key);
        request.body(full(Bytes::from(message.payload.clone()))).map_err(|e| e.to_string())
    }
}

impl Publisher for HttpPublisher {
    async fn publish(&self, message: &Claimed) -> Attempt {
        let reject = |reason: String| Attempt::Failed { class: Class::Reject, retry_after: None, reason };
        let Some(destination) = self.destinations.get(&message.destination) else {
            return reject(format!("no destination named {:?} is configured", message.destination));
        };
        let request = match Self::request(destination, message) {
            Ok(request) => request,
            Err(reason) => return reject(reason),
        };
        let exchange = async {
            let response = destination.client.send(request, destination.timeout).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let header = |name| response.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
            let retry_after = header(RETRY_AFTER).and_then(|v| parse_retry_after(v, header(DATE)));
            let class = classify_status(status);
            let mut body = response.into_body();
            let mut kept = BytesMut::new();
            // Drain a success so the connection returns to the pool; keep a
            // little of a failure for the log.
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("HTTP {status}, body failed: {e}"))?;
                if let Ok(data) = frame.into_data() {
                    let room = MAX_ERROR_BODY.saturating_sub(kept.len());
                    kept.extend_from_slice(&data[..data.len().min(room)]);
                    if class != Class::Delivered && room == 0 {
                        break;
                    }
                }
            }
            Ok::<_, String>((status, class, retry_after, kept))
        };
        match tokio::time::timeout(destination.timeout, exchange).await {
            Err(_) => Attempt::Failed {
                class: Class::Retry,
                retry_after: None,
                reason: format!("no answer within {:?}", destination.timeout),
            },
            Ok(Err(reason)) => Attempt::Failed { class: Class::Retry, retry_after: None, reason },
            Ok(Ok((_, Class::Delivered, _, _))) => Attempt::Delivered,
            Ok(Ok((status, class, retry_after, body))) => Attempt::Failed {
                class,
                retry_after,
                reason: format!("HTTP {status}: {}", String::from_utf8_lossy(&body)),
            },
        }
    }
}
