//! Prometheus metrics, served on the admin listener at `/metrics`.
//!
//! Labels are low-cardinality by construction: a route name, an outcome, a
//! store operation, a destination name — values that come from the config
//! or from a fixed list in the code, never from a request (no key, tenant,
//! path or status text). One [`Metrics`] per process, shared by reference.

use std::sync::OnceLock;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets in seconds: 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Every metric idemgate exports.
pub struct Metrics {
    registry: Registry,
    /// `idemgate_requests_total{route, outcome}`.
    pub requests: IntCounterVec,
    /// `idemgate_webhook_deliveries_total{route, outcome}` (verified,
    /// signature_failed, timestamp_failed, replayed).
    pub webhook_deliveries: IntCounterVec,
    /// `idemgate_webhook_refusals_total{route, reason}` (missing, repeated,
    /// malformed, mismatch, stale, future).
    pub webhook_refusals: IntCounterVec,
    /// `idemgate_upstream_duration_seconds{route}`.
    pub upstream_latency: HistogramVec,
    /// `idemgate_store_duration_seconds{operation}`.
    pub store_latency: HistogramVec,
    /// `idemgate_store_errors_total{operation}`.
    pub store_errors: IntCounterVec,
    /// `idemgate_lease_takeovers_total`.
    pub lease_takeovers: IntCounter,
    /// `idemgate_tenant_quota_refusals_total{limit}` (`keys`, `bytes`; no
    /// tenant label: tenants are unbounded, and the request log names the key).
    pub tenant_quota_refusals: IntCounterVec,
    /// `idemgate_fence_rejections_total{operation}`.
    pub fence_rejections: IntCounterVec,
    /// `idemgate_settle_abandoned_total`.
    pub settle_abandoned: IntCounter,
    /// `idemgate_settled_after_lapse_total`.
    pub settled_after_lapse: IntCounter,
    /// `idemgate_store_unreplicated_total{operation}`.
    pub store_unreplicated: IntCounterVec,
    /// `idemgate_unreplicated_answers_total`.
    pub unreplicated_answers: IntCounter,
    /// `idemgate_outbox_rows{destination, state}` (ready, leased, dead;
    /// unroutable for a destination the relay does not have, at most 16 of those).
    pub outbox_rows: IntGaugeVec,
    /// `idemgate_outbox_unroutable_destinations`.
    pub outbox_unroutable_destinations: IntGauge,
    /// `idemgate_outbox_in_flight{destination}`.
    pub outbox_in_flight: IntGaugeVec,
    /// `idemgate_outbox_oldest_ready_age_seconds{destination}`.
    pub outbox_oldest_ready_age: IntGaugeVec,
    /// `idemgate_outbox_delivery_attempts_total{destination, outcome}`.
    pub outbox_attempts: IntCounterVec,
    /// `idemgate_outbox_publish_duration_seconds{destination}`.
    pub outbox_publish_latency: HistogramVec,
    /// `idemgate_outbox_commit_to_delivery_seconds{destination}`.
    pub outbox_commit_to_delivery: HistogramVec,
    /// `idemgate_outbox_lease_lost_total`.
    pub outbox_lease_lost: IntCounter,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
            registry.register(Box::new(metric.clone())).expect("unique metric name");
            metric
        };
        let histogram_vec = |name: &str, help: &str, labels: &[&str]| {
            let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
            let metric = HistogramVec::new(opts, labels).expect("static metric definition");
            registry.register(Box::new(metric.clone())).expect("unique metric name");
            metric
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
            registry.register(Box::new(metric.clone())).expect("unique metric name");
            metric
        };
        let gauge = |name: &str, help: &str| {
            let metric = IntGauge::new(name, help).expect("static metric definition");
            registry.register(Box::new(metric.clone())).expect("unique metric name");
            metric
        };
        let counter = |name: &str, help: &str| {
            let metric = IntCounter::new(name, help).expect("static metric definition");
            registry.register(Box::new(metric.clone())).expect("unique metric name");
            metric
        };
        // The log sink's own counter, one per process.
        registry.register(Box::new(crate::log_sink::DROPPED.clone())).expect("unique metric name");
        Self {
            requests: counter_vec("idemgate_requests_total", "Requests by route and outcome.", &["route", "outcome"]),
            webhook_deliveries: counter_vec(
                "idemgate_webhook_deliveries_total",
                "Webhook deliveries by route and outcome: verified (and not answered from the store), \
                 signature_failed, timestamp_failed, replayed (a verified redelivery answered from the store).",
                &["route", "outcome"],
            ),
            webhook_refusals: counter_vec(
                "idemgate_webhook_refusals_total",
                "Webhook deliveries refused with 401, by route and reason.",
                &["route", "reason"],
            ),
            upstream_latency: histogram_vec(
                "idemgate_upstream_duration_seconds",
                "Time from forwarding a request to having its response (stored part read).",
                &["route"],
            ),
            store_latency: histogram_vec(
                "idemgate_store_duration_seconds",
                "Time of one store operation.",
                &["operation"],
            ),
            store_errors: counter_vec(
                "idemgate_store_errors_total",
                "Store operations that failed or timed out.",
                &["operation"],
            ),
            lease_takeovers: counter(
                "idemgate_lease_takeovers_total",
                "Keys acquired from an in-flight attempt whose lease had expired.",
            ),
            tenant_quota_refusals: counter_vec(
                "idemgate_tenant_quota_refusals_total",
                "New keys refused with 429 tenant-quota, by the limit their tenant had reached.",
                &["limit"],
            ),
            fence_rejections: counter_vec(
                "idemgate_fence_rejections_total",
                "Renew, complete or release refused because a newer attempt holds the key.",
                &["operation"],
            ),
            settle_abandoned: counter(
                "idemgate_settle_abandoned_total",
                "Attempts that could not settle their record: a release before its lease ended, a completion before \
                 upstream_deadline (the store stayed down).",
            ),
            settled_after_lapse: counter(
                "idemgate_settled_after_lapse_total",
                "Completions that landed after their lease had lapsed, under their fence, nobody having taken over.",
            ),
            store_unreplicated: counter_vec(
                "idemgate_store_unreplicated_total",
                "Begins and completes that fewer replicas than wait_replicas acknowledged within wait_timeout.",
                &["operation"],
            ),
            unreplicated_answers: counter(
                "idemgate_unreplicated_answers_total",
                "Clients answered although the replicas never acknowledged their completed record before its lease would end.",
            ),
            outbox_rows: gauge_vec(
                "idemgate_outbox_rows",
                "Outbox rows by destination and state (unroutable: no relay here has the destination).",
                &["destination", "state"],
            ),
            outbox_unroutable_destinations: gauge(
                "idemgate_outbox_unroutable_destinations",
                "Destinations with rows waiting that this relay does not have.",
            ),
            outbox_in_flight: gauge_vec(
                "idemgate_outbox_in_flight",
                "Publishes running now, by destination (at most relay.max_in_flight each).",
                &["destination"],
            ),
            outbox_oldest_ready_age: gauge_vec(
                "idemgate_outbox_oldest_ready_age_seconds",
                "Age of the oldest row ready for delivery.",
                &["destination"],
            ),
            outbox_attempts: counter_vec(
                "idemgate_outbox_delivery_attempts_total",
                "Delivery attempts by destination and outcome.",
                &["destination", "outcome"],
            ),
            outbox_publish_latency: histogram_vec(
                "idemgate_outbox_publish_duration_seconds",
                "Time of one publish to a destination.",
                &["destination"],
            ),
            outbox_commit_to_delivery: histogram_vec(
                "idemgate_outbox_commit_to_delivery_seconds",
                "Time from enqueue to successful delivery.",
                &["destination"],
            ),
            outbox_lease_lost: counter(
                "idemgate_outbox_lease_lost_total",
                "Publishes whose row lease was taken over before they finished.",
            ),
            registry,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `N` labelled series of one metric, each looked up by its labels once and
/// then kept. `with_label_values` hashes its labels and takes the vector's
/// lock on every call, which the request path would pay several times per
/// request. A series is still created only when first used, so `/metrics`
/// shows exactly what it would without the cache.
#[derive(Debug, Clone)]
pub struct Series<M, const N: usize> {
    cells: [OnceLock<M>; N],
}

impl<M, const N: usize> Series<M, N> {
    /// No series looked up yet.
    pub fn new() -> Self {
        Self { cells: std::array::from_fn(|_| OnceLock::new()) }
    }

    /// The series in slot `index` (`index < N`, chosen by the caller from a
    /// fixed list), made by `make` the first time.
    pub fn get(&self, index: usize, make: impl FnOnce() -> M) -> &M {
        self.cells[index].get_or_init(make)
    }
}

impl<M, const N: usize> Default for Series<M, N> {
    fn default() -> Self {
        Self::new()
    }
}
