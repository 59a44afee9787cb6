//! What the gateway's and the relay's admin listeners hold and answer
//! alike: the browser checks of a token-less listener ([`browser`]), the
//! bearer check ([`router::admit`]), liveness, metrics, the
//! console's files and the outbox routes. A listener adds only its own: readiness (what it waits
//! for) and, on the gateway, the keys routes.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use super::router::{self, GatewayRoutes, Route, SharedRoute};
use super::{AdminAccess, browser, json, outbox, ui};
use crate::gateway::problem::Problem;
use crate::http::body::{BoxedBody, full};
use crate::metrics::Metrics;
use crate::postgres::Database;

/// The part of an admin listener both kinds share.
pub(super) struct Surface {
    access: AdminAccess,
    /// The listener's bound address: its own `Host` (see [`browser`]).
    own: SocketAddr,
    keys: GatewayRoutes,
    metrics: Arc<Metrics>,
    outbox: Option<Database>,
    destinations: Vec<String>,
}

impl Surface {
    /// A surface with no outbox database (its routes answer `404`) and no destinations.
    pub(super) fn new(access: AdminAccess, keys: GatewayRoutes, metrics: Arc<Metrics>, own: SocketAddr) -> Self {
        Self { access, own, keys, metrics, outbox: None, destinations: Vec::new() }
    }

    /// The outbox database, if the config names one.
    pub(super) fn outbox(&self) -> Option<&Database> {
        self.outbox.as_ref()
    }

    /// Serves the outbox routes from this database.
    pub(super) fn with_outbox(mut self, outbox: Option<Database>) -> Self {
        self.outbox = outbox;
        self
    }

    /// The configured outbox destinations: rows for any other are listed as unroutable.
    pub(super) fn with_destinations(mut self, destinations: Vec<String>) -> Self {
        self.destinations = destinations;
        self
    }

    /// The request's route, or the problem that answers it (`404`, `405`,
    /// `401`, `403`). Without a token, a request a web page may have sent is
    /// refused before anything else.
    pub(super) fn admit<'a>(&self, request: &'a Request<Incoming>) -> Result<Route<'a>, Problem> {
        if matches!(self.access, AdminAccess::Open) {
            browser::admit(request.method(), request.uri(), request.headers(), self.own)?;
        }
        router::admit(request.method(), request.uri().path(), request.headers(), self.keys, &self.access)
    }

    /// Answers a route both listeners serve.
    pub(super) async fn answer(&self, route: SharedRoute<'_>, request: &Request<Incoming>) -> Response<BoxedBody> {
        let outbox = self.outbox.as_ref();
        match route {
            SharedRoute::Liveness => json(StatusCode::OK, serde_json::json!({ "status": "ok" })),
            SharedRoute::Metrics => {
                let mut response = Response::new(full(self.metrics.render()));
                let text = HeaderValue::from_static("text/plain; version=0.0.4");
                response.headers_mut().insert(header::CONTENT_TYPE, text);
                response
            }
            SharedRoute::Console(name) => ui::answer(name),
            SharedRoute::Destinations => outbox::destinations(outbox, &self.destinations, request).await,
            SharedRoute::DeadRows => outbox::list_dead(outbox, request).await,
            SharedRoute::Redrive(id) => outbox::redrive(outbox, id).await,
            SharedRoute::UnroutableRows => outbox::list_unroutable(outbox, &self.destinations, request).await,
        }
    }
}
