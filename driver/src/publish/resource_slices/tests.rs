//! Unit tests of [`super`] (`resource_slices.rs`).

use super::*;
use crate::gpu::catalog::parse_model;
use crate::gpu::{GpuModel, find_model};
use std::collections::BTreeMap;
use std::sync::Arc;

fn gpu(index: u32, model: &str) -> GpuInfo {
    gpu_of(index, find_model(model).unwrap().unwrap())
}

/// A GPU of `model` at `index` as `GpuInfo::for_tests` makes one: MIG mode on (off for a model
/// without MIG), the model's memory.
fn gpu_of(index: u32, model: Arc<GpuModel>) -> GpuInfo {
    GpuInfo {
        product_name: model.product_name.clone(),
        memory_mib: model.memory_mib,
        mig_enabled: model.mig,
        mig_switch: crate::gpu::MigSwitch::base(&model),
        model,
        ..GpuInfo::for_tests(index, "A30")
    }
}

fn all_devices(slices: &[DesiredResourceSlice]) -> Vec<&Device> {
    slices
        .iter()
        .flat_map(|s| s.slice.spec.devices.iter().flatten())
        .collect()
}

fn find<'a>(slices: &'a [DesiredResourceSlice], name: &str) -> &'a Device {
    all_devices(slices)
        .into_iter()
        .find(|d| d.name == name)
        .unwrap()
}

fn consumed(d: &Device) -> BTreeMap<String, String> {
    d.consumes_counters.as_ref().unwrap()[0]
        .counters
        .iter()
        .map(|(k, v)| (k.clone(), v.value.0.clone()))
        .collect()
}

#[test]
fn names_and_helpers() {
    assert_eq!(semver("580.95.05").as_deref(), Some("580.95.5"));
    assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
    assert_eq!(semver("575"), Some("575.0.0".into()));
    assert_eq!(semver("580.95.05-beta"), None);
    assert_eq!(semver("1.2.3.4"), None);
    assert_eq!(bytes_quantity(40960 * 1024 * 1024).0, "40Gi");
    assert_eq!(bytes_quantity(9984 * 1024 * 1024).0, "9984Mi");
    assert_eq!(bytes_quantity(1000).0, "1000");
    assert_eq!(count_quantity(14).0, "14");
    assert_eq!(count_quantity(0).0, "0");
    assert_eq!(count_quantity(2000).0, "2k");
    assert_eq!(
        ResourceSliceLayout::for_server_version(1, 34),
        ResourceSliceLayout::CountersWithDevices
    );
    assert_eq!(
        ResourceSliceLayout::for_server_version(1, 36),
        ResourceSliceLayout::SeparateCounterSlices
    );
}

#[test]
fn device_attributes_and_capacity_follow_design() {
    let g = located(gpu(0, "A100-SXM4-40GB"));
    let slices =
        desired_resource_slices("node-a", &[g], ResourceSliceLayout::SeparateCounterSlices)
            .unwrap();
    let d = find(&slices, "gpu-0-mig-1g-10gb-6");
    println!("{}", serde_json::to_string_pretty(d).unwrap());
    let a = d.attributes.as_ref().unwrap();
    let keys: Vec<&str> = a.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "architecture",
            "brand",
            "cudaComputeCapability",
            "cudaDriverVersion",
            "driverVersion",
            "gpuIndex",
            "parentUUID",
            "placementSize",
            "placementStart",
            "productName",
            "profile",
            "resource.kubernetes.io/pciBusID",
            "resource.kubernetes.io/pcieRoot",
            "type"
        ]
    );
    assert_eq!(a["type"].string.as_deref(), Some("mig"));
    assert_eq!(a["profile"].string.as_deref(), Some("1g.10gb"));
    assert_eq!(
        a["parentUUID"].string.as_deref(),
        Some("GPU-00000000-0000-0000-0000-000000000000")
    );
    assert_eq!(a["gpuIndex"].int, Some(0));
    assert_eq!(a["placementStart"].int, Some(6));
    assert_eq!(a["placementSize"].int, Some(2));
    assert_eq!(
        a["productName"].string.as_deref(),
        Some("NVIDIA A100-SXM4-40GB")
    );
    assert_eq!(a["brand"].string.as_deref(), Some("Nvidia"));
    assert_eq!(a["cudaComputeCapability"].version.as_deref(), Some("8.0.0"));
    assert_eq!(a["driverVersion"].version.as_deref(), Some("580.95.5"));
    assert_eq!(a["cudaDriverVersion"].version.as_deref(), Some("13.0.0"));
    assert_eq!(a["architecture"].string.as_deref(), Some("Ampere"));
    assert_eq!(
        a["resource.kubernetes.io/pciBusID"].string.as_deref(),
        Some("0000:3b:00.0")
    );
    assert_eq!(
        a["resource.kubernetes.io/pcieRoot"].string.as_deref(),
        Some("pci0000:3a")
    );
    let c = d.capacity.as_ref().unwrap();
    assert_eq!(c["memory"].value.0, "9984Mi");
    assert_eq!(c["multiprocessors"].value.0, "14");
    assert_eq!(c["decoders"].value.0, "1");
    assert_eq!(c["ofaEngines"].value.0, "0");
    assert!(a.len() + c.len() <= MAX_ATTRIBUTES_AND_CAPACITIES);

    let no_bus = desired_resource_slices(
        "node-a",
        &[gpu(0, "A30")],
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    let a = find(&no_bus, "gpu-0-mig-1g-6gb-0")
        .attributes
        .clone()
        .unwrap();
    // Facts the GPU does not know are left out, not published empty.
    for unknown in [
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
        "brand",
        "cudaDriverVersion",
    ] {
        assert!(!a.contains_key(unknown), "{unknown}");
    }
}

/// `g` with every fact the plugin may know about it (docs/design.md §3): PCI bus ID and PCIe
/// root, brand and CUDA driver version.
fn located(mut g: GpuInfo) -> GpuInfo {
    g.pci_bus_id = Some("0000:3b:00.0".into());
    g.pcie_root = Some("pci0000:3a".into());
    g.brand = Some("Nvidia".into());
    g.cuda_driver_version = Some("13.0".into());
    g
}

#[test]
fn counter_consumption() {
    let slices = desired_resource_slices(
        "n",
        &[gpu(0, "H100-80GB")],
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    // Only the counters the hardware rules need (layout::needed_counters): on the H100 the
    // memory slices, `memory` and `ofa-engines`; a 1g.10gb has no OFA.
    let small = consumed(find(&slices, "gpu-0-mig-1g-10gb-6"));
    let expected: BTreeMap<String, String> = [("memory", "9984Mi"), ("memory-slice-6", "1")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(small, expected);
    let big = consumed(find(&slices, "gpu-0-mig-7g-80gb-0"));
    assert!((0..8).all(|n| big[&format!("memory-slice-{n}")] == "1"));
    assert_eq!(big["ofa-engines"], "1");
    assert!(!big.contains_key("multiprocessors"), "{big:?}");
    let me = consumed(find(&slices, "gpu-0-mig-1g-10gb-me-3"));
    assert_eq!(
        me["ofa-engines"], "1",
        "a second +me is kept out by the OFA counter"
    );
    let d = find(&slices, "gpu-0-mig-1g-10gb-me-3");
    assert_eq!(
        d.consumes_counters.as_ref().unwrap()[0].counter_set,
        "gpu-0-counter-set"
    );
}

#[test]
fn overlapping_placements_share_memory_slice_counters() {
    let slices = desired_resource_slices(
        "n",
        &[gpu(0, "H100-80GB")],
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    let users: Vec<&str> = all_devices(&slices)
        .into_iter()
        .filter(|d| consumed(d).contains_key("memory-slice-6"))
        .map(|d| d.name.as_str())
        .collect();
    for name in [
        "gpu-0-mig-1g-10gb-6",
        "gpu-0-mig-1g-10gb-me-6",
        "gpu-0-mig-1g-20gb-6",
        "gpu-0-mig-3g-40gb-4",
        "gpu-0-mig-7g-80gb-0",
    ] {
        assert!(users.contains(&name), "{name} not in {users:?}");
    }
    assert_eq!(users.len(), 5);
    let set = &slices[0].slice.spec.shared_counters.as_ref().unwrap()[0];
    assert_eq!(set.name, "gpu-0-counter-set");
    assert_eq!(set.counters["memory-slice-7"].value.0, "1");
    assert_eq!(set.counters["memory"].value.0, "81152Mi");
    assert_eq!(
        set.counters
            .keys()
            .filter(|k| !k.starts_with("memory-slice-"))
            .collect::<Vec<_>>(),
        ["memory", "ofa-engines"]
    );
    assert_eq!(set.counters.len(), 2 + 8);
}

#[test]
fn eight_h100_on_1_35_and_newer() {
    let gpus: Vec<GpuInfo> = (0..8).map(|i| gpu(i, "H100-80GB")).collect();
    let slices =
        desired_resource_slices("node-a", &gpus, ResourceSliceLayout::SeparateCounterSlices)
            .unwrap();
    // 8 counter sets fit one counter slice; 8 × 25 devices need 4 device slices of ≤ 64.
    let kinds: Vec<ResourceSliceKind> = slices.iter().map(|s| s.kind).collect();
    assert_eq!(kinds[0], ResourceSliceKind::Counters);
    assert_eq!(slices.len(), 5);
    for s in &slices {
        let spec = &s.slice.spec;
        assert_eq!(spec.pool.resource_slice_count, 5);
        assert_eq!(spec.pool.name, "node-a");
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.driver, "mig.das.com");
        assert!(s.slice.metadata.name.is_none());
        assert!(
            spec.devices
                .as_ref()
                .is_none_or(|d| d.len() <= MAX_DEVICES_PER_SLICE)
        );
        assert!(spec.shared_counters.as_ref().is_none_or(|c| {
            c.len() <= MAX_COUNTER_SETS_PER_SLICE
                && c.iter()
                    .all(|set| set.counters.len() <= MAX_COUNTERS_PER_SET)
        }));
        // Never both in one slice on 1.35+.
        assert!(spec.devices.is_none() || spec.shared_counters.is_none());
    }
    // Counter-only slices leave `devices` unset, so the JSON has no "devices" key.
    assert!(slices[0].slice.spec.devices.is_none());
    let json = serde_json::to_value(&slices[0].slice).unwrap();
    assert!(json["spec"].get("devices").is_none());
    assert_eq!(all_devices(&slices).len(), 200);
    let prefixes: Vec<String> = slices
        .iter()
        .map(DesiredResourceSlice::name_prefix)
        .collect();
    let mut sorted = prefixes.clone();
    sorted.sort();
    assert_eq!(prefixes, sorted);
    assert_eq!(prefixes[0], "00000");
}

#[test]
fn eight_h100_on_1_34() {
    let gpus: Vec<GpuInfo> = (0..8).map(|i| gpu(i, "H100-80GB")).collect();
    let slices =
        desired_resource_slices("node-a", &gpus, ResourceSliceLayout::CountersWithDevices).unwrap();
    // 15 counters per GPU: two GPUs (30 counters, 50 devices) per slice.
    assert_eq!(slices.len(), 4);
    for s in &slices {
        assert_eq!(s.kind, ResourceSliceKind::Combined);
        let spec = &s.slice.spec;
        let sets = spec.shared_counters.as_ref().unwrap();
        let devices = spec.devices.as_ref().unwrap();
        assert_eq!(sets.len(), 2);
        assert!(sets.iter().map(|c| c.counters.len()).sum::<usize>() <= MAX_COUNTERS_PER_SET);
        assert!(devices.len() <= MAX_DEVICES_PER_SLICE);
        let consumptions: usize = devices.iter().map(consumption_count).sum();
        assert!(consumptions <= MAX_DEVICE_COUNTERS_PER_SLICE_1_34);
        // Every device consumes from a counter set in its own slice.
        for d in devices {
            let set = &d.consumes_counters.as_ref().unwrap()[0].counter_set;
            assert!(sets.iter().any(|s| &s.name == set), "{}", d.name);
        }
    }
}

#[test]
fn device_order_is_the_placement_order() {
    let gpus = [gpu(0, "H100-80GB"), gpu(1, "A100-SXM4-40GB")];
    let slices =
        desired_resource_slices("n", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let names: Vec<&str> = all_devices(&slices)
        .into_iter()
        .map(|d| d.name.as_str())
        .collect();
    let one_g: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with("gpu-0-mig-1g-10gb-") && !n.contains("-me-"))
        .collect();
    assert_eq!(one_g[0], "gpu-0-mig-1g-10gb-5");
    assert_eq!(one_g.last(), Some(&"gpu-0-mig-1g-10gb-0"));
    // 1g.10gb, which both models offer, is merged across them (placement::merge_models): the
    // A100's start 6 comes first. Every other device is GPU-major.
    let shared = |n: &&str| n.contains("-mig-1g-10gb-") && !n.contains("-me-");
    assert_eq!(
        names.iter().find(|n| shared(n)),
        Some(&"gpu-1-mig-1g-10gb-6")
    );
    let own: Vec<&str> = names.iter().copied().filter(|n| !shared(n)).collect();
    let first_gpu1 = own.iter().position(|n| n.starts_with("gpu-1-")).unwrap();
    assert!(own[first_gpu1..].iter().all(|n| n.starts_with("gpu-1-")));
}

#[test]
fn gpus_with_mig_off_offer_no_placements_and_empty_nodes() {
    let mut ampere_off = gpu(0, "A100-SXM4-40GB");
    ampere_off.mig_enabled = false;
    let mut hopper_off = gpu(1, "H100-80GB");
    hopper_off.mig_enabled = false;
    let slices = desired_resource_slices(
        "n",
        &[ampere_off, hopper_off],
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    // MIG mode is static: a Hopper with MIG off offers no placements even though it could be
    // switched on without a reset; each GPU is offered whole instead (tests/whole_gpus.rs).
    let names: Vec<&str> = all_devices(&slices)
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    let empty =
        desired_resource_slices("n", &[], ResourceSliceLayout::CountersWithDevices).unwrap();
    assert_eq!(empty.len(), 1);
    assert_eq!(empty[0].kind, ResourceSliceKind::Empty);
    assert!(empty[0].slice.spec.devices.is_none() && empty[0].slice.spec.shared_counters.is_none());
    assert_eq!(empty[0].slice.spec.pool.resource_slice_count, 1);
}

/// A made-up GPU with 65 whole-GPU profiles: 65 devices cannot share a slice with their
/// counter set on 1.34, but publish fine on 1.35+.
#[test]
fn gpu_too_large_for_1_34() {
    let mut text = String::from(
        "name = \"BIG\"\nproduct_name = \"Big\"\npci_device_ids = [0x000110DE]\narchitecture = \"Hopper\"\n\
         cuda_compute_capability = \"9.0\"\nmemory_mib = 100000\nmemory_slices = 1\ncompute_slices = 1\n\
         max_gpu_instances = 1\nmig_mode_change_requires_reset = false\n",
    );
    for id in 0..65 {
        text.push_str(&format!(
            "[[profiles]]\nid = {id}\nnvml_enum = \"NVML_GPU_INSTANCE_PROFILE_1_SLICE\"\nname = \"1g.{id}gb\"\n\
             compute_slices = 1\nmemory_mib = 1000\nmultiprocessors = 1\ncopy_engines = 1\ndecoders = 0\n\
             encoders = 0\njpeg_engines = 0\nofa_engines = 0\nmax_instances = 1\nmedia_extension = false\n\
             placement_size = 1\nplacement_starts = [0]\n\
             compute_instance = {{ id = 0, nvml_enum = \"NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE\" }}\n"
        ));
    }
    let model = Arc::new(parse_model("big.toml", &text).unwrap());
    let g = gpu_of(0, model);
    let e = desired_resource_slices(
        "n",
        std::slice::from_ref(&g),
        ResourceSliceLayout::CountersWithDevices,
    )
    .unwrap_err();
    assert!(e.to_string().contains("65 devices"), "{e}");
    let ok =
        desired_resource_slices("n", &[g], ResourceSliceLayout::SeparateCounterSlices).unwrap();
    assert_eq!(ok.len(), 1 + 2);
}

mod shared;
/// Whole GPUs (MIG mode off, `--whole-gpus`) beside MIG placements.
mod whole_gpus;
/// GPUs without MIG (T4, L4, …), served whole.
mod without_mig;
