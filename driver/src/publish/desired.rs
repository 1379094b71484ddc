//! The ResourceSlices to publish now (pure): the inventory's slices
//! ([`super::resource_slices`]) with what the node's state adds, as [`HealthFacts`]:
//!
//! - device taints of unhealthy GPUs and GPU instances ([`set_device_taints`]; docs/design.md
//!   §7, "Health"), so the scheduler stops allocating them (and, with `NoExecute`, evicts);
//! - no device overlapping a MIG instance that no claim holds ([`withdraw_overlapping`]), so no
//!   pod is allocated a placement no prepare can create.
//!
//! [`desired_slices`] is the one place that combines them. `crate::health` only reports the
//! facts; the publisher ([`super::Publisher::run_with_facts`]) applies this function to each
//! report and publishes the result.

use std::collections::BTreeMap;

use das_api::attributes as attr;
use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceSliceSpec};

use crate::gpu::Placement;

/// What publication needs to know beyond the inventory, as the health monitor reports it. The
/// default (no taints, nothing withdrawn) publishes the inventory's slices as they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthFacts {
    /// The taints of the devices at (GPU index, placement), in the order a device carries them;
    /// a device whose placement is not listed carries none. Keyed by placement rather than
    /// device name because health is a property of memory slices: every profile at the same
    /// placement carries the same taints.
    pub taints: BTreeMap<(u32, Placement), Vec<DeviceTaint>>,
    /// Placements of the MIG instances no claim holds, by GPU index: every device whose
    /// placement overlaps one is withdrawn (not published) until the instance is gone.
    pub withdrawn: BTreeMap<u32, Vec<Placement>>,
}

/// The specs to publish: `base` (the inventory's slices, without taints) with the taints of
/// `facts` set and the devices it withdraws removed. Counter sets stay as they are: the devices
/// left consume them as before. `facts` at its default gives `base` unchanged.
pub fn desired_slices(base: &[ResourceSliceSpec], facts: &HealthFacts) -> Vec<ResourceSliceSpec> {
    let mut specs = base.to_vec();
    set_device_taints(&mut specs, |gpu, placement| {
        facts
            .taints
            .get(&(gpu, placement))
            .cloned()
            .unwrap_or_default()
    });
    withdraw_overlapping(&mut specs, &facts.withdrawn);
    specs
}

/// Sets the taints of every device in `specs` to `taints_of(gpu, placement)`, from the device's
/// `gpuIndex`, `placementStart` and `placementSize` attributes (none when it returns none): a
/// GPU-wide fault taints every device of the GPU, a GPU instance's fault the devices overlapping
/// its placement. Taints need the `DRADeviceTaints` feature (beta and on from 1.36); a server
/// without it drops them, which the publisher reports (docs/design.md §7, "Health").
pub fn set_device_taints(
    specs: &mut [ResourceSliceSpec],
    taints_of: impl Fn(u32, Placement) -> Vec<DeviceTaint>,
) {
    for device in specs
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
    {
        device.taints = device_placement(device)
            .map(|(gpu, placement)| taints_of(gpu, placement))
            .filter(|t| !t.is_empty());
    }
}

/// A published device's GPU index and placement, from its attributes.
fn device_placement(d: &Device) -> Option<(u32, Placement)> {
    let int = |name: &str| {
        d.attributes
            .as_ref()
            .and_then(|a| a.get(name))
            .and_then(|a| a.int)
            .and_then(|i| u32::try_from(i).ok())
    };
    let placement = Placement {
        start: int(attr::PLACEMENT_START)?,
        size: int(attr::PLACEMENT_SIZE)?,
    };
    Some((int(attr::GPU_INDEX)?, placement))
}

/// Removes from `specs` every device whose placement overlaps an instance in `held` (GPU index →
/// placements of MIG instances no claim holds); returns how many were removed. The scheduler
/// cannot allocate what is not published, so no pod waits on a prepare that cannot succeed.
/// Shared counters stay: the devices left consume them as before.
pub fn withdraw_overlapping(
    specs: &mut [ResourceSliceSpec],
    held: &BTreeMap<u32, Vec<Placement>>,
) -> usize {
    let blocked = |d: &Device| {
        device_placement(d).is_some_and(|(gpu, placement)| {
            held.get(&gpu)
                .is_some_and(|ps| ps.iter().any(|p| p.mask() & placement.mask() != 0))
        })
    };
    let mut removed = 0;
    for spec in specs.iter_mut() {
        if let Some(devices) = spec.devices.as_mut() {
            let before = devices.len();
            devices.retain(|d| !blocked(d));
            removed += before - devices.len();
        }
    }
    removed
}

#[cfg(test)]
mod tests;
