//! Prometheus metrics of the controller (docs/operations.md lists them), served with `/healthz`
//! and `/readyz` by `das_runtime::probes`. Exposition: OpenMetrics text through
//! `prometheus-client` (<https://docs.rs/prometheus-client>).

use std::sync::{Arc, OnceLock};

use das_api::allocation::AllocationState;
use das_runtime::probes::Probe;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The labels of one series, in order.
pub type Labels = Vec<(String, String)>;

/// Name of the info gauge, without the `das_controller` prefix so dashboards join on a name that
/// does not depend on which component exports it.
pub const DEVICE_INFO: &str = "das_mig_device_info";

/// What computes the rows of [`DEVICE_INFO`] on a scrape (one label set per row). This module
/// knows only that it yields labels: where they come from (the controller's caches,
/// `crate::device_info`) is the caller's business, so the metrics depend on nothing else of the
/// crate.
type Rows = Box<dyn Fn() -> Vec<Labels> + Send + Sync>;

/// Encodes [`DEVICE_INFO`] on each scrape from the rows source (nothing until
/// [`Metrics::export_device_info`] gave one), so a row can never outlive its allocation.
#[derive(Default, Clone)]
struct DeviceInfoCollector(Arc<OnceLock<Rows>>);

impl std::fmt::Debug for DeviceInfoCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceInfoCollector")
    }
}

impl DeviceInfoCollector {
    /// The gauge as it is now: one series per row.
    fn family(&self) -> Family<Labels, Gauge> {
        let family = Family::<Labels, Gauge>::default();
        let Some(rows) = self.0.get() else {
            return family;
        };
        for labels in rows() {
            family.get_or_create(&labels).set(1);
        }
        family
    }
}

impl Collector for DeviceInfoCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = self.family();
        let metric = encoder.encode_descriptor(
            DEVICE_INFO,
            "1 per prepared MIG device and container using it: pod, claim, GPU and MIG UUIDs, \
             GPU- and compute-instance ids (join with dcgm-exporter on UUID and GPU_I_ID)",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

/// Every metric of the controller.
pub struct Metrics {
    /// Reconciles of a ResourceClaim, by `result` (`ok`, `error`).
    pub reconciles: Family<Labels, Counter>,
    /// Failed reconciles and leader-election rounds, by `cause`: the error's `metric_label`
    /// (`crate::error::Error::metric_label`).
    pub errors: Family<Labels, Counter>,
    /// Writes to AllocationClaims, by `op` (`apply`, `status`, `delete`).
    pub writes: Family<Labels, Counter>,
    /// AllocationClaims by `state`, as last counted.
    pub claims: Family<Labels, Gauge>,
    /// Seconds from the node plugin reporting the device ready (its `readyTime`, milliseconds;
    /// the `Ready` condition's whole-second time for older plugins) to the controller writing
    /// `inUse`.
    pub in_use_lag: Histogram,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    /// `/metrics` and `/readyz`: ready once the caches are synced, or the replica stands by as a follower.
    pub probe: Arc<Probe>,
    /// Source of [`DEVICE_INFO`].
    device_info: DeviceInfoCollector,
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
    /// Registers every metric under the `das_controller` prefix, and [`DEVICE_INFO`].
    pub fn new() -> Self {
        let mut root = Registry::default();
        let device_info = DeviceInfoCollector::default();
        root.register_collector(Box::new(device_info.clone()));
        let registry = root.sub_registry_with_prefix("das_controller");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let writes = Family::<Labels, Counter>::default();
        let claims = Family::<Labels, Gauge>::default();
        let in_use_lag = Histogram::new(exponential_buckets(0.05, 2.0, 10));
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "ResourceClaim reconciles by result",
            reconciles.clone(),
        );
        registry.register(
            "errors",
            "Errors while reconciling, by cause",
            errors.clone(),
        );
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
            probe: Arc::new(Probe::new(root)),
            device_info,
            reconciles,
            errors,
            writes,
            claims,
            in_use_lag,
            leader,
        }
    }

    /// Starts exporting [`DEVICE_INFO`] with the rows `rows` computes on each scrape (the first
    /// call wins: a process has one set of caches).
    pub fn export_device_info(&self, rows: impl Fn() -> Vec<Labels> + Send + Sync + 'static) {
        let _ = self.device_info.0.set(Box::new(rows));
    }

    /// Counts one reconcile by result (`ok`, `error`); a failed one is also counted by cause
    /// with [`Self::reconcile_error`].
    pub fn reconciled(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&label("result", result))
            .inc();
    }

    /// Counts one error by `cause` (an error's `metric_label`).
    pub fn reconcile_error(&self, cause: &'static str) {
        self.errors.get_or_create(&label("cause", cause)).inc();
    }

    /// Counts one failed leader-election round by `cause` (`lease`, `lease_timeout`), in the
    /// same `das_controller_errors_total` family.
    pub fn lease_error(&self, cause: &'static str) {
        self.reconcile_error(cause);
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
mod tests;
