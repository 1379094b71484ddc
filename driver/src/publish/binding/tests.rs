//! Unit tests of [`super`] (`binding.rs`).

use super::*;
use crate::gpu::GpuInfo;
use crate::publish::resource_slices::{
    ResourceSliceLayout, SharePolicy, SharedProfiles, SliceOptions, desired_resource_slices,
};

fn version(major: u32, minor: u32) -> ServerVersion {
    ServerVersion {
        major,
        minor,
        patch: 0,
    }
}

fn slices() -> Vec<DesiredResourceSlice> {
    let mig = GpuInfo::for_tests(0, "A30");
    let mut whole = GpuInfo::for_tests(1, "A30");
    whole.mig_enabled = false;
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: vec!["1g".into()],
            policy: SharePolicy::default(),
            ..Default::default()
        },
    };
    desired_resource_slices("node-a", &[mig, whole], options).unwrap()
}

fn devices(slices: &[DesiredResourceSlice]) -> Vec<&Device> {
    slices
        .iter()
        .flat_map(|s| s.slice.spec.devices.iter().flatten())
        .collect()
}

#[test]
fn binding_conditions_need_kubernetes_1_36() {
    assert!(binding_supported(version(1, 36)).is_ok());
    assert!(binding_supported(version(1, 37)).is_ok());
    let e = binding_supported(version(1, 35)).unwrap_err();
    assert!(
        e.contains("DRADeviceBindingConditions") && e.contains("1.36"),
        "{e}"
    );
    assert!(binding_supported(version(1, 34)).is_err());
    assert!(binding_supported(version(2, 0)).is_err());
}

#[test]
fn off_no_device_has_binding_conditions() {
    let plain = slices();
    assert!(!devices(&plain).is_empty());
    for d in devices(&plain) {
        assert_eq!(d.binding_conditions, None, "{}", d.name);
        assert_eq!(d.binding_failure_conditions, None, "{}", d.name);
    }
}

#[test]
fn on_every_mig_device_has_them_and_whole_gpus_have_none() {
    let with = with_binding_conditions(slices());
    let (mut mig, mut shared, mut whole) = (0, 0, 0);
    for d in devices(&with) {
        let kind = d.attributes.as_ref().unwrap()[attr::TYPE].string.clone();
        match kind.as_deref() {
            Some(attr::TYPE_GPU) => {
                whole += 1;
                assert_eq!(d.binding_conditions, None);
                assert_eq!(d.binding_failure_conditions, None);
                continue;
            }
            Some(attr::TYPE_MIG_SHARED) => shared += 1,
            _ => mig += 1,
        }
        assert_eq!(
            d.binding_conditions.as_deref(),
            Some(&["mig.das.com/SliceReady".to_string()][..])
        );
        assert_eq!(
            d.binding_failure_conditions.as_deref(),
            Some(&["mig.das.com/SliceFailed".to_string()][..])
        );
    }
    assert!(
        mig > 0 && shared > 0 && whole == 1,
        "{mig} {shared} {whole}"
    );
}

#[test]
fn without_them_a_device_is_as_before() {
    let plain = slices();
    let mut with = with_binding_conditions(plain.clone());
    for s in &mut with {
        for d in s.slice.spec.devices.iter_mut().flatten() {
            without_binding_conditions(d);
        }
    }
    assert_eq!(with, plain);
}
