//! `kind = "nats"`: each message a NATS JetStream publish.
//!
//! A [`NatsDestination`] publishes the payload as the message body on its
//! `subject` (a [`Template`] over the message's names), with the
//! destination's configured headers, the message's own, the row's trace
//! context as a new span (`traceparent`, `tracestate`), and always
//! `Nats-Msg-Id: <derived key>` (set last, so nothing overrides it).
//!
//! **The acknowledgement decides.** A message is delivered when the stream
//! acknowledges it — also with `duplicate: true`, which says the stream
//! already holds that `Nats-Msg-Id` (an earlier attempt landed and its
//! acknowledgement was lost). No stream for the subject, no acknowledgement
//! within `timeout`, a lost connection: retried with the destination's
//! backoff, under the same `Nats-Msg-Id`. JetStream forgets an id after the
//! stream's `duplicate_window` (two minutes by default), far sooner than a
//! retry can come, so consumers deduplicate on `Nats-Msg-Id` themselves for
//! `key_retention`, as HTTP destinations do on `Idempotency-Key`. A message
//! that can never be published — larger than the server takes, a name that
//! makes no valid subject, a message header JetStream would read as an
//! instruction (`Nats-*`) — is refused at once, with the reason.
//!
//! **Connecting.** The client connects on the first publish, in the
//! background, and reconnects by itself for as long as the relay runs: a
//! relay starts while its broker is down, and a broker restart costs the
//! attempts that time out meanwhile, nothing else. The URL's credentials
//! (`nats://user:password@host`, or a token as `nats://token@host`) log in;
//! `tls://` requires TLS, with `ca_file` trusted beside the system's roots.
//! What the connection last reported (a refused login, a TLS failure) is
//! part of the reason of an attempt that timed out.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{ConnectOptions, Event, HeaderMap, HeaderName, HeaderValue, ServerAddr};
use bytes::Bytes;
use tokio::sync::OnceCell;

use super::super::claim::Claimed;
use super::super::retry::Class;
use super::template::{Template, TemplateError};
use super::{Delivery, Destination, MessageHeaderError, message_headers};
use crate::config::{DestinationConfig, Scrubber, ServiceUrl};

/// The header JetStream deduplicates on, carrying the derived key.
const MESSAGE_ID: &str = "Nats-Msg-Id";

/// Why a NATS destination cannot be built (naming the field) or reached.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The client could not be made to connect (at the first publish).
    #[error("cannot connect to {shown}: {source}")]
    Connect {
        /// The URL, redacted.
        shown: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Not `nats://` or `tls://`.
    #[error("url {0:?} must be a nats:// or tls:// URL")]
    Scheme(String),
    /// The client does not take the URL.
    #[error("url {shown:?}: {source}")]
    Url {
        /// The URL, redacted.
        shown: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The URL has no host.
    #[error("url {0:?} has no host")]
    NoHost(String),
    /// No `subject`.
    #[error("kind = \"nats\" needs a subject")]
    NoSubject,
    /// The subject does not parse as a template.
    #[error("subject: {0}")]
    Template(#[source] TemplateError),
    /// The subject's fixed parts make no subject that can be published to.
    #[error("subject: {0}")]
    Subject(#[source] SubjectError),
    /// A configured header.
    #[error("headers: {0}")]
    Header(#[source] HeaderError),
    /// `ca_file` cannot be read.
    #[error("ca_file {}: {source}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Why a header cannot travel on a NATS message; the name cut to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// `Nats-*`: JetStream's instructions.
    #[error("header {0:?} is refused: Nats-* headers are JetStream's instructions")]
    Reserved(String),
    /// Not a header name.
    #[error("header {0:?} is not a valid header name")]
    Name(String),
    /// Not a header value.
    #[error("header {0:?} has an invalid value")]
    Value(String),
    /// A header checked before that the client still refuses.
    #[error("header {0:?} cannot be sent")]
    Unsendable(String),
}

/// Why a value cannot stand in a subject as (part of) one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Nothing.
    #[error("it is empty")]
    Empty,
    /// A `.`.
    #[error("a '.' would split it into more subject tokens")]
    Dot,
    /// `*` or `>`.
    #[error("'*' and '>' are wildcards, which cannot be published to")]
    Wildcard,
    /// Whitespace or a control character.
    #[error("subjects hold no whitespace or control characters")]
    Whitespace,
}

/// Why a subject cannot be published to; quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    /// Two dots, or one at an end.
    #[error("{0:?} has an empty token (two dots, or one at an end)")]
    EmptyToken(String),
    /// A token that is not one.
    #[error("{subject:?}: {why}")]
    Token {
        /// The subject.
        subject: String,
        /// Why.
        #[source]
        why: TokenError,
    },
}

/// Why one message cannot be published (refused, not retried).
#[derive(Debug, thiserror::Error)]
enum MessageError {
    /// A header of the message's.
    #[error(transparent)]
    Headers(#[from] MessageHeaderError<HeaderError>),
    /// A header, checked before, that the client refuses.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The derived key.
    #[error("the derived key is not a header value")]
    DerivedKey,
}

/// A NATS JetStream destination.
pub struct NatsDestination {
    server: ServerAddr,
    shown: String,
    subject: Template,
    /// The configured headers, checked.
    headers: Vec<(String, String)>,
    timeout: Duration,
    ca_file: Option<PathBuf>,
    context: OnceCell<async_nats::jetstream::Context>,
    /// What the connection last reported that went wrong, if anything.
    trouble: Arc<Mutex<Option<String>>>,
}

impl NatsDestination {
    /// Checks the destination's URL, subject, headers and `ca_file`; the
    /// error names the field. Connects to nothing.
    pub fn new(config: &DestinationConfig) -> Result<Self, NatsError> {
        let shown = ServiceUrl::new(config.url.as_str()).redacted();
        if !(config.url.starts_with("nats://") || config.url.starts_with("tls://")) {
            return Err(NatsError::Scheme(shown));
        }
        let server = match ServerAddr::from_str(&config.url) {
            Ok(server) => server,
            Err(source) => return Err(NatsError::Url { shown, source }),
        };
        if server.host().is_empty() {
            return Err(NatsError::NoHost(shown));
        }
        let subject = config.subject.as_deref().ok_or(NatsError::NoSubject)?;
        let subject = Template::parse(subject).map_err(NatsError::Template)?;
        subject_name(&subject.sample("x")).map_err(NatsError::Subject)?;
        let mut headers = Vec::new();
        for (name, value) in &config.headers {
            header(name, value).map_err(NatsError::Header)?;
            headers.push((name.clone(), value.clone()));
        }
        if let Some(path) = &config.ca_file {
            std::fs::read(path).map_err(|source| NatsError::CaFile { path: path.clone(), source })?;
        }
        Ok(Self {
            server,
            shown,
            subject,
            headers,
            timeout: config.timeout.0,
            ca_file: config.ca_file.clone(),
            context: OnceCell::new(),
            trouble: Arc::new(Mutex::new(None)),
        })
    }

    /// The JetStream context, its client connecting in the background from
    /// the first call on.
    async fn context(&self) -> Result<&async_nats::jetstream::Context, NatsError> {
        self.context
            .get_or_try_init(|| async {
                let trouble = Arc::clone(&self.trouble);
                let mut options = ConnectOptions::new()
                    .name("idemgate-relay")
                    .retry_on_initial_connect()
                    .max_reconnects(None)
                    .connection_timeout(self.timeout)
                    .event_callback(move |event| {
                        let trouble = Arc::clone(&trouble);
                        async move { note(&trouble, &event) }
                    });
                if let Some(path) = &self.ca_file {
                    options = options.add_root_certificates(path.clone());
                }
                let client = options
                    .connect(self.server.clone())
                    .await
                    .map_err(|source| NatsError::Connect { shown: self.shown.clone(), source })?;
                let mut context = async_nats::jetstream::new(client);
                context.set_timeout(self.timeout);
                Ok(context)
            })
            .await
    }

    /// The message's headers as published ([`message_headers`]), and the
    /// derived key last.
    fn headers(&self, message: &Claimed) -> Result<HeaderMap, MessageError> {
        let headers = message_headers(&self.headers, message, |name, value| header(name, value).map(drop))?;
        let mut map = HeaderMap::new();
        for (name, value) in &headers {
            let (name, value) = header_unchecked(name, value)?;
            map.insert(name, value);
        }
        let key = HeaderValue::from_str(&message.derived_key).map_err(|_| MessageError::DerivedKey)?;
        map.insert(MESSAGE_ID, key);
        Ok(map)
    }

    async fn attempt(&self, message: &Claimed) -> Delivery {
        let failed = |class, reason: String| Delivery::Failed { class, retry_after: None, reason };
        let subject = match self.subject.render(message, subject_token) {
            Ok(subject) => subject,
            Err(reason) => return failed(Class::Reject, format!("subject: {reason}")),
        };
        let headers = match self.headers(message) {
            Ok(headers) => headers,
            Err(reason) => return failed(Class::Reject, reason.to_string()),
        };
        let publish = PublishMessage::build().payload(Bytes::from(message.payload.clone())).headers(headers);
        let acknowledged = tokio::time::timeout(self.timeout, async {
            let context = self.context().await.map_err(|reason| (Class::Retry, reason.to_string()))?;
            let pending = context.send_publish(subject.clone(), publish).await.map_err(|e| classify(&e, &subject))?;
            pending.await.map_err(|e| classify(&e, &subject))
        })
        .await;
        match acknowledged {
            Ok(Ok(ack)) => {
                if ack.duplicate {
                    tracing::debug!(destination = %message.destination, trace_id = message.trace_id(), stream = %ack.stream, "delivered: the stream already held this Nats-Msg-Id");
                }
                Delivery::Delivered
            }
            Ok(Err((class, reason))) => failed(class, self.with_trouble(reason)),
            Err(_) => failed(Class::Retry, self.with_trouble(format!("no acknowledgement within {:?}", self.timeout))),
        }
    }

    /// `reason`, with what the connection last reported going wrong.
    fn with_trouble(&self, reason: String) -> String {
        match self.trouble.lock().ok().and_then(|trouble| trouble.clone()) {
            Some(trouble) => format!("{reason} (the connection to {}: {trouble})", self.shown),
            None => reason,
        }
    }
}

impl Destination for NatsDestination {
    fn publish<'a>(
        &'a self,
        message: &'a Claimed,
        _scrubber: &'a Scrubber,
    ) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.attempt(message))
    }
}

/// Keeps the last connection trouble, and forgets it once connected.
fn note(trouble: &Mutex<Option<String>>, event: &Event) {
    let Ok(mut trouble) = trouble.lock() else { return };
    match event {
        Event::Connected => *trouble = None,
        Event::Disconnected => *trouble = Some("disconnected".into()),
        Event::ServerError(_) | Event::ClientError(_) => *trouble = Some(event.to_string()),
        _ => {}
    }
}

/// A failed publish: refused for good when no retry can make it fit.
fn classify(error: &async_nats::jetstream::context::PublishError, subject: &str) -> (Class, String) {
    match error.kind() {
        PublishErrorKind::StreamNotFound => (Class::Retry, format!("no stream takes subject {subject:?}")),
        PublishErrorKind::MaxPayloadExceeded => (Class::Reject, error.to_string()),
        _ => (Class::Retry, error.to_string()),
    }
}

/// A configured or message header as NATS carries it. `Nats-*` headers
/// are JetStream's instructions (expected sequences, ids, TTLs): refused.
fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), HeaderError> {
    let shown: String = name.chars().take(64).collect();
    if name.len() >= 5 && name[..5].eq_ignore_ascii_case("nats-") {
        return Err(HeaderError::Reserved(shown));
    }
    let Ok(name) = HeaderName::from_str(name) else { return Err(HeaderError::Name(shown)) };
    let Ok(value) = HeaderValue::from_str(value) else { return Err(HeaderError::Value(shown)) };
    Ok((name, value))
}

/// A header already checked by [`header`], or the relay's own.
fn header_unchecked(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), HeaderError> {
    let parsed = (HeaderName::from_str(name), HeaderValue::from_str(value));
    match parsed {
        (Ok(name), Ok(value)) => Ok((name, value)),
        _ => Err(HeaderError::Unsendable(name.to_owned())),
    }
}

/// Whether `value` can stand in a subject as (part of) one token.
fn subject_token(value: &str) -> Result<(), TokenError> {
    if value.is_empty() {
        return Err(TokenError::Empty);
    }
    if value.contains('.') {
        return Err(TokenError::Dot);
    }
    if value.contains(['*', '>']) {
        return Err(TokenError::Wildcard);
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(TokenError::Whitespace);
    }
    Ok(())
}

/// Whether `subject` can be published to: tokens separated by `.`, none
/// empty, no wildcard, no whitespace.
fn subject_name(subject: &str) -> Result<(), SubjectError> {
    for token in subject.split('.') {
        if token.is_empty() {
            return Err(SubjectError::EmptyToken(subject.to_owned()));
        }
        subject_token(token).map_err(|why| SubjectError::Token { subject: subject.to_owned(), why })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_tokens_are_checked() {
        assert!(subject_name("orders.x.x").is_ok());
        for bad in ["orders..x", ".orders", "orders.", "orders.*", "orders.>", "or ders"] {
            assert!(subject_name(bad).is_err(), "{bad}");
        }
        assert!(subject_token("order-42").is_ok());
        for bad in ["", "a.b", "a*", "a>", "a b", "a\n"] {
            assert!(subject_token(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn jetstream_instructions_and_broken_headers_are_refused() {
        assert!(header("x-tenant", "acme").is_ok());
        for (name, value) in [("Nats-Msg-Id", "x"), ("nats-expected-last-sequence", "1"), ("a:b", "x"), ("x", "a\r\nb")]
        {
            assert!(header(name, value).is_err(), "{name:?}: {value:?}");
        }
    }
}
