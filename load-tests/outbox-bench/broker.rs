//! The broker side of B1 and B2: a JetStream stream or a RabbitMQ
//! exchange with a bound queue made for one run, what it holds, and its
//! removal. Loopback brokers only.
//!
//! ```text
//! outbox-bench broker-setup  --kind nats|amqp --url URL --name N
//! outbox-bench broker-count  --kind nats|amqp --url URL --name N
//! outbox-bench broker-delete --kind nats|amqp --url URL --name N
//! ```
//!
//! NATS: a stream `N` over subjects `N.>` (the relay publishes on
//! `N.<operation>`). RabbitMQ: a topic exchange `N` and a queue `N` bound
//! to it for every routing key. `broker-count` prints the messages held.

use std::collections::BTreeMap;

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::{Failure, flag};

/// Runs one broker command; its JSON result.
pub async fn run(command: &str, flags: &BTreeMap<String, String>) -> Result<String, Failure> {
    let (kind, url, name) = (flag(flags, "kind")?, flag(flags, "url")?, flag(flags, "name")?);
    let host = url.rsplit('@').next().unwrap_or(url).split("://").last().unwrap_or_default();
    if !(host.starts_with("127.0.0.1") || host.starts_with("localhost") || host.starts_with("[::1]")) {
        return Err("--url must point at 127.0.0.1".into());
    }
    match kind {
        "nats" => nats(command, url, name).await,
        "amqp" => amqp(command, url, name).await,
        other => Err(format!("--kind {other:?}: nats or amqp").into()),
    }
}

async fn nats(command: &str, url: &str, name: &str) -> Result<String, Failure> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    match command {
        "broker-setup" => {
            let config = async_nats::jetstream::stream::Config {
                name: name.to_string(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            };
            js.create_stream(config).await?;
            Ok(r#"{"ok": true}"#.into())
        }
        "broker-count" => {
            let info = js.get_stream(name).await?.get_info().await?;
            Ok(format!(r#"{{"messages": {}}}"#, info.state.messages))
        }
        _ => {
            js.delete_stream(name).await?;
            Ok(r#"{"ok": true}"#.into())
        }
    }
}

async fn amqp(command: &str, url: &str, name: &str) -> Result<String, Failure> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let result = amqp_command(&channel, command, name).await;
    let _ = connection.close(200, "done".into()).await;
    result
}

async fn amqp_command(channel: &Channel, command: &str, name: &str) -> Result<String, Failure> {
    match command {
        "broker-setup" => {
            let (exchange, queue) = (ExchangeDeclareOptions::default(), QueueDeclareOptions::default());
            channel.exchange_declare(name.into(), ExchangeKind::Topic, exchange, FieldTable::default()).await?;
            channel.queue_declare(name.into(), queue, FieldTable::default()).await?;
            let bind = QueueBindOptions::default();
            channel.queue_bind(name.into(), name.into(), "#".into(), bind, FieldTable::default()).await?;
            Ok(r#"{"ok": true}"#.into())
        }
        "broker-count" => {
            let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
            let queue = channel.queue_declare(name.into(), passive, FieldTable::default()).await?;
            Ok(format!(r#"{{"messages": {}}}"#, queue.message_count()))
        }
        _ => {
            channel.queue_delete(name.into(), QueueDeleteOptions::default()).await?;
            channel.exchange_delete(name.into(), ExchangeDeleteOptions::default()).await?;
            Ok(r#"{"ok": true}"#.into())
        }
    }
}
