//! The admin listener: health, metrics and the admin API.
//!
//! | method | path | auth | job |
//! |---|---|---|---|
//! | GET | `/healthz` | none | the process is alive |
//! | GET | `/readyz` | none | the store (and the outbox database, if configured) answers (`503` if not) |
//! | GET | `/metrics` | none | Prometheus text format |
//! | GET | `/admin/keys/{key}?tenant=…&route=…` | bearer | a key's record, metadata only |
//! | DELETE | `/admin/keys/{key}?tenant=…&route=…` | bearer | purge a key's record |
//! | GET | `/admin/gateway/outcomes` | bearer | requests per outcome in each of the last minutes |
//! | GET | `/admin/outbox/destinations?limit=N` | bearer | per destination: ready, leased, dead, held, oldest ready age |
//! | GET | `/admin/outbox/dead?limit=N&offset=M&destination=D` | bearer | dead outbox rows, oldest first, a page |
//! | POST | `/admin/outbox/dead/{id}/redrive` | bearer | send one dead row again |
//! | POST | `/admin/outbox/redrive` | bearer | send every dead row again |
//! | GET | `/admin/outbox/unroutable?limit=N` | bearer | rows waiting for a destination the config does not have, per destination |
//! | GET | `/admin/ui/` | none | the operators' console ([`ui`]): static files; every call it makes needs the token |
//!
//! It listens on its own address (default loopback) so it can be firewalled
//! apart from client traffic. `tenant` is the value the configured tenant
//! source reads — the client's full `Authorization` value, the tenant
//! header's value, or nothing for a fixed tenant — so an operator addresses
//! exactly the record that client's retries would, and no other. `route`
//! names a route whose keys come from another source (a webhook's event
//! ids, a field of the body), which are scoped by that route too; on a
//! webhook route the route is the tenant, and `tenant` is not taken. The
//! stored body is never returned: it may hold a customer's data.
//! [`ROUTES`] lists the routes; a test keeps it and `openapi.yaml` in step,
//! and one keeps the router (`router`, shared with the relay) and it.
//! Without a token (`admin.auth = "disabled"`), requests a web page may
//! have sent are refused `403 foreign-request` ([`browser`]).
//! A standalone relay serves the probes, metrics and outbox routes on its
//! own listener ([`relay`]); what the two listeners share is `surface`.

mod auth;
mod browser;
mod outbox;
mod query;
pub mod relay;
mod router;
mod surface;
pub mod ui;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tokio::net::TcpListener;

pub use auth::{AccessDenied, AdminAccess, TokenError};
pub use router::ROUTES;

use crate::gateway::problem::Problem;
use crate::gateway::recent::Minute;
use crate::gateway::{Disposition, Gateway};
use crate::http::body::{BoxedBody, full};
use crate::idempotency::hash::to_hex;
use crate::idempotency::{IdempotencyKey, Record, ScopedKey};
use crate::store::Store;
use router::{GatewayRoutes, Route};
use surface::Surface;

/// What the admin handlers need.
pub struct Admin<S> {
    gateway: Arc<Gateway<S>>,
    surface: Surface,
}

impl<S: Store> Admin<S> {
    /// The admin surface of a gateway, for the listener bound to `own`.
    pub fn new(gateway: Arc<Gateway<S>>, access: AdminAccess, own: std::net::SocketAddr) -> Self {
        let surface = Surface::new(access, GatewayRoutes::Served, gateway.metrics().clone(), own);
        Self { gateway, surface }
    }

    /// Serves the outbox routes (and checks the database for readiness).
    pub fn with_outbox(mut self, outbox: Option<crate::postgres::Database>) -> Self {
        self.surface = self.surface.with_outbox(outbox);
        self
    }

    /// The configured outbox destinations: rows for any other are listed as unroutable.
    pub fn with_destinations(mut self, destinations: Vec<String>) -> Self {
        self.surface = self.surface.with_destinations(destinations);
        self
    }

    /// Handles one admin request.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<BoxedBody> {
        match self.surface.admit(&request) {
            Ok(Route::Shared(route)) => self.surface.answer(route, &request).await,
            Ok(Route::Readiness) => self.ready().await,
            Ok(Route::Key { raw_key, purge }) => self.key(&request, raw_key, purge).await,
            Ok(Route::Outcomes) => json(StatusCode::OK, outcomes(&self.gateway.recent().minutes())),
            Err(problem) => problem.to_response(),
        }
    }

    async fn ready(&self) -> Response<BoxedBody> {
        // Bounded as every store operation is: by `gateway.store_timeout`.
        let store = tokio::time::timeout(self.gateway.store_timeout(), self.gateway.store().ping()).await;
        if let (Ok(Ok(())), Some(db)) = (&store, self.surface.outbox()) {
            return match outbox::ping(db).await {
                true => json(StatusCode::OK, serde_json::json!({ "status": "ready", "store": "ok", "database": "ok" })),
                false => json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "status": "not ready", "store": "ok", "database": "unavailable" }),
                ),
            };
        }
        match store {
            Ok(Ok(())) => json(StatusCode::OK, serde_json::json!({ "status": "ready", "store": "ok" })),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness: store unavailable");
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "status": "not ready", "store": "unavailable" }),
                )
            }
            Err(_) => {
                json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({ "status": "not ready", "store": "timeout" }))
            }
        }
    }

    /// Inspects (or, with `purge`, deletes) one tenant's record of a key.
    async fn key(&self, request: &Request<Incoming>, raw_key: &str, purge: bool) -> Response<BoxedBody> {
        let decoded = match query::percent_decode(raw_key) {
            Some(decoded) => decoded,
            None => return Problem::BadAdminRequest("the key is not valid percent-encoded UTF-8".into()).to_response(),
        };
        let key = match IdempotencyKey::new(&decoded) {
            Ok(key) => key,
            Err(e) => return Problem::BadAdminRequest(format!("invalid key: {e}")).to_response(),
        };
        let tenant_value = match query::param(request.uri().query(), "tenant") {
            Ok(value) => value,
            Err(why) => return Problem::BadAdminRequest(why.to_string()).to_response(),
        };
        let route_name = match query::param(request.uri().query(), "route") {
            Ok(value) => value,
            Err(why) => return Problem::BadAdminRequest(why.to_string()).to_response(),
        };
        let tenant = || self.gateway.tenant_source().tenant_from_value(tenant_value.as_deref());
        let scoped = match route_name.map(|name| self.gateway.route_named(&name).ok_or(name)) {
            None => ScopedKey::new(&tenant(), &key),
            Some(Err(name)) => return Problem::BadAdminRequest(format!("no route is named {name:?}")).to_response(),
            Some(Ok(route)) => match (&route.webhook, route.key.route_scoped()) {
                (Some(_), _) if tenant_value.is_some() => {
                    let why = "a webhook route is its own tenant: leave out the tenant parameter";
                    return Problem::BadAdminRequest(why.into()).to_response();
                }
                (Some(webhook), _) => ScopedKey::for_route(&webhook.tenant, &route.name, &key),
                (None, true) => ScopedKey::for_route(&tenant(), &route.name, &key),
                (None, false) => ScopedKey::new(&tenant(), &key),
            },
        };
        let store = self.gateway.store();
        let limit = self.gateway.store_timeout();
        if purge {
            return match crate::store::bounded(limit, store.purge(&scoped)).await {
                Ok(true) => {
                    tracing::info!(key = scoped.log_id().as_str(), "admin purged a record");
                    Response::builder()
                        .status(StatusCode::NO_CONTENT)
                        .body(full(Bytes::new()))
                        .unwrap_or_else(|_| Problem::Internal.to_response())
                }
                Ok(false) => Problem::NotFound.to_response(),
                Err(_) => Problem::StoreUnavailable.to_response(),
            };
        }
        match crate::store::bounded(limit, store.get(&scoped)).await {
            Ok(Some(record)) => json(StatusCode::OK, describe(&scoped, &record)),
            Ok(None) => Problem::NotFound.to_response(),
            Err(_) => Problem::StoreUnavailable.to_response(),
        }
    }
}

/// `GET /admin/gateway/outcomes`: per minute, oldest first, the count of
/// every outcome that happened in it (outcomes with none are left out).
fn outcomes(minutes: &[Minute]) -> serde_json::Value {
    let minutes: Vec<serde_json::Value> = minutes
        .iter()
        .map(|m| {
            let counts: serde_json::Map<String, serde_json::Value> = Disposition::ALL
                .iter()
                .zip(m.counts)
                .filter(|(_, count)| *count > 0)
                .map(|(outcome, count)| (outcome.as_str().to_owned(), count.into()))
                .collect();
            serde_json::json!({ "start_unix_ms": m.minute.saturating_mul(60_000), "counts": counts })
        })
        .collect();
    serde_json::json!({ "minute_seconds": 60, "minutes": minutes })
}

/// A record's metadata; never the stored body or header values.
fn describe(scoped: &ScopedKey, record: &Record) -> serde_json::Value {
    match record {
        Record::InFlight { fingerprint, lease_remaining, .. } => serde_json::json!({
            "scoped_key": scoped.to_hex(),
            "state": "in_flight",
            "fingerprint": to_hex(&fingerprint.0),
            "lease_remaining_ms": lease_remaining.as_millis() as u64,
        }),
        Record::Completed { fingerprint, response } => serde_json::json!({
            "scoped_key": scoped.to_hex(),
            "state": "completed",
            "fingerprint": to_hex(&fingerprint.0),
            "replayable": response.is_some(),
            "status": response.as_ref().map(|r| r.status),
            "body_bytes": response.as_ref().map(|r| r.body.len()),
            "header_names": response.as_ref().map(|r| r.headers.keys().map(|n| n.as_str()).collect::<Vec<_>>()),
        }),
        Record::Unknown { fingerprint } => serde_json::json!({
            "scoped_key": scoped.to_hex(),
            "state": "unknown",
            "fingerprint": to_hex(&fingerprint.0),
        }),
    }
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<BoxedBody> {
    let mut response = Response::new(full(serde_json::to_vec(&value).unwrap_or_default()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Serves the admin listener until `shutdown` resolves.
pub async fn serve<S: Store>(listener: TcpListener, admin: Arc<Admin<S>>, shutdown: impl Future<Output = ()>) {
    let handle = move |request| {
        let admin = admin.clone();
        async move { admin.handle(request).await }
    };
    crate::http::listener::serve_internal(listener, "admin", handle, shutdown).await;
}
