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
//! space a request's key lives in.

mod disposition;
mod guard;
pub mod headers;
pub mod key;
mod passthrough;
pub mod problem;
pub mod recent;
pub mod request_log;
pub mod rewrite;
pub mod routes;
pub mod server;
pub mod spelling;
pub mod tenant;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HeaderName;
use http::{Request, Response};
use hyper::body::Incoming;
use prometheus::{Histogram, IntCounter};
use tokio_util::task::TaskTracker;

use crate::config::{ConcurrentMode, Config, FailMode, ForwardKey};
use crate::http::body::ResponseBody;
use crate::http::connection::ConnectionInfo;
use crate::idempotency::{FingerprintPolicy, StatusPolicy};
use crate::metrics::{Metrics, Series};
use crate::store::{Store, StoreError};
pub use disposition::Disposition;
use problem::Problem;
use routes::{Route, RouteTable};
use tenant::TenantSource;

/// A store operation of the request path, as the store metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOp {
    Begin,
    Renew,
    Complete,
    Release,
    Get,
}

impl StoreOp {
    /// Every operation, in declaration order (`op as usize` is its slot).
    const ALL: [Self; 5] = [Self::Begin, Self::Renew, Self::Complete, Self::Release, Self::Get];
    const COUNT: usize = Self::ALL.len();

    fn as_str(self) -> &'static str {
        match self {
            Self::Begin => "begin",
            Self::Renew => "renew",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Get => "get",
        }
    }
}

/// The store metrics' series per operation, looked up once each.
#[derive(Default)]
struct StoreSeries {
    latency: Series<Histogram, { StoreOp::COUNT }>,
    errors: Series<IntCounter, { StoreOp::COUNT }>,
}

/// Settings the request path reads, resolved once from [`Config`].
#[derive(Debug, Clone)]
pub struct Policy {
    /// Retention of completed records.
    pub key_ttl: Duration,
    /// Lease of an in-flight attempt.
    pub lease: Duration,
    /// How long a client waits for its upstream answer.
    pub upstream_timeout: Duration,
    /// How long a guarded attempt may run before its outcome counts as unknown.
    pub upstream_deadline: Duration,
    /// Limit on receiving a request body (whole when guarded, per chunk when streamed).
    pub request_body_timeout: Duration,
    /// Largest accepted request body.
    pub max_request_body: u64,
    /// Largest response kept for replay.
    pub max_stored_response: usize,
    /// Store-down behaviour.
    pub fail_mode: FailMode,
    /// Duplicate-in-flight behaviour.
    pub concurrent: ConcurrentMode,
    /// Longest wait with `concurrent = "wait"`.
    pub wait_timeout: Duration,
    /// Key forwarded upstream.
    pub forward_key: ForwardKey,
    /// Limit on one store operation.
    pub store_timeout: Duration,
    /// Response headers never stored.
    pub response_header_deny: Vec<HeaderName>,
    /// Longest request target accepted.
    pub max_uri_bytes: u64,
    /// Most request header bytes accepted.
    pub max_header_bytes: u64,
}

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
    store_series: StoreSeries,
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
    /// A configured header name is not one.
    #[error("{name:?}: {source}")]
    HeaderName {
        /// The name as configured.
        name: String,
        /// Why.
        #[source]
        source: http::header::InvalidHeaderName,
    },
}

impl<S: Store> Gateway<S> {
    /// Builds the gateway from a validated config.
    pub fn new(config: &Config, store: S, metrics: Arc<Metrics>) -> Result<Self, BuildError> {
        let g = &config.gateway;
        let header = |name: &String| {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|source| BuildError::HeaderName { name: name.clone(), source })
        };
        let routes = RouteTable::from_config(
            &config.routes,
            &StatusPolicy { release: g.release_statuses.clone() },
            g.on_unknown,
        )?;
        let tenant = Arc::new(TenantSource::from_config(&g.tenant)?);
        Ok(Self {
            store,
            routes,
            policy: Policy {
                key_ttl: g.key_ttl.0,
                lease: g.lease.0,
                upstream_timeout: g.upstream_timeout.0,
                upstream_deadline: g.upstream_deadline.0,
                request_body_timeout: g.request_body_timeout.0,
                max_request_body: g.max_request_body.0,
                max_stored_response: g.max_stored_response.bytes(),
                fail_mode: g.fail_mode,
                concurrent: g.concurrent,
                wait_timeout: g.wait_timeout.0,
                forward_key: g.forward_key,
                store_timeout: g.store_timeout.0,
                response_header_deny: g.response_header_deny.iter().map(header).collect::<Result<_, _>>()?,
                max_uri_bytes: g.max_uri_bytes.0,
                max_header_bytes: g.max_header_bytes.0,
            },
            tenant,
            fingerprint: FingerprintPolicy {
                headers: g.fingerprint_headers.iter().map(header).collect::<Result<_, _>>()?,
                canonical_json: g.canonical_json,
            },
            tasks: TaskTracker::new(),
            metrics,
            recent: Arc::new(recent::Recent::new()),
            store_series: StoreSeries::default(),
        })
    }

    /// Another gateway derived from this one, one per core
    /// (`crate::app::cores`): its own `store` (its own connections), upstream
    /// pools and attempt tracker; this one's routes, policy, tenant source,
    /// metrics, recent outcomes and upstream connection limits (a route's
    /// `max_connections` counts for the process). Nothing is read or
    /// checked again: no key, CA or secrets file per core.
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
            store_series: StoreSeries::default(),
        }
    }

    /// The store (admin API, readiness).
    pub fn store(&self) -> &S {
        &self.store
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

    /// Handles one client request that arrived on `connection`.
    pub async fn handle(
        self: &Arc<Self>,
        mut request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        // Kept for the log line (32 bytes), read only when the line will be
        // written; the header goes upstream unchanged.
        let trace: Option<[u8; 32]> = tracing::enabled!(tracing::Level::INFO)
            .then(|| request.headers().get(&TRACEPARENT))
            .flatten()
            .and_then(|v| crate::http::trace_context::trace_id(v.as_bytes()))
            .and_then(|id| id.as_bytes().try_into().ok());
        let at = (started, trace);
        if let Err(problem) = self.check_head(&request) {
            return self.log(None, Disposition::BadHead, None, at, problem.to_response());
        }
        let route = match spelling::route(&self.routes, &mut request) {
            Ok(Some(route)) => route,
            Ok(None) => return self.log(None, Disposition::NoRoute, None, at, Problem::NoRoute.to_response()),
            Err(problem) => return self.log(None, Disposition::Ambiguous, None, at, problem.to_response()),
        };
        let (outcome, scoped, response) = self.dispatch(route, request, connection).await;
        // A settled answer its client's connection has no room left for is
        // dropped now: its record holds it, and the retry replays it.
        let (outcome, response) = match connection.response_budget.charge(response) {
            Some(response) => (outcome, response),
            None => (Disposition::ConnectionBusy, Problem::UnreadAnswers.to_response()),
        };
        self.log(Some(route), outcome, scoped, at, response)
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

    async fn dispatch(
        self: &Arc<Self>,
        route: &Arc<Route>,
        request: Request<Incoming>,
        connection: &ConnectionInfo,
    ) -> (Disposition, Option<String>, Response<ResponseBody>) {
        // Both paths boxed: hyper keeps a connection's in-flight future in a
        // slot it allocates once per connection, as large as this future, so
        // an inline path would cost every connection, busy or idle, its size.
        match spelling::judge_method(route, request.method(), request.headers()) {
            Ok(spelling::Judged::Guarded) => {}
            Ok(spelling::Judged::Unguarded) => {
                let (disposition, response) = Box::pin(self.passthrough(route, request, connection)).await;
                return (disposition, None, response);
            }
            Err(problem) => return (Disposition::Ambiguous, None, problem.to_response()),
        }
        // A key in the body, or a webhook delivery (verified before its
        // key is even looked at), is resolved by the guard after the read.
        if route.key.in_body() || route.webhook.is_some() {
            return Box::pin(guard::run(self, route, request, None, connection)).await;
        }
        match route.key.find(request.headers(), &[]) {
            Ok(Some(key)) => Box::pin(guard::run(self, route, request, Some(key), connection)).await,
            Ok(None) if route.require_key => (Disposition::MissingKey, None, guard::missing_key(route).to_response()),
            Ok(None) => {
                let (disposition, response) = Box::pin(self.passthrough(route, request, connection)).await;
                (disposition, None, response)
            }
            Err(e) => (Disposition::InvalidKey, None, Problem::InvalidKey(e).to_response()),
        }
    }

    /// Runs a store operation under the store timeout, and measures it.
    async fn store_call<T>(
        &self,
        op: StoreOp,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.store_call_within(op, self.policy.store_timeout, operation).await
    }

    /// [`Self::store_call`] bounded by `limit` instead of `store_timeout`.
    async fn store_call_within<T>(
        &self,
        op: StoreOp,
        limit: Duration,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = tokio::time::timeout(limit, operation).await.unwrap_or(Err(StoreError::Timeout));
        let series = &self.store_series;
        let latency = series.latency.get(op as usize, || self.metrics.store_latency.with_label_values(&[op.as_str()]));
        latency.observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            series.errors.get(op as usize, || self.metrics.store_errors.with_label_values(&[op.as_str()])).inc();
            if matches!(error, StoreError::Unreplicated { .. }) {
                self.metrics.store_unreplicated.with_label_values(&[op.as_str()]).inc();
            }
        }
        result
    }

    fn log(
        &self,
        route: Option<&Route>,
        outcome: Disposition,
        scoped: Option<String>,
        (started, trace): (Instant, Option<[u8; 32]>),
        response: Response<ResponseBody>,
    ) -> Response<ResponseBody> {
        match route {
            Some(route) => route.count_request(&self.metrics, outcome),
            None => self.metrics.requests.with_label_values(&["-", outcome.as_str()]).inc(),
        }
        self.recent.record(outcome);
        // Only the scoped hash of a key is ever logged, never the key itself.
        if tracing::enabled!(tracing::Level::INFO) {
            let line = request_log::Line {
                route: route.map_or("-", |r| r.name.as_str()),
                outcome: outcome.as_str(),
                status: response.status().as_u16(),
                key: scoped.as_deref().unwrap_or("-"),
                trace_id: trace.as_ref().and_then(|id| std::str::from_utf8(id).ok()).unwrap_or("-"),
                latency_us: started.elapsed().as_micros() as u64,
            };
            request_log::emit(&line);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::StoreOp;

    #[test]
    fn every_store_operation_has_its_own_metric_slot() {
        for (slot, op) in StoreOp::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, slot, "{}", op.as_str());
            // Exhaustive: a new operation fails to compile here; give it a slot in ALL too.
            match op {
                StoreOp::Begin | StoreOp::Renew | StoreOp::Complete | StoreOp::Release | StoreOp::Get => {}
            }
        }
    }
}
