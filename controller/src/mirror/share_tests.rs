//! Shares of a shareable device (docs/design.md §6 and §7, "Shared slices"): one AllocationClaim
//! per claim holding a share, each with its share, all on the same placement.

use super::*;
use das_api::DRIVER_NAME;
use das_api::allocation::MigPlacement;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::json;

const NOW: &str = "2026-01-01T00:00:00Z";
const SHARED: &str = "gpu-0-mig-1g-10gb-6-shared";

/// The shareable device as the plugin publishes it: the exclusive device's attributes but
/// `type: mig-shared`.
fn index() -> DeviceIndex {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": SHARED, "allowMultipleAllocations": true, "attributes": {
                "type": {"string": "mig-shared"},
                "profile": {"string": "1g.10gb"}, "parentUUID": {"string": "GPU-a"},
                "gpuIndex": {"int": 0}, "placementStart": {"int": 6}, "placementSize": {"int": 1}},
                "capacity": {"shares": {"value": "4"}, "memory": {"value": "10Gi"}}}]}
    }))
    .unwrap();
    DeviceIndex::from_slices([&slice])
}

/// Claim `name` holding share `share_id` (`shares` of the slice) of [`SHARED`], reserved for
/// pod `<name>-pod`, with its Ready entry (keyed by the shareID, as the plugin writes it) when
/// `ready`.
fn share_claim(name: &str, share_id: &str, shares: &str, ready: bool) -> ResourceClaim {
    let status_devices = if ready {
        json!([{"driver": DRIVER_NAME, "pool": "n0", "device": SHARED, "shareID": share_id,
            "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
                "message": "", "lastTransitionTime": NOW}],
            "data": {"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
                "placement": {"start": 6, "size": 1}}}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid")},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [{
                "request": "mig", "driver": DRIVER_NAME, "pool": "n0", "device": SHARED,
                "shareID": share_id,
                "consumedCapacity": {"shares": shares, "memory": "2560Mi"}}]}},
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"),
                "uid": format!("{name}-pod-uid")}],
            "devices": status_devices}
    }))
    .unwrap()
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-pod"), "namespace": "ns",
            "uid": format!("{name}-pod-uid")},
        "spec": {"containers": [], "nodeName": "n0"}
    }))
    .unwrap()
}

#[test]
fn a_shares_allocation_claim_carries_its_share_and_reaches_in_use() {
    let c = share_claim("s1", "share-1", "2", true);
    let m = desired_allocation_claims(&c, &[pod("s1")], &index(), NOW);
    assert!(m.unmirrored.is_empty(), "{:?}", m.unmirrored);
    let [a] = m.claims.as_slice() else {
        panic!("one AllocationClaim: {:?}", m.claims)
    };
    assert_eq!(
        a.metadata.name.as_deref(),
        Some("s1-gpu-0-mig-1g-10gb-6-shared")
    );
    assert_eq!(a.spec.profile, "1g.10gb");
    assert_eq!(a.spec.mig_placement, MigPlacement { start: 6, size: 1 });
    assert_eq!(
        a.spec.share,
        Some(AllocationShare {
            share_id: "share-1".into(),
            shares: Some(2),
            memory: Some("2560Mi".into()),
        })
    );
    let s = a.status.as_ref().unwrap();
    assert_eq!(s.state, AllocationState::InUse);
    assert_eq!(s.mig_uuid.as_deref(), Some("MIG-1"));
    let v = serde_json::to_value(&a.spec).unwrap();
    assert_eq!(v["share"]["shareID"], "share-1");
    assert_eq!(v["share"]["shares"], 2);
}

#[test]
fn a_share_not_reported_yet_is_created_and_still_has_its_share() {
    let c = share_claim("s1", "share-1", "1", false);
    let m = desired_allocation_claims(&c, &[pod("s1")], &index(), NOW);
    let a = &m.claims[0];
    assert_eq!(a.status.as_ref().unwrap().state, AllocationState::Created);
    assert_eq!(a.spec.share.as_ref().unwrap().shares, Some(1));
}

#[test]
fn two_claims_sharing_one_device_get_two_allocation_claims_on_one_placement() {
    let (c1, c2) = (
        share_claim("s1", "share-1", "1", true),
        share_claim("s2", "share-2", "2", true),
    );
    let pods = [pod("s1"), pod("s2")];
    let a1 = desired_allocation_claims(&c1, &pods, &index(), NOW).claims;
    let a2 = desired_allocation_claims(&c2, &pods, &index(), NOW).claims;
    let (a1, a2) = (&a1[0], &a2[0]);
    assert_ne!(a1.metadata.name, a2.metadata.name);
    for a in [a1, a2] {
        assert_eq!(a.spec.device, SHARED);
        assert_eq!(a.spec.gpu_uuid, "GPU-a");
        assert_eq!(a.spec.mig_placement, MigPlacement { start: 6, size: 1 });
        assert_eq!(a.status.as_ref().unwrap().state, AllocationState::InUse);
    }
    let who = |a: &AllocationClaim| {
        (
            a.spec.pod_ref.as_ref().unwrap().name.clone(),
            a.spec
                .share
                .as_ref()
                .map(|s| (s.share_id.clone(), s.shares)),
        )
    };
    assert_eq!(
        who(a1),
        ("s1-pod".into(), Some(("share-1".into(), Some(1))))
    );
    assert_eq!(
        who(a2),
        ("s2-pod".into(), Some(("share-2".into(), Some(2))))
    );
}

#[test]
fn an_exclusive_slice_has_no_share() {
    let mut c = share_claim("s1", "share-1", "1", false);
    let r = &mut c.status.as_mut().unwrap().allocation.as_mut().unwrap();
    let r = &mut r.devices.as_mut().unwrap().results.as_mut().unwrap()[0];
    r.share_id = None;
    r.consumed_capacity = None;
    let m = desired_allocation_claims(&c, &[pod("s1")], &index(), NOW);
    assert_eq!(m.claims[0].spec.share, None);
}

/// A share of a whole GPU (`gpu-1-shared`, `type: gpu-shared`, docs/design.md §7, "Memory
/// slices of a whole GPU") is mirrored as the whole GPU it shares: profile `gpu`, the GPU's
/// UUID and every memory slice, with the claim's share.
#[test]
fn a_share_of_a_whole_gpu_is_mirrored_as_its_gpu_with_its_share() {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-1-shared", "allowMultipleAllocations": true, "attributes": {
                "type": {"string": "gpu-shared"}, "uuid": {"string": "GPU-b"},
                "gpuIndex": {"int": 1}, "memoryEnforcement": {"string": "mps"}},
                "capacity": {"shares": {"value": "4"}, "memory": {"value": "22Gi"}},
                "consumesCounters": [{"counterSet": "gpu-1-counter-set", "counters": {
                    "memory": {"value": "22Gi"}, "memory-slice-0": {"value": "1"}}}]}]}
    }))
    .unwrap();
    let index = DeviceIndex::from_slices([&slice]);
    let mut c = share_claim("m1", "share-m1", "1", false);
    let results = c
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .unwrap();
    results[0].device = "gpu-1-shared".into();
    let m = desired_allocation_claims(&c, &[pod("m1")], &index, NOW);
    assert!(m.unmirrored.is_empty(), "{:?}", m.unmirrored);
    let [a] = m.claims.as_slice() else {
        panic!("one AllocationClaim: {:?}", m.claims)
    };
    assert_eq!(a.spec.profile, das_api::WHOLE_GPU_PROFILE);
    assert_eq!(a.spec.gpu_uuid, "GPU-b");
    assert_eq!(a.spec.mig_placement, MigPlacement { start: 0, size: 1 });
    assert_eq!(a.spec.device, "gpu-1-shared");
    let share = serde_json::to_value(&a.spec).unwrap();
    assert!(share.to_string().contains("share-m1"), "{share}");
}
