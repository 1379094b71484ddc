//! DAS's shareable devices ([`shareable`]): what is left of DAS's slices once they go
//! (`dra_plugin::resourceslice::gates::without_shareable_devices`).

use super::*;
use crate::publish::resource_slices::{SharePolicy, SharedProfiles, SliceOptions};

fn without_shareable_devices(desired: Vec<ResourceSliceSpec>) -> Vec<ResourceSliceSpec> {
    rs::gates::without_shareable_devices(desired, shareable)
}

fn specs(gpus: &[GpuInfo], selectors: &[&str]) -> Vec<ResourceSliceSpec> {
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: selectors.iter().map(|s| s.to_string()).collect(),
            policy: SharePolicy::default(),
            ..Default::default()
        },
    };
    desired_resource_slices("n0", gpus, options)
        .unwrap()
        .into_iter()
        .map(|d| d.slice.spec)
        .collect()
}

fn device_names(specs: &[ResourceSliceSpec]) -> Vec<String> {
    specs
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect()
}

#[test]
fn the_shareable_devices_go_and_everything_else_stays_in_order() {
    let gpus = [
        GpuInfo::for_tests(0, "H100-80GB"),
        GpuInfo::for_tests(1, "H100-80GB"),
    ];
    let plain = specs(&gpus, &[]);
    let shared = specs(&gpus, &["1g"]);
    assert!(
        shared.len() > plain.len(),
        "the shareable devices fill slices of their own"
    );
    let left = without_shareable_devices(shared);
    assert_eq!(device_names(&left), device_names(&plain));
    // The slices left are those the node publishes without shares: counter slices included,
    // none left empty.
    assert_eq!(left, plain);
    // Nothing shareable: unchanged.
    assert_eq!(without_shareable_devices(plain.clone()), plain);
}

#[test]
fn a_device_is_shareable_by_its_flag_or_its_type() {
    let gpus = [GpuInfo::for_tests(0, "H100-80GB")];
    let mut shared = specs(&gpus, &["1g.10gb"]);
    // A device stored without `allowMultipleAllocations` still has type mig-shared.
    for d in shared
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
    {
        d.allow_multiple_allocations = None;
    }
    let left = without_shareable_devices(shared);
    assert!(!device_names(&left).iter().any(|n| n.ends_with("-shared")));
    assert_eq!(left, specs(&gpus, &[]));
    // A pool without devices (withdrawn, or no GPU) stays as it is.
    let empty = vec![ResourceSliceSpec::default()];
    assert_eq!(without_shareable_devices(empty.clone()), empty);
}
