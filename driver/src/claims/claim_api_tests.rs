//! The requests of [`KubeClaimApi`] against a mocked API server ([`crate::mock_api_server`]):
//! the claim read, the paged cold-start listing, the server-side apply of `status.devices`,
//! and how the API server's errors and silence map to [`ApiError`].

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use super::checkpoint::{InstanceId, RecordedDevice};
use super::claim_api::{CLAIM_PAGE_SIZE, FIELD_MANAGER};
use super::{ApiError, ClaimApi, ClaimRef, EventSink, EventTarget, KubeClaimApi};
use crate::mock_api_server::{ANY, ApiServer, Exchange, finished};
use das_api::DRIVER_NAME;

const CLAIM: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c";
const ALL_CLAIMS: &str = "/apis/resource.k8s.io/v1/resourceclaims";

fn claim_ref() -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "claim-uid".into(),
    }
}

/// Claim `ns/<name>`, allocated a device of ours in `pool`, or not allocated (`None`).
fn claim(name: &str, pool: Option<&str>) -> Value {
    let mut v = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid")},
        "spec": {"devices": {"requests": []}},
    });
    if let Some(pool) = pool {
        v["status"] = json!({"allocation": {"devices": {"results": [{"request": "mig",
            "driver": DRIVER_NAME, "pool": pool, "device": "gpu-0-mig-1g-10gb-6"}]}}});
    }
    v
}

fn page(items: Vec<Value>, continue_: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
        "metadata": {"resourceVersion": "9", "continue": continue_}, "items": items})
}

fn names(claims: &[k8s_openapi::api::resource::v1::ResourceClaim]) -> Vec<&str> {
    claims
        .iter()
        .map(|c| c.metadata.name.as_deref().unwrap())
        .collect()
}

/// A prepared 1g.10gb device at memory slice 6 of GPU 0.
fn device() -> RecordedDevice {
    RecordedDevice {
        time_slice: None,
        acquired: false,
        kind: Default::default(),
        request: "mig".into(),
        pool: "n0".into(),
        device: "gpu-0-mig-1g-10gb-6".into(),
        gpu_index: 0,
        gpu_uuid: "GPU-a".into(),
        profile: "1g.10gb".into(),
        placement_start: 6,
        placement_size: 1,
        instance: Some(InstanceId {
            gi_id: 13,
            ci_id: 0,
            mig_uuid: "MIG-1".into(),
        }),
        mps: None,
        share: None,
    }
}

/// The PATCH of `write_status(claim_ref(), [device()])`.
fn status_apply() -> Exchange {
    Exchange::new(
        Method::PATCH,
        format!("{CLAIM}/status?&force=true&fieldManager={FIELD_MANAGER}"),
    )
    .content_type("application/apply-patch+yaml")
    .body(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        // The UID makes the API server refuse the apply (409) to a claim of the same name.
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "status": {"devices": [{
            "driver": DRIVER_NAME, "pool": "n0", "device": "gpu-0-mig-1g-10gb-6",
            "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
                "message": "MIG 1g.10gb at memory slice 6 on GPU 0 (MIG-1)",
                "lastTransitionTime": ANY}],
            "data": {"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
                "placement": {"start": 6, "size": 1}, "gpuInstanceId": 13,
                "computeInstanceId": 0, "readyTime": ANY},
        }]},
    }))
}

#[tokio::test]
async fn get_claim_reads_the_claim_by_namespace_and_name_and_a_missing_one_is_none() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::GET, CLAIM).answer(200, claim("c", Some("n0"))),
        Exchange::new(Method::GET, CLAIM).fail(404, "NotFound"),
    ]);
    let api = KubeClaimApi::new(client, "n0");
    let got = api.get_claim("ns", "c").await.unwrap().unwrap();
    assert_eq!(got.metadata.uid.as_deref(), Some("c-uid"));
    assert_eq!(api.get_claim("ns", "c").await, Ok(None));
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn list_claims_pages_through_the_cluster_and_keeps_this_nodes_claims() {
    let (client, server) = ApiServer::new();
    let first = format!("{ALL_CLAIMS}?&limit={CLAIM_PAGE_SIZE}");
    assert_eq!(first, format!("{ALL_CLAIMS}?&limit=500"));
    let server = server.run(vec![
        Exchange::new(Method::GET, first.clone()).answer(
            200,
            page(
                vec![claim("here-1", Some("n0")), claim("there", Some("n1"))],
                "token/1",
            ),
        ),
        Exchange::new(Method::GET, format!("{first}&continue=token%2F1")).answer(
            200,
            page(
                vec![claim("here-2", Some("n0")), claim("pending", None)],
                "",
            ),
        ),
    ]);
    let api = KubeClaimApi::new(client, "n0");
    let got = api.list_claims().await.unwrap();
    assert_eq!(names(&got), ["here-1", "here-2"]);
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn write_status_server_side_applies_the_devices_entries_on_the_claim_with_its_uid() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![status_apply().answer(200, claim("c", Some("n0")))]);
    let api = KubeClaimApi::new(client, "n0");
    api.write_status(&claim_ref(), &[device()]).await.unwrap();
    drop(api);
    let got = finished(server).await;
    let entry = &got[0].body.as_ref().unwrap()["status"]["devices"][0];
    let since = entry["conditions"][0]["lastTransitionTime"]
        .as_str()
        .unwrap();
    let ready = entry["data"]["readyTime"].as_str().unwrap();
    // `2026-11-25T20:19:27Z` and `2026-11-25T20:19:27.123Z`: the same instant, in whole
    // seconds and in milliseconds.
    let whole = since.strip_suffix('Z').expect("UTC");
    assert_eq!(whole.len(), "2026-11-25T20:19:27".len(), "{since}");
    let millis = ready
        .strip_prefix(whole)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.strip_suffix('Z'));
    assert!(
        millis.is_some_and(|m| m.len() == 3 && m.chars().all(|c| c.is_ascii_digit())),
        "readyTime {ready} is lastTransitionTime {since} in milliseconds"
    );
}

#[tokio::test]
async fn gone_conflicting_and_invalid_are_permanent_errors_and_a_server_error_is_transient() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        status_apply().fail(404, "NotFound"),
        status_apply().fail(409, "Conflict"),
        status_apply().fail(422, "Invalid"),
        status_apply().fail(500, "InternalError"),
        Exchange::new(Method::GET, CLAIM).fail(500, "InternalError"),
        Exchange::new(Method::GET, format!("{ALL_CLAIMS}?&limit=500")).fail(403, "Forbidden"),
    ]);
    let api = KubeClaimApi::new(client, "n0");
    for (code, permanent) in [(404, true), (409, true), (422, true), (500, false)] {
        let e = api
            .write_status(&claim_ref(), &[device()])
            .await
            .unwrap_err();
        assert_eq!(e.permanent, permanent, "{code}: {e}");
        assert!(
            e.message.contains("(test)"),
            "{code}: the server's message: {e}"
        );
    }
    let e = api.get_claim("ns", "c").await.unwrap_err();
    assert!(!e.permanent, "{e}");
    let e = api.list_claims().await.unwrap_err();
    assert!(!e.permanent, "{e}");
    drop(api);
    finished(server).await;
}

#[tokio::test(start_paused = true)]
async fn a_call_without_an_answer_is_a_transient_error_after_the_call_timeout() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::GET, CLAIM).unanswered(),
        Exchange::new(Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events?")
            .body(json!(ANY))
            .unanswered(),
    ]);
    let api = KubeClaimApi::new(client, "n0").with_call_timeout(Duration::from_secs(2));
    let start = tokio::time::Instant::now();
    let e = api.get_claim("ns", "c").await.unwrap_err();
    assert_eq!(
        e,
        ApiError::transient("read the ResourceClaim: no answer from the API server within 2s")
    );
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    // Event posts are bounded by the same limit.
    api.warn(
        &EventTarget::from(&claim_ref()),
        "PrepareFailed",
        "no slice".into(),
    )
    .await;
    assert_eq!(start.elapsed(), Duration::from_secs(4));
    drop(api);
    finished(server).await;
}
