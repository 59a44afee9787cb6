//! NATS with JetStream for tests: the shared server (`NATS_URL`, default
//! `nats://127.0.0.1:4222`), or a private `nats-server -js` on a free port
//! when none runs, and a JetStream client to make streams and read them.
//!
//! Each test isolates itself with a stream and subjects of its own
//! ([`unique_subject`]), and deletes the stream when it is done.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::{START_TIMEOUT, TempDir, free_port};

/// One private `nats-server -js`, killed when dropped.
pub struct NatsProcess {
    port: u16,
    child: Option<Child>,
    dir: TempDir,
}

impl NatsProcess {
    /// Starts a server with JetStream on a free loopback port and waits until it accepts connections.
    pub fn start() -> Self {
        let dir = TempDir::new("nats");
        let port = free_port();
        let child = spawn(port, &dir);
        Self { port, child: Some(child), dir }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server; [`NatsProcess::restart`] brings it back on the same port and store directory.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.child = Some(spawn(self.port, &self.dir));
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
        }
    }

    /// Leaves the server running until this test process exits.
    pub fn keep_until_this_process_exits(mut self) {
        let child = self.child.take().expect("a running server");
        super::services::stop_when_this_process_exits(child.id(), "TERM", &self.dir.0);
        std::mem::forget(child);
        std::mem::forget(self);
    }
}

impl Drop for NatsProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(port: u16, dir: &TempDir) -> Child {
    let log = std::fs::File::create(dir.0.join("nats.log")).expect("create a server log");
    let mut child = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.0.join("store"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone a file handle"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start nats-server (Debian: apt-get install nats-server): {e}"));
    let deadline = Instant::now() + START_TIMEOUT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if child.try_wait().ok().flatten().is_some() || Instant::now() >= deadline {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.0.join("nats.log")).unwrap_or_default();
            panic!("nats-server on {port} did not start:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// A subject prefix no other test uses, e.g. `test-3f2a…`.
pub fn unique_subject() -> String {
    format!("test-{:016x}", rand::random::<u64>())
}

/// A JetStream context on the suite's NATS.
pub async fn jetstream(url: &str) -> async_nats::jetstream::Context {
    let client = async_nats::connect(url).await.unwrap_or_else(|e| panic!("connect to NATS at {url}: {e}"));
    async_nats::jetstream::new(client)
}

/// Creates a stream `name` over `subjects`.
pub async fn create_stream(js: &async_nats::jetstream::Context, name: &str, subjects: Vec<String>) {
    js.create_stream(async_nats::jetstream::stream::Config { name: name.to_string(), subjects, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("create stream {name}: {e}"));
}

/// Every message in stream `name`, in stream order: (subject, headers, payload).
pub async fn messages(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Vec<async_nats::jetstream::message::StreamMessage> {
    let stream = js.get_stream(name).await.unwrap_or_else(|e| panic!("stream {name}: {e}"));
    let last = stream.get_info().await.map(|info| info.state.last_sequence).unwrap_or(0);
    let mut out = Vec::new();
    for sequence in 1..=last {
        if let Ok(message) = stream.get_raw_message(sequence).await {
            out.push(message);
        }
    }
    out
}
