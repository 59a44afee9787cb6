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
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::net::TcpListener;

use crate::http::body::{ResponseBody, full};
use crate::http::listener::serve_internal;

/// Starts the toy payments API on a free loopback port and returns its address.
pub async fn start_toy_payments() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let charges = Arc::new(AtomicU64::new(0));
    let handle = move |request| charge(request, charges.clone());
    tokio::spawn(serve_internal(listener, "toy payments", handle, std::future::pending()));
    Ok(address)
}

async fn charge(request: Request<Incoming>, charges: Arc<AtomicU64>) -> Response<ResponseBody> {
    let is_charge = request.method() == http::Method::POST && request.uri().path() == "/v1/charges";
    let Ok(body) = request.into_body().collect().await.map(|collected| collected.to_bytes()) else {
        let mut response = Response::new(full(Bytes::from_static(b"{\"error\":\"the request body broke off\"}\n")));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    if !is_charge {
        let mut response = Response::new(full(Bytes::from_static(b"{\"error\":\"try POST /v1/charges\"}\n")));
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    }
    let amount = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v.get("amount").cloned());
    let performed = charges.fetch_add(1, Ordering::SeqCst) + 1;
    let answer =
        serde_json::json!({ "id": format!("ch_{performed}"), "amount": amount, "charges_performed": performed });
    let mut response = Response::new(full(Bytes::from(format!("{answer}\n"))));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
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
