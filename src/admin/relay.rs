//! The standalone relay's admin listener (`idemgate relay`, on
//! `admin_listen` like the gateway's): `/healthz`, `/readyz` (the outbox
//! database answers and the relay has found its schema current),
//! `/metrics`, and the bearer-protected outbox routes (`/admin/outbox/…`:
//! list dead rows, redrive, list unroutable rows). The gateway-only routes
//! (`/admin/keys/…`) answer `404` here. A relay and a gateway on one host
//! need different `admin_listen` addresses (`--admin-listen`).

use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use super::{AccessDenied, AdminAccess, json, outbox};
use crate::gateway::problem::Problem;
use crate::http::body::{ResponseBody, full};
use crate::metrics::Metrics;
use crate::outbox::relay::Readiness;
use crate::postgres::Database;

/// What the relay's admin listener needs.
pub struct RelayAdmin {
    db: Database,
    metrics: Arc<Metrics>,
    access: AdminAccess,
    readiness: Arc<Readiness>,
    destinations: Vec<String>,
}

impl RelayAdmin {
    /// The admin surface of a relay serving `destinations`.
    pub fn new(
        db: Database,
        metrics: Arc<Metrics>,
        access: AdminAccess,
        readiness: Arc<Readiness>,
        destinations: Vec<String>,
    ) -> Self {
        Self { db, metrics, access, readiness, destinations }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<ResponseBody> {
        let path = request.uri().path().to_owned();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let allow = match segments.as_slice() {
            ["healthz"] | ["readyz"] | ["metrics"] | ["admin", "outbox", "dead" | "unroutable"] => "GET",
            ["admin", "outbox", "dead", id, "redrive"] if !id.is_empty() => "POST",
            ["admin", "outbox", "redrive"] => "POST",
            _ => return Problem::NotFound.to_response(),
        };
        if request.method().as_str() != allow {
            return Problem::MethodNotAllowed(allow).to_response();
        }
        if segments[0] == "admin"
            && let Err(denied) = self.access.check(request.headers())
        {
            return match denied {
                AccessDenied::Unauthorized => Problem::Unauthorized.to_response(),
                AccessDenied::Disabled => Problem::AdminDisabled.to_response(),
            };
        }
        match segments.as_slice() {
            ["healthz"] => json(StatusCode::OK, serde_json::json!({ "status": "ok" })),
            ["readyz"] => self.ready().await,
            ["metrics"] => {
                let mut response = Response::new(full(self.metrics.render()));
                let text = HeaderValue::from_static("text/plain; version=0.0.4");
                response.headers_mut().insert(header::CONTENT_TYPE, text);
                response
            }
            ["admin", "outbox", "dead"] => outbox::list_dead(Some(&self.db), &request).await,
            ["admin", "outbox", "dead", id, "redrive"] => outbox::redrive(Some(&self.db), Some(id)).await,
            ["admin", "outbox", "redrive"] => outbox::redrive(Some(&self.db), None).await,
            ["admin", "outbox", "unroutable"] => {
                outbox::list_unroutable(Some(&self.db), &self.destinations, &request).await
            }
            _ => Problem::NotFound.to_response(),
        }
    }

    /// Ready: the database answers, and the relay has checked its schema
    /// (it waits for a database that was down at start).
    async fn ready(&self) -> Response<ResponseBody> {
        let database = if outbox::ping(&self.db).await { "ok" } else { "unavailable" };
        let relay = if self.readiness.is_ready() { "running" } else { "starting" };
        let (status, state) = match (database, relay) {
            ("ok", "running") => (StatusCode::OK, "ready"),
            _ => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
        };
        json(status, serde_json::json!({ "status": state, "database": database, "relay": relay }))
    }
}

/// Serves until `shutdown` resolves.
pub async fn serve(listener: TcpListener, admin: Arc<RelayAdmin>, shutdown: impl Future<Output = ()>) {
    let handle = move |request| {
        let admin = admin.clone();
        async move { admin.handle(request).await }
    };
    crate::http::listener::serve_internal(listener, "relay admin", handle, shutdown).await;
}
