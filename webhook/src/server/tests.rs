use super::*;
use base64::Engine;
use serde_json::json;

#[test]
fn the_patch_goes_on_the_wire_as_base64() {
    let req: AdmissionReview<Pod> = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "userInfo": {}, "dryRun": false}
    }))
    .unwrap();
    let req: AdmissionRequest<Pod> = req.try_into().unwrap();
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/a"}])).unwrap();
    let review = AdmissionResponse::from(&req)
        .with_patch(patch)
        .unwrap()
        .into_review();
    let v = wire_review(review);
    let b64 = v["response"]["patch"].as_str().expect("a string");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let back: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(back, json!([{"op": "remove", "path": "/a"}]));
    assert_eq!(v["response"]["uid"], "u1");
    assert_eq!(v["response"]["patchType"], "JSONPatch");
}

/// Knows one token, of a user who may read /metrics.
struct OneReader;

impl das_runtime::metrics_auth::Reviewer for OneReader {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> das_runtime::metrics_auth::Review<'a, Option<k8s_openapi::api::authentication::v1::UserInfo>>
    {
        Box::pin(async move {
            Ok(
                (token == "good").then(|| k8s_openapi::api::authentication::v1::UserInfo {
                    username: Some("prometheus".into()),
                    ..Default::default()
                }),
            )
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a k8s_openapi::api::authentication::v1::UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> das_runtime::metrics_auth::Review<'a, bool> {
        Box::pin(async move {
            Ok(user.username.as_deref() == Some("prometheus")
                && verb == "get"
                && path == "/metrics")
        })
    }
}

#[tokio::test]
async fn metrics_ask_for_a_reviewed_token_and_health_stays_open() {
    use tower::ServiceExt;
    // An API server that is never reached: /healthz and /metrics do not call it.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let app = Arc::new(App {
        profiles: Arc::new(Profiles::new(client.clone(), Duration::from_secs(30))),
        templates: Templates::watch(&das_runtime::client::Clients {
            calls: client.clone(),
            watches: client,
        }),
        metrics: Metrics::default(),
        metrics_access: MetricsAccess::reviewed(Arc::new(OneReader)),
        shares_across_namespaces: false,
    });
    let routes = router(app, Limits::default());
    let get = |path: &'static str, token: Option<&'static str>| {
        let routes = routes.clone();
        async move {
            let mut req = axum::http::Request::get(path);
            if let Some(t) = token {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            let resp = routes
                .oneshot(req.body(axum::body::Body::empty()).unwrap())
                .await
                .unwrap();
            resp.status().as_u16()
        }
    };
    assert_eq!(get("/metrics", None).await, 401);
    assert_eq!(get("/metrics", Some("forged")).await, 401);
    assert_eq!(get("/metrics", Some("good")).await, 200);
    assert_eq!(get("/healthz", None).await, 200);
}

/// An app whose API server is never reached (nothing listens on port 9).
fn unreachable_app() -> Arc<App> {
    unreachable_app_translating(false)
}

/// [`unreachable_app`], translating `nvidia.com/gpu` when `whole_gpus`.
fn unreachable_app_translating(whole_gpus: bool) -> Arc<App> {
    unreachable_app_with(whole_gpus, false)
}

/// [`unreachable_app`], translating `nvidia.com/gpu` when `whole_gpus`, letting shares cross
/// namespaces when `across`.
fn unreachable_app_with(whole_gpus: bool, across: bool) -> Arc<App> {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    Arc::new(App {
        profiles: Arc::new(
            Profiles::new(client.clone(), Duration::from_secs(30))
                .translating_whole_gpus(whole_gpus),
        ),
        templates: Templates::watch(&das_runtime::client::Clients {
            calls: client.clone(),
            watches: client,
        }),
        metrics: Metrics::default(),
        metrics_access: Default::default(),
        shares_across_namespaces: across,
    })
}

/// Posts `review` to `/mutate-pods`; the answer's `response`.
async fn mutate(app: &Arc<App>, review: Value) -> Value {
    post_review(app, "/mutate-pods", review).await
}

/// Posts `review` to `path`; the answer's `response`.
async fn post_review(app: &Arc<App>, path: &str, review: Value) -> Value {
    use tower::ServiceExt;
    let req = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(serde_json::to_vec(&review).unwrap()))
        .unwrap();
    let resp = router(app.clone(), Limits::default())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
}

#[tokio::test]
async fn a_failed_listing_denies_the_pod_and_is_counted_by_its_cause() {
    let app = unreachable_app();
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns", "operation": "CREATE", "userInfo": {},
            "object": {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [
                {"name": "app", "image": "i",
                    "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}}});
    let response = mutate(&app, review).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("das-webhook: list DeviceClasses: "),
        "{message}"
    );
    let text = app.metrics.encode();
    let want = "das_webhook_admission_requests_total{outcome=\"error\",cause=\"list_classes\"} 1";
    assert!(text.contains(want), "{want} missing in\n{text}");
}

#[tokio::test]
async fn a_review_without_a_request_is_invalid_and_counted_as_bad_review() {
    let app = unreachable_app();
    let response = mutate(
        &app,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("bad AdmissionReview: "), "{message}");
    let text = app.metrics.encode();
    let want = "das_webhook_admission_requests_total{outcome=\"error\",cause=\"bad_review\"} 1";
    assert!(text.contains(want), "{want} missing in\n{text}");
}

/// `nvidia.com/gpu` is the webhook's only with `--translate-whole-gpus`: without it such a pod is
/// admitted unchanged without asking the API server; with it, what the cluster offers is listed.
#[tokio::test]
async fn nvidia_com_gpu_is_translated_only_with_the_flag() {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns", "operation": "CREATE", "userInfo": {},
            "object": {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [
                {"name": "app", "image": "i",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}});
    let off = unreachable_app();
    let response = mutate(&off, review.clone()).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    let on = unreachable_app_translating(true);
    let response = mutate(&on, review).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("das-webhook: list DeviceClasses: "),
        "{message}"
    );
}

/// A review of ResourceClaim `default/c` asking for a share of `1g.10gb`, by `operation`.
fn shared_claim_review(operation: &str) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u2", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "namespace": "team-a", "operation": operation, "userInfo": {},
            "object": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": "team-a"},
                "spec": {"devices": {"requests": [{"name": "share",
                    "exactly": {"deviceClassName": "1g.10gb.shared.mig.das.com"}}]}}}}})
}

/// docs/design.md §8, "Shared slices at admission": a claim for a shared class gets the
/// namespace selector as a base64 JSON patch; an update, or any claim with
/// `--shares-across-namespaces`, passes unchanged; each review is counted by outcome.
#[tokio::test]
async fn a_shared_claim_gets_its_namespace_selector_unless_shares_cross_namespaces() {
    use base64::Engine;
    let app = unreachable_app();
    let response = post_review(
        &app,
        "/mutate-resource-claims",
        shared_claim_review("CREATE"),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let patch: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/devices/requests/0/exactly/selectors",
            "value": [{"cel": {"expression": das_api::share_namespace_selector("team-a")}}]}])
    );
    let response = post_review(
        &app,
        "/mutate-resource-claims",
        shared_claim_review("UPDATE"),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    let text = app.metrics.encode();
    for want in [
        "das_webhook_shared_claim_reviews_total{outcome=\"patched\"} 1",
        "das_webhook_shared_claim_reviews_total{outcome=\"unchanged\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }

    let across = unreachable_app_with(false, true);
    let response = post_review(
        &across,
        "/mutate-resource-claims",
        shared_claim_review("CREATE"),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");

    let response = post_review(
        &app,
        "/mutate-resource-claims",
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        app.metrics
            .encode()
            .contains("das_webhook_shared_claim_reviews_total{outcome=\"error\"} 1")
    );
}
