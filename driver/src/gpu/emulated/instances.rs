//! MIG instances of the emulated GPUs: create (the hardware rules of [`Occupancy`], GI IDs
//! from the "driver", a fresh MIG UUID), destroy, and the records as [`MigInstance`]s. Every
//! change is written to the state file before it is kept in memory.

use super::identity::format_uuid;
use super::state::{
    GpuState, InstanceState, StateFile, gpu_state, gpu_state_mut, write_atomically,
};
use super::{EmuGpu, EmulatedBackend, GI_ID_SPACE, lock};
use crate::gpu::layout::{Conflict, Occupancy, Placement};
use crate::gpu::{BackendError, MigInstance, Target, ci_cap_minor, gi_cap_minor};

impl EmulatedBackend {
    /// Destroys the instance at memory slice `start` of GPU `gpu_index` as an administrator
    /// would (no latency, no faults).
    pub(super) fn destroy_at(&self, gpu_index: u32, start: u32) -> Result<(), BackendError> {
        let gpu = self.gpu(gpu_index, Target::gpu(gpu_index))?;
        let gi_id = {
            let state = lock(&self.state);
            gpu_state(&state, gpu.index)
                .instances
                .iter()
                .find(|i| i.start == start)
                .map(|i| i.gi_id)
        };
        let Some(gi_id) = gi_id else {
            return Err(BackendError::NotFound {
                target: Target::gpu(gpu_index),
                reason: format!("no instance at memory slice {start}"),
            });
        };
        self.destroy(gpu, gi_id)
    }

    /// Creates an instance as an administrator would with `nvidia-smi` (marked `created_by_das =
    /// false`), without latency or faults: for tests of start-up reconciliation.
    pub(crate) fn create_foreign_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let gpu = self.gpu(gpu_index, Target::gpu(gpu_index))?;
        self.create(gpu, profile, start, false)
    }

    pub(super) fn create(
        &self,
        gpu: &EmuGpu,
        profile: &str,
        start: u32,
        by_das: bool,
    ) -> Result<MigInstance, BackendError> {
        if !gpu.model.mig {
            // NVML's answer to a GPU-instance create on a GPU without MIG.
            return Err(BackendError::NotSupported {
                target: Target::at(gpu.index, profile, Placement { start, size: 0 }),
                reason: format!("{} has no MIG (it is served whole)", gpu.model.name),
            });
        }
        let (profile_idx, size) = match gpu.model.profile(profile) {
            Some((i, p)) => (i, p.placement_size),
            None => {
                return Err(BackendError::InvalidArgument {
                    target: Target::at(gpu.index, profile, Placement { start, size: 0 }),
                    reason: format!(
                        "{} has no profile {profile}; valid: {}",
                        gpu.model.name,
                        gpu.model.profile_names()
                    ),
                });
            }
        };
        let target = Target::at(gpu.index, profile, Placement { start, size });
        let mut state = lock(&self.state);
        let gs = gpu_state(&state, gpu.index);
        if !gs.mig_enabled {
            // NVML's answer to a GPU-instance create with MIG mode off.
            return Err(BackendError::NotSupported {
                target,
                reason: "MIG mode is off on this GPU (it is served whole)".into(),
            });
        }
        check_create(gpu, gs, profile_idx, start, &target)?;
        let gi_id = lowest_free_gi(gs).ok_or_else(|| BackendError::InsufficientResources {
            target: target.clone(),
            reason: format!("all {GI_ID_SPACE} GPU-instance IDs are in use"),
        })?;
        let mut next = state.clone();
        let instance = InstanceState {
            gi_id,
            ci_id: 0,
            profile: profile.to_string(),
            start,
            mig_uuid: format_uuid(
                "MIG-",
                &[gpu.uuid.as_bytes(), &next.next_serial.to_le_bytes()],
            ),
            created_by_das: by_das,
        };
        next.next_serial += 1;
        gpu_state_mut(&mut next, gpu.index)
            .instances
            .push(instance.clone());
        self.persist(&next, &target)?;
        *state = next;
        Ok(to_instance(gpu, &instance))
    }

    pub(super) fn destroy(&self, gpu: &EmuGpu, gi_id: u32) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        let gs = gpu_state(&state, gpu.index);
        let Some(pos) = gs.instances.iter().position(|i| i.gi_id == gi_id) else {
            return Err(BackendError::NotFound {
                target: Target {
                    gi_id: Some(gi_id),
                    ..Target::gpu(gpu.index)
                },
                reason: "no such GPU instance".into(),
            });
        };
        let inst = &gs.instances[pos];
        let target = Target {
            gi_id: Some(gi_id),
            ..instance_target(gpu, inst)
        };
        let mut next = state.clone();
        // The compute instance goes first, then the GPU instance (docs/reference/mig.md, "Create and destroy"); both are
        // one record here.
        gpu_state_mut(&mut next, gpu.index).instances.remove(pos);
        self.persist(&next, &target)?;
        *state = next;
        Ok(())
    }

    pub(super) fn persist(&self, state: &StateFile, target: &Target) -> Result<(), BackendError> {
        write_atomically(&self.state_path, state).map_err(|e| BackendError::Other {
            target: target.clone(),
            reason: format!(
                "writing emulated GPU state {}: {e}",
                self.state_path.display()
            ),
        })
    }
}

fn occupancy(gpu: &EmuGpu, gs: &GpuState) -> Occupancy {
    let mut occ = Occupancy::empty(&gpu.model);
    for inst in &gs.instances {
        if let Some((idx, _)) = gpu.model.profile(&inst.profile) {
            occ.add(&gpu.model, idx, inst.start);
        }
    }
    occ
}

fn check_create(
    gpu: &EmuGpu,
    gs: &GpuState,
    profile: usize,
    start: u32,
    target: &Target,
) -> Result<(), BackendError> {
    let occ = occupancy(gpu, gs);
    match occ.check_hardware(&gpu.model, profile, start) {
        Ok(()) => Ok(()),
        Err(Conflict::StartNotAllowed { starts }) => Err(BackendError::InvalidArgument {
            target: target.clone(),
            reason: format!("placement start {start} not allowed; valid starts: {starts:?}"),
        }),
        Err(Conflict::Overlap(mask)) => Err(BackendError::InsufficientResources {
            target: target.clone(),
            reason: format!("{}{}", Conflict::Overlap(mask), occupants(gpu, gs, mask)),
        }),
        Err(c) => Err(BackendError::InsufficientResources {
            target: target.clone(),
            reason: c.to_string(),
        }),
    }
}

/// ` by GI 3 (1g.10gb at 6:2)` for the instances covering `mask`.
fn occupants(gpu: &EmuGpu, gs: &GpuState, mask: u64) -> String {
    let names: Vec<String> = gs
        .instances
        .iter()
        .filter_map(|i| {
            let size = gpu.model.profile(&i.profile)?.1.placement_size;
            let p = Placement {
                start: i.start,
                size,
            };
            (p.mask() & mask != 0).then(|| format!("GI {} ({} at {p})", i.gi_id, i.profile))
        })
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" by {}", names.join(", "))
    }
}

fn lowest_free_gi(gs: &GpuState) -> Option<u32> {
    (0..GI_ID_SPACE).find(|id| gs.instances.iter().all(|i| i.gi_id != *id))
}

fn instance_target(gpu: &EmuGpu, inst: &InstanceState) -> Target {
    let size = gpu
        .model
        .profile(&inst.profile)
        .map_or(0, |(_, p)| p.placement_size);
    Target::at(
        gpu.index,
        &inst.profile,
        Placement {
            start: inst.start,
            size,
        },
    )
}

pub(super) fn to_instance(gpu: &EmuGpu, inst: &InstanceState) -> MigInstance {
    let (profile_id, size) = gpu
        .model
        .profile(&inst.profile)
        .map_or((0, 0), |(_, p)| (p.id, p.placement_size));
    let minor = gpu.index;
    MigInstance {
        gpu_index: gpu.index,
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: minor,
        profile: inst.profile.clone(),
        profile_id,
        placement: Placement {
            start: inst.start,
            size,
        },
        gi_id: inst.gi_id,
        ci_id: inst.ci_id,
        mig_uuid: inst.mig_uuid.clone(),
        gi_cap_minor: gi_cap_minor(minor, inst.gi_id),
        ci_cap_minor: ci_cap_minor(minor, inst.gi_id, inst.ci_id),
        created_by_das: Some(inst.created_by_das),
    }
}
