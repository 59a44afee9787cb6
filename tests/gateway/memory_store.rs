//! Bounded memory per connection: the `idemgate serve` binary holds
//! [`CONNECTIONS`] idle keep-alive connections, each of which has served
//! one request, for at most [`PER_CONNECTION_KIB`] of resident memory each
//! (P10 in the load tests measures the same at 1,000 connections).
//!
//! What a connection holds is mostly hyper's: an 8 KiB read buffer, an
//! 8 KiB write buffer, its in-flight slot and its task; resident, about
//! 16.5 KiB on a debug build (pages of a buffer never written are not
//! resident). The bound catches the read buffer doubling to 16 KiB, which
//! is what happened while hyper_util's protocol detection replayed a
//! connection's first 24 bytes to the HTTP/1 parser: 20.7 KiB a connection
//! here with that detection put back. It is an assertion on memory, not on
//! time; the figure is printed.

use crate::support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::redis_server::free_port;
use support::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BINARY: &str = env!("CARGO_BIN_EXE_idemgate");
const CONNECTIONS: u64 = 500;
const PER_CONNECTION_KIB: u64 = 18;

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Gateway {
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).expect("the gateway runs");
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS in kB")
    }
}

/// One `GET` on a fresh keep-alive connection, its whole response read; the
/// connection is returned open.
async fn served_connection(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET /held HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the gateway closed a keep-alive connection: {}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            assert!(text.starts_with("http/1.1 200"), "{text}");
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .expect("a content-length");
            if reply.len() >= end + 4 + length {
                return stream;
            }
        }
    }
}

#[tokio::test]
async fn an_idle_connection_that_served_a_request_costs_under_the_bound() {
    let upstream = Upstream::start().await;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port());
    let gateway = Gateway(
        Command::new(BINARY)
            .args(["serve", "--listen", &addr.to_string(), "--admin-listen", &admin])
            .args(["--upstream", &upstream.url(), "--store", "memory://"])
            .env("IDEMGATE__LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start idemgate serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "idemgate serve did not listen on {addr}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Warm up: the first requests allocate what every later one shares
    // (the upstream pool's connection, metric series, the runtime's caches).
    for _ in 0..20 {
        drop(served_connection(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = gateway.rss_kib();
    let mut held = Vec::new();
    for _ in 0..CONNECTIONS {
        held.push(served_connection(addr).await);
    }
    let after = gateway.rss_kib();
    let per_connection = after.saturating_sub(before) as f64 / CONNECTIONS as f64;
    eprintln!("{CONNECTIONS} idle connections: RSS {before} -> {after} KiB, {per_connection:.1} KiB each");
    assert!(
        per_connection <= PER_CONNECTION_KIB as f64,
        "{per_connection:.1} KiB per idle connection, more than {PER_CONNECTION_KIB} KiB"
    );
    assert_eq!(upstream.total(), 20 + CONNECTIONS);
    drop(held);
}
