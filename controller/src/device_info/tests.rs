use super::*;
use das_api::DRIVER_NAME;
use serde_json::json;

const NOW: &str = "2026-01-01T00:00:00Z";

/// A claim with two ready devices (requests `a` and `b`) and one not ready, reserved for
/// pod `p`.
fn claim() -> ResourceClaim {
    let result = |req: &str, dev: &str| json!({"request": req, "driver": DRIVER_NAME, "pool": "n0", "device": dev});
    let ready = |dev: &str, mig: &str, gi: u32, status: &str| {
        json!({"driver": DRIVER_NAME, "pool": "n0", "device": dev,
            "conditions": [{"type": "Ready", "status": status, "reason": "SliceCreated",
                "message": "", "lastTransitionTime": NOW}],
            "data": {"migUUID": mig, "gpuUUID": "GPU-a", "profile": "1g.10gb",
                "placement": {"start": 0, "size": 1}, "gpuInstanceId": gi,
                "computeInstanceId": 0}})
    };
    serde_json::from_value(json!({
        "metadata": {"name": "p-gpu-x", "namespace": "ns", "uid": "c1"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": [
                result("a", "d0"), result("b/small", "d1"), result("a", "d2"),
                {"request": "n", "driver": "other.example.com", "pool": "n0", "device": "x"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
            "devices": [ready("d0", "MIG-0", 7, "True"), ready("d1", "MIG-1", 9, "True"),
                ready("d2", "MIG-2", 11, "False")]}
    }))
    .unwrap()
}

/// Pod `p`: claim entry `gpu` generated as `p-gpu-x`; `main` uses all of it, `side` only
/// request `b`, `init` request `a`, `other` uses nothing.
fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
            "initContainers": [{"name": "init", "resources": {"claims": [{"name": "gpu", "request": "a"}]}}],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "side", "resources": {"claims": [{"name": "gpu", "request": "b"}]}},
                {"name": "other"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    }))
    .unwrap()
}

fn rows(claim: &ResourceClaim, pods: &[Pod]) -> Vec<(String, String, String)> {
    device_info(claim, pods)
        .into_iter()
        .map(|r| (r.container, r.mig_uuid, r.gpu_instance_id))
        .collect()
}

#[test]
fn each_container_gets_a_row_per_ready_device_it_uses() {
    let got = rows(&claim(), &[pod()]);
    let want = [
        ("init", "MIG-0", "7"),
        ("main", "MIG-0", "7"),
        ("main", "MIG-1", "9"),
        ("side", "MIG-1", "9"),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(c, m, g)| (c.to_string(), m.to_string(), g.to_string()))
        .collect();
    assert_eq!(got, want);
    let all = device_info(&claim(), &[pod()]);
    let labels = all[0].labels();
    let names: Vec<_> = labels.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "namespace",
            "pod",
            "container",
            "claim",
            "gpu_uuid",
            "mig_uuid",
            "gpu_instance_id",
            "compute_instance_id",
            "profile",
            "node"
        ]
    );
    assert_eq!(all[0].node, "n0");
    assert_eq!(all[0].claim, "p-gpu-x");
    assert_eq!(all[0].compute_instance_id, "0");
}

#[test]
fn unreserved_pods_and_unprepared_claims_have_no_rows() {
    let mut c = claim();
    c.status.as_mut().unwrap().reserved_for = None;
    assert!(device_info(&c, &[pod()]).is_empty());
    let mut c = claim();
    c.status.as_mut().unwrap().devices = None;
    assert!(device_info(&c, &[pod()]).is_empty());
    let mut other_ns = pod();
    other_ns.metadata.namespace = Some("elsewhere".into());
    assert!(device_info(&claim(), &[other_ns]).is_empty());
}

#[test]
fn a_pod_whose_containers_name_no_claim_still_shows_its_devices() {
    let mut p = pod();
    let spec = p.spec.as_mut().unwrap();
    spec.init_containers = None;
    spec.containers.retain(|c| c.name == "other");
    let got = rows(&claim(), &[p]);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|(c, _, _)| c.is_empty()));
}

#[test]
fn a_claim_named_in_the_pod_spec_is_found_and_old_data_has_empty_ids() {
    let mut p = pod();
    p.status = None;
    p.spec.as_mut().unwrap().resource_claims.as_mut().unwrap()[0].resource_claim_name =
        Some("p-gpu-x".into());
    let mut c = claim();
    for d in c.status.as_mut().unwrap().devices.as_mut().unwrap() {
        let data = &mut d.data.as_mut().unwrap().0;
        data.as_object_mut().unwrap().remove("gpuInstanceId");
    }
    let got = rows(&c, &[p]);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|(_, _, gi)| gi.is_empty()));
}

#[test]
fn a_prepared_whole_gpu_has_rows_with_profile_gpu_and_no_mig_ids() {
    let c: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "p-gpu-x", "namespace": "ns", "uid": "c1"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER_NAME, "pool": "n0", "device": "gpu-1"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
            "devices": [{"driver": DRIVER_NAME, "pool": "n0", "device": "gpu-1",
                "conditions": [{"type": "Ready", "status": "True",
                    "reason": das_api::claim_status::REASON_WHOLE_GPU_READY,
                    "message": "", "lastTransitionTime": NOW}],
                "data": {"migUUID": "", "gpuUUID": "GPU-b", "profile": "gpu",
                    "placement": {"start": 0, "size": 8}}}]}
    }))
    .unwrap();
    let got = device_info(&c, &[pod()]);
    let containers: Vec<&str> = got.iter().map(|r| r.container.as_str()).collect();
    assert_eq!(containers, ["main"], "request gpu: neither `a` nor `b`");
    let r = &got[0];
    assert_eq!(
        (
            r.profile.as_str(),
            r.gpu_uuid.as_str(),
            r.mig_uuid.as_str(),
            r.gpu_instance_id.as_str(),
            r.compute_instance_id.as_str()
        ),
        ("gpu", "GPU-b", "", "", "")
    );
}

/// Claim `name` holding the shares `shares` (shareIDs) of one shared slice, each ready with the
/// slice's MIG UUID, reserved for pod `<name>-pod` (whose container `app` uses the claim).
fn share_claim_and_pod(name: &str, shares: &[&str]) -> (ResourceClaim, Pod) {
    const SHARED: &str = "gpu-0-mig-1g-10gb-6-shared";
    let results: Vec<_> = shares
        .iter()
        .enumerate()
        .map(|(i, id)| {
            json!({"request": format!("s{i}"), "driver": DRIVER_NAME, "pool": "n0",
            "device": SHARED, "shareID": id, "consumedCapacity": {"shares": "1"}})
        })
        .collect();
    let entries: Vec<_> = shares
        .iter()
        .map(|id| {
            json!({"driver": DRIVER_NAME, "pool": "n0", "device": SHARED, "shareID": id,
            "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
                "message": "", "lastTransitionTime": NOW}],
            "data": {"migUUID": "MIG-s", "gpuUUID": "GPU-a", "profile": "1g.10gb",
                "placement": {"start": 6, "size": 1}, "gpuInstanceId": 13,
                "computeInstanceId": 0}})
        })
        .collect();
    let claim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid")},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"),
                "uid": format!("{name}-pod-uid")}],
            "devices": entries}
    }))
    .unwrap();
    let pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-pod"), "namespace": "ns",
            "uid": format!("{name}-pod-uid")},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "app", "resources": {"claims": [{"name": "gpu"}]}}]}
    }))
    .unwrap();
    (claim, pod)
}

#[test]
fn two_pods_sharing_one_slice_have_a_row_each_with_their_share_id() {
    let (c1, p1) = share_claim_and_pod("s1", &["share-1"]);
    let (c2, p2) = share_claim_and_pod("s2", &["share-2"]);
    let pods = [p1, p2];
    let rows: Vec<DeviceInfo> = [c1, c2]
        .iter()
        .flat_map(|c| device_info(c, &pods))
        .collect();
    let got: Vec<_> = rows
        .iter()
        .map(|r| (r.pod.as_str(), r.mig_uuid.as_str(), r.share_id.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("s1-pod", "MIG-s", "share-1"),
            ("s2-pod", "MIG-s", "share-2")
        ]
    );
    let labels = rows[0].labels();
    assert_eq!(
        labels.last(),
        Some(&("share_id".to_string(), "share-1".to_string())),
        "a share's row names its share last"
    );
    let sets: std::collections::BTreeSet<_> = rows.iter().map(DeviceInfo::labels).collect();
    assert_eq!(sets.len(), 2, "distinct label sets");
}

#[test]
fn one_container_holding_two_shares_of_a_slice_has_two_distinct_rows() {
    let (c, p) = share_claim_and_pod("s1", &["share-1", "share-2"]);
    let rows = device_info(&c, &[p]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_ne!(rows[0].labels(), rows[1].labels());
    assert!(
        rows.iter()
            .all(|r| r.container == "app" && r.mig_uuid == "MIG-s")
    );
}

#[test]
fn rows_of_exclusive_devices_have_no_share_id_label() {
    let rows = device_info(&claim(), &[pod()]);
    assert!(
        rows.iter()
            .all(|r| r.labels().iter().all(|(k, _)| k != "share_id"))
    );
}
