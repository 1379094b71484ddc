//! What is published while the API server drops consumable capacity (pure; KEP-5075):
//! everything but the shareable devices.

use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};

/// Which devices are shareable: the ones that must not be published once the server was seen
/// dropping consumable capacity. The default is [`allows_multiple_allocations`]; a driver that
/// also marks them otherwise (an attribute) says so with
/// [`crate::resourceslice::Publisher::with_shareable`].
pub type Shareable = fn(&Device) -> bool;

/// Whether `d` sets `allowMultipleAllocations: true`: the API's own mark of a shareable device.
pub fn allows_multiple_allocations(d: &Device) -> bool {
    d.allow_multiple_allocations == Some(true)
}

/// `desired` without its `shareable` devices. A slice that held devices and is left with none
/// goes too (the rest keep their order, and their pool's `resourceSliceCount` is the new count);
/// counter slices and a pool without devices stay as they are.
pub fn without_shareable_devices(
    desired: Vec<ResourceSliceSpec>,
    shareable: Shareable,
) -> Vec<ResourceSliceSpec> {
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

#[cfg(test)]
mod tests;
