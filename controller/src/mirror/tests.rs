use super::*;
use das_api::DRIVER_NAME;
use das_api::allocation::MigPlacement;
use das_api::health_taints;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::json;

const NOW: &str = "2026-01-01T00:00:00Z";

fn slice() -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0-mig-1g-10gb-6", "attributes": {
                    "profile": {"string": "1g.10gb"}, "parentUUID": {"string": "GPU-a"},
                    "gpuIndex": {"int": 0}, "placementStart": {"int": 6}, "placementSize": {"int": 1}}},
                {"name": "gpu-0-mig-3g-40gb-0", "attributes": {
                    "profile": {"string": "3g.40gb"}, "parentUUID": {"string": "GPU-a"},
                    "gpuIndex": {"int": 0}, "placementStart": {"int": 0}, "placementSize": {"int": 4}}}
            ]}
    }))
    .unwrap()
}

fn claim(devices: &[&str], reserved: bool, status_devices: serde_json::Value) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|d| json!({"request": "mig", "driver": DRIVER_NAME, "pool": "n0", "device": d}))
        .collect();
    let reserved_for = if reserved {
        json!([{"resource": "pods", "name": "p", "uid": "pod-uid"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}},
            "reservedFor": reserved_for, "devices": status_devices}
    }))
    .unwrap()
}

fn pod(node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {"containers": [], "nodeName": node}
    }))
    .unwrap()
}

fn ready(device: &str, status: &str) -> serde_json::Value {
    json!({"driver": DRIVER_NAME, "pool": "n0", "device": device,
        "conditions": [{"type": "Ready", "status": status, "reason": "SliceCreated",
            "message": "", "lastTransitionTime": NOW}],
        "data": {"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
            "placement": {"start": 6, "size": 1}}})
}

fn index() -> DeviceIndex {
    DeviceIndex::from_slices([&slice()])
}

#[test]
fn allocated_claim_without_bound_pod_is_staged() {
    let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
    let m = desired_allocation_claims(&c, &[pod(None)], &index(), NOW);
    assert_eq!(m.claims.len(), 1);
    let a = &m.claims[0];
    assert_eq!(a.metadata.name.as_deref(), Some("c-gpu-0-mig-1g-10gb-6"));
    assert_eq!(a.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(a.spec.profile, "1g.10gb");
    assert_eq!(a.spec.gpu_uuid, "GPU-a");
    assert_eq!(a.spec.mig_placement, MigPlacement { start: 6, size: 1 });
    assert_eq!(a.spec.nodename, "n0");
    assert_eq!(a.spec.pod_ref.as_ref().unwrap().uid, "pod-uid");
    assert_eq!(a.spec.resource_claim_ref.uid, "claim-uid");
    let owner = &a.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("ResourceClaim", "claim-uid")
    );
    let s = a.status.as_ref().unwrap();
    assert_eq!(s.state, AllocationState::Staged);
    assert_eq!(s.conditions[0].reason, "staged");
    assert_eq!(s.mig_uuid, None);
}

#[test]
fn bound_pod_makes_it_created() {
    let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
    let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
    assert_eq!(
        m.claims[0].status.as_ref().unwrap().state,
        AllocationState::Created
    );
}

/// Carve before bind (docs/design.md §7): the slice exists before its pod is bound, so the
/// states go staged → created (SliceReady) → inUse (Ready), in that order.
#[test]
fn a_carved_slice_is_created_before_its_pod_is_bound() {
    let carved = |status: &str| {
        json!({"driver": "mig.das.com", "pool": "n0", "device": "gpu-0-mig-1g-10gb-6",
            "conditions": [{"type": das_api::claim_status::CONDITION_SLICE_READY, "status": status,
                "reason": "SliceCarved", "message": "", "lastTransitionTime": "2026-11-26T00:00:00Z"}]})
    };
    let state = |c: &ResourceClaim, p: &Pod| {
        desired_allocation_claims(c, std::slice::from_ref(p), &index(), NOW).claims[0]
            .status
            .clone()
            .unwrap()
            .state
    };
    let unbound = pod(None);
    let staged = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([carved("False")]));
    assert_eq!(state(&staged, &unbound), AllocationState::Staged);
    let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([carved("True")]));
    assert_eq!(state(&c, &unbound), AllocationState::Created);
    let mut in_use = ready("gpu-0-mig-1g-10gb-6", "True");
    in_use["conditions"]
        .as_array_mut()
        .unwrap()
        .extend(carved("True")["conditions"].as_array().unwrap().clone());
    let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([in_use]));
    assert_eq!(state(&c, &pod(Some("n0"))), AllocationState::InUse);
}

#[test]
fn unreserved_pods_do_not_count() {
    let c = claim(&["gpu-0-mig-1g-10gb-6"], false, json!([]));
    let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
    let a = &m.claims[0];
    assert_eq!(a.status.as_ref().unwrap().state, AllocationState::Staged);
    assert!(a.spec.pod_ref.is_none());
}

#[test]
fn ready_device_is_in_use_with_mig_uuid() {
    let c = claim(
        &["gpu-0-mig-1g-10gb-6"],
        true,
        json!([ready("gpu-0-mig-1g-10gb-6", "True")]),
    );
    let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
    let s = m.claims[0].status.as_ref().unwrap();
    assert_eq!(s.state, AllocationState::InUse);
    assert_eq!(s.mig_uuid.as_deref(), Some("MIG-1"));
    assert_eq!(s.conditions[0].reason, "inUse");
}

#[test]
fn not_ready_device_is_not_in_use() {
    let c = claim(
        &["gpu-0-mig-1g-10gb-6"],
        true,
        json!([ready("gpu-0-mig-1g-10gb-6", "False")]),
    );
    let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
    assert_eq!(
        m.claims[0].status.as_ref().unwrap().state,
        AllocationState::Created
    );
}

#[test]
fn one_per_result_of_our_driver_only() {
    let mut c = claim(
        &["gpu-0-mig-1g-10gb-6", "gpu-0-mig-3g-40gb-0"],
        true,
        json!([]),
    );
    let other: DeviceRequestAllocationResult = serde_json::from_value(
        json!({"request": "net", "driver": "other.example.com", "pool": "n0", "device": "x"}),
    )
    .unwrap();
    let results = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
    results
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()
        .push(other);
    let m = desired_allocation_claims(&c, &[pod(None)], &index(), NOW);
    let placements: Vec<_> = m.claims.iter().map(|a| a.spec.mig_placement).collect();
    assert_eq!(
        placements,
        [
            MigPlacement { start: 6, size: 1 },
            MigPlacement { start: 0, size: 4 }
        ]
    );
    assert!(m.unmirrored.is_empty());
}

#[test]
fn unallocated_or_deleting_claim_has_none() {
    let mut c = claim(&[], true, json!([]));
    assert!(
        desired_allocation_claims(&c, &[], &index(), NOW)
            .claims
            .is_empty()
    );
    c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
    c.metadata.deletion_timestamp = Some(serde_json::from_value(json!(NOW)).unwrap());
    assert!(
        desired_allocation_claims(&c, &[], &index(), NOW)
            .claims
            .is_empty()
    );
}

#[test]
fn status_data_stands_in_for_a_missing_slice() {
    let c = claim(
        &["gpu-0-mig-1g-10gb-6"],
        true,
        json!([ready("gpu-0-mig-1g-10gb-6", "True")]),
    );
    let m = desired_allocation_claims(&c, &[], &DeviceIndex::default(), NOW);
    assert_eq!(m.claims[0].spec.gpu_uuid, "GPU-a");
    let c = claim(&["gpu-9-mig-1g-10gb-0"], true, json!([]));
    let m = desired_allocation_claims(&c, &[], &DeviceIndex::default(), NOW);
    assert!(m.claims.is_empty());
    assert_eq!(m.unmirrored.len(), 1);
}

/// A result whose device facts are momentarily unknown (its slice wiped by a kubelet
/// restart, no status yet) cannot be mirrored now, but its existing AllocationClaim is kept.
#[test]
fn an_allocated_result_keeps_its_allocation_claim_while_its_slice_is_missing() {
    let c = claim(&["gpu-9-mig-1g-10gb-0"], true, json!([]));
    let m = desired_allocation_claims(&c, &[], &DeviceIndex::default(), NOW);
    assert!(m.claims.is_empty());
    let names = desired_names(&c);
    assert_eq!(names.len(), 1);
    assert!(names[0].ends_with("gpu-9-mig-1g-10gb-0"), "{names:?}");
    let mut deleting = c.clone();
    deleting.metadata.deletion_timestamp = Some(serde_json::from_value(json!(NOW)).unwrap());
    assert!(desired_names(&deleting).is_empty());
}

#[test]
fn unchanged_object_needs_no_write() {
    let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
    let existing = desired_allocation_claims(&c, &[pod(None)], &index(), NOW)
        .claims
        .remove(0);
    let mut later = desired_allocation_claims(&c, &[pod(None)], &index(), "2026-01-02T00:00:00Z")
        .claims
        .remove(0);
    carry_transition_time(&mut later, &existing);
    assert_eq!(
        writes_needed(&later, Some(&existing)),
        Writes {
            object: false,
            status: false
        }
    );
    let mut bound = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW)
        .claims
        .remove(0);
    carry_transition_time(&mut bound, &existing);
    assert_eq!(
        writes_needed(&bound, Some(&existing)),
        Writes {
            object: false,
            status: true
        }
    );
    assert_eq!(
        writes_needed(&bound, None),
        Writes {
            object: true,
            status: true
        }
    );
}

fn health_of(a: &AllocationClaim) -> Option<&StateCondition> {
    a.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_DEVICE_HEALTHY)
}

#[test]
fn a_das_health_taint_makes_the_device_unhealthy_and_others_do_not() {
    let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
    let healthy = desired_allocation_claims(&c, &[pod(None)], &index(), NOW)
        .claims
        .remove(0);
    let h = health_of(&healthy).unwrap();
    assert_eq!((h.status.as_str(), h.reason.as_str()), ("True", "Healthy"));

    let mut tainted = slice();
    let device = &mut tainted.spec.devices.as_mut().unwrap()[0];
    device.taints = Some(
        serde_json::from_value(json!([
            {"key": "example.com/other", "value": "x", "effect": "NoSchedule"},
            {"key": health_taints::XID, "value": "79", "effect": "NoExecute"},
            {"key": health_taints::GPU_LOST, "value": "true", "effect": "NoExecute"}
        ]))
        .unwrap(),
    );
    let index = DeviceIndex::from_slices([&tainted]);
    let later = "2026-01-02T00:00:00Z";
    let mut sick = desired_allocation_claims(&c, &[pod(None)], &index, later)
        .claims
        .remove(0);
    carry_transition_time(&mut sick, &healthy);
    let h = health_of(&sick).unwrap();
    assert_eq!((h.status.as_str(), h.reason.as_str()), ("False", "XID"));
    assert!(
        h.message.contains("mig.das.com/xid=79:NoExecute"),
        "{}",
        h.message
    );
    assert!(
        h.message.contains("mig.das.com/gpu-lost=true:NoExecute"),
        "{}",
        h.message
    );
    assert!(!h.message.contains("example.com"), "{}", h.message);
    assert_eq!(
        h.last_transition_time, later,
        "a new status is a transition"
    );
    assert_eq!(
        sick.status.as_ref().unwrap().conditions[0].last_transition_time,
        NOW,
        "the unchanged state condition keeps its time"
    );
    assert!(writes_needed(&sick, Some(&healthy)).status);
}

#[test]
fn health_is_kept_while_the_slice_is_not_published() {
    let c = claim(
        &["gpu-0-mig-1g-10gb-6"],
        true,
        json!([ready("gpu-0-mig-1g-10gb-6", "True")]),
    );
    let published = desired_allocation_claims(&c, &[pod(None)], &index(), NOW)
        .claims
        .remove(0);
    let mut unpublished = desired_allocation_claims(
        &c,
        &[pod(None)],
        &DeviceIndex::default(),
        "2026-01-02T00:00:00Z",
    )
    .claims
    .remove(0);
    assert!(
        health_of(&unpublished).is_none(),
        "unknown while unpublished"
    );
    carry_transition_time(&mut unpublished, &published);
    assert_eq!(health_of(&unpublished), health_of(&published));
    assert!(!writes_needed(&unpublished, Some(&published)).status);
}

/// Kubernetes' DNS-1123 subdomain: at most 253 bytes, dot-separated labels of `[a-z0-9-]`
/// that start and end with a letter or digit.
fn is_dns_subdomain(s: &str) -> bool {
    let label_ok = |l: &str| {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        l.starts_with(alnum) && l.ends_with(alnum) && l.chars().all(|c| alnum(c) || c == '-')
    };
    s.len() <= MAX_NAME && s.split('.').all(label_ok)
}

/// Issue 30 item 8: a cut that lands just after a `.` of a long claim name gave `….-<hash>`,
/// which the API server refuses. (Only the claim's and the device's names make the name: the
/// object lives in the claim's namespace, and pods do not enter it.)
#[test]
fn shortened_names_stay_dns_subdomains_and_apart() {
    let devices = ["gpu-0-mig-1g-10gb-6", "gpu-15-mig-1g-24gb--me-3"];
    let mut seen = std::collections::HashSet::new();
    // Every position of a `.` around the cut (236), in claims of up to 253 bytes.
    for dot in 200..252 {
        let lens: std::collections::BTreeSet<usize> = [dot + 2, 240, 253].into();
        for len in lens.into_iter().filter(|l| *l >= dot + 2) {
            let claim = format!("{}.{}", "a".repeat(dot), "b".repeat(len - dot - 1));
            assert!(is_dns_subdomain(&claim), "{claim}");
            for d in devices {
                let n = allocation_claim_name(&claim, d);
                assert!(is_dns_subdomain(&n), "{claim} {d}: {n}");
                assert_eq!(n, allocation_claim_name(&claim, d), "stable");
                assert!(seen.insert(n.clone()), "{claim} {d}: {n} given twice");
            }
        }
    }
    // A cut after a `-` keeps the name earlier releases gave.
    let claim = format!("{}-{}", "a".repeat(235), "b".repeat(17));
    let full = format!("{claim}-{}", devices[0]);
    let hash = das_runtime::hash::fnv1a64(full.as_bytes());
    assert_eq!(
        allocation_claim_name(&claim, devices[0]),
        format!("{}-{hash:016x}", &full[..236])
    );
}

#[test]
fn long_names_are_shortened_stably() {
    let long = "c".repeat(250);
    let n = allocation_claim_name(&long, "gpu-0-mig-1g-10gb-6");
    assert_eq!(n.len(), 253);
    assert_eq!(n, allocation_claim_name(&long, "gpu-0-mig-1g-10gb-6"));
    assert_ne!(n, allocation_claim_name(&long, "gpu-0-mig-1g-10gb-5"));
}

/// A whole GPU as the node plugin publishes it with `--whole-gpus` (docs/design.md §3): `type:
/// gpu`, `uuid`, no profile or placement attributes; it consumes every memory slice of its GPU
/// (`memory_slices` of them).
fn whole_gpu_slice(memory_slices: i64) -> ResourceSlice {
    let mut counters = json!({"memory": {"value": "80Gi"}});
    for s in 0..memory_slices {
        counters[format!("memory-slice-{s}")] = json!({"value": "1"});
    }
    serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-1", "attributes": {
                "type": {"string": "gpu"}, "uuid": {"string": "GPU-b"}, "gpuIndex": {"int": 1},
                "productName": {"string": "NVIDIA H100 80GB HBM3"}},
                "consumesCounters": [{"counterSet": "gpu-1-counter-set", "counters": counters}]}]}
    }))
    .unwrap()
}

/// The plugin's `status.devices` entry of a prepared whole GPU (docs/design.md §7): reason
/// `GpuPrepared`, profile `gpu`, every memory slice, no MIG UUID.
fn gpu_prepared(status: &str) -> serde_json::Value {
    json!({"driver": DRIVER_NAME, "pool": "n0", "device": "gpu-1",
        "conditions": [{"type": "Ready", "status": status,
            "reason": das_api::claim_status::REASON_WHOLE_GPU_READY,
            "message": "", "lastTransitionTime": NOW}],
        "data": {"migUUID": "", "gpuUUID": "GPU-b", "profile": "gpu",
            "placement": {"start": 0, "size": 8}, "readyTime": "2026-01-01T00:00:00.000Z"}})
}

#[test]
fn a_whole_gpu_is_mirrored_with_profile_gpu_over_every_memory_slice() {
    let index = DeviceIndex::from_slices([&whole_gpu_slice(8)]);
    let staged = claim(&["gpu-1"], true, json!([]));
    let m = desired_allocation_claims(&staged, &[pod(None)], &index, NOW);
    assert!(m.unmirrored.is_empty(), "{:?}", m.unmirrored);
    let a = &m.claims[0];
    assert_eq!(a.metadata.name.as_deref(), Some("c-gpu-1"));
    assert_eq!(a.spec.profile, das_api::WHOLE_GPU_PROFILE);
    assert_eq!(a.spec.gpu_uuid, "GPU-b");
    assert_eq!(a.spec.mig_placement, MigPlacement { start: 0, size: 8 });
    assert_eq!(a.spec.device, "gpu-1");
    let s = a.status.as_ref().unwrap();
    assert_eq!(s.state, AllocationState::Staged);
    assert_eq!(s.conditions[0].message, "whole GPU is staged");

    let bound = desired_allocation_claims(&staged, &[pod(Some("n0"))], &index, NOW);
    assert_eq!(
        bound.claims[0].status.as_ref().unwrap().state,
        AllocationState::Created
    );
    let preparing = claim(&["gpu-1"], true, json!([gpu_prepared("False")]));
    let m = desired_allocation_claims(&preparing, &[pod(Some("n0"))], &index, NOW);
    assert_eq!(
        m.claims[0].status.as_ref().unwrap().state,
        AllocationState::Created
    );

    // Ready=True with reason GpuPrepared is inUse; no MIG UUID.
    let prepared = claim(&["gpu-1"], true, json!([gpu_prepared("True")]));
    let m = desired_allocation_claims(&prepared, &[pod(Some("n0"))], &index, NOW);
    let a = &m.claims[0];
    let s = a.status.as_ref().unwrap();
    assert_eq!(s.state, AllocationState::InUse);
    assert_eq!(s.mig_uuid, None, "a whole GPU has no MIG device");
    assert_eq!(a.spec.mig_placement, MigPlacement { start: 0, size: 8 });
    assert_eq!(
        health_of(a).map(|h| h.status.as_str()),
        Some("True"),
        "published: its health is known"
    );
}

#[test]
fn a_whole_gpu_without_counters_takes_its_placement_from_the_plugin() {
    // An API server without DRAPartitionableDevices drops consumesCounters: the published
    // device says nothing of its size, so it is mirrored once the plugin has reported it.
    let index = DeviceIndex::from_slices([&whole_gpu_slice(0)]);
    let staged = claim(&["gpu-1"], true, json!([]));
    let m = desired_allocation_claims(&staged, &[pod(None)], &index, NOW);
    assert!(m.claims.is_empty() && m.unmirrored.len() == 1, "{m:?}");
    let prepared = claim(&["gpu-1"], true, json!([gpu_prepared("True")]));
    let m = desired_allocation_claims(&prepared, &[pod(Some("n0"))], &index, NOW);
    let a = &m.claims[0];
    assert_eq!(a.spec.profile, "gpu");
    assert_eq!(a.spec.gpu_uuid, "GPU-b");
    assert_eq!(a.spec.mig_placement, MigPlacement { start: 0, size: 8 });
    // Reported data wins over the counters where both are there.
    let four = DeviceIndex::from_slices([&whole_gpu_slice(4)]);
    let m = desired_allocation_claims(&prepared, &[pod(Some("n0"))], &four, NOW);
    assert_eq!(
        m.claims[0].spec.mig_placement,
        MigPlacement { start: 0, size: 8 }
    );
}
