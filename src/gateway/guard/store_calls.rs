//! The guard's calls to the store: each bounded by `gateway.store_timeout`
//! (a settle's try by less, when less of its lease is left) and measured
//! per operation. The timeout is the only one a store operation has
//! (`docs/stores.md`): it bounds the backend's whole work, reconnects and
//! retries included, so the guard decides what a slow store means.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntCounter};

use crate::metrics::{Metrics, Series};
use crate::store::StoreError;

/// A store operation of the request path, as the store metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StoreOp {
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

    pub(super) fn as_str(self) -> &'static str {
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

/// How the guard calls the store: under one timeout, measured.
pub(in crate::gateway) struct StoreCalls {
    timeout: Duration,
    metrics: Arc<Metrics>,
    series: StoreSeries,
}

impl StoreCalls {
    /// Calls bounded by `timeout` (`gateway.store_timeout`), counted in `metrics`.
    pub(in crate::gateway) fn new(timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self { timeout, metrics, series: StoreSeries::default() }
    }

    /// The same calls for a sibling gateway (one per core), with its own
    /// cache of the series' handles; the series themselves are the
    /// process's, shared by every core.
    pub(in crate::gateway) fn sibling(&self) -> Self {
        Self::new(self.timeout, self.metrics.clone())
    }

    /// The limit on one store operation.
    pub(in crate::gateway) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs a store operation under the store timeout, and measures it.
    pub(super) async fn call<T>(
        &self,
        op: StoreOp,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call_within(op, self.timeout, operation).await
    }

    /// [`Self::call`] bounded by `limit` instead of the store timeout.
    pub(super) async fn call_within<T>(
        &self,
        op: StoreOp,
        limit: Duration,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = crate::store::bounded(limit, operation).await;
        let series = &self.series;
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
