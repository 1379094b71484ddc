//! Prometheus metrics of the controller (docs/operations.md lists them), served with `/healthz`
//! and `/readyz` by `das_runtime::probes`. Exposition: OpenMetrics text through
//! `prometheus-client` (<https://docs.rs/prometheus-client>).

use std::sync::Arc;

use das_api::allocation::AllocationState;
use das_runtime::probes::Probe;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Every metric of the controller.
pub struct Metrics {
    /// Reconciles of a ResourceClaim, by `result` (`ok`, `error`).
    pub reconciles: Family<Labels, Counter>,
    /// API errors while reconciling.
    pub errors: Counter,
    /// Writes to AllocationClaims, by `op` (`apply`, `status`, `delete`).
    pub writes: Family<Labels, Counter>,
    /// AllocationClaims by `state`, as last counted.
    pub claims: Family<Labels, Gauge>,
    /// Seconds from the node plugin's `Ready` condition (second precision, as stored by the API
    /// server) to the controller writing `inUse`.
    pub in_use_lag: Histogram,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    /// `/metrics` and `/readyz`: ready once the caches are synced, or the replica stands by as a follower.
    pub probe: Arc<Probe>,
}

fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_string(), v.to_string())]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `das_controller` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("das_controller");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Counter::default();
        let writes = Family::<Labels, Counter>::default();
        let claims = Family::<Labels, Gauge>::default();
        let in_use_lag = Histogram::new(exponential_buckets(0.05, 2.0, 10));
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "ResourceClaim reconciles by result",
            reconciles.clone(),
        );
        registry.register("errors", "API errors while reconciling", errors.clone());
        registry.register(
            "writes",
            "AllocationClaim writes by operation",
            writes.clone(),
        );
        registry.register(
            "allocation_claims",
            "AllocationClaims by state",
            claims.clone(),
        );
        registry.register(
            "in_use_lag_seconds",
            "Seconds from the device Ready condition to the AllocationClaim showing inUse",
            in_use_lag.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica is the leader",
            leader.clone(),
        );
        Self {
            probe: Arc::new(Probe::new(registry)),
            reconciles,
            errors,
            writes,
            claims,
            in_use_lag,
            leader,
        }
    }

    /// Counts one reconcile.
    pub fn reconciled(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&label("result", result))
            .inc();
        if !ok {
            self.errors.inc();
        }
    }

    /// Counts one write (`apply`, `status`, `delete`).
    pub fn wrote(&self, op: &str) {
        self.writes.get_or_create(&label("op", op)).inc();
    }

    /// Sets the per-state gauge from `counts` (every state is set, absent ones to 0).
    pub fn set_claims(&self, counts: &[(AllocationState, i64)]) {
        for s in AllocationState::ALL {
            let n = counts.iter().find(|(k, _)| *k == s).map_or(0, |(_, n)| *n);
            self.claims
                .get_or_create(&label("state", s.as_str()))
                .set(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_labels() {
        let m = Metrics::new();
        m.reconciled(true);
        m.reconciled(false);
        m.wrote("apply");
        m.set_claims(&[(AllocationState::InUse, 2)]);
        let text = m.probe.encode();
        for want in [
            "das_controller_reconciles_total{result=\"ok\"} 1",
            "das_controller_errors_total 1",
            "das_controller_writes_total{op=\"apply\"} 1",
            "das_controller_allocation_claims{state=\"inUse\"} 2",
            "das_controller_allocation_claims{state=\"staged\"} 0",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }
}
