//! The standalone relay's listener (`idemgate relay` with
//! `relay.admin_listen`): `/healthz`, `/readyz` (the outbox database
//! answers) and `/metrics`, so a relay-only deployment can be probed and
//! scraped. It serves no `/admin/` routes: dead rows are listed and
//! redriven through a gateway's admin API (or SQL). Off unless configured,
//! so a relay next to a gateway never fights over the default admin port.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use super::{json, outbox};
use crate::gateway::body::{ResponseBody, full};
use crate::gateway::problem::Problem;
use crate::metrics::Metrics;
use crate::outbox::Database;

async fn handle(request: Request<Incoming>, db: &Database, metrics: &Metrics) -> Response<ResponseBody> {
    let path = request.uri().path();
    if !["/healthz", "/readyz", "/metrics"].contains(&path) {
        return Problem::NotFound.to_response();
    }
    if request.method() != Method::GET {
        return Problem::MethodNotAllowed("GET").to_response();
    }
    match path {
        "/healthz" => json(StatusCode::OK, serde_json::json!({ "status": "ok" })),
        "/readyz" if outbox::ping(db).await => {
            json(StatusCode::OK, serde_json::json!({ "status": "ready", "database": "ok" }))
        }
        "/readyz" => json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({ "status": "not ready", "database": "unavailable" }),
        ),
        _ => {
            let mut response = Response::new(full(metrics.render()));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            response
        }
    }
}

/// Serves until `shutdown` resolves.
pub async fn serve(listener: TcpListener, db: Database, metrics: Arc<Metrics>, shutdown: impl Future<Output = ()>) {
    let shared = Arc::new((db, metrics));
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "relay admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(request, &shared.0, &shared.1).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
