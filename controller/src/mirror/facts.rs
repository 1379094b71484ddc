//! The device facts an AllocationClaim needs (profile, parent GPU, placement, health), read from
//! the published ResourceSlices' attributes, counters and taints (docs/design.md §3, §7) or from
//! the node plugin's device status data, and indexed by (pool, device).
//!
//! A whole GPU (`type: gpu`, docs/design.md §7, "Whole GPUs") has no profile or placement
//! attributes: its profile is [`WHOLE_GPU_PROFILE`], its GPU UUID the `uuid` attribute, and its
//! placement every memory slice of the GPU, `{0, N}`, N being the `memory-slice-<n>` counters it
//! consumes.

use std::collections::BTreeMap;

use das_api::allocation::MigPlacement;
use das_api::attributes as attr;
use das_api::claim_status::DeviceStatusData;
use das_api::health_taints;
use das_api::{DRIVER_NAME, WHOLE_GPU_PROFILE};
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, Device, DeviceAttribute, DeviceTaint, ResourceSlice,
};

/// Where a published device is: the facts an AllocationClaim needs from the ResourceSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// MIG profile, e.g. `1g.10gb`; [`WHOLE_GPU_PROFILE`] for a whole GPU.
    pub profile: String,
    /// UUID of the parent GPU.
    pub gpu_uuid: String,
    /// Placement on the GPU.
    pub placement: MigPlacement,
    /// Health from the device's DAS taints; `None` when the device is not published (facts
    /// from the plugin's status data).
    pub health: Option<DeviceHealth>,
}

/// Health of a published device, read from the taints the node plugin puts on every device of
/// an unhealthy GPU ([`das_api::health_taints`], docs/design.md §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceHealth {
    /// No DAS health taint.
    Healthy,
    /// At least one DAS health taint: the condition's reason and message.
    Unhealthy {
        /// `GPULost`, `XID` or `UncorrectableECC` (the first taint's).
        reason: String,
        /// Every DAS taint, as `key=value:effect`.
        message: String,
    },
}

impl DeviceHealth {
    /// Health from `d`'s taints; taints of other owners do not count.
    pub fn of_device(d: &Device) -> Self {
        Self::of_taints(d.taints.as_deref().unwrap_or_default())
    }

    /// Health from a device's taints (`spec.devices[].taints`); taints of other owners do not
    /// count.
    pub fn of_taints(taints: &[DeviceTaint]) -> Self {
        let ours: Vec<_> = taints
            .iter()
            .filter_map(|t| Some((health_reason(&t.key)?, t)))
            .collect();
        let Some((reason, _)) = ours.first() else {
            return Self::Healthy;
        };
        let message = ours
            .iter()
            .map(|(_, t)| {
                format!(
                    "{}={}:{}",
                    t.key,
                    t.value.as_deref().unwrap_or(""),
                    t.effect
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        Self::Unhealthy {
            reason: (*reason).to_string(),
            message: format!("the GPU of this device is unhealthy: {message}"),
        }
    }
}

/// Condition reason for a DAS health taint key; `None` for another key.
fn health_reason(key: &str) -> Option<&'static str> {
    match key {
        health_taints::GPU_LOST => Some("GPULost"),
        health_taints::XID => Some("XID"),
        health_taints::ECC => Some("UncorrectableECC"),
        _ => None,
    }
}

/// Published devices of our driver by (pool, device name).
#[derive(Debug, Default, Clone)]
pub struct DeviceIndex(BTreeMap<(String, String), DeviceFacts>);

impl DeviceIndex {
    /// Indexes the devices of our driver in `slices` (other drivers' slices are skipped).
    pub fn from_slices<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>) -> Self {
        let mut index = BTreeMap::new();
        for s in slices.into_iter().filter(|s| s.spec.driver == DRIVER_NAME) {
            for d in s.spec.devices.iter().flatten() {
                if let Some(f) = facts_of_device(d) {
                    index.insert((s.spec.pool.name.clone(), d.name.clone()), f);
                }
            }
        }
        Self(index)
    }

    /// Indexes facts gathered elsewhere (the controller's compact slice cache,
    /// `crate::published`), by (pool, device name).
    pub fn from_facts(facts: impl IntoIterator<Item = ((String, String), DeviceFacts)>) -> Self {
        Self(facts.into_iter().collect())
    }

    /// Facts of `device` in `pool`, if published.
    pub fn get(&self, pool: &str, device: &str) -> Option<&DeviceFacts> {
        self.0.get(&(pool.to_string(), device.to_string()))
    }

    /// Number of indexed devices.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no device is indexed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A device's attributes (`spec.devices[].attributes`), by name.
pub type Attributes = BTreeMap<String, DeviceAttribute>;

/// An attribute by its short name or fully qualified (`mig.das.com/<name>`).
fn attribute<'a>(attrs: &'a Attributes, name: &str) -> Option<&'a DeviceAttribute> {
    attrs
        .get(name)
        .or_else(|| attrs.get(&format!("{DRIVER_NAME}/{name}")))
}

fn int_attribute(attrs: &Attributes, name: &str) -> Option<i32> {
    attribute(attrs, name)?
        .int
        .and_then(|v| i32::try_from(v).ok())
}

fn string_attribute(attrs: &Attributes, name: &str) -> Option<String> {
    attribute(attrs, name)?.string.clone()
}

/// Facts from a device's attributes, counters and taints (docs/design.md §3); `None` if one is
/// missing.
fn facts_of_device(d: &Device) -> Option<DeviceFacts> {
    let memory_slices = d
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| c.counters.keys())
        .filter(|k| is_memory_slice(k))
        .count();
    facts_of(
        d.attributes.as_ref(),
        d.taints.as_deref(),
        u32::try_from(memory_slices).unwrap_or(u32::MAX),
    )
}

/// Prefix of the per-memory-slice counters, `memory-slice-<n>` (docs/design.md §3,
/// [`das_api::counters::memory_slice`]).
const MEMORY_SLICE_COUNTER_PREFIX: &str = "memory-slice-";

/// Whether counter `name` is a memory slice's.
pub fn is_memory_slice(name: &str) -> bool {
    name.starts_with(MEMORY_SLICE_COUNTER_PREFIX)
}

/// Facts from a device's attributes, taints and the number of `memory-slice-<n>` counters it
/// consumes (`memory_slices`): of a MIG device the attributes `profile`, `parentUUID`,
/// `placementStart` and `placementSize` (short or qualified names, docs/design.md §3); of a
/// whole GPU or a share of one (`type: gpu` or `gpu-shared`) the attribute `uuid` and `memory_slices` as its placement `{0, N}`;
/// and the DAS health taints. `None` if an attribute is missing, or a whole GPU consumes no
/// memory slice (an API server without `DRAPartitionableDevices` drops the counters; the
/// plugin's status data then says where it is). Everything the mirror reads of a published
/// device.
pub fn facts_of(
    attrs: Option<&Attributes>,
    taints: Option<&[DeviceTaint]>,
    memory_slices: u32,
) -> Option<DeviceFacts> {
    let attrs = attrs?;
    if string_attribute(attrs, attr::TYPE).is_some_and(|t| attr::is_whole_gpu_type(&t)) {
        return Some(DeviceFacts {
            profile: WHOLE_GPU_PROFILE.to_string(),
            gpu_uuid: string_attribute(attrs, attr::UUID)?,
            placement: MigPlacement {
                start: 0,
                size: i32::try_from(memory_slices).ok().filter(|n| *n > 0)?,
            },
            health: Some(DeviceHealth::of_taints(taints.unwrap_or_default())),
        });
    }
    Some(DeviceFacts {
        profile: string_attribute(attrs, attr::PROFILE)?,
        gpu_uuid: string_attribute(attrs, attr::PARENT_UUID)?,
        placement: MigPlacement {
            start: int_attribute(attrs, attr::PLACEMENT_START)?,
            size: int_attribute(attrs, attr::PLACEMENT_SIZE)?,
        },
        health: Some(DeviceHealth::of_taints(taints.unwrap_or_default())),
    })
}

/// Facts from the node plugin's device status data.
pub(super) fn facts_of_status(s: &AllocatedDeviceStatus) -> Option<DeviceFacts> {
    let data = DeviceStatusData::of(s)?;
    Some(DeviceFacts {
        profile: data.profile,
        gpu_uuid: data.gpu_uuid,
        placement: data.placement,
        health: None,
    })
}
