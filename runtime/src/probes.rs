//! The HTTP endpoint of the node plugin and the controller: `/metrics` (OpenMetrics text from a
//! `prometheus-client` registry, with its content type), `/healthz` (the process answers and no
//! thread has panicked since [`fail_liveness_on_panic`]) and `/readyz` (a flag the component
//! sets).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text exposition (OpenMetrics 1.0, as `prometheus-client`
/// encodes it); Prometheus negotiates it.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoint serves: a metrics registry and the readiness flag. A component's metrics
/// struct holds one and exposes it through `AsRef<Probe>`.
#[derive(Debug, Default)]
pub struct Probe {
    registry: Registry,
    ready: AtomicBool,
    broken: OnceLock<String>,
}

impl Probe {
    /// A probe over `registry`, not ready.
    pub fn new(registry: Registry) -> Self {
        Self {
            registry,
            ready: AtomicBool::new(false),
            broken: OnceLock::new(),
        }
    }

    /// Makes `/healthz` answer 500 with `why` from now on (the first reason stays), so the
    /// kubelet restarts the container.
    pub fn set_broken(&self, why: String) {
        let _ = self.broken.set(why);
    }

    /// Why `/healthz` fails, if it does.
    pub fn broken(&self) -> Option<&str> {
        self.broken.get().map(String::as_str)
    }

    /// The registry `/metrics` encodes.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Sets what `/readyz` answers: 200 when `ready`, 503 otherwise.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// What `/readyz` answers now.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The OpenMetrics text of the registry.
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

impl AsRef<Probe> for Probe {
    fn as_ref(&self) -> &Probe {
        self
    }
}

/// The OpenMetrics text of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The routes: `/metrics`, `/healthz`, `/readyz`.
pub fn router<P: AsRef<Probe> + Send + Sync + 'static>(probed: Arc<P>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(p): State<Arc<P>>| async move {
                (
                    [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                    (*p).as_ref().encode(),
                )
            }),
        )
        .route(
            "/healthz",
            get(|State(p): State<Arc<P>>| async move {
                match (*p).as_ref().broken() {
                    None => (StatusCode::OK, "ok".to_string()),
                    Some(why) => (StatusCode::INTERNAL_SERVER_ERROR, why.to_string()),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(p): State<Arc<P>>| async move {
                if (*p).as_ref().is_ready() {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(probed)
}

/// Turns `/healthz` red when any thread panics, after the panic is reported as before. A panic
/// is a bug, and one inside a lock leaves it poisoned: every later call through that lock fails
/// while the process still answers. A failing liveness probe makes the kubelet restart the
/// container, which recovers from its persisted state (the node plugin from its checkpoint)
/// instead of staying wedged.
pub fn fail_liveness_on_panic(probe: Arc<Probe>) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        probe.set_broken(format!("a thread panicked: {info}"));
    }));
}

/// Serves [`router`] on `addr` until `shutdown` resolves.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve<P: AsRef<Probe> + Send + Sync + 'static>(
    addr: SocketAddr,
    probed: Arc<P>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving metrics and health probes");
    axum::serve(listener, router(probed))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[tokio::test]
    async fn metrics_carry_their_content_type_and_readyz_follows_the_flag() {
        let mut r = Registry::with_prefix("t");
        let c = Counter::<u64>::default();
        r.register("hits", "hits", c.clone());
        c.inc();
        let p = Arc::new(Probe::new(r));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(p.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let m = get("/metrics").await;
        assert!(
            m.contains(OPENMETRICS_CONTENT_TYPE) && m.contains("t_hits_total 1"),
            "{m}"
        );
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        p.set_ready(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        // A panic while a lock is held: /healthz turns red and says why.
        fail_liveness_on_panic(p.clone());
        let lock = Arc::new(std::sync::Mutex::new(()));
        let held = lock.clone();
        let r = std::thread::spawn(move || {
            let _guard = held.lock().unwrap();
            panic!("injected panic inside a lock");
        })
        .join();
        assert!(r.is_err() && lock.is_poisoned());
        let h = get("/healthz").await;
        assert!(
            h.starts_with("HTTP/1.1 500") && h.contains("injected panic inside a lock"),
            "{h}"
        );
    }
}
