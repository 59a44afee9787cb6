//! RabbitMQ for tests: the shared broker (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`) or, when none runs, a private
//! `rabbitmq-server` ([`RabbitProcess`]), and a client to declare an
//! exchange and queue of the test's own and read what reached them.
//!
//! Each test isolates itself with an exchange and queue named by
//! [`unique_name`], and deletes them when it is done.

use std::fs;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::redis_server::{TempDir, free_port};

/// The suite's RabbitMQ: `AMQP_URL`, else the one on 127.0.0.1:5672,
/// else a private one for this test process.
pub fn amqp_url() -> String {
    super::services::amqp_url()
}

/// One private `rabbitmq-server` (its own node name, ports, data and
/// config), SIGKILLed when dropped. It takes some seconds to start.
pub struct RabbitProcess {
    port: u16,
    dist_port: u16,
    dir: TempDir,
    /// The Erlang VM's PID (the server's own wrapper scripts run it under
    /// the rabbitmq user, in a session of its own).
    pid: Option<u32>,
    /// The `rabbitmq-server` wrapper this process started.
    wrapper: Option<std::process::Child>,
}

impl RabbitProcess {
    pub fn start() -> Self {
        let dir = TempDir::new("rabbitmq");
        let (port, dist_port) = (free_port(), free_port());
        fs::write(dir.0.join("enabled_plugins"), "[].\n").expect("write enabled_plugins");
        let config = format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n");
        fs::write(dir.0.join("rabbitmq.conf"), config).expect("write rabbitmq.conf");
        // The server drops to the rabbitmq user: its directory must be that user's.
        let _ = Command::new("chown").args(["-R", "rabbitmq"]).arg(&dir.0).status();
        let mut server = Self { port, dist_port, dir, pid: None, wrapper: None };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn spawn(&mut self) {
        let dir = &self.dir.0;
        let pid_file = dir.join("pid");
        let _ = fs::remove_file(&pid_file);
        let log = fs::File::create(dir.join("server.log")).expect("create a server log");
        let mut child = Command::new("rabbitmq-server")
            .env("RABBITMQ_NODENAME", format!("idemgate-test-{}@localhost", self.port))
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_PID_FILE", &pid_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start rabbitmq-server (Debian: apt-get install rabbitmq-server): {e}"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let pid = fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse().ok());
            if pid.is_some() && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.pid = pid;
                self.wrapper = Some(child);
                return;
            }
            if child.try_wait().ok().flatten().is_some() || Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let log = fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                panic!("rabbitmq-server on {} did not start:\n{log}", self.port);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the broker (its Erlang VM, by the PID it wrote).
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if let Some(mut wrapper) = self.wrapper.take() {
            let _ = wrapper.kill();
            let _ = wrapper.wait();
        }
    }

    /// SIGKILLs the broker and starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Leaves the broker running until this test process exits.
    pub fn keep_until_this_process_exits(mut self) {
        let pid = self.pid.take().expect("a running broker");
        super::services::stop_when_this_process_exits(pid, "TERM", &self.dir.0);
        std::mem::forget(self.wrapper.take());
        std::mem::forget(self);
    }
}

impl Drop for RabbitProcess {
    fn drop(&mut self) {
        self.kill();
    }
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

/// A durable topic exchange `name` and a durable queue `name` bound to it
/// for every routing key: both outlive a broker restart.
pub async fn exchange_with_queue(channel: &Channel, name: &str) {
    exchange(channel, name).await;
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(name.into(), durable, FieldTable::default()).await.expect("declare a queue");
    channel
        .queue_bind(name.into(), name.into(), "#".into(), QueueBindOptions::default(), FieldTable::default())
        .await
        .expect("bind the queue");
}

/// A durable topic exchange `name`, no queue bound.
pub async fn exchange(channel: &Channel, name: &str) {
    let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
    channel
        .exchange_declare(name.into(), ExchangeKind::Topic, durable, FieldTable::default())
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
