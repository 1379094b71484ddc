//! The ResourceSlices to publish now (pure): the inventory's slices
//! ([`super::resource_slices`]) with what the node's state adds, as [`HealthFacts`]:
//!
//! - device taints of unhealthy GPUs and GPU instances ([`set_device_taints`]; docs/design.md
//!   §7, "Health"), so the scheduler stops allocating them (and, with `NoExecute`, evicts);
//! - no device overlapping a MIG instance that no claim holds ([`withdraw_overlapping`]), so no
//!   pod is allocated a placement no prepare can create. A whole GPU overlaps every MIG
//!   instance of its GPU (none can exist while its MIG mode is off; should one appear, the
//!   whole GPU is withdrawn);
//! - only the devices of its current MIG mode for a GPU whose mode switch failed
//!   ([`serve_only`]; docs/design.md §7, "MIG mode follows demand"): its whole GPU while MIG
//!   mode is off, its MIG placements while it is on;
//! - on each shareable device whose slice claims hold, the namespace it serves
//!   ([`set_share_namespaces`]; docs/design.md §7, "Shares are a tenant's own"), which
//!   das-webhook's selector compares with a new claim's.
//!
//! [`desired_slices`] is the one place that combines them. `crate::health` only reports the
//! facts; the publisher ([`super::Publisher::run_with_facts`]) applies this function to each
//! report and publishes the result.

use std::collections::BTreeMap;

use das_api::attributes as attr;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceTaint, ResourceSliceSpec};

use crate::gpu::Placement;
use crate::publish::devices::DeviceKind;

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
    /// GPUs that serve one kind of device only, by GPU index: a GPU published with both (DAS
    /// may switch its MIG mode) whose switch failed keeps its mode and serves only what that
    /// mode serves ([`DeviceKind::Mig`] with MIG mode on, [`DeviceKind::WholeGpu`] with it
    /// off). Reported by the request path, not the health monitor.
    pub serves_only: BTreeMap<u32, DeviceKind>,
    /// The `shareNamespace` attribute of the shareable devices whose slice claims hold, by
    /// device name: the namespace of those claims (or
    /// [`das_api::attributes::SHARE_NAMESPACE_SEVERAL`]). Reported by the request path from
    /// the checkpoint's records; empty where shares may cross namespaces.
    pub share_namespaces: BTreeMap<String, String>,
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
    serve_only(&mut specs, &facts.serves_only);
    set_share_namespaces(&mut specs, &facts.share_namespaces);
    specs
}

/// Sets the `shareNamespace` attribute of every shareable device (`type: mig-shared` or
/// `gpu-shared`) in
/// `specs` to its value in `namespaces` (by device name), and removes it from those not there;
/// other devices are left alone. Returns how many devices carry it.
pub(crate) fn set_share_namespaces(
    specs: &mut [ResourceSliceSpec],
    namespaces: &BTreeMap<String, String>,
) -> usize {
    let mut set = 0;
    for device in specs
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
        .filter(|d| type_of(d).is_some_and(attr::is_shared_type))
    {
        let attributes = device.attributes.get_or_insert_with(BTreeMap::new);
        match namespaces.get(&device.name) {
            Some(ns) => {
                let value = DeviceAttribute {
                    string: Some(ns.clone()),
                    ..Default::default()
                };
                attributes.insert(attr::SHARE_NAMESPACE.to_string(), value);
                set += 1;
            }
            None => {
                attributes.remove(attr::SHARE_NAMESPACE);
            }
        }
    }
    set
}

/// A published device's `type` attribute.
fn type_of(d: &Device) -> Option<&str> {
    d.attributes
        .as_ref()
        .and_then(|a| a.get(attr::TYPE))
        .and_then(|a| a.string.as_deref())
}

/// Removes from `specs` every device of a GPU in `only` that is not of the kind given for it
/// (by the device's `gpuIndex` and `type` attributes); returns how many were removed. Counter
/// sets stay.
pub(crate) fn serve_only(
    specs: &mut [ResourceSliceSpec],
    only: &BTreeMap<u32, DeviceKind>,
) -> usize {
    if only.is_empty() {
        return 0;
    }
    let other_kind = |d: &Device| {
        let Some((gpu, _)) = device_placement(d) else {
            return false;
        };
        only.get(&gpu)
            .is_some_and(|kind| (*kind == DeviceKind::WholeGpu) != is_whole_gpu(d))
    };
    let mut removed = 0;
    for spec in specs.iter_mut() {
        if let Some(devices) = spec.devices.as_mut() {
            let before = devices.len();
            devices.retain(|d| !other_kind(d));
            removed += before - devices.len();
        }
    }
    removed
}

/// Whether a published device is a whole GPU (its `type` attribute is `gpu`).
fn is_whole_gpu(d: &Device) -> bool {
    type_of(d) == Some(attr::TYPE_GPU)
}

/// Sets the taints of every device in `specs` to `taints_of(gpu, placement)`, from the device's
/// `gpuIndex`, `placementStart` and `placementSize` attributes, or for a whole GPU every memory
/// slice of its GPU (none when it returns none): a GPU-wide fault taints every device of the GPU,
/// its whole-GPU device included, a GPU instance's fault the devices overlapping its placement. Taints need the `DRADeviceTaints` feature (beta and on from 1.36); a server
/// without it drops them, which the publisher reports (docs/design.md §7, "Health").
pub(crate) fn set_device_taints(
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

/// A published device's GPU index and placement: a MIG device's from its `gpuIndex`,
/// `placementStart` and `placementSize` attributes; a whole GPU's (type `gpu`, no placement
/// attributes) is every memory slice of its GPU, read from the `memory-slice-<n>` counters it
/// consumes (all of them, docs/design.md §7, "Whole GPUs"). So a GPU-wide taint, keyed by that
/// placement as `crate::publish::devices::device_index` gives it (start 0, size the model's
/// memory slices), reaches it, and any MIG instance of its GPU overlaps it.
fn device_placement(d: &Device) -> Option<(u32, Placement)> {
    let int = |name: &str| {
        d.attributes
            .as_ref()
            .and_then(|a| a.get(name))
            .and_then(|a| a.int)
            .and_then(|i| u32::try_from(i).ok())
    };
    let gpu = int(attr::GPU_INDEX)?;
    if let (Some(start), Some(size)) = (int(attr::PLACEMENT_START), int(attr::PLACEMENT_SIZE)) {
        return Some((gpu, Placement { start, size }));
    }
    if !is_whole_gpu(d) {
        return None;
    }
    Some((gpu, consumed_memory_slices(d)))
}

/// The memory slices whose `memory-slice-<n>` counters a device consumes, as a placement from
/// the lowest to the highest (size 0 when it consumes none).
fn consumed_memory_slices(d: &Device) -> Placement {
    // `memory-slice-<n>` (das_api::counters::memory_slice).
    let slices: Vec<u32> = d
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| c.counters.keys())
        .filter_map(|k| k.strip_prefix("memory-slice-")?.parse().ok())
        .collect();
    let start = slices.iter().copied().min().unwrap_or(0);
    let end = slices.iter().copied().max().map_or(start, |m| m + 1);
    Placement {
        start,
        size: end - start,
    }
}

/// Removes from `specs` every device whose placement overlaps an instance in `held` (GPU index →
/// placements of MIG instances no claim holds); returns how many were removed. The scheduler
/// cannot allocate what is not published, so no pod waits on a prepare that cannot succeed.
/// Shared counters stay: the devices left consume them as before.
pub(crate) fn withdraw_overlapping(
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
