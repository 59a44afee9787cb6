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

/// Panics with what to do when nothing listens at `url`'s address.
fn require(name: &str, variable: &str, url: &str, default_port: u16, start: &str) {
    let Some(address) = address_of(url, default_port) else { return };
    if !listening(&address) {
        panic!(
            "the test suite needs {name} at {address} ({variable} = {url:?}) and nothing listens there: {start}, \
             or set {variable} to one that runs (see README, Development)"
        );
    }
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

/// The suite's PostgreSQL: `DATABASE_URL`, else the one on 127.0.0.1:5432,
/// else a private one for this test process.
pub fn postgres_url() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let given = std::env::var("DATABASE_URL").ok().filter(|_| !private_forced());
            if given.is_none() && (private_forced() || !listening("127.0.0.1:5432")) {
                let server = super::postgres_server::PostgresProcess::start();
                let url = server.url();
                server.keep_until_this_process_exits();
                return url;
            }
            let url = given.unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_string());
            require(
                "PostgreSQL",
                "DATABASE_URL",
                &url,
                5432,
                "install and start it (Debian: `apt-get install postgresql`, then \
                 `pg_ctlcluster <version> main start`; trust auth for postgres on 127.0.0.1 and a database `test`, \
                 as .ci/run sets up)",
            );
            url
        })
        .clone()
}

/// The suite's Redis: `REDIS_URL`, else the one on 127.0.0.1:6379, else a
/// private one for this test process.
pub fn redis_url() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let given = std::env::var("REDIS_URL").ok().filter(|_| !private_forced());
            if given.is_none() && (private_forced() || !listening("127.0.0.1:6379")) {
                let server = super::redis_server::RedisProcess::start();
                let url = server.url();
                server.keep_until_this_process_exits();
                return url;
            }
            let url = given.unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string());
            require(
                "Redis",
                "REDIS_URL",
                &url,
                6379,
                "install and start it (Debian: `apt-get install redis-server`, then \
                 `redis-server --daemonize yes --port 6379 --save ''`)",
            );
            url
        })
        .clone()
}
