//! The admission server: `POST /mutate-pods`, `POST /validate-resource-claims` and
//! `POST /mutate-resource-claims` (AdmissionReview `admission.k8s.io/v1`), `/healthz`,
//! `/readyz`, `/metrics` (to callers [`App::metrics_access`] lets in), over HTTPS.
//!
//! Source: "Dynamic Admission Control"
//! (<https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/>):
//! a mutating webhook answers with a base64 JSON patch; `dryRun` requests must have no side
//! effects when the configuration says `sideEffects: NoneOnDryRun`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use das_runtime::metrics_auth::MetricsAccess;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tower_http::timeout::TimeoutLayer;

use crate::device_configs::{self, Verdict};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::profiles::Profiles;
use crate::shared_claims;
use crate::templates::{Ensured, Templates};
use crate::translate::{self, Translation};

/// Shared state of the handlers.
pub struct App {
    /// The offered profiles, for the translation.
    pub profiles: Arc<Profiles>,
    /// The ResourceClaimTemplates the webhook created, and creates.
    pub templates: Templates,
    /// The webhook's metrics, served on `/metrics`.
    pub metrics: Metrics,
    /// Who may read `/metrics` (`--metrics-auth`); `/healthz` and `/readyz` are open.
    pub metrics_access: MetricsAccess,
    /// `--shares-across-namespaces`: claims of several namespaces may share a slice, so claims
    /// for a shared class are admitted without the namespace selector ([`shared_claims`]).
    pub shares_across_namespaces: bool,
}

/// What one client may cost the server: slow or silent clients, many connections and large
/// bodies are cut off instead of tying the webhook (and, through `failurePolicy: Fail`, every
/// legacy pod's admission) up.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest TLS handshake.
    pub handshake: Duration,
    /// Longest wait for a request's headers (also between requests on a kept-alive connection).
    pub header_read: Duration,
    /// Longest time from a request's headers to its response: reading the body and answering.
    /// A client that trickles its body would otherwise hold a connection slot for ever; past
    /// this the answer is 408 and the connection is closed (the body was not read to its end).
    pub request: Duration,
    /// Most connections served at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Largest request body, in bytes; larger ones get 413. An AdmissionReview of a pod is at
    /// most a few MiB (the API server refuses objects over ~1.5 MiB; a review carries two).
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            // The longest an API server waits for a webhook ("Dynamic Admission Control" above,
            // "Timeouts": `timeoutSeconds` is 1 to 30): a request it still waits for is never cut.
            request: Duration::from_secs(30),
            max_connections: 256,
            max_body_bytes: 4 << 20,
        }
    }
}

/// The routes of the webhook; request bodies are capped at `limits.max_body_bytes`, and each
/// request (body read and answer) at `limits.request`.
pub fn router(app: Arc<App>, limits: Limits) -> Router {
    Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .route("/validate-resource-claims", post(validate_resource_claims))
        .route("/mutate-resource-claims", post(mutate_resource_claims))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        // The extractors read the body inside the handler's future: a trickled body counts.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request,
        ))
        .with_state(app)
}

/// Accepts TLS connections on `listener` for ever, one task per connection (HTTP/1.1), within
/// `limits`. A failed accept (out of file descriptors, a reset connection) is logged and the
/// loop goes on: it never ends the process, and it never returns.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    routes: Router,
    limits: Limits,
) -> std::convert::Infallible {
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed; going on");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let svc = TowerToHyperService::new(routes.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let stream = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

async fn readyz(State(app): State<Arc<App>>) -> (StatusCode, String) {
    match app.profiles.check().await {
        Ok(()) => (StatusCode::OK, "ok".into()),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "cannot list DeviceClasses: {}",
                das_runtime::errors::chain(&e)
            ),
        ),
    }
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = app.metrics_access.check(&headers).await {
        return refusal.into_response();
    }
    let ct = das_runtime::probes::OPENMETRICS_CONTENT_TYPE;
    ([("content-type", ct)], app.metrics.encode()).into_response()
}

async fn mutate_pods(
    State(app): State<Arc<App>>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<Value> {
    let started = Instant::now();
    let parsed: Result<AdmissionRequest<Pod>, _> = review.try_into();
    let response = match parsed {
        Ok(req) => match review_pod(&app, &req).await {
            Ok((outcome, response)) => {
                app.metrics.count(outcome);
                response
            }
            Err(e) => {
                app.metrics.count_error(e.metric_label());
                let why = das_runtime::errors::chain(&e);
                AdmissionResponse::from(&req).deny(format!("das-webhook: {why}"))
            }
        },
        Err(e) => {
            let e = Error::BadReview(e);
            app.metrics.count_error(e.metric_label());
            AdmissionResponse::invalid(e.to_string())
        }
    };
    app.metrics.latency.observe(started.elapsed().as_secs_f64());
    Json(wire_review(response.into_review()))
}

/// Answers a review of a ResourceClaim or ResourceClaimTemplate: denied when a config for
/// `mig.das.com` does not decode ([`device_configs::review`]). Only a creation is checked (the
/// chart registers CREATE only: a claim's and a template's spec are immutable).
async fn validate_resource_claims(
    State(app): State<Arc<App>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<Value> {
    let started = Instant::now();
    let parsed: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let response = match parsed {
        Ok(req) => {
            let resp = AdmissionResponse::from(&req);
            let kind = req.kind.kind.clone();
            let object = req
                .object
                .as_ref()
                .filter(|_| req.operation == kube::core::admission::Operation::Create);
            let verdict = object.map(|o| {
                let json = serde_json::to_value(o).expect("a DynamicObject serializes");
                device_configs::review(&kind, &json)
            });
            match verdict {
                None | Some(Ok(Verdict::Allowed)) => {
                    app.metrics.count_config_review(&kind, "allowed");
                    resp
                }
                Some(Ok(Verdict::Denied(why))) => {
                    app.metrics.count_config_review(&kind, "denied");
                    tracing::info!(kind, name = %claim_ref(&req), reason = %why, "denied");
                    resp.deny(why)
                }
                Some(Err(e)) => {
                    app.metrics.count_config_review(&kind, "error");
                    resp.deny(format!("das-webhook: cannot read the {kind}: {e}"))
                }
            }
        }
        Err(e) => {
            let e = Error::BadReview(e);
            app.metrics.count_config_review("", "error");
            AdmissionResponse::invalid(e.to_string())
        }
    };
    app.metrics.latency.observe(started.elapsed().as_secs_f64());
    Json(wire_review(response.into_review()))
}

/// Answers a review of a ResourceClaim that asks for a shared class: the selector that keeps
/// shared slices within the claim's namespace is added ([`shared_claims::review`]). Only a
/// ResourceClaim's creation is changed (the chart registers CREATE only: a claim's spec is
/// immutable); anything else, and everything with `--shares-across-namespaces`, passes as is.
async fn mutate_resource_claims(
    State(app): State<Arc<App>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<Value> {
    let started = Instant::now();
    let parsed: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let response = match parsed {
        Ok(req) => {
            let (outcome, resp) = review_shared_claim(&app, &req);
            app.metrics.count_shared_claim_review(outcome);
            resp
        }
        Err(e) => {
            let e = Error::BadReview(e);
            app.metrics.count_shared_claim_review("error");
            AdmissionResponse::invalid(e.to_string())
        }
    };
    app.metrics.latency.observe(started.elapsed().as_secs_f64());
    Json(wire_review(response.into_review()))
}

/// One shared-claim review: (outcome label, response).
fn review_shared_claim(
    app: &App,
    req: &AdmissionRequest<DynamicObject>,
) -> (&'static str, AdmissionResponse) {
    let resp = AdmissionResponse::from(req);
    let object = req.object.as_ref().filter(|_| {
        req.operation == kube::core::admission::Operation::Create
            && req.kind.kind == "ResourceClaim"
    });
    let Some(object) = object else {
        return ("unchanged", resp);
    };
    let json = serde_json::to_value(object).expect("a DynamicObject serializes");
    let ns = req.namespace.as_deref().unwrap_or_default();
    match shared_claims::review(ns, &json, !app.shares_across_namespaces) {
        shared_claims::Verdict::Unchanged => ("unchanged", resp),
        shared_claims::Verdict::Denied(why) => {
            tracing::info!(claim = %claim_ref(req), reason = %why, "denied");
            ("denied", resp.deny(why))
        }
        shared_claims::Verdict::Patched { patch, requests } => {
            tracing::debug!(claim = %claim_ref(req), ?requests, "the namespace selector added");
            match resp.clone().with_patch(patch) {
                Ok(r) => ("patched", r),
                Err(e) => {
                    let e = Error::Patch(e);
                    ("error", resp.deny(format!("das-webhook: {e}")))
                }
            }
        }
    }
}

fn claim_ref(req: &AdmissionRequest<DynamicObject>) -> String {
    format!(
        "{}/{}",
        req.namespace.as_deref().unwrap_or_default(),
        req.name
    )
}

/// The review as JSON with `response.patch` base64-encoded, as the API expects for a `[]byte`
/// field (kube-core serializes its `Vec<u8>` as an array of numbers, which the API server
/// accepts but which is about four times larger).
fn wire_review(review: AdmissionReview<DynamicObject>) -> Value {
    use base64::Engine;
    let mut v = serde_json::to_value(&review).expect("an AdmissionReview serializes");
    if let Some(Value::Array(bytes)) = v.pointer("/response/patch") {
        let raw: Vec<u8> = bytes
            .iter()
            .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect();
        v["response"]["patch"] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(raw));
    }
    v
}

/// Answers one review: (outcome label, response); an error is answered by the caller with a
/// denial that says what failed, and counted by its label.
async fn review_pod(
    app: &App,
    req: &AdmissionRequest<Pod>,
) -> Result<(&'static str, AdmissionResponse)> {
    let resp = AdmissionResponse::from(req);
    // Only a pod's creation is translated (the chart registers CREATE only). An UPDATE cannot
    // add `nvidia.com/mig-*`: container resources are immutable but for in-place resize of CPU
    // and memory, and ephemeral containers may not have resources; the API server refuses both.
    if req.operation != kube::core::admission::Operation::Create {
        return Ok(("unchanged", resp));
    }
    let Some(pod) = req.object.as_ref() else {
        return Ok(("unchanged", resp));
    };
    let t = match translation(app, pod).await? {
        Ok(t) => t,
        Err(denial) => {
            app.metrics.denials.inc();
            tracing::info!(pod = %pod_ref(req, pod), reason = %denial, "denied");
            return Ok(("denied", resp.deny(denial)));
        }
    };
    if t.is_empty() {
        return Ok(("unchanged", resp));
    }
    if !req.dry_run {
        ensure_templates(app, req, &t).await?;
    }
    tracing::info!(pod = %pod_ref(req, pod), dry_run = req.dry_run, translated = ?t.translated, "translated");
    let warnings = (!t.warnings.is_empty()).then(|| t.warnings.clone());
    let mut r = resp.with_patch(t.patch).map_err(Error::Patch)?;
    r.warnings = warnings;
    Ok(("patched", r))
}

/// The translation of `pod` against the profiles (and, with `--translate-whole-gpus`, the whole
/// GPUs) the cluster offers; the outer error is an
/// infrastructure failure (DeviceClasses cannot be listed), the inner one a denial.
async fn translation(app: &App, pod: &Pod) -> Result<Result<Translation, translate::Denial>> {
    let wanted = translate::wanted(pod, app.profiles.translates_whole_gpus());
    if wanted.is_empty() {
        return Ok(Ok(Translation::default()));
    }
    let offered = app.profiles.get(&wanted).await?;
    Ok(translate::translate(pod, offered.as_ref()))
}

/// Creates the templates the pod's claims point at in the request's namespace; a template that
/// already exists (another pod, another replica, a race) is fine.
async fn ensure_templates(app: &App, req: &AdmissionRequest<Pod>, t: &Translation) -> Result<()> {
    let ns = req.namespace.as_deref().unwrap_or("default");
    for tpl in &t.templates {
        if app.templates.ensure(ns, tpl).await? == Ensured::Created {
            app.metrics.templates_created.inc();
        }
    }
    Ok(())
}

fn pod_ref(req: &AdmissionRequest<Pod>, pod: &Pod) -> String {
    let name = pod
        .metadata
        .name
        .as_deref()
        .or(pod.metadata.generate_name.as_deref())
        .unwrap_or(&req.name);
    format!("{}/{name}", req.namespace.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests;
