//! GPUs without MIG (T4, L4, …; docs/design.md §7, "Whole GPUs"): one whole-GPU device with
//! NVIDIA's full-GPU attributes, `memory` (NVML's total) and `multiprocessors`, a counter set of
//! `memory` and one memory slice, in both slice layouts, and first in the publish order.

use super::*;
use crate::gpu::builtin_models;

/// An L4 at `index` as the NVML backend reports one on a real node: NVML's total memory (here
/// 22 GiB, less than the data file's, as with ECC), PCI facts from sysfs, NUMA node 1.
fn l4(index: u32) -> GpuInfo {
    GpuInfo {
        memory_mib: 22 * 1024,
        numa_node: Some(1),
        brand: Some("Nvidia".into()),
        cuda_driver_version: Some("13.0".into()),
        pci_bus_id: Some("0000:3b:00.0".into()),
        pcie_root: Some("pci0000:3a".into()),
        ..gpu(index, "L4")
    }
}

fn set_of<'a>(slices: &'a [DesiredResourceSlice], name: &str) -> &'a CounterSet {
    slices
        .iter()
        .flat_map(|s| s.slice.spec.shared_counters.iter().flatten())
        .find(|c| c.name == name)
        .unwrap()
}

#[test]
fn a_gpu_without_mig_is_one_device_with_nvidias_full_gpu_attributes() {
    let g = l4(2);
    assert!(g.only_whole() && !g.offers_mig());
    let slices = desired_resource_slices(
        "n",
        std::slice::from_ref(&g),
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    let devices = all_devices(&slices);
    assert_eq!(devices.len(), 1);
    let d = find(&slices, "gpu-2");
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
            "productName",
            "resource.kubernetes.io/numaNode",
            "resource.kubernetes.io/pciBusID",
            "resource.kubernetes.io/pcieRoot",
            "type",
            "uuid"
        ]
    );
    let s = |k: &str| a[k].string.as_deref();
    assert_eq!(s("type"), Some("gpu"));
    assert_eq!(s("uuid"), Some(g.uuid.as_str()));
    assert_eq!(s("productName"), Some("NVIDIA L4"));
    // NVIDIA's DRA driver's spelling (go-nvlib `GetArchitectureAsString`).
    assert_eq!(s("architecture"), Some("Ada Lovelace"));
    assert_eq!(a["cudaComputeCapability"].version.as_deref(), Some("8.9.0"));
    assert_eq!(a["resource.kubernetes.io/numaNode"].int, Some(1));
    assert_eq!(s("resource.kubernetes.io/pcieRoot"), Some("pci0000:3a"));
    // Capacity: NVML's total memory and the data file's SM count, nothing else.
    let c = d.capacity.as_ref().unwrap();
    let caps: Vec<(&str, &str)> = c
        .iter()
        .map(|(k, v)| (k.as_str(), v.value.0.as_str()))
        .collect();
    assert_eq!(caps, [("memory", "22Gi"), ("multiprocessors", "58")]);
    // Its counter set: `memory` (NVML's total) and one memory slice, all of it consumed.
    let set = set_of(&slices, "gpu-2-counter-set");
    let counters: Vec<(&str, &str)> = set
        .counters
        .iter()
        .map(|(k, v)| (k.as_str(), v.value.0.as_str()))
        .collect();
    assert_eq!(counters, [("memory", "22Gi"), ("memory-slice-0", "1")]);
    let consumes = d.consumes_counters.as_ref().unwrap();
    assert_eq!(consumes.len(), 1);
    assert_eq!(consumes[0].counter_set, "gpu-2-counter-set");
    assert_eq!(consumes[0].counters, set.counters);
}

/// Every model without MIG publishes one device whose capacity is its memory and SM count and
/// which consumes its whole counter set; without an SM count (a GPU no data file knows) only
/// `memory`.
#[test]
fn every_model_without_mig_publishes_one_whole_device() {
    let models: Vec<_> = builtin_models()
        .unwrap()
        .iter()
        .filter(|m| !m.mig)
        .cloned()
        .collect();
    assert!(
        models.len() >= 7,
        "T4, A10, A10G, A40, L4, L40S, RTX 6000 Ada"
    );
    for m in &models {
        let g = gpu_of(0, m.clone());
        let slices =
            desired_resource_slices("n", &[g], ResourceSliceLayout::CountersWithDevices).unwrap();
        assert_eq!(slices.len(), 1, "{}", m.name);
        assert_eq!(slices[0].kind, ResourceSliceKind::Combined);
        let d = find(&slices, "gpu-0");
        let c = d.capacity.as_ref().unwrap();
        assert_eq!(
            c["memory"].value,
            bytes_quantity(m.memory_bytes()),
            "{}",
            m.name
        );
        assert_eq!(
            c["multiprocessors"].value,
            count_quantity(u64::from(m.multiprocessors.unwrap())),
            "{}",
            m.name
        );
        let set = set_of(&slices, "gpu-0-counter-set");
        assert_eq!(set.counters.len(), 2, "{}", m.name);
        assert_eq!(
            d.consumes_counters.as_ref().unwrap()[0].counters,
            set.counters
        );
    }
    let unknown = GpuModel {
        multiprocessors: None,
        ..(*models[0]).clone()
    };
    let d = whole_gpu_device(&gpu_of(0, Arc::new(unknown)));
    let caps: Vec<&String> = d.capacity.as_ref().unwrap().keys().collect();
    assert_eq!(caps, ["memory"]);
}

/// A mixed node (an L4 and an H100): the L4 is `gpu-0` alone, first; the H100's MIG devices keep
/// their order; both layouts carry each device's counter set.
#[test]
fn a_mixed_node_serves_the_l4_whole_and_the_h100_as_slices() {
    let gpus = [gpu(0, "L4"), gpu(1, "H100-80GB")];
    let h100_alone = desired_resource_slices(
        "n",
        &[gpu(1, "H100-80GB")],
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    for layout in [
        ResourceSliceLayout::SeparateCounterSlices,
        ResourceSliceLayout::CountersWithDevices,
    ] {
        let slices = desired_resource_slices("n", &gpus, layout).unwrap();
        let names: Vec<String> = all_devices(&slices)
            .iter()
            .map(|d| d.name.clone())
            .collect();
        assert_eq!(names[0], "gpu-0", "{layout:?}");
        assert!(!names.iter().any(|n| n.starts_with("gpu-0-")), "{names:?}");
        assert!(!names.contains(&"gpu-1".to_string()), "the H100 has MIG on");
        let mig: Vec<String> = names[1..].to_vec();
        let alone: Vec<String> = all_devices(&h100_alone)
            .iter()
            .map(|d| d.name.clone())
            .collect();
        assert_eq!(mig, alone, "{layout:?}");
        for s in &slices {
            let sets: Vec<&str> = s
                .slice
                .spec
                .shared_counters
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            for d in s.slice.spec.devices.iter().flatten() {
                let set = d.consumes_counters.as_ref().unwrap()[0]
                    .counter_set
                    .as_str();
                match layout {
                    ResourceSliceLayout::CountersWithDevices => {
                        assert!(sets.contains(&set), "{}: {set} not in its slice", d.name)
                    }
                    ResourceSliceLayout::SeparateCounterSlices => assert!(sets.is_empty()),
                }
            }
        }
    }
}
