//! The shared servers the suite needs, and one clear message when one is
//! missing.
//!
//! Most tests talk to the PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and the Redis at `REDIS_URL`
//! (default `redis://127.0.0.1:6379/0`). A machine without them would fail
//! dozens of tests with a dozen different errors; instead, the first use of
//! either checks that something listens there and, if not, fails with what
//! to start or set.

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

/// The shared PostgreSQL's URL, once it is known to listen.
pub fn postgres_url() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let url =
                std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
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

/// The shared Redis's URL, once it is known to listen.
pub fn redis_url() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_string());
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
