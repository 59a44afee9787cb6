//! Where messages go: the [`Publisher`] trait, and [`Destinations`], the
//! publisher the relay runs — one [`Destination`] per configured name, each
//! of its kind.
//!
//! A publisher makes one delivery attempt and reports its [`Delivery`]; it
//! never retries by itself and never touches the database. The relay turns
//! the attempt into a completion, a scheduled retry or a dead row.
//!
//! **Kinds.** Each kind of destination is one file implementing
//! [`Destination`] and one arm in [`Destinations::new`]: [`http`] (a
//! request carrying `Idempotency-Key: <derived key>`), [`nats`] (a
//! JetStream publish carrying `Nats-Msg-Id: <derived key>`) and [`amqp`]
//! (a RabbitMQ publish carrying `message_id = <derived key>`). Every kind
//! calls a message delivered only once the far side has confirmed it (a
//! `2xx` response head, the stream's acknowledgement, the broker's
//! confirmation of a message it did not return); anything else is a
//! failure, classed as worth a retry or not. A relay mixes kinds freely:
//! each destination has a lane of its own, so a slow broker holds up no
//! HTTP destination and no other broker. The fields of one kind set on a
//! destination of another are refused by name, here, where `relay`,
//! `serve --relay` and `check-config` all build their destinations.
//!
//! **One place for failure reasons.** A kind reports its reason as it saw
//! it; [`Destinations`] scrubs it of every configured secret ([`Scrubber`])
//! and makes it [`printable`], once: `last_error`, the admin API and the
//! log line all show that text, and a destination that echoes its own
//! token does not make the relay store or print it.

pub mod amqp;
pub mod http;
pub mod nats;
pub mod target;
mod template;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::claim::Claimed;
use super::retry::Class;
use crate::config::{DestinationConfig, DestinationKind, Scrubber};
use crate::escape::printable;
pub use target::Target;
pub use template::{RenderError, TemplateError};

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

/// Why a destination could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A destination's fields do not make a request, or its `ca_file`
    /// cannot be read.
    #[error("destinations.{name}: {reason}")]
    Invalid {
        /// The destination.
        name: String,
        /// What is wrong, naming the field (boxed: it is large, and rare).
        #[source]
        reason: Box<DestinationError>,
    },
}

/// What is wrong with one destination's fields, by its kind.
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// A field of another kind.
    #[error(transparent)]
    Foreign(#[from] ForeignField),
    /// `kind = "http"`.
    #[error(transparent)]
    Http(#[from] http::HttpError),
    /// `kind = "nats"`.
    #[error(transparent)]
    Nats(#[from] nats::NatsError),
    /// `kind = "amqp"`.
    #[error(transparent)]
    Amqp(#[from] amqp::AmqpError),
}

/// One configured destination, of some kind.
pub trait Destination: Send + Sync + 'static {
    /// One attempt, bounded by the destination's `timeout`. A failure's
    /// reason may hold whatever the far side said: [`Destinations`] scrubs
    /// it; `scrubber` is for a kind that must cut such text short.
    fn publish<'a>(
        &'a self,
        message: &'a Claimed,
        scrubber: &'a Scrubber,
    ) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>>;
}

/// The relay's publisher: every configured destination by name.
pub struct Destinations {
    destinations: HashMap<String, Box<dyn Destination>>,
    scrubber: Scrubber,
}

impl Destinations {
    /// Builds every destination of `configs`, each by its kind. Everything
    /// a destination can get wrong fails here, before any row is claimed:
    /// `check-config` builds the same. Connects to nothing yet.
    pub fn new(configs: &BTreeMap<String, DestinationConfig>) -> Result<Self, PublisherError> {
        let mut destinations = HashMap::new();
        for (name, config) in configs {
            let invalid =
                |reason: DestinationError| PublisherError::Invalid { name: name.clone(), reason: Box::new(reason) };
            refuse_other_kinds_fields(config).map_err(|e| invalid(e.into()))?;
            let destination: Box<dyn Destination> = match config.kind {
                DestinationKind::Http => Box::new(http::HttpDestination::new(config).map_err(|e| invalid(e.into()))?),
                DestinationKind::Nats => Box::new(nats::NatsDestination::new(config).map_err(|e| invalid(e.into()))?),
                DestinationKind::Amqp => Box::new(amqp::AmqpDestination::new(config).map_err(|e| invalid(e.into()))?),
            };
            destinations.insert(name.clone(), destination);
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

impl Publisher for Destinations {
    async fn publish(&self, message: &Claimed) -> Delivery {
        let Some(destination) = self.destinations.get(&message.destination) else {
            let reason = format!("no destination named {:?} is configured", message.destination);
            return self.failed(Class::Reject, None, &reason);
        };
        match destination.publish(message, &self.scrubber).await {
            Delivery::Failed { class, retry_after, reason } => self.failed(class, retry_after, &reason),
            delivered => delivered,
        }
    }
}

/// A broker message's headers, in order: the destination's configured
/// ones, the message's own (each checked by `allowed`; a name given in
/// both, in any case, is the message's), and the row's trace context as a
/// new span (`traceparent`, and `tracestate` when it has one), replacing
/// any trace headers of the message. The kind adds its own key header last.
fn message_headers<E>(
    configured: &[(String, String)],
    message: &Claimed,
    allowed: impl Fn(&str, &str) -> Result<(), E>,
) -> Result<Vec<(String, String)>, MessageHeaderError<E>> {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| {
        headers.retain(|(other, _)| !other.eq_ignore_ascii_case(name));
        headers.push((name.to_owned(), value.to_owned()));
    };
    for (name, value) in configured {
        set(name, value);
    }
    for (name, value) in &message.headers {
        allowed(name, value).map_err(MessageHeaderError)?;
        set(name, value);
    }
    if let Some(trace) = &message.trace {
        set("traceparent", &trace.child());
        set("tracestate", trace.tracestate().unwrap_or_default());
    }
    headers.retain(|(name, value)| !(name == "tracestate" && value.is_empty()));
    Ok(headers)
}

/// A message header the destination's rule `E` refuses.
#[derive(Debug, thiserror::Error)]
#[error("message {0}")]
pub struct MessageHeaderError<E>(#[source] pub E);

/// A field set that belongs to another kind of destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is a field of kind = \"{}\" destinations, and this one is kind = \"{}\"", owner.as_str(), this.as_str())]
pub struct ForeignField {
    /// The field.
    pub field: &'static str,
    /// The kind it belongs to.
    pub owner: DestinationKind,
    /// The destination's kind.
    pub this: DestinationKind,
}

/// Refuses a field that belongs to another kind of destination: set by
/// mistake, it would otherwise be ignored without a word.
fn refuse_other_kinds_fields(config: &DestinationConfig) -> Result<(), ForeignField> {
    let fields = [
        ("method", config.method.is_some(), DestinationKind::Http),
        ("subject", config.subject.is_some(), DestinationKind::Nats),
    ];
    for (field, set, owner) in fields {
        if set && config.kind != owner {
            return Err(ForeignField { field, owner, this: config.kind });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServiceUrl;

    fn build(config: DestinationConfig) -> Result<Destinations, String> {
        Destinations::new(&BTreeMap::from([("d".to_string(), config)])).map_err(|e| e.to_string())
    }

    fn nats(url: &str, subject: Option<&str>) -> DestinationConfig {
        let mut config = DestinationConfig::new(url);
        config.kind = DestinationKind::Nats;
        config.subject = subject.map(str::to_owned);
        config
    }

    #[test]
    fn each_kind_refuses_the_fields_of_another_and_names_them() {
        assert!(build(nats("nats://127.0.0.1:4222", Some("orders.{operation}"))).is_ok());
        let mut http = DestinationConfig::new("http://127.0.0.1:9/");
        http.subject = Some("orders".into());
        let error = build(http).err().unwrap();
        assert!(error.contains("destinations.d: subject is a field of kind = \"nats\""), "{error}");
        let mut with_method = nats("nats://127.0.0.1:4222", Some("orders"));
        with_method.method = Some("PUT".into());
        let error = build(with_method).err().unwrap();
        assert!(error.contains("method is a field of kind = \"http\""), "{error}");
    }

    #[test]
    fn a_nats_destination_needs_a_nats_url_and_a_subject_that_can_be_published_to() {
        for (config, says) in [
            (nats("http://127.0.0.1:4222", Some("orders")), "must be a nats:// or tls:// URL"),
            (nats("nats://127.0.0.1:4222", None), "needs a subject"),
            (nats("nats://127.0.0.1:4222", Some("orders.>")), "wildcards"),
            (nats("nats://127.0.0.1:4222", Some("orders..{operation}")), "empty token"),
            (nats("nats://127.0.0.1:4222", Some("orders.{tenant}")), "{tenant}"),
        ] {
            let error = build(config).err().unwrap();
            assert!(error.contains(says), "{says}: {error}");
        }
        let mut with_header = nats("nats://127.0.0.1:4222", Some("orders"));
        with_header.headers.insert("Nats-Expected-Stream".into(), "x".into());
        assert!(build(with_header).err().unwrap().contains("JetStream's instructions"));
    }

    #[test]
    fn an_amqp_destination_needs_an_amqp_url_an_exchange_and_a_routing_key() {
        let amqp = |url: &str, exchange: Option<&str>, routing_key: Option<&str>| {
            let mut config = DestinationConfig::new(url);
            config.kind = DestinationKind::Amqp;
            config.exchange = exchange.map(str::to_owned);
            config.routing_key = routing_key.map(str::to_owned);
            config
        };
        assert!(build(amqp("amqp://guest:guest@127.0.0.1:5672/%2f", Some(""), Some("orders.{operation}"))).is_ok());
        let mut with_ca = amqp("amqps://127.0.0.1:5671/%2f", Some("x"), Some("k"));
        with_ca.ca_file = Some("/etc/ssl/ca.pem".into());
        let mut with_subject = amqp("amqp://127.0.0.1:5672/%2f", Some("x"), Some("k"));
        with_subject.subject = Some("orders".into());
        for (config, says) in [
            (amqp("nats://127.0.0.1:4222", Some("x"), Some("k")), "must be an amqp:// or amqps:// URL"),
            (amqp("amqp://127.0.0.1:5672/%2f", None, Some("k")), "needs an exchange"),
            (amqp("amqp://127.0.0.1:5672/%2f", Some("x"), None), "needs a routing_key"),
            (amqp("amqp://127.0.0.1:5672/%2f", Some(&"x".repeat(256)), Some("k")), "longer than 255 bytes"),
            (amqp("amqp://127.0.0.1:5672/%2f", Some("x"), Some("{tenant}")), "{tenant}"),
            (with_ca, "ca_file is not supported"),
            (with_subject, "subject is a field of kind = \"nats\""),
        ] {
            let error = build(config).err().unwrap();
            assert!(error.contains(says), "{says}: {error}");
        }
    }

    #[test]
    fn a_nats_token_in_the_url_is_redacted_like_a_password() {
        let config = nats("nats://s3cr3t-token@127.0.0.1:4222", Some("orders"));
        assert_eq!(ServiceUrl::new(config.url.as_str()).redacted(), "nats://[redacted]@127.0.0.1:4222");
        let printed = format!("{} {config:?}", toml::to_string(&config).unwrap());
        assert!(!printed.contains("s3cr3t-token"), "{printed}");
        let scrubbed = Scrubber::of_destinations([&config]).scrub("auth failed for s3cr3t-token");
        assert!(!scrubbed.contains("s3cr3t-token"), "{scrubbed}");
    }
}
