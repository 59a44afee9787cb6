//! The shared servers the suite needs.
//!
//! Most tests talk to the PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and the Redis at `REDIS_URL`
//! (default `redis://127.0.0.1:6379/0`). When the variable is set, the
//! server must be there: the first use checks that something listens and,
//! if not, fails with what to start or set. When it is not set and nothing
//! runs at the default address, the test process starts a private server
//! on a free port (as the fault tests do) and uses it; it is stopped when
//! the process exits. So `cargo test` on a machine with the server binaries
//! installed needs nothing running. `IDEMGATE_TEST_PRIVATE_SERVERS=1`
//! forces the private servers (to check this path where shared ones run).

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

/// `host:port` of a `scheme://[user[:password]@]host:port/...` URL, if it has one.
fn address_of(url: &str, default_port: u16) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.is_empty() || host_port.contains(',') {
        return None; // a socket directory, or several hosts: not checked here
    }
    let has_port =
        host_port.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) && !host_port.ends_with(']');
    Some(if has_port { host_port.to_string() } else { format!("{host_port}:{default_port}") })
}

/// Whether something accepts TCP connections at `address` within a second.
fn listening(address: &str) -> bool {
    let Ok(addresses) = address.to_socket_addrs() else { return false };
    addresses.into_iter().any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

/// Whether the private servers are forced (`IDEMGATE_TEST_PRIVATE_SERVERS=1`).
fn private_forced() -> bool {
    std::env::var_os("IDEMGATE_TEST_PRIVATE_SERVERS").is_some_and(|v| v == "1")
}

/// Stops `pid` with `signal` (then SIGKILL) and removes `dir` once this
/// process has exited, by a small watchdog shell of its own.
// The watchdog outlives this process by design: nothing here waits for it.
#[allow(clippy::zombie_processes)]
pub fn stop_when_this_process_exits(pid: u32, signal: &str, dir: &std::path::Path) {
    let me = std::process::id();
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill -{signal} {pid} 2>/dev/null; \
         for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 {pid} 2>/dev/null || break; sleep 0.5; done; \
         kill -KILL {pid} 2>/dev/null; rm -rf '{}'",
        dir.display()
    );
    std::process::Command::new("sh")
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the watchdog of a private test server");
}

/// One of the servers the suite shares.
struct Service {
    name: &'static str,
    variable: &'static str,
    default_url: &'static str,
    default_port: u16,
    /// What to do when `variable` names a server that is not there.
    start: &'static str,
    /// Starts a private server for this process; returns its URL.
    start_private: fn() -> String,
}

impl Service {
    /// `variable` if set, else the server at the default address, else a
    /// private one for this process.
    fn url(&self) -> String {
        let given = std::env::var(self.variable).ok().filter(|_| !private_forced());
        let Some(url) = given else {
            let default = format!("127.0.0.1:{}", self.default_port);
            if private_forced() || !listening(&default) {
                return (self.start_private)();
            }
            return self.default_url.to_string();
        };
        if let Some(address) = address_of(&url, self.default_port)
            && !listening(&address)
        {
            panic!(
                "the test suite needs {} at {address} ({} = {url:?}) and nothing listens there: {}, \
                 or point {} at one that runs (see docs/development.md)",
                self.name, self.variable, self.start, self.variable
            );
        }
        url
    }
}

/// The suite's PostgreSQL: `DATABASE_URL`, else the one on 127.0.0.1:5432,
/// else a private one for this test process.
pub fn postgres_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    let service = Service {
        name: "PostgreSQL",
        variable: "DATABASE_URL",
        default_url: "postgres://postgres@127.0.0.1:5432/test",
        default_port: 5432,
        start: "start it (Debian: `pg_ctlcluster <version> main start`; trust auth for postgres on 127.0.0.1), \
                or unset DATABASE_URL to let each test process start a private one",
        start_private: || {
            let server = super::postgres_server::PostgresProcess::start();
            let url = server.url();
            server.keep_until_this_process_exits();
            url
        },
    };
    URL.get_or_init(|| service.url()).clone()
}

/// The suite's Redis: `REDIS_URL`, else the one on 127.0.0.1:6379, else a
/// private one for this test process.
pub fn redis_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    let service = Service {
        name: "Redis",
        variable: "REDIS_URL",
        default_url: "redis://127.0.0.1:6379/0",
        default_port: 6379,
        start: "start it (`redis-server --daemonize yes --port 6379 --save ''`), \
                or unset REDIS_URL to let each test process start a private one",
        start_private: || {
            let server = super::redis_server::RedisProcess::start();
            let url = server.url();
            server.keep_until_this_process_exits();
            url
        },
    };
    URL.get_or_init(|| service.url()).clone()
}

/// The suite's NATS with JetStream: `NATS_URL`, else the one on
/// 127.0.0.1:4222, else a private one for this test process.
pub fn nats_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    let service = Service {
        name: "NATS",
        variable: "NATS_URL",
        default_url: "nats://127.0.0.1:4222",
        default_port: 4222,
        start: "start it with JetStream (`nats-server -js`), or unset NATS_URL to let each test process start a private one",
        start_private: || {
            let server = super::nats::NatsProcess::start();
            let url = server.url();
            server.keep_until_this_process_exits();
            url
        },
    };
    URL.get_or_init(|| service.url()).clone()
}

/// The suite's RabbitMQ: `AMQP_URL`, else the one on 127.0.0.1:5672,
/// else a private one for this test process.
pub fn amqp_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    let service = Service {
        name: "RabbitMQ",
        variable: "AMQP_URL",
        default_url: "amqp://guest:guest@127.0.0.1:5672/%2f",
        default_port: 5672,
        start: "start it (`rabbitmq-server -detached`), or unset AMQP_URL to let each test process start a private one",
        start_private: || {
            let server = super::amqp::RabbitProcess::start();
            let url = server.url();
            server.keep_until_this_process_exits();
            url
        },
    };
    URL.get_or_init(|| service.url()).clone()
}
