//! Whole-GPU devices (docs/design.md §3 and §7, "Whole GPUs"): their shape, the counters they
//! consume (every counter of the GPU's set at its full value), and where they are listed.

use super::*;
use crate::gpu::builtin_models;

fn off(index: u32, model: &str) -> GpuInfo {
    let mut g = gpu(index, model);
    g.mig_enabled = false;
    g
}

fn names(slices: &[DesiredResourceSlice]) -> Vec<String> {
    all_devices(slices).iter().map(|d| d.name.clone()).collect()
}

fn set_of<'a>(slices: &'a [DesiredResourceSlice], name: &str) -> &'a CounterSet {
    slices
        .iter()
        .flat_map(|s| s.slice.spec.shared_counters.iter().flatten())
        .find(|c| c.name == name)
        .unwrap()
}

#[test]
fn a_whole_gpu_device_has_the_designed_shape() {
    let g = located(off(3, "H100-80GB"));
    let slices = desired_resource_slices(
        "node-a",
        std::slice::from_ref(&g),
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    assert_eq!(names(&slices), ["gpu-3"]);
    let d = find(&slices, "gpu-3");
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
            "productName",
            "resource.kubernetes.io/pciBusID",
            "resource.kubernetes.io/pcieRoot",
            "type",
            "uuid"
        ]
    );
    assert_eq!(a["type"].string.as_deref(), Some("gpu"));
    assert_eq!(a["uuid"].string.as_deref(), Some(g.uuid.as_str()));
    assert_eq!(a["gpuIndex"].int, Some(3));
    assert_eq!(
        a["productName"].string.as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(a["architecture"].string.as_deref(), Some("Hopper"));
    assert_eq!(a["cudaComputeCapability"].version.as_deref(), Some("9.0.0"));
    assert_eq!(a["driverVersion"].version.as_deref(), Some("580.95.5"));
    assert_eq!(a["brand"].string.as_deref(), Some("Nvidia"));
    assert_eq!(a["cudaDriverVersion"].version.as_deref(), Some("13.0.0"));
    assert_eq!(
        a["resource.kubernetes.io/pciBusID"].string.as_deref(),
        Some("0000:3b:00.0")
    );
    assert_eq!(
        a["resource.kubernetes.io/pcieRoot"].string.as_deref(),
        Some("pci0000:3a")
    );
    let c = d.capacity.as_ref().unwrap();
    // The model's total memory (81559 MiB), not the counter set's 81152 MiB of MIG memory.
    assert_eq!(c["memory"].value.0, "81559Mi");
    assert_eq!(c["multiprocessors"].value.0, "132");
    assert_eq!(c.len(), 7);
    assert!(a.len() + c.len() <= MAX_ATTRIBUTES_AND_CAPACITIES);
    let consumes = d.consumes_counters.as_ref().unwrap();
    assert_eq!(consumes.len(), 1);
    assert_eq!(consumes[0].counter_set, "gpu-3-counter-set");
    assert_eq!(
        consumes[0].counters,
        set_of(&slices, "gpu-3-counter-set").counters
    );
    assert!(d.taints.is_none());
}

#[test]
fn a_whole_gpu_consumes_every_counter_at_its_full_value_on_every_model() {
    // Models without MIG: `without_mig.rs`.
    for model in builtin_models().unwrap().iter().filter(|m| m.mig) {
        let on = gpu_of(0, model.clone());
        let mut whole = gpu_of(1, model.clone());
        whole.mig_enabled = false;
        let slices = desired_resource_slices(
            "n",
            &[on, whole],
            ResourceSliceLayout::SeparateCounterSlices,
        )
        .unwrap();
        let set = set_of(&slices, "gpu-1-counter-set");
        // The same counter set as a GPU of the model with MIG on.
        assert_eq!(
            set.counters,
            set_of(&slices, "gpu-0-counter-set").counters,
            "{}",
            model.name
        );
        assert_eq!(
            (0..model.memory_slices)
                .filter(|n| set.counters.contains_key(&format!("memory-slice-{n}")))
                .count() as u32,
            model.memory_slices
        );
        let d = find(&slices, "gpu-1");
        assert_eq!(consumed(d), {
            set.counters
                .iter()
                .map(|(k, v)| (k.clone(), v.value.0.clone()))
                .collect::<BTreeMap<_, _>>()
        });
        assert_eq!(
            d.capacity.as_ref().unwrap()["memory"].value,
            bytes_quantity(model.memory_bytes()),
            "{}",
            model.name
        );
        // Only the GPU with MIG on has MIG devices.
        assert!(
            names(&slices)
                .iter()
                .all(|n| n == "gpu-1" || n.starts_with("gpu-0-mig-")),
            "{}",
            model.name
        );
    }
}

/// GPUs offered only whole come first; a switchable GPU's whole device after the devices of its
/// GPU and the lower ones (docs/design.md §5).
#[test]
fn gpus_offered_only_whole_come_first_and_switchable_ones_after_their_slices() {
    let switchable = |index| GpuInfo {
        mig_switch: crate::gpu::MigSwitch::Allowed,
        ..gpu(index, "H100-80GB")
    };
    let gpus = [
        switchable(0),
        off(1, "A100-SXM4-40GB"),
        gpu(2, "H100-80GB"),
        off(3, "A30"),
        switchable(4),
    ];
    let slices =
        desired_resource_slices("n", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let listed = names(&slices);
    let at = |n: &str| listed.iter().position(|x| x == n).unwrap();
    let last_of = |prefix: &str| listed.iter().rposition(|x| x.starts_with(prefix)).unwrap();
    assert_eq!((at("gpu-1"), at("gpu-3")), (0, 1), "{listed:?}");
    assert!(listed[2].starts_with("gpu-0-mig-"), "{listed:?}");
    assert_eq!(at("gpu-0"), last_of("gpu-0-") + 1);
    assert_eq!(at("gpu-4"), listed.len() - 1);
    assert_eq!(at("gpu-4"), last_of("gpu-4-") + 1);
    // The MIG devices keep the order they have without whole GPUs.
    let mig_only: Vec<String> = listed
        .iter()
        .filter(|n| n.contains("-mig-"))
        .cloned()
        .collect();
    let without = desired_resource_slices(
        "n",
        &[
            gpu(0, "H100-80GB"),
            gpu(2, "H100-80GB"),
            gpu(4, "H100-80GB"),
        ],
        ResourceSliceLayout::SeparateCounterSlices,
    )
    .unwrap();
    assert_eq!(mig_only, names(&without));
    // On 1.34 a GPU's devices stay in its slice: GPUs in index order whatever their kind.
    let combined =
        desired_resource_slices("n", &gpus, ResourceSliceLayout::CountersWithDevices).unwrap();
    let listed = names(&combined);
    let first = |prefix: &str| listed.iter().position(|x| x.starts_with(prefix)).unwrap();
    assert!(first("gpu-0") < first("gpu-1") && first("gpu-1") < first("gpu-2-"));
}

#[test]
fn layouts_carry_the_counter_set_of_a_whole_gpu() {
    let gpus: Vec<GpuInfo> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                gpu(i, "H100-80GB")
            } else {
                off(i, "H100-80GB")
            }
        })
        .collect();
    // 1.34: each device shares a slice with the counter set it consumes from.
    let combined =
        desired_resource_slices("n", &gpus, ResourceSliceLayout::CountersWithDevices).unwrap();
    for s in &combined {
        let spec = &s.slice.spec;
        let sets = spec.shared_counters.as_ref().unwrap();
        let devices = spec.devices.as_ref().unwrap();
        assert!(devices.len() <= MAX_DEVICES_PER_SLICE);
        assert!(sets.iter().map(|c| c.counters.len()).sum::<usize>() <= MAX_COUNTERS_PER_SET);
        assert!(
            devices.iter().map(consumption_count).sum::<usize>()
                <= MAX_DEVICE_COUNTERS_PER_SLICE_1_34
        );
        for d in devices {
            let set = &d.consumes_counters.as_ref().unwrap()[0].counter_set;
            assert!(sets.iter().any(|s| &s.name == set), "{}", d.name);
        }
    }
    assert_eq!(all_devices(&combined).len(), 4 * 25 + 4);
    // 1.35+: 8 counter sets in one counter slice, then the devices.
    let separate =
        desired_resource_slices("n", &gpus, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    assert_eq!(separate[0].kind, ResourceSliceKind::Counters);
    assert_eq!(
        separate[0]
            .slice
            .spec
            .shared_counters
            .as_ref()
            .unwrap()
            .len(),
        8
    );
    assert_eq!(all_devices(&separate).len(), 4 * 25 + 4);
}
