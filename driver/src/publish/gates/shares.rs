//! What is published while the API server drops consumable capacity (pure; docs/design.md §7,
//! "Shared slices"): everything but the shareable devices.

use das_api::attributes as attr;
use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};

/// `desired` without its shareable devices (`allowMultipleAllocations: true`, or attribute
/// `type: mig-shared`). A slice that held devices and is left with none goes too (the rest keep
/// their order, and their pool's `resourceSliceCount` is the new count); counter slices and a
/// pool without devices stay as they are.
pub fn without_shareable_devices(desired: Vec<ResourceSliceSpec>) -> Vec<ResourceSliceSpec> {
    let before = desired.len();
    let mut left: Vec<ResourceSliceSpec> = desired
        .into_iter()
        .filter_map(|mut spec| {
            let Some(devices) = spec.devices.take() else {
                return Some(spec);
            };
            let had = !devices.is_empty();
            let kept: Vec<Device> = devices.into_iter().filter(|d| !shareable(d)).collect();
            if had && kept.is_empty() && spec.shared_counters.as_ref().is_none_or(Vec::is_empty) {
                return None;
            }
            spec.devices = Some(kept);
            Some(spec)
        })
        .collect();
    if left.len() != before {
        let count = left.len() as i64;
        for spec in &mut left {
            spec.pool.resource_slice_count = count;
        }
    }
    left
}

/// Whether `d` is a shareable device.
fn shareable(d: &Device) -> bool {
    d.allow_multiple_allocations == Some(true)
        || d.attributes
            .as_ref()
            .and_then(|a| a.get(attr::TYPE))
            .and_then(|t| t.string.as_deref())
            == Some(attr::TYPE_MIG_SHARED)
}

#[cfg(test)]
mod tests;
