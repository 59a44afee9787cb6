//! The standalone relay's admin listener (`idemgate relay`, on
//! `admin_listen` like the gateway's): `/healthz`, `/readyz` (the outbox
//! database answers and the relay has found its schema current),
//! `/metrics`, and the bearer-protected outbox routes (`/admin/outbox/…`:
//! per-destination counts, list dead rows, redrive, list unroutable rows)
//! and the console (`/admin/ui/`). The gateway-only routes (`/admin/keys/…`,
//! `/admin/gateway/outcomes`) answer `404` here. A relay and a gateway on one host
//! need different `admin_listen` addresses (`--admin-listen`).

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use super::router::{GatewayRoutes, Route};
use super::surface::Surface;
use super::{AdminAccess, json, outbox};
use crate::gateway::problem::Problem;
use crate::http::body::BoxedBody;
use crate::metrics::Metrics;
use crate::outbox::relay::Readiness;
use crate::postgres::Database;

/// What the relay's admin listener needs.
pub struct RelayAdmin {
    db: Database,
    readiness: Arc<Readiness>,
    surface: Surface,
}

impl RelayAdmin {
    /// The admin surface of a relay serving `destinations`, for the listener bound to `own`.
    pub fn new(
        db: Database,
        metrics: Arc<Metrics>,
        access: AdminAccess,
        readiness: Arc<Readiness>,
        destinations: Vec<String>,
        own: std::net::SocketAddr,
    ) -> Self {
        let surface = Surface::new(access, GatewayRoutes::Absent, metrics, own)
            .with_outbox(Some(db.clone()))
            .with_destinations(destinations);
        Self { db, readiness, surface }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<BoxedBody> {
        match self.surface.admit(&request) {
            Ok(Route::Shared(route)) => self.surface.answer(route, &request).await,
            Ok(Route::Readiness) => self.ready().await,
            // Routed only where the keys routes are served, which is not here.
            Ok(Route::Key { .. } | Route::Outcomes) => Problem::NotFound.to_response(),
            Err(problem) => problem.to_response(),
        }
    }

    /// Ready: the database answers, and the relay has checked its schema
    /// (it waits for a database that was down at start).
    async fn ready(&self) -> Response<BoxedBody> {
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
