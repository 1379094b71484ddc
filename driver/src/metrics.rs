//! Prometheus metrics of the node plugin and its HTTP endpoint (`/metrics`, `/healthz`,
//! `/readyz`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
}

/// Buckets for latencies in seconds: 1 ms to ~16 s.
fn latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 15,
    ))
}

/// The plugin's metrics. Names are prefixed `das_kubelet_plugin_`.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    call_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    backend_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    prepared: Family<GpuLabels, Gauge>,
    status_write_failures: Counter,
    /// Set once the plugin serves the kubelet and has published its slices.
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("das_kubelet_plugin");
        let calls = Family::<CallLabels, Counter>::default();
        let call_seconds =
            Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let backend_seconds =
            Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        let prepared = Family::<GpuLabels, Gauge>::default();
        let status_write_failures = Counter::default();
        registry.register(
            "requests",
            "NodePrepareResources/NodeUnprepareResources per claim, by result",
            calls.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to prepare or unprepare one claim",
            call_seconds.clone(),
        );
        registry.register(
            "backend_duration_seconds",
            "Time of GPU backend operations (create, destroy)",
            backend_seconds.clone(),
        );
        registry.register(
            "prepared_slices",
            "MIG slices prepared for claims, per GPU index",
            prepared.clone(),
        );
        registry.register(
            "claim_status_write_failures",
            "Failed writes of a claim's status.devices",
            status_write_failures.clone(),
        );
        Self {
            registry,
            calls,
            call_seconds,
            backend_seconds,
            prepared,
            status_write_failures,
            ready: AtomicBool::new(false),
        }
    }

    /// Records one prepare or unprepare of a claim.
    pub fn observe_call(&self, method: &str, ok: bool, took: Duration) {
        let result = if ok { "success" } else { "error" };
        self.calls
            .get_or_create(&CallLabels {
                method: method.into(),
                result: result.into(),
            })
            .inc();
        self.call_seconds
            .get_or_create(&MethodLabels {
                method: method.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one backend operation (`create`, `destroy`).
    pub fn observe_backend(&self, op: &str, took: Duration) {
        self.backend_seconds
            .get_or_create(&MethodLabels { method: op.into() })
            .observe(took.as_secs_f64());
    }

    /// Sets the prepared-slice gauge of every GPU (GPUs absent from `per_gpu` go to 0).
    pub fn set_prepared(&self, per_gpu: BTreeMap<u32, u64>) {
        self.prepared.clear();
        for (gpu, n) in per_gpu {
            self.prepared
                .get_or_create(&GpuLabels {
                    gpu: gpu.to_string(),
                })
                .set(n as i64);
        }
    }

    pub fn status_write_failed(&self) {
        self.status_write_failures.inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves `/metrics`, `/healthz` (the process answers) and `/readyz` (registered and published)
/// on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { m.encode() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if m.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving metrics and health probes");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_labels() {
        let m = Metrics::new();
        m.observe_call("prepare", true, Duration::from_millis(3));
        m.observe_call("prepare", false, Duration::from_millis(3));
        m.set_prepared(BTreeMap::from([(0, 2), (1, 1)]));
        m.set_prepared(BTreeMap::from([(1, 1)]));
        let text = m.encode();
        assert!(
            text.contains(
                r#"das_kubelet_plugin_requests_total{method="prepare",result="success"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"das_kubelet_plugin_requests_total{method="prepare",result="error"} 1"#
            )
        );
        assert!(text.contains(r#"das_kubelet_plugin_prepared_slices{gpu="1"} 1"#));
        assert!(!text.contains(r#"gpu="0""#), "cleared GPUs disappear");
    }
}
