//! Property tests of what the webhook reads from untrusted clients: AdmissionReview bodies (any
//! bytes to `POST /mutate-pods`), and pods with any container names, resource keys and
//! quantities through the translation. Any input: an answer, never a panic; a translation
//! leaves no `nvidia.com/mig-*` request behind and every container claim is a pod claim.
//! `make test` runs a fixed number of cases; `make fuzz` many more (PROPTEST_CASES).

use std::sync::Arc;
use std::time::Duration;

use das_runtime::client::Clients;
use das_webhook::metrics::Metrics;
use das_webhook::profiles::Profiles;
use das_webhook::server::{self, App, Limits};
use das_webhook::templates::Templates;
use das_webhook::translate::{Offered, translate};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;
use tower::ServiceExt;

fn router() -> axum::Router {
    // An API server that is never reached: a pod with legacy requests gets a denial saying the
    // offered profiles cannot be listed; every other body is answered without one.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let app = Arc::new(App {
        profiles: Arc::new(Profiles::new(client.clone(), Duration::from_secs(30))),
        templates: Templates::watch(&Clients {
            calls: client.clone(),
            watches: client,
        }),
        metrics: Metrics::default(),
        metrics_access: Default::default(),
        shares_across_namespaces: false,
    });
    server::router(app, Limits::default())
}

fn review(pod: serde_json::Value, operation: &str) -> serde_json::Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ns", "operation": operation, "userInfo": {}, "object": pod}})
}

async fn post(router: &axum::Router, body: Vec<u8>) -> u16 {
    let req = axum::http::Request::post("/mutate-pods")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    router.clone().oneshot(req).await.unwrap().status().as_u16()
}

fn container() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        "nvidia\\.com/mig-\\PC{0,12}",
        "nvidia\\.com/mig-(1g\\.10gb|2g\\.20gb|1g\\.10gb\\+me|1g\\.10gb-me|7g\\.80gb)",
        "(cpu|memory|nvidia\\.com/gpu)",
    ];
    let qty = "\\PC{0,12}|[0-9]{1,25}";
    (
        "\\PC{0,70}",
        proptest::collection::btree_map(key.clone(), qty, 0..4),
        proptest::collection::btree_map(key, "[0-9]{1,3}", 0..3),
    )
        .prop_map(|(name, limits, requests)| {
            json!({"name": name, "image": "i", "resources": {"limits": limits, "requests": requests}})
        })
}

fn pod() -> impl Strategy<Value = serde_json::Value> {
    (
        proptest::collection::vec(container(), 0..4),
        proptest::collection::vec(container(), 0..2),
        proptest::option::of("\\PC{0,20}"),
    )
        .prop_map(|(containers, init, claim)| {
            let mut spec = json!({"containers": containers, "initContainers": init});
            if let Some(c) = claim {
                spec["resourceClaims"] =
                    json!([{"name": c, "resourceClaimTemplateName": format!("das-mig-{c}-x1")}]);
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
        })
}

/// ResourceClaims with any mix of requests and subrequests of shared, exclusive and odd
/// classes, with or without selectors (some not lists).
fn claim() -> impl Strategy<Value = serde_json::Value> {
    let class = prop_oneof![
        Just("1g.10gb.shared.mig.das.com".to_string()),
        Just("1g.10gb.mig.das.com".to_string()),
        "\\PC{0,30}",
    ];
    let selectors = prop_oneof![
        Just(serde_json::Value::Null),
        (0usize..34).prop_map(|n| json!(vec![json!({"cel": {"expression": "true"}}); n])),
        Just(json!("not a list")),
    ];
    let exact = (class.clone(), selectors.clone()).prop_map(|(c, s)| {
        let mut e = json!({"deviceClassName": c});
        if !s.is_null() {
            e["selectors"] = s;
        }
        e
    });
    let request = prop_oneof![
        ("\\PC{0,10}", exact.clone()).prop_map(|(n, e)| json!({"name": n, "exactly": e})),
        (
            "\\PC{0,10}",
            proptest::collection::vec(("\\PC{0,10}", exact), 0..3)
        )
            .prop_map(|(n, subs)| {
                let subs: Vec<_> = subs
                    .into_iter()
                    .map(|(sn, mut e)| {
                        e["name"] = json!(sn);
                        e
                    })
                    .collect();
                json!({"name": n, "firstAvailable": subs})
            }),
        Just(json!(42)),
    ];
    proptest::collection::vec(request, 0..4).prop_map(|requests| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c"}, "spec": {"devices": {"requests": requests}}})
    })
}

fn offered() -> Offered {
    let mut o: Offered = ["1g.10gb", "1g.10gb-me", "2g.20gb"]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .into();
    o.max_per_node.insert("1g.10gb".into(), 14);
    o
}

proptest! {
    // Each case makes an HTTP request in process: fewer by default, PROPTEST_CASES for more.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_body_gets_an_answer(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let code = rt.block_on(async { post(&router(), body).await });
        prop_assert!(code == 200 || (400..500).contains(&code), "{code}");
    }

    #[test]
    fn any_review_of_any_pod_gets_an_answer(p in pod(), op in "(CREATE|UPDATE|DELETE|CONNECT|x)") {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let body = serde_json::to_vec(&review(p, &op)).unwrap();
        let code = rt.block_on(async { post(&router(), body).await });
        prop_assert!(code == 200 || (400..500).contains(&code), "{code}");
    }

    #[test]
    fn any_claim_gets_an_answer_and_a_patch_that_applies(c in claim(), ns in "[a-z0-9-]{0,70}|\\PC{0,10}") {
        match das_webhook::shared_claims::review(&ns, &c, true) {
            das_webhook::shared_claims::Verdict::Patched { patch, requests } => {
                prop_assert!(!requests.is_empty());
                let mut after = c.clone();
                json_patch::patch(&mut after, &patch).unwrap();
                // A second review (a reinvocation) changes nothing more.
                prop_assert_eq!(das_webhook::shared_claims::review(&ns, &after, true), das_webhook::shared_claims::Verdict::Unchanged);
            }
            das_webhook::shared_claims::Verdict::Unchanged | das_webhook::shared_claims::Verdict::Denied(_) => {}
        }
    }

    #[test]
    fn a_translation_leaves_no_legacy_request_and_only_known_claims(p in pod()) {
        let Ok(pod) = serde_json::from_value::<Pod>(p) else { return Ok(()) };
        let Ok(t) = translate(&pod, &offered()) else { return Ok(()) };
        let mut after = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut after, &t.patch).unwrap();
        let after: Pod = serde_json::from_value(after).unwrap();
        let spec = after.spec.unwrap_or_default();
        let claims: Vec<String> = spec.resource_claims.iter().flatten().map(|c| c.name.clone()).collect();
        for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
            let r = c.resources.clone().unwrap_or_default();
            for m in [r.limits, r.requests].into_iter().flatten() {
                prop_assert!(!m.keys().any(|k| k.starts_with("nvidia.com/mig-")), "{m:?}");
            }
            for rc in r.claims.iter().flatten() {
                prop_assert!(claims.contains(&rc.name), "{} not a pod claim", rc.name);
            }
        }
        for name in &claims {
            prop_assert!(name.len() <= 63, "{name}");
        }
    }
}
