//! MIG mode switches of the emulated GPUs, as `nvmlDeviceSetMigMode` makes them
//! (docs/reference/mig.md, "MIG mode"), and whether DAS may make them ([`MigSwitch`],
//! docs/design.md §7, "MIG mode follows demand").
//!
//! - The same mode again is a no-op; asking for the mode the GPU has now while a change is
//!   pending clears the pending change (how a caller reverts a [`BackendError::ResetRequired`]).
//! - A GPU with MIG instances refuses ([`BackendError::InUse`], NVML's `IN_USE`).
//! - A model that needs a GPU reset for the change (Ampere) keeps its mode now and records the
//!   requested one as pending ([`BackendError::ResetRequired`], NVML's activation status
//!   `RESET_REQUIRED`). Nothing applies a pending change: the emulation has no GPU reset.
//! - Otherwise (Hopper and newer) the mode changes after the injected latency
//!   ([`Latency::mig_mode_switch`](super::Latency::mig_mode_switch)), slept outside the state
//!   lock.
//!
//! Every change is written to the state file before it is kept in memory.

use std::sync::MutexGuard;

use super::control::Op;
use super::state::{GpuState, StateFile, gpu_state, gpu_state_mut};
use super::{EmuGpu, EmulatedBackend, FaultKind, lock};
use crate::gpu::model::GpuModel;
use crate::gpu::{BackendError, MigModeState, MigSwitch, Target, on_off};

/// Whether a MIG mode change on `model` waits for a GPU reset: its data file says so
/// (`mig_mode_change_requires_reset`), or it is an Ampere GPU (only Hopper and newer toggle
/// without a reset, NVIDIA's DRA driver's `supportsMIGModeToggle`).
pub(super) fn needs_reset(model: &GpuModel) -> bool {
    model.mig_mode_change_requires_reset() || model.architecture.eq_ignore_ascii_case("Ampere")
}

impl EmulatedBackend {
    /// Whether DAS may switch GPU `gpu`'s MIG mode, which is `mode`: only with
    /// [`Self::with_mig_mode_switching`], on a model that needs no reset, with no change pending.
    pub(super) fn mig_switch(&self, gpu: &EmuGpu, mode: MigModeState) -> MigSwitch {
        if !gpu.model.mig {
            return MigSwitch::no_mig();
        }
        if !self.mig_mode_switching {
            return MigSwitch::off();
        }
        if needs_reset(&gpu.model) {
            return MigSwitch::Refused(format!(
                "{} ({}): a MIG mode change needs a GPU reset",
                gpu.model.name, gpu.model.architecture
            ));
        }
        if mode.pending != mode.current {
            return MigSwitch::Refused(format!(
                "a MIG mode change to {} is pending a GPU reset",
                on_off(mode.pending)
            ));
        }
        MigSwitch::Allowed
    }

    /// `set_mig_mode` on a live GPU once no injected fault answered (see the module docs).
    pub(super) fn switch_mig_mode(&self, gpu: &EmuGpu, enabled: bool) -> Result<(), BackendError> {
        let target = Target::gpu(gpu.index);
        if !gpu.model.mig {
            // `nvmlDeviceSetMigMode` on a GPU without MIG.
            return Err(BackendError::NotSupported {
                target,
                reason: format!("{} has no MIG", gpu.model.name),
            });
        }
        let now = MigModeState {
            current: enabled,
            pending: enabled,
        };
        {
            let mut state = lock(&self.state);
            let gs = gpu_state(&state, gpu.index);
            let mode = gs.mode();
            if mode.current == enabled {
                if mode.pending != enabled {
                    self.store_mode(&mut state, gpu.index, now, &target)?;
                    tracing::info!(
                        gpu = gpu.index,
                        mode = on_off(enabled),
                        "emulated GPU: pending MIG mode change cleared"
                    );
                }
                return Ok(());
            }
            check_idle(gs, &target)?;
            if needs_reset(&gpu.model) {
                let pending = MigModeState {
                    current: mode.current,
                    pending: enabled,
                };
                self.store_mode(&mut state, gpu.index, pending, &target)?;
                return Err(BackendError::ResetRequired {
                    target,
                    reason: format!(
                        "MIG mode change to {} is pending a GPU reset ({}, {})",
                        on_off(enabled),
                        gpu.model.name,
                        gpu.model.architecture
                    ),
                });
            }
        }
        self.sleep(Op::SetMigMode);
        let mut state = lock(&self.state);
        // An instance made while the switch slept (an administrator's, through the control
        // file) keeps the mode, as NVML's `IN_USE` would.
        check_idle(gpu_state(&state, gpu.index), &target)?;
        self.store_mode(&mut state, gpu.index, now, &target)?;
        tracing::info!(
            gpu = gpu.index,
            mode = on_off(enabled),
            "emulated GPU: MIG mode switched"
        );
        Ok(())
    }

    /// The answer of an injected fault `kind` to a switch of GPU `gpu` to `enabled`:
    /// [`FaultKind::ResetRequired`] leaves `enabled` pending, as a GPU that cannot be reset
    /// would; any other kind changes nothing.
    pub(super) fn injected_mig_mode_fault(
        &self,
        gpu: &EmuGpu,
        enabled: bool,
        kind: FaultKind,
        target: Target,
    ) -> Result<(), BackendError> {
        if kind != FaultKind::ResetRequired {
            return Err(kind.error(target));
        }
        let mut state = lock(&self.state);
        let mode = MigModeState {
            current: gpu_state(&state, gpu.index).mig_enabled,
            pending: enabled,
        };
        self.store_mode(&mut state, gpu.index, mode, &target)?;
        Err(BackendError::ResetRequired {
            target,
            reason: format!(
                "injected fault: MIG mode change to {} is pending a GPU reset",
                on_off(enabled)
            ),
        })
    }

    /// Writes GPU `gpu`'s MIG `mode` to the state file, then keeps it.
    fn store_mode(
        &self,
        state: &mut MutexGuard<'_, StateFile>,
        gpu: u32,
        mode: MigModeState,
        target: &Target,
    ) -> Result<(), BackendError> {
        let mut next = (**state).clone();
        gpu_state_mut(&mut next, gpu).set_mode(mode);
        self.persist(&next, target)?;
        **state = next;
        Ok(())
    }
}

/// `InUse` while MIG instances exist on the GPU.
fn check_idle(gs: &GpuState, target: &Target) -> Result<(), BackendError> {
    match gs.instances.len() {
        0 => Ok(()),
        n => Err(BackendError::InUse {
            target: target.clone(),
            reason: format!(
                "{n} MIG instances exist; MIG mode changes only on a GPU without MIG instances"
            ),
        }),
    }
}
