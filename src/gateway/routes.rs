//! The route table: path prefix → upstream and policy. First match wins.
//!
//! Built from the config once, by `RouteTable::try_from(&config)`: each
//! `[[routes]]` table with the `[gateway]` defaults it does not override;
//! the methods come parsed from the config, so nothing here re-checks them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{Method, Uri};

use prometheus::{Histogram, IntCounter};

use super::Disposition;
use super::key::KeySource;
use crate::config::{Config, GatewayConfig, OnUnknown, RouteConfig, check_upstream_url};
use crate::http::client::Upstream;
use crate::idempotency::{StatusPolicy, Tenant};
use crate::metrics::{Metrics, Series};
use crate::webhook::{Reason, Verifier};

/// A route compiled from its config.
#[derive(Debug, Clone)]
pub struct Route {
    /// Name for logs and metrics.
    pub name: String,
    /// Path prefix.
    pub prefix: String,
    /// Upstream base path, without a trailing `/` (often empty).
    pub base_path: String,
    /// Guarded methods.
    pub methods: Vec<Method>,
    /// Guarded requests need a key.
    pub require_key: bool,
    /// Forward the client's `Host`.
    pub keep_host: bool,
    /// Which outcomes are stored.
    pub status_policy: StatusPolicy,
    /// What a lost outcome does to the key.
    pub on_unknown: OnUnknown,
    /// The pooled client for this route's upstream.
    pub upstream: Upstream,
    /// Recent upstream latency, for `Retry-After` on `409`.
    pub latency: LatencyEstimate,
    /// This route's metric series, looked up once each.
    pub metrics: RouteMetrics,
    /// Where a guarded request's key is.
    pub key: KeySource,
    /// Overrides `gateway.key_ttl`.
    pub key_ttl: Option<Duration>,
    /// A webhook route's verifier and tenant (the route itself).
    pub webhook: Option<Arc<Webhook>>,
}

/// What a webhook route verifies deliveries with, and whose key space
/// they live in: the route's own (`route:<name>`), since the signature
/// says who sent a delivery and providers send no credential of a tenant.
#[derive(Debug)]
pub struct Webhook {
    /// The scheme and its secrets.
    pub verifier: Verifier,
    /// The route as a tenant.
    pub tenant: Tenant,
    /// The signature covers the event id (`Scheme::signs_key`): a verified
    /// redelivery is then the same request whatever its body, and its
    /// fingerprint is the id alone. Otherwise (GitHub's and Shopify's id
    /// headers) the fingerprint is the request's, so one captured delivery
    /// resent under a real event's id gets `422`, never that event's `2xx`.
    pub id_is_signed: bool,
}

/// What became of a webhook delivery, as `idemgate_webhook_deliveries_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Verified, and not answered from the store.
    Verified,
    /// No valid signature (`401 webhook-signature`).
    SignatureFailed,
    /// Validly signed, outside the tolerance (`401 webhook-timestamp`).
    TimestampFailed,
    /// Verified, and answered from the store: a redelivery.
    Replayed,
}

impl Delivery {
    const COUNT: usize = 4;

    fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "verified",
            Self::SignatureFailed => "signature_failed",
            Self::TimestampFailed => "timestamp_failed",
            Self::Replayed => "replayed",
        }
    }
}

/// A route's series of the request counter (one per outcome) and of the
/// upstream latency histogram, so the request path never looks a series up
/// by its labels.
#[derive(Debug, Clone, Default)]
pub struct RouteMetrics {
    requests: Series<IntCounter, { Disposition::COUNT }>,
    upstream_latency: Series<Histogram, 1>,
    deliveries: Series<IntCounter, { Delivery::COUNT }>,
    refusals: Series<IntCounter, { Reason::ALL.len() }>,
}

impl Route {
    /// Counts one request of this route in `idemgate_requests_total`.
    pub fn count_request(&self, metrics: &Metrics, outcome: Disposition) {
        let make = || metrics.requests.with_label_values(&[self.name.as_str(), outcome.as_str()]);
        self.metrics.requests.get(outcome.index(), make).inc();
    }

    /// Counts one webhook delivery in `idemgate_webhook_deliveries_total`,
    /// and a refused one in `idemgate_webhook_refusals_total` by its reason.
    pub fn count_delivery(&self, metrics: &Metrics, delivery: Delivery, refused: Option<Reason>) {
        let make = || metrics.webhook_deliveries.with_label_values(&[self.name.as_str(), delivery.as_str()]);
        self.metrics.deliveries.get(delivery as usize, make).inc();
        if let Some(reason) = refused {
            let make = || metrics.webhook_refusals.with_label_values(&[self.name.as_str(), reason.as_str()]);
            self.metrics.refusals.get(reason as usize, make).inc();
        }
    }

    /// Records one upstream call in `idemgate_upstream_duration_seconds`.
    pub fn observe_upstream(&self, metrics: &Metrics, elapsed: Duration) {
        let make = || metrics.upstream_latency.with_label_values(&[self.name.as_str()]);
        self.metrics.upstream_latency.get(0, make).observe(elapsed.as_secs_f64());
    }
}

/// A moving average of a route's upstream latency: what a `409` tells a
/// client to wait, since the running attempt will most likely have finished
/// by then. Lock-free; updates that race may lose one sample, which only
/// blurs an estimate.
#[derive(Debug, Default)]
pub struct LatencyEstimate {
    micros: AtomicU64,
}

impl LatencyEstimate {
    /// Folds in one observed latency (weight 1/8, like TCP's smoothed RTT).
    pub fn observe(&self, latency: Duration) {
        let sample = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let old = self.micros.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { old - old / 8 + sample / 8 };
        self.micros.store(new.max(1), Ordering::Relaxed);
    }

    /// The current estimate (zero before the first sample).
    pub fn get(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }
}

impl Clone for LatencyEstimate {
    fn clone(&self) -> Self {
        Self { micros: AtomicU64::new(self.micros.load(Ordering::Relaxed)) }
    }
}

/// Why a route cannot be built; names the route.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The upstream URL is not an absolute `http`/`https` URL with a host.
    #[error("{0}")]
    Upstream(#[source] crate::config::UpstreamUrlError),
    /// The upstream's client cannot be made (its CA file, its origin).
    #[error("route {route:?}: {source}")]
    Client {
        /// The route.
        route: String,
        /// Why.
        #[source]
        source: crate::http::client::ClientError,
    },
    /// The webhook secrets cannot be used (a missing or empty file, say).
    #[error("route {route:?}: {source}")]
    Webhook {
        /// The route.
        route: String,
        /// Why.
        #[source]
        source: crate::webhook::SecretError,
    },
}

/// What a route takes from `[gateway]` unless it sets its own.
struct RouteDefaults {
    status_policy: StatusPolicy,
    on_unknown: OnUnknown,
}

impl From<&GatewayConfig> for RouteDefaults {
    fn from(g: &GatewayConfig) -> Self {
        Self { status_policy: StatusPolicy { release: g.release_statuses.clone() }, on_unknown: g.on_unknown }
    }
}

impl Route {
    /// Compiles a validated route config.
    fn compile(config: &RouteConfig, defaults: &RouteDefaults) -> Result<Self, RouteError> {
        let uri = check_upstream_url(&config.upstream).map_err(RouteError::Upstream)?;
        let route = || config.name.clone();
        let upstream =
            Upstream::new(&uri, config.ca_file.as_deref(), config.max_connections, config.pool_idle_timeout.0)
                .map_err(|source| RouteError::Client { route: route(), source })?;
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let methods = config.methods.iter().map(|method| method.0.clone()).collect();
        let key = KeySource::from_config(&config.key_source());
        let webhook = match &config.webhook {
            Some(webhook) => Some(Arc::new(Webhook {
                verifier: Verifier::from_config(webhook)
                    .map_err(|source| RouteError::Webhook { route: route(), source })?,
                tenant: Tenant::from_bytes(format!("route:{}", config.name)),
                id_is_signed: webhook.scheme.signs_key(&config.key_source()),
            })),
            None => None,
        };
        Ok(Self {
            name: config.name.clone(),
            prefix: config.prefix.clone(),
            base_path,
            methods,
            require_key: config.require_key,
            keep_host: config.keep_host,
            status_policy: config
                .release_statuses
                .clone()
                .map(|release| StatusPolicy { release })
                .unwrap_or_else(|| defaults.status_policy.clone()),
            on_unknown: config.on_unknown.unwrap_or(defaults.on_unknown),
            upstream,
            latency: LatencyEstimate::default(),
            metrics: RouteMetrics::default(),
            key,
            key_ttl: config.key_ttl.map(|ttl| ttl.0),
            webhook,
        })
    }

    /// `true` when requests with this method are guarded.
    pub fn guards(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// The upstream URI for a request URI: base path + the request's path and query.
    pub fn upstream_uri(&self, uri: &Uri) -> Result<Uri, http::Error> {
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        if self.base_path.is_empty() {
            return Ok(Uri::from(uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"))));
        }
        Uri::builder().path_and_query(format!("{}{path_and_query}", self.base_path)).build()
    }
}

/// Routes in match order.
#[derive(Debug, Clone, Default)]
pub struct RouteTable(Vec<Arc<Route>>);

impl TryFrom<&Config> for RouteTable {
    type Error = RouteError;

    /// Compiles every route of a validated config, each with the
    /// `[gateway]` defaults it does not override.
    fn try_from(config: &Config) -> Result<Self, RouteError> {
        let defaults = RouteDefaults::from(&config.gateway);
        let compile = |route| Route::compile(route, &defaults).map(Arc::new);
        config.routes.iter().map(compile).collect::<Result<_, _>>().map(Self)
    }
}

impl RouteTable {
    /// The same routes, each with an upstream pool of its own that shares
    /// this one's connection slots ([`Upstream::sibling`]): one
    /// `max_connections` per route for a process's per-core gateways
    /// (`Gateway::sibling`).
    pub(super) fn sibling(&self) -> Self {
        let route = |route: &Arc<Route>| Arc::new(Route { upstream: route.upstream.sibling(), ..Route::clone(route) });
        Self(self.0.iter().map(route).collect())
    }

    /// The first route whose prefix matches `path`.
    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.0.iter().find(|r| path.starts_with(&r.prefix))
    }

    /// `true` when some prefix has a letter, so that ignoring case could
    /// lead a path to another route.
    pub fn case_matters(&self) -> bool {
        self.0.iter().any(|r| r.prefix.bytes().any(|b| b.is_ascii_alphabetic()))
    }

    /// The first route whose prefix matches `path` when ASCII case is
    /// ignored: the route an upstream that ignores case would take.
    pub fn find_ignoring_case(&self, path: &str) -> Option<&Arc<Route>> {
        let path = path.as_bytes();
        self.0
            .iter()
            .find(|r| path.get(..r.prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(r.prefix.as_bytes())))
    }

    /// The routes.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, prefix: &str, upstream: &str) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            prefix: prefix.into(),
            upstream: upstream.into(),
            methods: vec![Method::POST.into(), "patch".to_owned().try_into().unwrap()],
            require_key: false,
            keep_host: false,
            ca_file: None,
            max_connections: 4,
            release_statuses: None,
            on_unknown: None,
            pool_idle_timeout: crate::config::ConfigDuration(crate::config::DEFAULT_POOL_IDLE_TIMEOUT),
            key: None,
            webhook: None,
            key_ttl: None,
        }
    }

    #[test]
    fn the_first_matching_prefix_wins_and_paths_join_the_base() {
        let config = Config {
            routes: vec![
                route("pay", "/v1/pay", "http://127.0.0.1:9000/api/"),
                route("all", "/", "http://127.0.0.1:9001"),
            ],
            ..Config::default()
        };
        let table = RouteTable::try_from(&config).unwrap();
        let pay = table.find("/v1/payments").unwrap();
        assert_eq!(pay.name, "pay");
        assert_eq!(pay.upstream_uri(&"/v1/payments?x=1".parse().unwrap()).unwrap(), "/api/v1/payments?x=1");
        assert!(pay.guards(&Method::PATCH) && !pay.guards(&Method::GET));
        assert_eq!(table.find("/other").unwrap().name, "all");
    }

    #[test]
    fn the_latency_estimate_follows_recent_calls() {
        let estimate = LatencyEstimate::default();
        assert_eq!(estimate.get(), Duration::ZERO);
        estimate.observe(Duration::from_millis(800));
        assert_eq!(estimate.get(), Duration::from_millis(800));
        for _ in 0..64 {
            estimate.observe(Duration::from_millis(8));
        }
        assert!(estimate.get() < Duration::from_millis(10), "{:?}", estimate.get());
    }
}
