//! `kind = "amqp"`: each message an AMQP 0-9-1 publish (RabbitMQ).
//!
//! An [`AmqpDestination`] publishes the payload as a persistent message
//! (`delivery_mode = 2`, `content_type = application/json`) to its
//! `exchange` with a `routing_key` (a [`Template`] over the message's
//! names), `message_id = <derived key>`, the destination's configured
//! headers, the message's own and the row's trace context as a new span
//! (`traceparent`, `tracestate`), on a channel in confirm mode, with
//! `mandatory` set.
//!
//! **The broker's confirmation decides.** A message is delivered when the
//! broker acks it and did not return it. A return (no queue bound for the
//! routing key: RabbitMQ would otherwise drop the message and still ack),
//! a nack, no confirmation within `timeout`, a closed channel or connection
//! (an exchange that does not exist closes the channel) are retried with
//! the destination's backoff, under the same `message_id`: RabbitMQ keeps
//! no memory of ids, so consumers deduplicate on `message_id` for
//! `key_retention`, as HTTP destinations do on `Idempotency-Key`. A message
//! no retry can publish (a routing key or header name over AMQP's 255
//! bytes, a name that cannot fill the template) is refused at once.
//!
//! **Connecting.** The connection and its channel are opened on the first
//! publish, and again on the next publish after either closed or an
//! attempt on them went unanswered (a killed broker leaves a connection
//! that still looks open), so a relay starts while its broker is down and
//! a broker restart costs the attempts that fail meanwhile, nothing else.
//! The URL's credentials (`amqp://user:password@host/vhost`) log in;
//! `amqps://` is TLS, verified against the public roots. A TCP connect is
//! bounded by the destination's `timeout` unless the URL sets
//! `?connection_timeout=` (milliseconds).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::super::claim::Claimed;
use super::super::retry::Class;
use super::template::{Template, TemplateError};
use super::{Delivery, Destination, MessageHeaderError, message_headers};
use crate::config::{DestinationConfig, Scrubber, ServiceUrl};

/// AMQP's limit on a short string: a routing key, an exchange, a header name.
const MAX_SHORT: usize = 255;

/// A RabbitMQ (AMQP 0-9-1) destination.
pub struct AmqpDestination {
    /// The broker's URI, credentials included (never printed), with a
    /// TCP connect timeout.
    uri: AMQPUri,
    shown: String,
    exchange: ShortString,
    routing_key: Template,
    /// The configured headers, checked.
    headers: Vec<(String, String)>,
    timeout: Duration,
    open: Mutex<Option<Open>>,
}

/// A connection and its confirm-mode channel; the generation tells a
/// failed attempt's connection from one opened since.
struct Open {
    generation: u64,
    connection: Connection,
    channel: Channel,
}

/// Why an AMQP destination cannot be built (naming the field) or reached.
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// Not `amqp://` or `amqps://`.
    #[error("url {0:?} must be an amqp:// or amqps:// URL")]
    Scheme(String),
    /// The client does not take the URL.
    #[error("url {shown:?}: {}", printable_error(.reason))]
    Url {
        /// The URL, redacted.
        shown: String,
        /// The client's reason (it gives text only).
        reason: String,
    },
    /// `ca_file`, not supported yet.
    #[error("ca_file is not supported for kind = \"amqp\" yet: amqps:// is verified against the public roots")]
    CaFile,
    /// No `exchange`.
    #[error("kind = \"amqp\" needs an exchange (\"\" is the default exchange)")]
    NoExchange,
    /// An exchange name longer than a short string.
    #[error("exchange is longer than {MAX_SHORT} bytes")]
    LongExchange,
    /// No `routing_key`.
    #[error("kind = \"amqp\" needs a routing_key")]
    NoRoutingKey,
    /// The routing key does not parse as a template.
    #[error("routing_key: {0}")]
    RoutingKey(#[source] TemplateError),
    /// A configured header.
    #[error("headers: {0}")]
    Header(#[source] HeaderNameError),
    /// No connection (at a publish).
    #[error("cannot connect to {shown}: {}", printable_error(.source))]
    Connect {
        /// The URL, redacted.
        shown: String,
        /// Why.
        #[source]
        source: lapin::Error,
    },
    /// No channel on the connection.
    #[error("cannot open a channel: {0}")]
    Channel(#[source] lapin::Error),
    /// The channel refused confirm mode.
    #[error("cannot turn publisher confirms on: {0}")]
    Confirms(#[source] lapin::Error),
}

/// A header name longer than an AMQP short string, or empty (cut to 64 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {0:?} must be 1 to {MAX_SHORT} bytes")]
pub struct HeaderNameError(pub String);

/// Why one message cannot be published (refused, not retried).
#[derive(Debug, thiserror::Error)]
enum MessageError {
    /// A header of the message's.
    #[error(transparent)]
    Headers(#[from] MessageHeaderError<HeaderNameError>),
    /// A header name, once checked, still too long.
    #[error("a header name is too long")]
    LongHeader,
    /// The derived key.
    #[error("the derived key is too long")]
    DerivedKey,
}

impl AmqpDestination {
    /// Checks the destination's URL, exchange, routing key and headers;
    /// the error names the field. Connects to nothing.
    pub fn new(config: &DestinationConfig) -> Result<Self, AmqpError> {
        let shown = ServiceUrl::new(config.url.as_str()).redacted();
        if !(config.url.starts_with("amqp://") || config.url.starts_with("amqps://")) {
            return Err(AmqpError::Scheme(shown));
        }
        let mut uri: AMQPUri = match config.url.parse() {
            Ok(uri) => uri,
            Err(reason) => return Err(AmqpError::Url { shown, reason }),
        };
        // lapin connects on a thread of its own with a blocking connect: to
        // a host that drops packets that would outlive the attempt by
        // minutes, one thread per attempt, unless the URI bounds it.
        if uri.query.connection_timeout.is_none() {
            uri.query.connection_timeout = Some(u64::try_from(config.timeout.0.as_millis()).unwrap_or(u64::MAX));
        }
        if config.ca_file.is_some() {
            return Err(AmqpError::CaFile);
        }
        let exchange = config.exchange.as_deref().ok_or(AmqpError::NoExchange)?;
        let exchange = ShortString::try_new(exchange).map_err(|_| AmqpError::LongExchange)?;
        let routing_key = config.routing_key.as_deref().ok_or(AmqpError::NoRoutingKey)?;
        let routing_key = Template::parse(routing_key).map_err(AmqpError::RoutingKey)?;
        let mut headers = Vec::new();
        for (name, value) in &config.headers {
            header_name(name).map_err(AmqpError::Header)?;
            headers.push((name.clone(), value.clone()));
        }
        Ok(Self { uri, shown, exchange, routing_key, headers, timeout: config.timeout.0, open: Mutex::new(None) })
    }

    /// The open channel and its generation, opening a connection and a
    /// channel when there is none, or the one there is has closed.
    async fn channel(&self) -> Result<(u64, Channel), AmqpError> {
        let mut open = self.open.lock().await;
        if let Some(open) = open.as_ref()
            && open.connection.status().connected()
            && open.channel.status().connected()
        {
            return Ok((open.generation, open.channel.clone()));
        }
        let generation = open.as_ref().map_or(0, |open| open.generation + 1);
        if let Some(stale) = open.take() {
            close(stale.connection);
        }
        let properties = ConnectionProperties::default().with_connection_name("idemgate-relay".into());
        let connection = Connection::connect_uri(self.uri.clone(), properties)
            .await
            .map_err(|source| AmqpError::Connect { shown: self.shown.clone(), source })?;
        let channel = connection.create_channel().await.map_err(AmqpError::Channel)?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(AmqpError::Confirms)?;
        *open = Some(Open { generation, connection, channel: channel.clone() });
        Ok((generation, channel))
    }

    /// Gives up the connection of `generation` after an attempt on it
    /// failed for want of an answer: a broker that was killed or cut off
    /// leaves a connection that still looks open, and waiting on it would
    /// cost every later attempt its whole `timeout`. The next attempt opens
    /// a new one; publishes still waiting on the old one fail and are
    /// retried under their own `message_id`.
    async fn give_up(&self, generation: u64) {
        let mut open = self.open.lock().await;
        if open.as_ref().is_some_and(|open| open.generation == generation)
            && let Some(stale) = open.take()
        {
            close(stale.connection);
        }
    }

    /// The message's properties: persistent, JSON, its headers and the derived key.
    fn properties(&self, message: &Claimed) -> Result<BasicProperties, MessageError> {
        let headers = message_headers(&self.headers, message, |name, _| header_name(name))?;
        let mut table = FieldTable::default();
        for (name, value) in headers {
            let name = ShortString::try_new(name).map_err(|_| MessageError::LongHeader)?;
            table.insert(name, AMQPValue::LongString(LongString::from(value)));
        }
        let id = ShortString::try_new(message.derived_key.as_str()).map_err(|_| MessageError::DerivedKey)?;
        Ok(BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(id)
            .with_headers(table))
    }

    async fn attempt(&self, message: &Claimed) -> Delivery {
        let failed = |class, reason: String| Delivery::Failed { class, retry_after: None, reason };
        let routing_key = match self.routing_key.render(message, |_| Ok::<(), std::convert::Infallible>(())) {
            Ok(key) => key,
            Err(reason) => return failed(Class::Reject, format!("routing_key: {reason}")),
        };
        let Ok(routing_key) = ShortString::try_new(routing_key) else {
            return failed(Class::Reject, format!("routing_key: longer than {MAX_SHORT} bytes once filled in"));
        };
        let properties = match self.properties(message) {
            Ok(properties) => properties,
            Err(reason) => return failed(Class::Reject, reason.to_string()),
        };
        let used = std::sync::Mutex::new(None);
        let confirmed = tokio::time::timeout(self.timeout, async {
            let (generation, channel) = self.channel().await.map_err(|e| e.to_string())?;
            if let Ok(mut used) = used.lock() {
                *used = Some(generation);
            }
            let options = BasicPublishOptions { mandatory: true, immediate: false };
            let payload = message.payload.as_bytes();
            let pending = channel
                .basic_publish(self.exchange.clone(), routing_key.clone(), options, payload, properties)
                .await
                .map_err(|e| format!("the publish failed: {}", printable_error(&e)))?;
            pending.await.map_err(|e| format!("no confirmation: {}", printable_error(&e)))
        })
        .await;
        let generation = used.lock().ok().and_then(|used| *used);
        // Any answer but a clean ack gives the connection up: the next
        // attempt starts from a fresh connection and channel.
        if !matches!(confirmed, Ok(Ok(Confirmation::Ack(None))))
            && let Some(generation) = generation
        {
            self.give_up(generation).await;
        }
        match confirmed {
            Ok(Ok(Confirmation::Ack(None))) => Delivery::Delivered,
            Ok(Ok(Confirmation::Ack(Some(returned)))) => failed(
                Class::Retry,
                format!(
                    "returned by the broker ({} {}): no queue is bound to exchange {:?} for routing key {:?}",
                    returned.reply_code,
                    returned.reply_text,
                    self.exchange.as_str(),
                    routing_key.as_str()
                ),
            ),
            Ok(Ok(Confirmation::Nack(_))) => failed(Class::Retry, "the broker refused the message (nack)".into()),
            Ok(Ok(Confirmation::NotRequested)) => failed(Class::Retry, "the channel was not in confirm mode".into()),
            Ok(Err(reason)) => failed(Class::Retry, reason),
            Err(_) => failed(Class::Retry, format!("no confirmation within {:?}", self.timeout)),
        }
    }
}

impl Destination for AmqpDestination {
    fn publish<'a>(
        &'a self,
        message: &'a Claimed,
        _scrubber: &'a Scrubber,
    ) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.attempt(message))
    }
}

/// Closes a connection given up on, in the background and briefly: a dead
/// broker never answers the close.
fn close(connection: Connection) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(1), connection.close(320, "reconnecting".into())).await;
    });
}

/// Whether `name` can be an AMQP header name.
fn header_name(name: &str) -> Result<(), HeaderNameError> {
    if name.is_empty() || name.len() > MAX_SHORT {
        return Err(HeaderNameError(name.chars().take(64).collect()));
    }
    Ok(())
}

/// An error as one line: the broker's texts may hold line breaks.
fn printable_error(error: &impl std::fmt::Display) -> String {
    error.to_string().replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigDuration, DestinationKind};

    fn destination(url: &str) -> AmqpDestination {
        let mut config = DestinationConfig::new(url);
        config.kind = DestinationKind::Amqp;
        config.exchange = Some("x".into());
        config.routing_key = Some("k".into());
        config.timeout = ConfigDuration(Duration::from_secs(3));
        AmqpDestination::new(&config).expect("a valid destination")
    }

    #[test]
    fn a_connect_is_bounded_by_the_timeout_unless_the_url_says_otherwise() {
        assert_eq!(destination("amqp://127.0.0.1:5672/%2f").uri.query.connection_timeout, Some(3000));
        let explicit = destination("amqp://127.0.0.1:5672/%2f?connection_timeout=500");
        assert_eq!(explicit.uri.query.connection_timeout, Some(500));
    }
}
