//! Hostile and careless HTTP on both sides of the gateway, over real
//! sockets, counting effects at the upstream.
//!
//! One module per guarantee:
//!
//! - [`parser`]: malformed requests get a clear error (problem+json, also
//!   for the heads the HTTP parser refuses) and do not stall other clients;
//! - [`spelling`]: one spelling of a request — no spelling of a path or a
//!   method that a common upstream routes to a guarded prefix reaches it
//!   unguarded, and two requests the upstream reads differently never share
//!   a fingerprint;
//! - [`framing`]: an upstream answer with ambiguous framing is a malformed
//!   answer to a sent request — held as unknown, never stored or relayed.

use crate::support;

mod framing;
mod parser;
mod spelling;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::gateway::TestGateway;

/// Sends raw bytes and reads until the server closes or 5 s pass.
pub async fn exchange(gateway: &TestGateway, raw: &[u8]) -> String {
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream.write_all(raw).await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await;
    String::from_utf8_lossy(&reply).into_owned()
}

/// The status of the first response in `reply` (0 when there is none).
pub fn status_of(reply: &str) -> u16 {
    reply.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// An upstream that answers every request head with the same raw bytes,
/// then closes: for answers no HTTP library would send.
pub struct RawUpstream {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
}

impl RawUpstream {
    pub async fn start(answer: &'static [u8]) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(answer).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { addr, requests }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Request heads received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}
