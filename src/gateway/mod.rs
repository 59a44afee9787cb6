//! The gateway: an idempotent reverse proxy.
//!
//! A request is routed by path prefix ([`routes`]). Methods the route does
//! not guard, and guarded requests without a key on routes that do not
//! require one, pass straight through and never touch the store. A guarded
//! request with a key goes through [`guard`]: body read under a limit,
//! fingerprint, one atomic `try_begin`, then the decision table — forward
//! (with lease renewal, and a fenced complete or release afterwards),
//! replay, `409`, `422`. The upstream call runs in its own task, so a client
//! that disconnects cannot leave a record in flight: the attempt finishes
//! and settles its record either way.
//!
//! Where the key is comes from the route ([`key`]): the `Idempotency-Key`
//! header, another header, or a field of the body; a webhook route
//! verifies each delivery's signature before anything else and takes the
//! provider's event id as the key (see [`guard`]).
//!
//! [`server`] owns the listener and graceful shutdown; [`problem`] renders
//! every error the gateway itself produces; [`tenant`] says whose key
//! space a request's key lives in. [`Policy`] (`policy.rs`) is `[gateway]`
//! converted once, which every stage reads; each stage hands a `Reply`
//! (`reply.rs`) back to the one above it. The guard makes every store call
//! of the request path itself (`guard/store_calls.rs`), under the one
//! store timeout.

mod disposition;
mod guard;
pub mod headers;
pub mod key;
mod passthrough;
mod policy;
pub mod problem;
pub mod recent;
mod reply;
pub mod request_log;
pub mod rewrite;
pub mod routes;
pub mod server;
pub mod spelling;
pub mod tenant;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::http::body::BoxedBody;
use crate::http::connection::ConnectionInfo;
use crate::idempotency::FingerprintPolicy;
use crate::metrics::Metrics;
use crate::store::Store;
pub use disposition::Disposition;
pub use policy::Policy;
use problem::Problem;
use reply::{Handled, Reply};
use routes::{Route, RouteTable};
use tenant::TenantSource;

/// W3C Trace Context: read for the request log, forwarded unchanged.
static TRACEPARENT: http::header::HeaderName = http::header::HeaderName::from_static("traceparent");

/// The longest a start-up probe waits for an upstream connection.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// The gateway's shared state; one per process, behind an `Arc`.
pub struct Gateway<S> {
    store: S,
    routes: RouteTable,
    policy: Policy,
    tenant: Arc<TenantSource>,
    fingerprint: FingerprintPolicy,
    tasks: TaskTracker,
    metrics: Arc<Metrics>,
    recent: Arc<recent::Recent>,
    store_calls: guard::StoreCalls,
}

/// Why a gateway cannot be built from a config.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A route cannot be built.
    #[error(transparent)]
    Route(#[from] routes::RouteError),
    /// The tenant source cannot be built (its key file, say).
    #[error(transparent)]
    Tenant(#[from] tenant::TenantSourceError),
}

impl<S: Store> Gateway<S> {
    /// Builds the gateway from a validated config: each runtime part
    /// converted from its section once ([`Policy`], [`FingerprintPolicy`],
    /// [`RouteTable`], [`TenantSource`]).
    pub fn new(config: &Config, store: S, metrics: Arc<Metrics>) -> Result<Self, BuildError> {
        Ok(Self {
            store,
            routes: RouteTable::try_from(config)?,
            policy: Policy::from(&config.gateway),
            tenant: Arc::new(TenantSource::from_config(&config.gateway.tenant)?),
            fingerprint: FingerprintPolicy::from(&config.gateway),
            tasks: TaskTracker::new(),
            store_calls: guard::StoreCalls::new(config.gateway.store_timeout.0, metrics.clone()),
            metrics,
            recent: Arc::new(recent::Recent::new()),
        })
    }

    /// Another gateway derived from this one, one per core
    /// (`crate::app::cores`): its own `store` (its own connections), upstream
    /// pools and attempt tracker; this one's routes, policy, tenant source,
    /// metrics, recent outcomes and upstream connection limits (a route's
    /// `max_connections` counts for the process). Nothing of the gateway's
    /// is read or checked again: no route CA, webhook secrets or tenant key
    /// file per core. (The store is the caller's: `AnyStore::sibling` keeps
    /// the sealing keys; a Redis URL's `ca_file` is read by each core's
    /// connection.)
    pub fn sibling(&self, store: S) -> Self {
        Self {
            store,
            routes: self.routes.sibling(),
            policy: self.policy.clone(),
            tenant: self.tenant.clone(),
            fingerprint: self.fingerprint.clone(),
            tasks: TaskTracker::new(),
            metrics: self.metrics.clone(),
            recent: self.recent.clone(),
            store_calls: self.store_calls.sibling(),
        }
    }

    /// The store (admin API, readiness).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The one limit on a store operation (`gateway.store_timeout`): the
    /// admin API bounds its own store calls by it too.
    pub fn store_timeout(&self) -> Duration {
        self.store_calls.timeout()
    }

    /// The metrics this gateway records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Requests per outcome over the last minutes (the admin console).
    pub fn recent(&self) -> &recent::Recent {
        &self.recent
    }

    /// The route of this name (admin API: a route's own key scope).
    pub fn route_named(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|route| route.name == name)
    }

    /// The tenant source (admin API scopes keys the same way).
    pub fn tenant_source(&self) -> &TenantSource {
        &self.tenant
    }

    /// Upstream attempts still running (they settle their records before ending).
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Dials each route's upstream once, in the background, and warns
    /// about one that cannot be reached (a name that does not resolve, a
    /// refused port, a certificate its CA does not sign). Nothing is sent
    /// and nothing stops: an upstream that comes up later (the app beside a
    /// sidecar) is used as soon as it does. `/readyz` does not follow
    /// upstreams, so this warning is where a wrong upstream shows at start.
    pub fn probe_upstreams(&self) {
        let wait = self.policy.upstream_timeout.min(PROBE_WAIT);
        for route in self.routes.iter() {
            let route = route.clone();
            tokio::spawn(async move {
                match route.upstream.probe(wait).await {
                    Ok(()) => tracing::debug!(route = %route.name, "upstream reachable"),
                    Err(e) => tracing::warn!(
                        route = %route.name,
                        error = %e,
                        "upstream not reachable at start: requests to this route are answered 502 until it is"
                    ),
                }
            });
        }
    }

    /// Handles one client request that arrived on `connection`: the head
    /// checks, the route, then [`Self::dispatch`]; every request ends in
    /// [`Self::log`].
    pub async fn handle(
        self: &Arc<Self>,
        mut request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> Response<BoxedBody> {
        let arrival = Arrival::of(&request);
        if let Err(problem) = self.check_head(&request) {
            return self.log(None, Reply::problem(Disposition::BadHead, problem).into(), arrival);
        }
        let route = match spelling::route(&self.routes, &mut request) {
            Ok(Some(route)) => route,
            Ok(None) => return self.log(None, Reply::problem(Disposition::NoRoute, Problem::NoRoute).into(), arrival),
            Err(problem) => return self.log(None, Reply::problem(Disposition::Ambiguous, problem).into(), arrival),
        };
        let Handled { reply, logged_key } = self.dispatch(route, request, connection).await;
        // A settled answer its client's connection has no room left for is
        // dropped now: its record holds it, and the retry replays it.
        let reply = match connection.response_budget.charge(reply.response) {
            Some(response) => Reply::new(reply.disposition, response),
            None => Reply::problem(Disposition::ConnectionBusy, Problem::UnreadAnswers),
        };
        self.log(Some(route), Handled { reply, logged_key }, arrival)
    }

    /// The gateway's own limits on a request head, below hyper's, so that
    /// the answer is a problem a client can read rather than a bare status.
    fn check_head(&self, request: &Request<Incoming>) -> Result<(), Problem> {
        let target = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
        if target as u64 > self.policy.max_uri_bytes {
            return Err(Problem::UriTooLong { limit: self.policy.max_uri_bytes });
        }
        let bytes: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
        if bytes as u64 > self.policy.max_header_bytes {
            return Err(Problem::HeadersTooLarge { limit: self.policy.max_header_bytes });
        }
        Ok(())
    }

    /// Unguarded requests to [`passthrough`], guarded ones to [`guard`].
    async fn dispatch(
        self: &Arc<Self>,
        route: &Arc<Route>,
        request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> Handled {
        // Both paths boxed: hyper keeps a connection's in-flight future in a
        // slot it allocates once per connection, as large as this future, so
        // an inline path would cost every connection, busy or idle, its size.
        match spelling::judge_method(route, request.method(), request.headers()) {
            Ok(spelling::Judged::Guarded) => {}
            Ok(spelling::Judged::Unguarded) => {
                return Box::pin(self.passthrough(route, request, connection)).await.into();
            }
            Err(problem) => return Reply::problem(Disposition::Ambiguous, problem).into(),
        }
        // A key in the body, or a webhook delivery (verified before its
        // key is even looked at), is resolved by the guard after the read.
        if route.key.in_body() || route.webhook.is_some() {
            return Box::pin(guard::run(self, route, request, None, connection)).await;
        }
        match route.key.find(request.headers(), &[]) {
            Ok(Some(key)) => Box::pin(guard::run(self, route, request, Some(key), connection)).await,
            Ok(None) if route.require_key => {
                Reply::problem(Disposition::MissingKey, Problem::missing_key(&route.key)).into()
            }
            Ok(None) => Box::pin(self.passthrough(route, request, connection)).await.into(),
            Err(e) => Reply::problem(Disposition::InvalidKey, Problem::InvalidKey(e)).into(),
        }
    }

    /// Counts and logs a handled request; its response goes to the client.
    fn log(&self, route: Option<&Route>, handled: Handled, arrival: Arrival) -> Response<BoxedBody> {
        let Handled { reply: Reply { disposition, response }, logged_key } = handled;
        match route {
            Some(route) => route.count_request(&self.metrics, disposition),
            None => self.metrics.requests.with_label_values(&["-", disposition.as_str()]).inc(),
        }
        self.recent.record(disposition);
        // Only the scoped hash of a key is ever logged, never the key itself.
        if tracing::enabled!(tracing::Level::INFO) {
            let line = request_log::Line {
                route: route.map_or("-", |r| r.name.as_str()),
                outcome: disposition.as_str(),
                status: response.status().as_u16(),
                key: logged_key.as_deref().unwrap_or("-"),
                trace_id: arrival.trace.as_ref().and_then(|id| std::str::from_utf8(id).ok()).unwrap_or("-"),
                latency_us: arrival.started.elapsed().as_micros() as u64,
            };
            request_log::emit(&line);
        }
        response
    }
}

/// When a request arrived, and its trace id for the log line.
struct Arrival {
    started: Instant,
    /// Kept (32 bytes) only when the line will be written; the header
    /// goes upstream unchanged.
    trace: Option<[u8; 32]>,
}

impl Arrival {
    fn of(request: &Request<Incoming>) -> Self {
        let started = Instant::now();
        let trace = tracing::enabled!(tracing::Level::INFO)
            .then(|| request.headers().get(&TRACEPARENT))
            .flatten()
            .and_then(|v| crate::http::trace_context::trace_id(v.as_bytes()))
            .and_then(|id| id.as_bytes().try_into().ok());
        Self { started, trace }
    }
}
