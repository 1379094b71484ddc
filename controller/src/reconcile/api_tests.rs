//! The cheap tier of reconcile tests: [`reconcile`] (and the sweep) against a mocked API server,
//! as kube-rs's controller-rs example does (`tower_test::mock::pair` behind
//! `kube::Client::new`). Each scenario lists the exact requests the reconcile must make, in
//! order, and the API server's answer to each; a request that is not the next one expected, or
//! one more than expected, fails the test. The real-cluster tests are in e2e/tests/controller.rs.

use std::time::Duration;

use das_api::DRIVER_NAME;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::Value;
use tokio::task::JoinHandle;

use super::*;
use crate::published::PublishedSlice;
use crate::sweep::{Sweep, sweep};

/// The AllocationClaim of the test claim's one device.
const NAME: &str = "c-gpu-0-mig-1g-10gb-6";
/// Its URL.
const URL: &str =
    "/apis/inference.redhat.com/v1alpha1/namespaces/ns/allocationclaims/c-gpu-0-mig-1g-10gb-6";
/// The query of every server-side apply the controller makes.
const APPLY_QUERY: &str = "?&force=true&fieldManager=das-controller";
/// Stands for the transition times the reconcile takes from the clock.
const ANY_TIME: &str = "<now>";

/// One request the reconcile must make next, and the answer it gets.
struct Exchange {
    method: Method,
    /// Path and query, exactly.
    uri: String,
    /// The body, exactly, with every `lastTransitionTime` as [`ANY_TIME`]; `None`: no body.
    body: Option<Value>,
    /// HTTP status and JSON body of the answer.
    answer: (StatusCode, Value),
}

/// The API server's side of the mock: answers the scenario's exchanges in order.
struct ApiServer(tower_test::mock::Handle<Request<Body>, Response<Body>>);

impl ApiServer {
    /// A client whose every request comes to the returned [`ApiServer`].
    fn new() -> (Client, Self) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(service, "default"), Self(handle))
    }

    /// Serves `scenario` on a task of its own; the task ends once every exchange was made and
    /// every client is gone, and fails on any request the scenario does not expect next.
    fn run(mut self, scenario: Vec<Exchange>) -> JoinHandle<()> {
        tokio::spawn(async move {
            for (n, want) in scenario.into_iter().enumerate() {
                let (request, reply) = self.0.next_request().await.unwrap_or_else(|| {
                    panic!("request {n} ({} {}) never came", want.method, want.uri)
                });
                let uri = request.uri().to_string();
                assert_eq!(
                    (request.method(), uri.as_str()),
                    (&want.method, want.uri.as_str()),
                    "request {n}"
                );
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = (!bytes.is_empty()).then(|| {
                    let mut v: Value = serde_json::from_slice(&bytes).expect("a JSON body");
                    any_time(&mut v);
                    v
                });
                assert_eq!(body, want.body, "body of request {n} ({uri})");
                let (status, answer) = want.answer;
                reply.send_response(
                    Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                        .unwrap(),
                );
            }
            if let Some((request, _)) = self.0.next_request().await {
                panic!("unexpected request {} {}", request.method(), request.uri());
            }
        })
    }
}

/// Waits for the API server's side of a scenario (every client must be dropped by then).
async fn finished(server: JoinHandle<()>) {
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the scenario ended in time")
        .expect("the scenario passed");
}

/// Every `lastTransitionTime` in `v` as [`ANY_TIME`].
fn any_time(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "lastTransitionTime" {
                    *v = Value::String(ANY_TIME.into());
                } else {
                    any_time(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(any_time),
        _ => {}
    }
}

/// A store holding `objects`.
fn store<K>(objects: Vec<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(o));
    }
    reader
}

/// A synced context over the given caches, its client the mock's.
fn context(
    client: Client,
    pods: Vec<Pod>,
    allocs: Vec<AllocationClaim>,
) -> (Arc<Context>, Arc<Metrics>) {
    context_with(client, pods, allocs, slice())
}

/// [`context`] with `published` as node `n0`'s slice.
fn context_with(
    client: Client,
    pods: Vec<Pod>,
    allocs: Vec<AllocationClaim>,
    published: PublishedSlice,
) -> (Arc<Context>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: None,
    };
    let caches = Caches {
        pods: store(pods),
        slices: store(vec![published]),
        allocs: store(allocs),
    };
    let ctx = Context::new(
        client.clone(),
        caches,
        metrics.clone(),
        Recorder::new(client, reporter),
        Arc::default(),
    );
    ctx.set_synced();
    (Arc::new(ctx), metrics)
}

/// Node `n0`'s published slice: one 1g.10gb device at placement 6 of GPU-a.
fn slice() -> PublishedSlice {
    serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0-mig-1g-10gb-6", "attributes": {
                "profile": {"string": "1g.10gb"}, "parentUUID": {"string": "GPU-a"},
                "gpuIndex": {"int": 0}, "placementStart": {"int": 6},
                "placementSize": {"int": 1}}}]}
    }))
    .unwrap()
}

/// Claim `ns/c`, allocated device `gpu-0-mig-1g-10gb-6` on `n0` and reserved for pod `p`.
fn claim() -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "mig", "driver": DRIVER_NAME,
                "pool": "n0", "device": "gpu-0-mig-1g-10gb-6"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]}
    }))
    .unwrap()
}

/// Pod `ns/p`, not bound to a node yet.
fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {"containers": []}
    }))
    .unwrap()
}

/// The claim's AllocationClaim as the API server stores it, with `status` and `rv`.
fn stored(status: Option<Value>, rv: &str) -> Value {
    let mut v = object_body();
    v["metadata"]["resourceVersion"] = json!(rv);
    v["metadata"]["uid"] = json!("alloc-uid");
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

/// The body of the object apply for the claim: everything but the status.
fn object_body() -> Value {
    json!({
        "apiVersion": "inference.redhat.com/v1alpha1",
        "kind": "AllocationClaim",
        "metadata": {
            "name": NAME,
            "namespace": "ns",
            "labels": {"mig.das.com/claim-uid": "claim-uid"},
            "ownerReferences": [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "name": "c", "uid": "claim-uid", "controller": true}]
        },
        "spec": {
            "profile": "1g.10gb",
            "gpuUUID": "GPU-a",
            "migPlacement": {"start": 6, "size": 1},
            "nodename": "n0",
            "podRef": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "pod-uid"},
            "resourceClaimRef": {"name": "c", "uid": "claim-uid"},
            "request": "mig",
            "pool": "n0",
            "device": "gpu-0-mig-1g-10gb-6"
        }
    })
}

/// The `staged` status the reconcile writes for the claim.
fn staged_status() -> Value {
    json!({
        "state": "staged",
        "conditions": [
            {"type": "State", "status": "True", "reason": "staged",
                "message": "slice is staged", "lastTransitionTime": ANY_TIME},
            {"type": "DeviceHealthy", "status": "True", "reason": "Healthy",
                "message": "no health taint on the device", "lastTransitionTime": ANY_TIME}
        ]
    })
}

/// The API server's answer to a failed request.
fn failure(code: u16, reason: &str) -> (StatusCode, Value) {
    (
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("{reason} (test)"), "reason": reason, "code": code}),
    )
}

/// A deletion's answer.
fn deleted() -> (StatusCode, Value) {
    (
        StatusCode::OK,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
            "details": {"name": NAME, "group": "inference.redhat.com",
                "kind": "allocationclaims", "uid": "alloc-uid"}}),
    )
}

/// The DELETE of the claim's AllocationClaim.
fn delete_request(answer: (StatusCode, Value)) -> Exchange {
    Exchange {
        method: Method::DELETE,
        uri: format!("{URL}?"),
        body: Some(json!({"propagationPolicy": "Background"})),
        answer,
    }
}

#[tokio::test]
async fn an_allocated_claim_gets_its_allocation_claim_applied_staged() {
    let (client, server) = ApiServer::new();
    let status_body = json!({
        "apiVersion": "inference.redhat.com/v1alpha1",
        "kind": "AllocationClaim",
        "metadata": {"name": NAME},
        "status": staged_status(),
    });
    let server = server.run(vec![
        Exchange {
            method: Method::PATCH,
            uri: format!("{URL}{APPLY_QUERY}"),
            body: Some(object_body()),
            answer: (StatusCode::OK, stored(None, "1")),
        },
        Exchange {
            method: Method::PATCH,
            uri: format!("{URL}/status{APPLY_QUERY}"),
            body: Some(status_body),
            answer: (StatusCode::OK, stored(Some(staged_status()), "2")),
        },
    ]);
    let (ctx, metrics) = context(client, vec![pod()], vec![]);
    let action = reconcile(Arc::new(claim()), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let key = format!("ns/{NAME}");
    let recorded = ctx.triggers.own_writes.freshest(&key, "claim-uid", None);
    assert_eq!(
        recorded.and_then(|a| a.status.as_ref().map(|s| s.state)),
        Some(AllocationState::Staged),
        "the answer to the status write stands in until the cache shows it"
    );
    drop(ctx);
    finished(server).await;
    let text = metrics.probe.encode();
    for want in [
        "das_controller_writes_total{op=\"apply\"} 1",
        "das_controller_writes_total{op=\"status\"} 1",
        "das_controller_reconciles_total{result=\"ok\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}

#[tokio::test]
async fn a_stored_allocation_claim_that_matches_costs_no_request() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![]);
    let mut current = desired_allocation_claims(
        &claim(),
        &[pod()],
        &crate::published::device_index([&slice()]),
        "2026-01-01T00:00:00Z",
    )
    .claims
    .remove(0);
    current.metadata.resource_version = Some("2".into());
    let (ctx, metrics) = context(client, vec![pod()], vec![current]);
    reconcile(Arc::new(claim()), ctx.clone()).await.unwrap();
    drop(ctx);
    finished(server).await;
    assert!(
        !metrics
            .probe
            .encode()
            .contains("das_controller_writes_total{"),
        "nothing written"
    );
}

#[tokio::test]
async fn a_claim_being_deleted_has_its_allocation_claim_deleted() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![delete_request(deleted())]);
    let existing: AllocationClaim =
        serde_json::from_value(stored(Some(staged_status()), "2")).unwrap();
    let (ctx, metrics) = context(client, vec![pod()], vec![existing]);
    let mut deleting = claim();
    deleting.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap());
    reconcile(Arc::new(deleting), ctx.clone()).await.unwrap();
    drop(ctx);
    finished(server).await;
    let text = metrics.probe.encode();
    assert!(
        text.contains("das_controller_writes_total{op=\"delete\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn the_sweep_deletes_the_allocation_claim_of_a_claim_that_is_gone() {
    let (client, server) = ApiServer::new();
    // The first pass deletes; the second finds it gone already (404), which is fine.
    let server = server.run(vec![
        delete_request(deleted()),
        delete_request(failure(404, "NotFound")),
    ]);
    let existing: AllocationClaim =
        serde_json::from_value(stored(Some(staged_status()), "2")).unwrap();
    let metrics = Arc::new(Metrics::new());
    let s = Sweep {
        client,
        claims: store(vec![]),
        allocs: store(vec![existing]),
        pods: store(vec![]),
        metrics: metrics.clone(),
        triggers: Arc::default(),
    };
    sweep(&s).await;
    sweep(&s).await;
    drop(s);
    finished(server).await;
    let text = metrics.probe.encode();
    for want in [
        "das_controller_writes_total{op=\"delete\"} 1",
        "das_controller_allocation_claims{state=\"staged\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}

#[tokio::test]
async fn an_api_error_is_the_typed_error_counted_by_its_label_and_retried() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![Exchange {
        method: Method::PATCH,
        uri: format!("{URL}{APPLY_QUERY}"),
        body: Some(object_body()),
        answer: failure(403, "Forbidden"),
    }]);
    let (ctx, metrics) = context(client, vec![pod()], vec![]);
    let claim = Arc::new(claim());
    let err = reconcile(claim.clone(), ctx.clone()).await.unwrap_err();
    match &err {
        Error::Apply {
            name,
            source: kube::Error::Api(status),
        } => assert_eq!((name.as_str(), status.code), (NAME, 403)),
        other => panic!("not an apply error: {other:?}"),
    }
    assert_eq!(err.metric_label(), "apply");
    assert!(
        ctx.triggers
            .own_writes
            .freshest(&format!("ns/{NAME}"), "claim-uid", None)
            .is_none(),
        "a failed write is not taken for one that happened"
    );
    assert_eq!(
        error_policy(claim.clone(), &err, ctx.clone()),
        Action::requeue(Duration::from_millis(500))
    );
    assert_eq!(
        error_policy(claim, &err, ctx.clone()),
        Action::requeue(Duration::from_millis(1000)),
        "backs off per claim"
    );
    drop(ctx);
    finished(server).await;
    let text = metrics.probe.encode();
    for want in [
        "das_controller_errors_total{cause=\"apply\"} 1",
        "das_controller_reconciles_total{result=\"error\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}

#[tokio::test]
async fn nothing_is_written_before_the_caches_are_synced() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![]);
    let ctx = Arc::new(Context::new(
        client.clone(),
        Caches {
            pods: store(vec![]),
            slices: store(vec![]),
            allocs: store(vec![]),
        },
        Arc::new(Metrics::new()),
        Recorder::new(
            client,
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            },
        ),
        Arc::default(),
    ));
    let action = reconcile(Arc::new(claim()), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_millis(500)));
    drop(ctx);
    finished(server).await;
}

/// A whole GPU (docs/design.md §7, "Whole GPUs") prepared by the plugin (`Ready=True`, reason
/// `GpuPrepared`) for a bound pod: its AllocationClaim is applied `inUse`, profile `gpu` over
/// every memory slice, without a MIG UUID.
#[tokio::test]
async fn a_prepared_whole_gpu_gets_its_allocation_claim_applied_in_use() {
    let name = "c-gpu-1";
    let url = "/apis/inference.redhat.com/v1alpha1/namespaces/ns/allocationclaims/c-gpu-1";
    let counters: serde_json::Map<String, Value> = (0..8)
        .map(|s| (format!("memory-slice-{s}"), json!({"value": "1"})))
        .collect();
    let published: PublishedSlice = serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-1", "attributes": {
                "type": {"string": "gpu"}, "uuid": {"string": "GPU-b"}, "gpuIndex": {"int": 1}},
                "consumesCounters": [{"counterSet": "gpu-1-counter-set", "counters": counters}]}]}
    }))
    .unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER_NAME,
                "pool": "n0", "device": "gpu-1"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
            "devices": [{"driver": DRIVER_NAME, "pool": "n0", "device": "gpu-1",
                "conditions": [{"type": "Ready", "status": "True", "reason": "GpuPrepared",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "data": {"migUUID": "", "gpuUUID": "GPU-b", "profile": "gpu",
                    "placement": {"start": 0, "size": 8}}}]}
    }))
    .unwrap();
    let mut bound = pod();
    bound.spec.as_mut().unwrap().node_name = Some("n0".into());
    let mut object = object_body();
    object["metadata"]["name"] = json!(name);
    object["spec"] = json!({
        "profile": "gpu",
        "gpuUUID": "GPU-b",
        "migPlacement": {"start": 0, "size": 8},
        "nodename": "n0",
        "podRef": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "pod-uid"},
        "resourceClaimRef": {"name": "c", "uid": "claim-uid"},
        "request": "gpu",
        "pool": "n0",
        "device": "gpu-1"
    });
    let status = json!({
        "state": "inUse",
        "conditions": [
            {"type": "State", "status": "True", "reason": "inUse",
                "message": "whole GPU is inUse", "lastTransitionTime": ANY_TIME},
            {"type": "DeviceHealthy", "status": "True", "reason": "Healthy",
                "message": "no health taint on the device", "lastTransitionTime": ANY_TIME}
        ]
    });
    let mut stored_object = object.clone();
    stored_object["metadata"]["resourceVersion"] = json!("1");
    let mut stored_status = stored_object.clone();
    stored_status["status"] = status.clone();
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange {
            method: Method::PATCH,
            uri: format!("{url}{APPLY_QUERY}"),
            body: Some(object),
            answer: (StatusCode::OK, stored_object),
        },
        Exchange {
            method: Method::PATCH,
            uri: format!("{url}/status{APPLY_QUERY}"),
            body: Some(json!({
                "apiVersion": "inference.redhat.com/v1alpha1",
                "kind": "AllocationClaim",
                "metadata": {"name": name},
                "status": status,
            })),
            answer: (StatusCode::OK, stored_status),
        },
    ]);
    let (ctx, _metrics) = context_with(client, vec![bound], vec![], published);
    reconcile(Arc::new(claim), ctx.clone()).await.unwrap();
    drop(ctx);
    finished(server).await;
}
