//! RabbitMQ for tests: the shared broker (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), and a client to declare an
//! exchange and queue of the test's own and read what reached them.
//!
//! Each test isolates itself with an exchange and queue named by
//! [`unique_name`], and deletes them when it is done.

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

/// The broker's URL: `AMQP_URL`, else the one on 127.0.0.1:5672.
pub fn amqp_url() -> String {
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let address = url.split_once('@').map_or("127.0.0.1:5672", |(_, rest)| rest.split('/').next().unwrap_or_default());
    assert!(
        std::net::TcpStream::connect(address).is_ok(),
        "the test suite needs RabbitMQ at {address} (AMQP_URL = {url:?}): start it (`rabbitmq-server -detached`), or point AMQP_URL at one that runs"
    );
    url
}

/// A name no other test uses, e.g. `test-3f2a…`.
pub fn unique_name() -> String {
    format!("test-{:016x}", rand::random::<u64>())
}

/// A client channel on the broker at `url`, and its connection.
pub async fn channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("connect to RabbitMQ at {url}: {e}"));
    let channel = connection.create_channel().await.expect("a channel");
    (connection, channel)
}

/// A topic exchange `name` and a queue `name` bound to it for every routing key.
pub async fn exchange_with_queue(channel: &Channel, name: &str) {
    exchange(channel, name).await;
    channel
        .queue_declare(name.into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .expect("declare a queue");
    channel
        .queue_bind(name.into(), name.into(), "#".into(), QueueBindOptions::default(), FieldTable::default())
        .await
        .expect("bind the queue");
}

/// A topic exchange `name`, no queue bound.
pub async fn exchange(channel: &Channel, name: &str) {
    channel
        .exchange_declare(name.into(), ExchangeKind::Topic, ExchangeDeclareOptions::default(), FieldTable::default())
        .await
        .expect("declare an exchange");
}

/// Every message in queue `name`, in queue order, acknowledged.
pub async fn drain(channel: &Channel, name: &str) -> Vec<lapin::message::Delivery> {
    let mut out = Vec::new();
    while let Some(message) = channel.basic_get(name.into(), BasicGetOptions { no_ack: true }).await.expect("basic.get")
    {
        out.push(message.delivery);
    }
    out
}

/// Deletes the exchange and queue `name`.
pub async fn delete(channel: &Channel, name: &str) {
    let _ = channel.queue_delete(name.into(), QueueDeleteOptions::default()).await;
    let _ = channel.exchange_delete(name.into(), ExchangeDeleteOptions::default()).await;
}

/// A header of `message` as text.
pub fn header(message: &lapin::message::Delivery, name: &str) -> Option<String> {
    let headers = message.properties.headers().as_ref()?;
    headers.inner().iter().find(|(key, _)| key.as_str() == name).and_then(|(_, value)| match value {
        lapin::types::AMQPValue::LongString(text) => Some(text.to_string()),
        _ => None,
    })
}
