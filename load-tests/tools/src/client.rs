//! One HTTP/1.1 keep-alive connection per worker, no pool: what each worker
//! sends goes down its own connection, like a wrk connection.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A connected HTTP/1.1 client.
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
    addr: SocketAddr,
}

/// What one request is.
#[derive(Clone)]
pub struct Shape {
    pub method: http::Method,
    pub path: String,
    pub body: Bytes,
}

/// The answer to one request: status and whether it was a replay.
pub struct Answer {
    pub status: StatusCode,
    pub replayed: bool,
}

impl Connection {
    /// Opens a connection and spawns its driver task.
    pub async fn open(addr: SocketAddr) -> Result<Self, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("handshake {addr}: {e}"))?;
        tokio::spawn(connection);
        Ok(Self { sender, addr })
    }

    /// Sends one request, reads the whole response; reconnects once if the
    /// connection was closed under it.
    pub async fn send(&mut self, shape: &Shape, key: Option<&str>) -> Result<Answer, String> {
        if self.sender.ready().await.is_err() {
            *self = Self::open(self.addr).await?;
        }
        let mut request = Request::builder()
            .method(shape.method.clone())
            .uri(&shape.path)
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Full::new(shape.body.clone())).map_err(|e| e.to_string())?;
        let response = self.sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        response.into_body().collect().await.map_err(|e| format!("body: {e}"))?;
        Ok(Answer { status, replayed })
    }

    /// Sends one Stripe-style delivery (W1): a JSON body and its
    /// `Stripe-Signature`; reads the whole response.
    pub async fn send_signed(&mut self, path: &str, signature: &str, body: Bytes) -> Result<StatusCode, String> {
        if self.sender.ready().await.is_err() {
            *self = Self::open(self.addr).await?;
        }
        let request = Request::builder()
            .method(http::Method::POST)
            .uri(path)
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("stripe-signature", signature)
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let response = self.sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        response.into_body().collect().await.map_err(|e| format!("body: {e}"))?;
        Ok(status)
    }
}
