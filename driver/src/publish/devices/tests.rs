//! Unit tests of [`super`] (`devices.rs`).

use std::collections::BTreeSet;

use super::*;
use crate::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};

fn gpu(index: u32, model: &str, mig_enabled: bool) -> GpuInfo {
    GpuInfo {
        minor: 10 + index,
        mig_enabled,
        ..GpuInfo::for_tests(index, model)
    }
}

#[test]
fn a_gpu_with_mig_off_is_one_whole_gpu_device() {
    let inv = [gpu(0, "A30", true), gpu(1, "A100-SXM4-40GB", false)];
    let map = device_index(&inv);
    assert_eq!(
        map["gpu-1"],
        DeviceRef {
            kind: DeviceKind::WholeGpu,
            gpu_index: 1,
            gpu_uuid: inv[1].uuid.clone(),
            gpu_minor: 11,
            profile: "gpu".into(),
            start: 0,
            size: 8,
            shared: false,
        }
    );
    assert_eq!(
        map["gpu-1-shared"],
        DeviceRef {
            shared: true,
            ..map["gpu-1"].clone()
        }
    );
    assert!(
        map.keys()
            .all(|n| n == "gpu-1" || n == "gpu-1-shared" || n.starts_with("gpu-0-mig-"))
    );
    let a30_placements: usize = inv[0]
        .model
        .profiles
        .iter()
        .map(|p| p.placement_starts.len())
        .sum();
    // Every placement and the whole GPU twice: exclusive and shareable.
    assert_eq!(map.len(), 2 * a30_placements + 2);
    let r = &map["gpu-0-mig-1g-6gb-3"];
    assert_eq!(
        (r.kind, r.profile.as_str(), r.start, r.size, r.shared),
        (DeviceKind::Mig, "1g.6gb", 3, 1, false)
    );
    let twin = &map["gpu-0-mig-1g-6gb-3-shared"];
    assert_eq!(
        twin,
        &DeviceRef {
            shared: true,
            ..r.clone()
        }
    );
    assert!(!map.contains_key("gpu-0"));
}

#[test]
fn the_index_names_exactly_the_published_devices() {
    let inv = [
        gpu(0, "H100-80GB", false),
        gpu(1, "H100-80GB", true),
        gpu(2, "A30", false),
    ];
    let slices =
        desired_resource_slices("n", &inv, ResourceSliceLayout::SeparateCounterSlices).unwrap();
    let published: BTreeSet<String> = slices
        .iter()
        .flat_map(|s| s.slice.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect();
    let index = device_index(&inv);
    let exclusive: BTreeSet<String> = index
        .iter()
        .filter(|(_, d)| !d.shared)
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(published, exclusive);
    // With every profile shared, the shareable twins are published too.
    let all = crate::publish::resource_slices::SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: crate::publish::resource_slices::SharedProfiles {
            selectors: (1..=8)
                .map(|g| format!("{g}g"))
                .chain(["gpu".to_string()])
                .collect(),
            policy: Default::default(),
            ..Default::default()
        },
    };
    let published: BTreeSet<String> = desired_resource_slices("n", &inv, all)
        .unwrap()
        .iter()
        .flat_map(|s| s.slice.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect();
    let indexed: BTreeSet<String> = index.into_keys().collect();
    assert_eq!(published, indexed);
    assert!(indexed.contains("gpu-0") && indexed.contains("gpu-2"));
    assert!(indexed.contains("gpu-0-shared") && indexed.contains("gpu-2-shared"));
}
