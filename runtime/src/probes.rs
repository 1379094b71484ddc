//! The HTTP endpoint of the node plugin and the controller: `/metrics` (OpenMetrics text from a
//! `prometheus-client` registry, with its content type; only to callers a [`MetricsAccess`] lets
//! in), `/healthz` (the process answers and no thread has panicked since
//! [`fail_liveness_on_panic`]) and `/readyz` (a flag the component sets). The health endpoints
//! are always open: the kubelet's probes carry no token.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::metrics_auth::MetricsAccess;

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

/// The state of the routes: what is probed, and who may read its metrics.
struct Served<P> {
    probed: Arc<P>,
    access: MetricsAccess,
}

impl<P> Clone for Served<P> {
    fn clone(&self) -> Self {
        Self {
            probed: self.probed.clone(),
            access: self.access.clone(),
        }
    }
}

/// The routes: `/metrics` (to callers `access` lets in), `/healthz`, `/readyz` (to anyone).
pub fn router<P: AsRef<Probe> + Send + Sync + 'static>(
    probed: Arc<P>,
    access: MetricsAccess,
) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(
                |State(s): State<Served<P>>, headers: HeaderMap| async move {
                    if let Err(refusal) = s.access.check(&headers).await {
                        return refusal.into_response();
                    }
                    (
                        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                        (*s.probed).as_ref().encode(),
                    )
                        .into_response()
                },
            ),
        )
        .route(
            "/healthz",
            get(|State(s): State<Served<P>>| async move {
                match (*s.probed).as_ref().broken() {
                    None => (StatusCode::OK, "ok".to_string()),
                    Some(why) => (StatusCode::INTERNAL_SERVER_ERROR, why.to_string()),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(s): State<Served<P>>| async move {
                if (*s.probed).as_ref().is_ready() {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(Served { probed, access })
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
    access: MetricsAccess,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, metrics_access = ?access, "serving metrics and health probes");
    axum::serve(listener, router(probed, access))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::Mutex;
    use std::time::Duration;

    use k8s_openapi::api::authentication::v1::UserInfo;

    use crate::metrics_auth::{AccessReviews, Review, Reviewer};

    /// `GET path` on `addr` with an optional `Authorization` header; the raw response.
    async fn request(addr: SocketAddr, path: &str, authorization: Option<&str>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// An API server in a box: `tokens` maps a token to its user; `readers` may get /metrics.
    /// Every review it is asked for is recorded.
    #[derive(Default)]
    struct FakeReviewer {
        tokens: Vec<(&'static str, &'static str)>,
        readers: Vec<&'static str>,
        fail: bool,
        asked: Mutex<Vec<String>>,
    }

    impl Reviewer for FakeReviewer {
        fn authenticate<'a>(&'a self, token: &'a str) -> Review<'a, Option<UserInfo>> {
            Box::pin(async move {
                self.asked.lock().unwrap().push(format!("token {token}"));
                anyhow::ensure!(!self.fail, "API server unreachable");
                Ok(self
                    .tokens
                    .iter()
                    .find(|(t, _)| *t == token)
                    .map(|(_, user)| UserInfo {
                        username: Some(user.to_string()),
                        ..Default::default()
                    }))
            })
        }

        fn authorize<'a>(
            &'a self,
            user: &'a UserInfo,
            verb: &'a str,
            path: &'a str,
        ) -> Review<'a, bool> {
            Box::pin(async move {
                let name = user.username.clone().unwrap_or_default();
                self.asked
                    .lock()
                    .unwrap()
                    .push(format!("{name} {verb} {path}"));
                Ok(self.readers.contains(&name.as_str()))
            })
        }
    }

    /// A probe behind `reviewer` (callers remembered for `ttl`), ready, served on a free port.
    async fn guarded(reviewer: Arc<FakeReviewer>, ttl: Duration) -> SocketAddr {
        let mut r = Registry::with_prefix("t");
        let c = Counter::<u64>::default();
        r.register("hits", "hits", c.clone());
        let p = Arc::new(Probe::new(r));
        p.set_ready(true);
        let access = MetricsAccess::Reviewed(Arc::new(AccessReviews::new(reviewer, ttl)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(p, access);
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    fn prometheus() -> Arc<FakeReviewer> {
        Arc::new(FakeReviewer {
            tokens: vec![("good", "prometheus"), ("tenant-token", "tenant")],
            readers: vec!["prometheus"],
            ..Default::default()
        })
    }

    fn asked(r: &FakeReviewer) -> Vec<String> {
        r.asked.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn metrics_without_a_bearer_token_are_401_and_ask_nothing() {
        let r = prometheus();
        let addr = guarded(r.clone(), Duration::from_secs(60)).await;
        for auth in [None, Some("Basic Z29vZA=="), Some("Bearer ")] {
            let m = request(addr, "/metrics", auth).await;
            assert!(m.starts_with("HTTP/1.1 401"), "{auth:?}: {m}");
            assert!(
                m.to_ascii_lowercase().contains("www-authenticate: bearer"),
                "{m}"
            );
            assert!(!m.contains("t_hits_total"), "{m}");
        }
        assert!(asked(&r).is_empty(), "{:?}", asked(&r));
    }

    #[tokio::test]
    async fn metrics_with_a_token_the_api_server_rejects_are_401() {
        let r = prometheus();
        let addr = guarded(r.clone(), Duration::from_secs(60)).await;
        let m = request(addr, "/metrics", Some("Bearer forged")).await;
        assert!(m.starts_with("HTTP/1.1 401"), "{m}");
        assert!(!m.contains("t_hits_total"), "{m}");
        assert_eq!(
            asked(&r),
            ["token forged"],
            "rejected before any access review"
        );
    }

    #[tokio::test]
    async fn metrics_for_a_user_without_get_on_metrics_are_403() {
        let r = prometheus();
        let addr = guarded(r.clone(), Duration::from_secs(60)).await;
        let m = request(addr, "/metrics", Some("Bearer tenant-token")).await;
        assert!(m.starts_with("HTTP/1.1 403"), "{m}");
        assert!(m.contains("\"tenant\" may not get /metrics"), "{m}");
        assert!(!m.contains("t_hits_total"), "{m}");
        assert_eq!(asked(&r), ["token tenant-token", "tenant get /metrics"]);
        // A refusal is not remembered: the next request is reviewed again.
        request(addr, "/metrics", Some("Bearer tenant-token")).await;
        assert_eq!(asked(&r).len(), 4);
    }

    #[tokio::test]
    async fn metrics_for_an_allowed_user_are_served_and_remembered() {
        let r = prometheus();
        let addr = guarded(r.clone(), Duration::from_secs(60)).await;
        let m = request(addr, "/metrics", Some("Bearer good")).await;
        assert!(
            m.starts_with("HTTP/1.1 200") && m.contains("t_hits_total 0"),
            "{m}"
        );
        assert_eq!(asked(&r), ["token good", "prometheus get /metrics"]);
        // Within the TTL the same token is let in without a second review.
        let m = request(addr, "/metrics", Some("bearer good")).await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert_eq!(asked(&r).len(), 2, "{:?}", asked(&r));
        // Another token is not covered by the first one's review.
        let m = request(addr, "/metrics", Some("Bearer forged")).await;
        assert!(m.starts_with("HTTP/1.1 401"), "{m}");
    }

    #[tokio::test]
    async fn an_expired_allowance_is_reviewed_again() {
        let r = prometheus();
        let addr = guarded(r.clone(), Duration::ZERO).await;
        for _ in 0..2 {
            let m = request(addr, "/metrics", Some("Bearer good")).await;
            assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        }
        assert_eq!(asked(&r).len(), 4, "{:?}", asked(&r));
    }

    #[tokio::test]
    async fn a_review_that_fails_is_503() {
        let r = Arc::new(FakeReviewer {
            fail: true,
            ..Default::default()
        });
        let addr = guarded(r, Duration::from_secs(60)).await;
        let m = request(addr, "/metrics", Some("Bearer good")).await;
        assert!(m.starts_with("HTTP/1.1 503"), "{m}");
        assert!(!m.contains("t_hits_total"), "{m}");
    }

    #[tokio::test]
    async fn health_endpoints_stay_open_behind_metrics_auth() {
        let r = prometheus();
        let addr = guarded(r.clone(), Duration::from_secs(60)).await;
        assert!(
            request(addr, "/healthz", None)
                .await
                .starts_with("HTTP/1.1 200")
        );
        assert!(
            request(addr, "/readyz", None)
                .await
                .starts_with("HTTP/1.1 200")
        );
        assert!(
            request(addr, "/metrics", None)
                .await
                .starts_with("HTTP/1.1 401"),
            "the guard is on"
        );
        assert!(asked(&r).is_empty());
    }

    #[tokio::test]
    async fn metrics_carry_their_content_type_and_readyz_follows_the_flag() {
        let mut r = Registry::with_prefix("t");
        let c = Counter::<u64>::default();
        r.register("hits", "hits", c.clone());
        c.inc();
        let p = Arc::new(Probe::new(r));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(p.clone(), MetricsAccess::Open);
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
