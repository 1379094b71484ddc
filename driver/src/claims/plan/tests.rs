//! Unit tests of [`super`] (`plan.rs`).

use super::*;
use crate::gpu::Placement;
use das_api::{DRIVER_NAME, device_name};
use serde_json::json;

fn at(gpu: u32, start: u32) -> DeviceRef {
    DeviceRef {
        kind: Default::default(),
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}"),
        gpu_minor: gpu,
        profile: "1g.10gb".into(),
        start,
        size: 1,
        shared: false,
    }
}

fn planned(gpu: u32, start: u32, request: &str) -> Planned {
    Planned {
        time_slice: None,
        request: request.into(),
        pool: "n0".into(),
        device: device_name(gpu, "1g.10gb", start),
        at: at(gpu, start),
        mps: None,
        share: None,
    }
}

fn live(gpu: u32, start: u32, gi: u32, mig: &str) -> MigInstance {
    MigInstance {
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}"),
        gpu_minor: gpu,
        profile: "1g.10gb".into(),
        profile_id: 19,
        placement: Placement { start, size: 1 },
        gi_id: gi,
        ci_id: 0,
        mig_uuid: mig.into(),
        gi_cap_minor: 3 + 9 * gi,
        ci_cap_minor: 4 + 9 * gi,
        created_by_das: Some(true),
    }
}

fn claim() -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "uid-1".into(),
    }
}

fn rc(uid: &str, results: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

fn result(device: &str, pool: &str, driver: &str) -> serde_json::Value {
    json!({"request": "gpu", "driver": driver, "pool": pool, "device": device})
}

#[test]
fn allocation_is_resolved_or_refused_with_the_reason() {
    let devices: HashMap<_, _> = [(device_name(0, "1g.10gb", 6), at(0, 6))].into();
    let ok = rc(
        "uid-1",
        json!([
            result("gpu-0-mig-1g-10gb-6", "n0", DRIVER_NAME),
            result("x", "n0", "other.example.com")
        ]),
    );
    let p = resolve_allocation(&claim(), Some(&ok), "n0", &devices, 4).unwrap();
    assert_eq!(p, vec![planned(0, 6, "gpu")]);
    let cases: Vec<(Option<ResourceClaim>, &str)> = vec![
        (None, "claim_gone"),
        (Some(rc("uid-2", json!([]))), "claim_replaced"),
        (
            Some(rc("uid-1", json!([result("x", "n0", "other.example.com")]))),
            "no_device_of_ours",
        ),
        (
            Some(rc(
                "uid-1",
                json!([result("gpu-0-mig-1g-10gb-6", "n1", DRIVER_NAME)]),
            )),
            "foreign_pool",
        ),
        (
            Some(rc(
                "uid-1",
                json!([result("gpu-9-mig-1g-10gb-6", "n0", DRIVER_NAME)]),
            )),
            "unknown_device",
        ),
    ];
    for (rc, label) in cases {
        let e = resolve_allocation(&claim(), rc.as_ref(), "n0", &devices, 4).unwrap_err();
        assert_eq!(e.metric_label(), label, "{e}");
    }
    let mut unallocated = ok.clone();
    unallocated.status = None;
    let e = resolve_allocation(&claim(), Some(&unallocated), "n0", &devices, 4).unwrap_err();
    assert!(matches!(e, PrepareError::NotAllocated));
    // adminAccess (docs/reliability.md, "Bad input and what it gets"): refused, naming the
    // device; an explicit `false` is an ordinary allocation.
    let with_admin = |admin: bool| {
        let mut r = result("gpu-0-mig-1g-10gb-6", "n0", DRIVER_NAME);
        r["adminAccess"] = json!(admin);
        rc("uid-1", json!([r]))
    };
    let e = resolve_allocation(&claim(), Some(&with_admin(true)), "n0", &devices, 4).unwrap_err();
    assert!(
        matches!(&e, PrepareError::AdminAccess { device } if device == "gpu-0-mig-1g-10gb-6"),
        "{e:?}"
    );
    assert_eq!(e.metric_label(), "admin_access");
    assert!(e.to_string().contains("gpu-0-mig-1g-10gb-6"), "{e}");
    let p = resolve_allocation(&claim(), Some(&with_admin(false)), "n0", &devices, 4).unwrap();
    assert_eq!(p, vec![planned(0, 6, "gpu")]);
    // A config for DAS must decode (das_api::device_config); another driver's is ignored.
    let with_config = |driver: &str, kind: &str| {
        let mut c = rc(
            "uid-1",
            json!([result("gpu-0-mig-1g-10gb-6", "n0", DRIVER_NAME)]),
        );
        let config: k8s_openapi::api::resource::v1::DeviceAllocationConfiguration =
            serde_json::from_value(json!({"source": "FromClaim", "opaque": {"driver": driver,
                "parameters": {"apiVersion": "mig.das.com/v1alpha1", "kind": kind}}}))
            .unwrap();
        let a = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
        a.devices.as_mut().unwrap().config = Some(vec![config]);
        c
    };
    let e = resolve_allocation(
        &claim(),
        Some(&with_config(DRIVER_NAME, "Nope")),
        "n0",
        &devices,
        4,
    )
    .unwrap_err();
    assert_eq!(e.metric_label(), "invalid_config");
    assert!(
        e.to_string().contains("unknown kind \"Nope\"")
            && e.to_string().contains("valid: MigDeviceConfig"),
        "{e}"
    );
    for ok in [
        with_config(DRIVER_NAME, "MigDeviceConfig"),
        with_config("gpu.nvidia.com", "Nope"),
    ] {
        assert_eq!(
            resolve_allocation(&claim(), Some(&ok), "n0", &devices, 4).unwrap(),
            vec![planned(0, 6, "gpu")]
        );
    }
}

/// Issue 11 finding 2: GI IDs are reused after a destroy; only the exact instance is ours.
#[test]
fn a_reused_gi_id_at_the_same_placement_is_not_our_instance() {
    let d = with_instance(&record(&planned(0, 6, "gpu")), &live(0, 6, 3, "MIG-a"));
    assert!(is_instance(&d, &live(0, 6, 3, "MIG-a")));
    assert!(
        !is_instance(&d, &live(0, 6, 3, "MIG-b")),
        "successor at the same GI ID"
    );
    assert!(!is_instance(&d, &live(0, 6, 4, "MIG-a")));
    assert!(!is_instance(&d, &live(1, 6, 3, "MIG-a")), "another GPU");
    // Our GI whose compute instance is already gone lists without a MIG UUID.
    assert!(is_instance(&d, &live(0, 6, 3, "")));
    assert!(!is_instance(
        &record(&planned(0, 6, "gpu")),
        &live(0, 6, 3, "MIG-a")
    ));
}

#[test]
fn a_device_without_instance_claims_its_placement_only_if_nobody_else_does() {
    let d = record(&planned(0, 6, "gpu"));
    let s = live(0, 6, 2, "MIG-x");
    assert_eq!(
        match_devices(std::slice::from_ref(&d), std::slice::from_ref(&s), |_| {
            false
        }),
        vec![Some(s.clone())]
    );
    assert_eq!(
        match_devices(std::slice::from_ref(&d), std::slice::from_ref(&s), |_| true),
        vec![None]
    );
    let foreign = MigInstance {
        created_by_das: Some(false),
        ..s
    };
    assert_eq!(match_devices(&[d], &[foreign], |_| false), vec![None]);
}

#[test]
fn placement_holders_are_the_other_claims_with_overlapping_slices() {
    let mut cp = Checkpoint::new("boot");
    // 1g.10gb at 6 (size 1) on GPU 0, held by uid-old.
    cp.set_completed(
        "uid-old",
        "ns",
        "old",
        vec![record(&planned(0, 6, "gpu"))],
        BTreeMap::new(),
    );
    let mut big = planned(0, 4, "gpu");
    big.at.size = 4; // 4..8 overlaps 6
    assert_eq!(
        placement_holders(&cp, "uid-new", &[planned(0, 2, "gpu"), big.clone()]),
        BTreeMap::from([("uid-old".to_string(), big.device.clone())]),
        "the holder, with the first planned device it blocks"
    );
    assert!(placement_holders(&cp, "uid-new", &[planned(0, 5, "gpu")]).is_empty());
    assert!(placement_holders(&cp, "uid-new", &[planned(1, 6, "gpu")]).is_empty());
    assert!(
        placement_holders(&cp, "uid-old", &[big]).is_empty(),
        "not itself"
    );
}

#[test]
fn prepare_reuses_only_a_completed_record_of_the_same_allocation() {
    let p = vec![planned(0, 6, "gpu")];
    let mut r = ClaimRecord {
        namespace: "ns".into(),
        name: "c".into(),
        state: PrepareState::PrepareCompleted,
        devices: vec![record(&p[0])],
        cdi_device_ids: BTreeMap::new(),
        pods: Vec::new(),
        handed_to_kubelet: false,
        updated_at: 0,
    };
    assert_eq!(on_prepare(None, &p), OnPrepare::Create);
    assert_eq!(on_prepare(Some(&r), &p), OnPrepare::Verify);
    assert_eq!(
        on_prepare(Some(&r), &[planned(0, 5, "gpu")]),
        OnPrepare::ReleaseFirst,
        "same UID, new allocation"
    );
    for state in [PrepareState::PrepareStarted, PrepareState::Releasing] {
        r.state = state;
        assert_eq!(on_prepare(Some(&r), &p), OnPrepare::ReleaseFirst);
    }
}

#[test]
fn start_up_keeps_claims_still_allocated_as_recorded() {
    let r = ClaimRecord {
        namespace: "ns".into(),
        name: "c".into(),
        state: PrepareState::PrepareCompleted,
        devices: vec![record(&planned(0, 6, "gpu"))],
        cdi_device_ids: BTreeMap::new(),
        pods: Vec::new(),
        handed_to_kubelet: false,
        updated_at: 0,
    };
    let same = rc(
        "uid-1",
        json!([result("gpu-0-mig-1g-10gb-6", "n0", DRIVER_NAME)]),
    );
    assert!(still_allocated(&claim(), &r, Some(&same), "n0"));
    assert!(!still_allocated(&claim(), &r, None, "n0"));
    let replaced = rc(
        "uid-2",
        json!([result("gpu-0-mig-1g-10gb-6", "n0", DRIVER_NAME)]),
    );
    assert!(!still_allocated(&claim(), &r, Some(&replaced), "n0"));
    let moved = rc(
        "uid-1",
        json!([result("gpu-0-mig-1g-10gb-5", "n0", DRIVER_NAME)]),
    );
    assert!(!still_allocated(&claim(), &r, Some(&moved), "n0"));
    let mut deallocated = same.clone();
    deallocated.status = None;
    assert!(!still_allocated(&claim(), &r, Some(&deallocated), "n0"));
}

#[test]
fn orphans_are_the_unclaimed_slices_only_ours_destroyed() {
    let mut cp = Checkpoint::new("boot");
    let kept = live(0, 6, 1, "MIG-kept");
    let d = with_instance(&record(&planned(0, 6, "gpu")), &kept);
    cp.set_completed("uid-1", "ns", "c", vec![d], BTreeMap::new());
    let ours = live(0, 5, 2, "MIG-orphan");
    let foreign = MigInstance {
        created_by_das: None,
        ..live(0, 4, 3, "MIG-foreign")
    };
    let all = [kept, ours.clone(), foreign.clone()];
    let o = orphans(&all, &cp, false);
    assert_eq!(o.destroy, vec![ours.clone()]);
    assert_eq!(o.foreign, vec![foreign.clone()]);
    assert_eq!(orphans(&all, &cp, true).destroy, vec![ours, foreign]);
}

#[test]
fn unclaimed_instances_are_those_no_record_holds_or_overlaps() {
    let mut cp = Checkpoint::new("boot");
    let kept = live(0, 6, 1, "MIG-kept");
    let d = with_instance(&record(&planned(0, 6, "gpu")), &kept);
    cp.set_completed("uid-1", "ns", "c", vec![d], BTreeMap::new());
    // A prepare in flight: its placement (GPU 1, memory slice 2) is recorded, the instance just made.
    cp.set_started("uid-2", "ns", "d", vec![record(&planned(1, 2, "gpu"))]);
    let in_flight = live(1, 2, 1, "MIG-new");
    let foreign = MigInstance {
        created_by_das: Some(false),
        ..live(0, 4, 3, "MIG-foreign")
    };
    let same_slice_other_gpu = live(1, 6, 2, "MIG-left");
    let all = [
        kept,
        in_flight,
        foreign.clone(),
        same_slice_other_gpu.clone(),
    ];
    assert_eq!(unclaimed(&all, &cp), vec![foreign, same_slice_other_gpu]);
}

#[test]
fn spec_devices_number_slices_per_request() {
    let p = [planned(0, 6, "a"), planned(1, 6, "b/x"), planned(0, 5, "a")];
    let instances = [
        live(0, 6, 1, "MIG-1"),
        live(1, 6, 1, "MIG-2"),
        live(0, 5, 2, "MIG-3"),
    ];
    let devices: Vec<RecordedDevice> = p
        .iter()
        .zip(&instances)
        .map(|(p, s)| with_instance(&record(p), s))
        .collect();
    let held: Vec<Holding> = instances.iter().cloned().map(Holding::Instance).collect();
    let specs = spec_devices(&devices, &held, 508, &[]);
    let shape: Vec<(String, String, usize)> = specs
        .iter()
        .map(|d| {
            (
                d.key.clone(),
                d.instances[0].request.clone(),
                d.instances[0].index,
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            ("gpu-0-mig-1g-10gb-6".into(), "a".into(), 0),
            ("gpu-1-mig-1g-10gb-6".into(), "b".into(), 0),
            ("gpu-0-mig-1g-10gb-5".into(), "a".into(), 1),
        ]
    );
    // A record of the first release keeps one CDI device per request.
    let legacy = spec_devices(&devices, &held, 508, &["a".into(), "b".into()]);
    assert_eq!(legacy.len(), 2);
    assert_eq!(legacy[0].instances.len(), 2);
}

#[test]
fn kubelet_devices_carry_their_cdi_device() {
    let p = [planned(0, 6, "a"), planned(0, 5, "b/x")];
    let devices: Vec<RecordedDevice> = p.iter().map(record).collect();
    let mut r = ClaimRecord {
        namespace: "ns".into(),
        name: "c".into(),
        state: PrepareState::PrepareCompleted,
        devices,
        pods: Vec::new(),
        handed_to_kubelet: false,
        cdi_device_ids: BTreeMap::from([
            (
                "gpu-0-mig-1g-10gb-6".to_string(),
                vec!["das.com/mig=u-6".to_string()],
            ),
            (
                "gpu-0-mig-1g-10gb-5".to_string(),
                vec!["das.com/mig=u-5".to_string()],
            ),
        ]),
        updated_at: 0,
    };
    let out = kubelet_devices(&r);
    assert_eq!(out[0].requests, ["a"]);
    assert_eq!(out[0].cdi_device_ids, ["das.com/mig=u-6"]);
    assert_eq!(out[1].requests, ["b"]);
    assert_eq!(out[1].cdi_device_ids, ["das.com/mig=u-5"]);
    assert!(legacy_cdi_keys(&r).is_empty());
    // First-release records: per request.
    r.cdi_device_ids = BTreeMap::from([
        ("a".to_string(), vec!["das.com/mig=u-a".to_string()]),
        ("b".to_string(), vec!["das.com/mig=u-b".to_string()]),
    ]);
    assert_eq!(kubelet_devices(&r)[1].cdi_device_ids, ["das.com/mig=u-b"]);
    assert_eq!(legacy_cdi_keys(&r), ["a", "b"]);
}

#[test]
fn free_placements_follow_nvml_rules_on_what_is_recorded() {
    let model = crate::gpu::catalog::find_model("A100-SXM4-40GB")
        .unwrap()
        .unwrap();
    let free = |devices: &[RecordedDevice]| -> BTreeMap<String, u64> {
        free_placements(&model, devices.iter())
            .into_iter()
            .collect()
    };
    let empty = free(&[]);
    assert_eq!(empty["1g.5gb"], 7);
    assert_eq!(empty["7g.40gb"], 1);
    // One 1g.5gb at memory slice 0: no 7g, one 4g placement (0) gone, six 1g.5gb left.
    let mut d = record(&planned(0, 0, "gpu"));
    d.profile = "1g.5gb".into();
    let one = free(&[d]);
    assert_eq!(one["7g.40gb"], 0);
    assert_eq!(one["4g.20gb"], 0, "4g.20gb only starts at 0");
    assert_eq!(one["1g.5gb"], 6);
    assert_eq!(one["3g.20gb"], 1);
}

#[test]
fn the_pods_of_a_claim_are_its_reserving_pods_only() {
    let rc: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {},
        "status": {"reservedFor": [
            {"resource": "pods", "name": "a", "uid": "pod-a"},
            {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "not-a-pod"},
            {"resource": "pods", "name": "b", "uid": "pod-b"}
        ]}
    }))
    .unwrap();
    assert_eq!(reserving_pods(&rc), ["pod-a", "pod-b"]);
    assert!(reserving_pods(&self::rc("u", json!([]))).is_empty());
    let known = vec!["pod-a".to_string()];
    assert_eq!(
        with_pods(&known, &["pod-b".into(), "pod-a".into()]),
        ["pod-a", "pod-b"],
        "a pod that left stays known; new ones are added once"
    );
}

/// The orphan rule needs positive evidence for every recorded pod, and that no live container
/// carries the claim's marks; anything else keeps the MIG instances (issues 30 and 41).
#[test]
fn an_orphan_is_released_only_when_the_runtime_has_no_container_of_any_of_its_pods() {
    let pods = ["p1".to_string(), "p2".to_string()];
    let gone = |p: &str| (p.to_string(), Ok(false));
    let evidence = |pods: Vec<(String, Result<bool, RuntimeError>)>| RuntimeEvidence {
        pods,
        holding: Ok(Vec::new()),
    };
    let all_gone = evidence(vec![gone("p1"), gone("p2")]);
    assert_eq!(
        orphan_verdict(true, &pods, Some(&all_gone)),
        OrphanVerdict::Allocated
    );
    assert_eq!(
        orphan_verdict(false, &pods, Some(&all_gone)),
        OrphanVerdict::Release
    );
    let keeps = |v: OrphanVerdict, why: &str| match v {
        OrphanVerdict::Keep(text) => assert!(text.contains(why), "{text}"),
        other => panic!("expected Keep({why}), got {other:?}"),
    };
    keeps(orphan_verdict(false, &pods, None), "no container runtime");
    keeps(
        orphan_verdict(false, &[], Some(&all_gone)),
        "no pod is recorded",
    );
    keeps(
        orphan_verdict(
            false,
            &pods,
            Some(&evidence(vec![gone("p1"), ("p2".into(), Ok(true))])),
        ),
        "still has a sandbox or container of pod p2",
    );
    keeps(
        orphan_verdict(
            false,
            &pods,
            Some(&evidence(vec![
                gone("p1"),
                ("p2".into(), Err(RuntimeError::Injected("timeout".into()))),
            ])),
        ),
        "could not say whether pod p2",
    );
    keeps(
        orphan_verdict(false, &pods, Some(&evidence(vec![gone("p1")]))),
        "pod p2 was not asked",
    );
    // A pod the record never heard of still holds the claim's devices.
    let held = RuntimeEvidence {
        holding: Ok(vec!["container main of pod ns/late".into()]),
        ..all_gone.clone()
    };
    keeps(
        orphan_verdict(false, &pods, Some(&held)),
        "container main of pod ns/late still holds its devices",
    );
    let unknown = RuntimeEvidence {
        holding: Err(RuntimeError::NoRuntimeSpec {
            container: "c".into(),
        }),
        ..all_gone
    };
    keeps(
        orphan_verdict(false, &pods, Some(&unknown)),
        "could not say which containers hold its devices: container c: its verbose ContainerStatus has no runtime spec",
    );
}
