//! Unit tests of [`super`] (`desired.rs`).

use super::*;
use crate::gpu::GpuInfo;
use crate::publish::devices::device_index;
use crate::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};

fn gpu(index: u32, model: &str) -> GpuInfo {
    GpuInfo::for_tests(index, model)
}

/// The inventory-built specs of two A30s on `n0`.
fn base() -> (Vec<GpuInfo>, Vec<ResourceSliceSpec>) {
    let gpus = vec![gpu(0, "A30"), gpu(1, "A30")];
    let desired =
        desired_resource_slices("n0", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    (gpus, desired.into_iter().map(|d| d.slice.spec).collect())
}

fn devices(specs: &[ResourceSliceSpec]) -> Vec<&Device> {
    specs
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .collect()
}

fn xid_taint(xid: &str) -> DeviceTaint {
    DeviceTaint {
        key: das_api::health_taints::XID.into(),
        value: Some(xid.into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

#[test]
fn no_facts_publish_the_inventory_as_it_is() {
    let (_, base) = base();
    assert_eq!(desired_slices(&base, &HealthFacts::default()), base);
}

#[test]
fn taints_go_on_the_devices_at_their_placement_only() {
    let (gpus, base) = base();
    let at = Placement { start: 0, size: 1 };
    let facts = HealthFacts {
        taints: BTreeMap::from([((1, at), vec![xid_taint("94")])]),
        ..HealthFacts::default()
    };
    let specs = desired_slices(&base, &facts);
    let index = device_index(&gpus);
    let mut tainted = 0;
    for d in devices(&specs) {
        let r = &index[&d.name];
        let here = r.gpu_index == 1 && (r.start, r.size) == (at.start, at.size);
        assert_eq!(d.taints, here.then(|| vec![xid_taint("94")]), "{}", d.name);
        tainted += usize::from(here);
    }
    assert!(tainted > 0);
    assert_eq!(
        devices(&specs).len(),
        devices(&base).len(),
        "nothing withdrawn"
    );
    assert_eq!(
        specs.iter().map(|s| &s.shared_counters).collect::<Vec<_>>(),
        base.iter().map(|s| &s.shared_counters).collect::<Vec<_>>(),
        "counters untouched"
    );
}

#[test]
fn withdrawn_devices_are_removed_tainted_or_not() {
    let (_, base) = base();
    let facts = HealthFacts {
        taints: BTreeMap::from([((1, Placement { start: 0, size: 1 }), vec![xid_taint("94")])]),
        withdrawn: BTreeMap::from([(1, vec![Placement { start: 0, size: 1 }])]),
        ..HealthFacts::default()
    };
    let names: Vec<String> = devices(&desired_slices(&base, &facts))
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert!(!names.contains(&"gpu-1-mig-1g-6gb-0".to_string()));
    assert!(
        !names.contains(&"gpu-1-mig-4g-24gb-0".to_string()),
        "covers slice 0"
    );
    assert!(names.contains(&"gpu-1-mig-1g-6gb-1".to_string()));
    assert!(names.contains(&"gpu-0-mig-1g-6gb-0".to_string()));
}

#[test]
fn taints_go_on_every_device_of_their_gpu_and_nowhere_else() {
    let gpus = [gpu(0, "A30"), gpu(1, "A30")];
    let desired =
        desired_resource_slices("n0", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let mut specs: Vec<ResourceSliceSpec> = desired.into_iter().map(|d| d.slice.spec).collect();
    let taint = DeviceTaint {
        key: das_api::health_taints::XID.into(),
        value: Some("79".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    set_device_taints(&mut specs, |gpu, _| {
        if gpu == 1 {
            vec![taint.clone()]
        } else {
            Vec::new()
        }
    });
    let devices: Vec<&Device> = specs
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .collect();
    assert!(!devices.is_empty());
    for d in &devices {
        let want = d.name.starts_with("gpu-1-").then(|| vec![taint.clone()]);
        assert_eq!(d.taints, want, "{}", d.name);
    }
    // Recovery: no taints clears them again.
    set_device_taints(&mut specs, |_, _| Vec::new());
    assert!(
        specs
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .all(|d| d.taints.is_none())
    );
}

#[test]
fn devices_overlapping_an_unclaimed_instance_are_withdrawn() {
    let gpus = [gpu(0, "A30"), gpu(1, "A30")];
    let desired =
        desired_resource_slices("n0", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let mut specs: Vec<ResourceSliceSpec> = desired.into_iter().map(|d| d.slice.spec).collect();
    let names = |specs: &[ResourceSliceSpec]| -> Vec<String> {
        specs
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .map(|d| d.name.clone())
            .collect()
    };
    let all = names(&specs);
    // A 1g.6gb at memory slice 0 of GPU 1 (A30: 4 memory slices).
    let held = BTreeMap::from([(1, vec![crate::gpu::Placement { start: 0, size: 1 }])]);
    let removed = withdraw_overlapping(&mut specs, &held);
    let left = names(&specs);
    assert_eq!(removed, all.len() - left.len());
    assert!(removed > 0);
    assert!(!left.contains(&"gpu-1-mig-1g-6gb-0".to_string()));
    assert!(
        !left.contains(&"gpu-1-mig-4g-24gb-0".to_string()),
        "covers slice 0"
    );
    assert!(left.contains(&"gpu-1-mig-1g-6gb-1".to_string()));
    assert!(
        left.contains(&"gpu-0-mig-1g-6gb-0".to_string()),
        "other GPU untouched"
    );
    assert!(
        left.iter().all(|n| all.contains(n)),
        "only removals, nothing else changes"
    );
}

/// GPU 0 an A30 with MIG on, GPU 1 an A30 with MIG off (a whole GPU, `gpu-1`).
fn with_a_whole_gpu() -> (Vec<GpuInfo>, Vec<ResourceSliceSpec>) {
    let mut whole = gpu(1, "A30");
    whole.mig_enabled = false;
    let gpus = vec![gpu(0, "A30"), whole];
    let desired =
        desired_resource_slices("n0", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    (gpus, desired.into_iter().map(|d| d.slice.spec).collect())
}

#[test]
fn gpu_wide_taints_reach_the_whole_gpu_device() {
    let (gpus, base) = with_a_whole_gpu();
    // What the health monitor reports for a GPU-wide fault: every device of the GPU, by the
    // placement `device_index` gives it (a whole GPU: start 0, every memory slice).
    let index = device_index(&gpus);
    let taints: BTreeMap<(u32, Placement), Vec<DeviceTaint>> = index
        .values()
        .filter(|r| r.gpu_index == 1)
        .map(|r| {
            let at = Placement {
                start: r.start,
                size: r.size,
            };
            ((1, at), vec![xid_taint("79")])
        })
        .collect();
    assert_eq!(
        taints.keys().collect::<Vec<_>>(),
        [&(1, Placement { start: 0, size: 4 })]
    );
    let facts = HealthFacts {
        taints,
        ..HealthFacts::default()
    };
    let specs = desired_slices(&base, &facts);
    for d in devices(&specs) {
        let want = (d.name == "gpu-1").then(|| vec![xid_taint("79")]);
        assert_eq!(d.taints, want, "{}", d.name);
    }
    // The same through set_device_taints keyed by GPU only.
    let mut specs = base.clone();
    set_device_taints(&mut specs, |gpu, placement| {
        assert!(gpu != 1 || placement == Placement { start: 0, size: 4 });
        if gpu == 1 {
            vec![xid_taint("48")]
        } else {
            Vec::new()
        }
    });
    let tainted: Vec<&str> = devices(&specs)
        .into_iter()
        .filter(|d| d.taints.is_some())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(tainted, ["gpu-1"]);
}

#[test]
fn a_mig_instance_on_a_whole_gpu_withdraws_it() {
    let (_, base) = with_a_whole_gpu();
    // Cannot happen while its MIG mode is off; if someone switched it on and made one, the
    // whole GPU overlaps it.
    let facts = HealthFacts {
        withdrawn: BTreeMap::from([(1, vec![Placement { start: 3, size: 1 }])]),
        ..HealthFacts::default()
    };
    let names: Vec<String> = devices(&desired_slices(&base, &facts))
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert!(!names.contains(&"gpu-1".to_string()));
    assert_eq!(names.len(), devices(&base).len() - 1, "GPU 0 untouched");
    // An instance on GPU 0 leaves the whole GPU 1 published.
    let facts = HealthFacts {
        withdrawn: BTreeMap::from([(0, vec![Placement { start: 0, size: 4 }])]),
        ..HealthFacts::default()
    };
    let names: Vec<String> = devices(&desired_slices(&base, &facts))
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(names, ["gpu-1"]);
}

#[test]
fn a_gpu_that_serves_one_kind_loses_the_other_kinds_devices_only() {
    // Two H100s DAS may switch: each is published whole and with every MIG placement.
    let gpus: Vec<GpuInfo> = (0..2)
        .map(|i| GpuInfo {
            mig_switch: crate::gpu::MigSwitch::Allowed,
            ..gpu(i, "H100-SXM5-80GB")
        })
        .collect();
    let desired =
        desired_resource_slices("n0", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let base: Vec<ResourceSliceSpec> = desired.into_iter().map(|d| d.slice.spec).collect();
    let index = device_index(&gpus);
    let kinds = |specs: &[ResourceSliceSpec], gpu: u32| {
        let mut k: Vec<DeviceKind> = devices(specs)
            .iter()
            .map(|d| &index[&d.name])
            .filter(|r| r.gpu_index == gpu)
            .map(|r| r.kind)
            .collect();
        k.dedup();
        k
    };
    assert_eq!(kinds(&base, 0), vec![DeviceKind::Mig, DeviceKind::WholeGpu]);
    let facts = HealthFacts {
        serves_only: BTreeMap::from([(0, DeviceKind::WholeGpu), (1, DeviceKind::Mig)]),
        ..HealthFacts::default()
    };
    let specs = desired_slices(&base, &facts);
    assert_eq!(kinds(&specs, 0), vec![DeviceKind::WholeGpu]);
    assert_eq!(kinds(&specs, 1), vec![DeviceKind::Mig]);
    let mig_before = devices(&base)
        .iter()
        .filter(|d| index[&d.name].gpu_index == 1 && index[&d.name].kind == DeviceKind::Mig)
        .count();
    assert_eq!(devices(&specs).len(), 1 + mig_before);
    assert_eq!(
        specs.iter().map(|s| &s.shared_counters).collect::<Vec<_>>(),
        base.iter().map(|s| &s.shared_counters).collect::<Vec<_>>(),
        "counters untouched"
    );
}

/// The inventory-built specs of two A30s on `n0` whose `1g.6gb` placements are also shareable.
fn shared_base() -> Vec<ResourceSliceSpec> {
    use crate::publish::resource_slices::{SharedProfiles, SliceOptions};
    let gpus = vec![gpu(0, "A30"), gpu(1, "A30")];
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: vec!["1g.6gb".into()],
            ..SharedProfiles::default()
        },
    };
    let desired = desired_resource_slices("n0", &gpus, options).unwrap();
    desired.into_iter().map(|d| d.slice.spec).collect()
}

/// The `shareNamespace` of every device of `specs` that has one, by device name.
fn share_namespaces_of(specs: &[ResourceSliceSpec]) -> BTreeMap<String, String> {
    devices(specs)
        .into_iter()
        .filter_map(|d| {
            let a = d.attributes.as_ref()?.get(attr::SHARE_NAMESPACE)?;
            Some((d.name.clone(), a.string.clone()?))
        })
        .collect()
}

#[test]
fn the_namespace_of_a_shared_slice_goes_on_its_shareable_device_only() {
    let base = shared_base();
    let shared = "gpu-1-mig-1g-6gb-2-shared";
    assert!(devices(&base).iter().any(|d| d.name == shared));
    let facts = HealthFacts {
        share_namespaces: BTreeMap::from([
            (shared.to_string(), "team-a".to_string()),
            // An exclusive device, or one not published, never gets it.
            ("gpu-1-mig-1g-6gb-2".to_string(), "team-b".to_string()),
            (
                "gpu-7-mig-1g-6gb-0-shared".to_string(),
                "team-c".to_string(),
            ),
        ]),
        ..HealthFacts::default()
    };
    let specs = desired_slices(&base, &facts);
    assert_eq!(
        share_namespaces_of(&specs),
        BTreeMap::from([(shared.to_string(), "team-a".to_string())])
    );
    // Nothing else changes: the same devices, and the device's other attributes as they were.
    assert_eq!(devices(&specs).len(), devices(&base).len());
    let mut without = specs.clone();
    set_share_namespaces(&mut without, &BTreeMap::new());
    assert_eq!(without, base);
}

#[test]
fn the_namespace_goes_with_the_last_share_and_several_show_as_several() {
    let base = shared_base();
    let shared = "gpu-0-mig-1g-6gb-3-shared";
    let mut specs = base.clone();
    let one = BTreeMap::from([(shared.to_string(), "team-a".to_string())]);
    assert_eq!(set_share_namespaces(&mut specs, &one), 1);
    let several = BTreeMap::from([(
        shared.to_string(),
        attr::SHARE_NAMESPACE_SEVERAL.to_string(),
    )]);
    assert_eq!(set_share_namespaces(&mut specs, &several), 1);
    assert_eq!(share_namespaces_of(&specs), several);
    // The last share's record dropped: the attribute goes, the slices are the inventory's.
    assert_eq!(set_share_namespaces(&mut specs, &BTreeMap::new()), 0);
    assert_eq!(specs, base);
}
