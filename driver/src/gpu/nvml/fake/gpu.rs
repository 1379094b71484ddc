//! One fake GPU's hardware state (its GPU and compute instances, MIG device slots) and the
//! rules NVML applies to it: the order of GI IDs, free MIG device slots, and the return codes of
//! placement conflicts and CI profiles.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::FakeGpuSpec;
use crate::gpu::layout::{Conflict, Occupancy, Placement};
use crate::gpu::model::GpuModel;
use crate::gpu::nvml::{CI_ENUMS, CI_PROFILE_ENUM_COUNT, GiInfo, MigModeState, code};

/// GI IDs in the order the driver hands them out (observed on A100 and H100, docs/reference/mig.md, "Create and destroy").
pub(super) const GI_ID_ORDER: [u32; 15] = [9, 7, 8, 11, 12, 13, 14, 1, 2, 3, 4, 5, 6, 10, 0];

/// A compute instance.
#[derive(Debug)]
pub(super) struct FakeCi {
    /// CI profile ID (= its enum).
    pub(super) profile_id: u32,
    /// Compute slices it takes of its GI.
    pub(super) slices: u32,
    /// Its MIG device slot (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub(super) slot: u32,
    /// `MIG-…` UUID.
    pub(super) uuid: String,
    /// A process uses it: destroying it returns `IN_USE`.
    pub(super) busy: bool,
}

/// A GPU instance.
#[derive(Debug)]
pub(super) struct FakeGi {
    /// Index of its profile in the model's profile list.
    pub(super) profile: usize,
    /// First memory slice of its placement.
    pub(super) start: u32,
    /// Its compute instances by CI ID.
    pub(super) cis: BTreeMap<u32, FakeCi>,
}

/// One fake GPU's state.
#[derive(Debug)]
pub(super) struct FakeGpu {
    /// What it is.
    pub(super) spec: FakeGpuSpec,
    /// `/dev/nvidia<minor>`.
    pub(super) minor: u32,
    /// Current and pending MIG mode.
    pub(super) mig: MigModeState,
    /// Fell off the bus: every call on it returns `GPU_IS_LOST`.
    pub(super) lost: bool,
    /// A MIG mode change waits for a reset even on Hopper and newer
    /// ([`super::FakeNvml::set_needs_reset`]).
    pub(super) needs_reset: bool,
    /// Memory slices and counters its GIs take (`None` without a model).
    pub(super) occupancy: Option<Occupancy>,
    /// Its GPU instances by GI ID.
    pub(super) gis: BTreeMap<u32, FakeGi>,
}

impl FakeGpu {
    /// The model; `NOT_SUPPORTED` on a GPU without MIG (no model, or a model without MIG).
    pub(super) fn model(&self) -> Result<&Arc<GpuModel>, u32> {
        self.spec
            .model
            .as_ref()
            .filter(|m| m.mig)
            .ok_or(code::NOT_SUPPORTED)
    }

    /// Model and MIG mode on: what every instance call needs.
    pub(super) fn mig_model(&self) -> Result<Arc<GpuModel>, u32> {
        let model = self.model()?.clone();
        if !self.mig.current {
            return Err(code::NOT_SUPPORTED);
        }
        Ok(model)
    }

    /// The model and the index of the profile with real ID `profile_id`; `INVALID_ARGUMENT` when
    /// the model has none.
    pub(super) fn profile_by_id(&self, profile_id: u32) -> Result<(Arc<GpuModel>, usize), u32> {
        let model = self.model()?.clone();
        let i = model
            .profiles
            .iter()
            .position(|p| p.id == profile_id)
            .ok_or(code::INVALID_ARGUMENT)?;
        Ok((model, i))
    }

    /// GI `gi_id`; `NOT_SUPPORTED` with MIG mode off, `NOT_FOUND` when it does not exist.
    pub(super) fn gi(&mut self, gi_id: u32) -> Result<&mut FakeGi, u32> {
        self.mig_model()?;
        self.gis.get_mut(&gi_id).ok_or(code::NOT_FOUND)
    }

    /// What `nvmlGpuInstanceGetInfo` reports for GI `id`.
    pub(super) fn gi_info(&self, id: u32, gi: &FakeGi) -> GiInfo {
        let p = &self
            .spec
            .model
            .as_ref()
            .expect("GIs exist only with a model")
            .profiles[gi.profile];
        GiInfo {
            id,
            profile_id: p.id,
            placement: Placement {
                start: gi.start,
                size: p.placement_size,
            },
        }
    }

    /// Compute slices of the GI's profile.
    pub(super) fn gi_slices(&self, gi: &FakeGi) -> u32 {
        self.spec
            .model
            .as_ref()
            .map_or(0, |m| m.profiles[gi.profile].compute_slices)
    }

    /// The lowest MIG device slot no CI holds.
    pub(super) fn free_slot(&self) -> Option<u32> {
        let max = self.spec.model.as_ref()?.max_gpu_instances;
        (0..max).find(|s| {
            !self
                .gis
                .values()
                .flat_map(|g| g.cis.values())
                .any(|c| c.slot == *s)
        })
    }
}

/// NVML's return code for a placement conflict: a start not in the profile's list is
/// `INVALID_ARGUMENT`, anything else `INSUFFICIENT_RESOURCES`.
pub(super) fn conflict_code(c: &Conflict) -> u32 {
    match c {
        Conflict::StartNotAllowed { .. } => code::INVALID_ARGUMENT,
        _ => code::INSUFFICIENT_RESOURCES,
    }
}

/// Compute slices of CI profile enum `e`; `INVALID_ARGUMENT` past the last enum.
pub(super) fn ci_slices(e: u32) -> Result<u32, u32> {
    if e >= CI_PROFILE_ENUM_COUNT {
        return Err(code::INVALID_ARGUMENT);
    }
    Ok(CI_ENUMS[e as usize].1)
}
