//! `idemgate demo`: a toy payments API behind the gateway, for a first look.
//!
//! The toy API is deliberately *not* idempotent: every `POST /v1/charges`
//! performs a new charge and says how many it has performed so far. Sending
//! the same request twice through the gateway with one `Idempotency-Key`
//! shows the second answered from the store, with the count unchanged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Starts the toy payments API on a free loopback port and returns its address.
pub async fn start_toy_payments() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let charges = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let charges = charges.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| charge(request, charges.clone()));
                let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(address)
}

async fn charge(request: Request<Incoming>, charges: Arc<AtomicU64>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let is_charge = request.method() == http::Method::POST && request.uri().path() == "/v1/charges";
    let body = request.into_body().collect().await?.to_bytes();
    if !is_charge {
        let mut response = Response::new(Full::new(Bytes::from_static(b"{\"error\":\"try POST /v1/charges\"}\n")));
        *response.status_mut() = StatusCode::NOT_FOUND;
        return Ok(response);
    }
    let amount = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v.get("amount").cloned());
    let performed = charges.fetch_add(1, Ordering::SeqCst) + 1;
    let answer =
        serde_json::json!({ "id": format!("ch_{performed}"), "amount": amount, "charges_performed": performed });
    let mut response = Response::new(Full::new(Bytes::from(format!("{answer}\n"))));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    Ok(response)
}

/// The commands printed for the newcomer.
pub fn instructions(gateway: SocketAddr) -> String {
    format!(
        r#"idemgate demo: gateway on http://{gateway} (embedded store) in front of a toy payments API that is NOT idempotent.

1. Charge once:
   curl -si http://{gateway}/v1/charges -H 'Idempotency-Key: order-1001' -H 'Content-Type: application/json' -d '{{"amount": 500}}'
2. Retry the same request: the stored response comes back (Idempotent-Replayed: true), charges_performed is unchanged:
   curl -si http://{gateway}/v1/charges -H 'Idempotency-Key: order-1001' -H 'Content-Type: application/json' -d '{{"amount": 500}}'
3. Reuse the key for a different request: 422 key-mismatch, nothing charged:
   curl -si http://{gateway}/v1/charges -H 'Idempotency-Key: order-1001' -H 'Content-Type: application/json' -d '{{"amount": 900}}'
4. A new key is a new charge:
   curl -si http://{gateway}/v1/charges -H 'Idempotency-Key: order-1002' -H 'Content-Type: application/json' -d '{{"amount": 500}}'

Press Ctrl-C to stop."#
    )
}
