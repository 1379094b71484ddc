//! MIG mode follows demand on real GPUs (docs/design.md §7, "MIG mode follows demand"): whether
//! DAS may switch a GPU's MIG mode ([`MigSwitch`], decided at discovery), and the switch itself
//! (`nvmlDeviceSetMigMode`, NVML API reference, "Multi Instance GPU Management").
//!
//! - Allowed only with [`NvmlOptions::mig_mode_switching`], on Hopper and newer
//!   (`nvmlDeviceGetArchitecture` ≥ `NVML_DEVICE_ARCH_HOPPER`, NVIDIA's DRA driver's
//!   `supportsMIGModeToggle`), for a model not known to need a reset, outside a vGPU guest
//!   (`nvmlDeviceGetVirtualizationMode` ≠ `VGPU`), and while no change is pending a reset
//!   (`nvmlDeviceGetMigMode`'s pending equals its current mode).
//! - A switch reads the mode back: a change NVML left pending is
//!   [`BackendError::ResetRequired`]; the mode asked for with nothing pending is success,
//!   whatever the call returned (asking for the mode now clears a pending change).
//! - Enabling MIG mode may re-bind the GPU and change its minor number (docs/reference/mig.md,
//!   "MIG mode"); the backend then refuses further switches and answers
//!   [`BackendError::Other`]: the published device node would be wrong until the plugin
//!   restarts.
//! - The backend's copy of the GPU ([`GpuInfo::mig_enabled`], [`GpuInfo::mig_switch`]) follows
//!   every switch, so the inventory, creates and instance lists see the mode now.

use super::{NvmlBackend, NvmlOptions, ServedGpu, map_error, write};
#[cfg(doc)]
use crate::gpu::GpuInfo;
use crate::gpu::model::GpuModel;
use crate::gpu::nvml::{
    ARCH_HOPPER, DeviceIdentity, MigModeState, NvmlApi, NvmlCallError, code, virtualization,
};
use crate::gpu::{BackendError, MigSwitch, Target, on_off};

use crate::gpu::nvml::architecture_name;

/// Whether DAS may switch GPU `dev`'s MIG mode, but for a pending change ([`with_pending`]
/// adds that): the option, the architecture, the model and the virtualization mode
/// (`nvmlDeviceGetVirtualizationMode`, read only when the rest allows; a failure to read it
/// refuses).
pub(in crate::gpu::nvml) fn switch_base<A: NvmlApi>(
    api: &A,
    options: &NvmlOptions,
    dev: u32,
    id: &DeviceIdentity,
    model: &GpuModel,
) -> MigSwitch {
    if !model.mig {
        return MigSwitch::no_mig();
    }
    if !options.mig_mode_switching {
        return MigSwitch::off();
    }
    if id.architecture < ARCH_HOPPER {
        return MigSwitch::Refused(format!(
            "{} ({}): a MIG mode change needs a GPU reset",
            model.name,
            architecture_name(id.architecture)
        ));
    }
    if model.mig_mode_change_requires_reset() {
        return MigSwitch::Refused(format!(
            "{}: its model data says a MIG mode change needs a GPU reset",
            model.name
        ));
    }
    match api.virtualization_mode(dev) {
        Ok(virtualization::VGPU) => MigSwitch::Refused(
            "a vGPU guest (nvmlDeviceGetVirtualizationMode: VGPU): its MIG mode is the host's"
                .into(),
        ),
        Ok(_) => MigSwitch::Allowed,
        Err(e) => MigSwitch::Refused(format!("cannot read the virtualization mode: {e}")),
    }
}

/// `base` ([`switch_base`]), refused while a change waits for a reset.
pub(in crate::gpu::nvml) fn with_pending(base: &MigSwitch, mode: MigModeState) -> MigSwitch {
    if base.allowed() && mode.pending != mode.current {
        return MigSwitch::Refused(format!(
            "a MIG mode change to {} is pending a GPU reset",
            on_off(mode.pending)
        ));
    }
    base.clone()
}

impl<A: NvmlApi> NvmlBackend<A> {
    /// `nvmlDeviceGetMigMode` of GPU `gpu_index`; off (now and pending) for a GPU without MIG,
    /// which NVML answers `NOT_SUPPORTED` (its instance lists and whole-GPU prepares need no
    /// special case).
    pub(super) fn read_mig_mode(&self, gpu_index: u32) -> Result<MigModeState, BackendError> {
        let target = Target::gpu(gpu_index);
        if !self.gpu(&target)?.model.mig {
            return Ok(MigModeState {
                current: false,
                pending: false,
            });
        }
        self.api
            .mig_mode(gpu_index)
            .map_err(|e| map_error(target, &e))
    }

    /// `nvmlDeviceSetMigMode` of GPU `gpu_index` to `enabled`, checked by reading the mode back
    /// (see the module docs).
    pub(super) fn switch_mig_mode(
        &self,
        gpu_index: u32,
        enabled: bool,
    ) -> Result<(), BackendError> {
        let target = Target::gpu(gpu_index);
        let gpu = self.gpu(&target)?;
        let set = self.api.set_mig_mode(gpu_index, enabled);
        let after = self.api.mig_mode(gpu_index);
        // Whatever happened, the instance list is read again.
        self.invalidate(gpu_index, &"MIG mode switch");
        if let Ok(m) = after {
            self.note_mode(gpu_index, m, None);
        }
        let mode = match (set, after) {
            // The mode asked for, nothing pending: done, whatever the call said.
            (_, Ok(m)) if m.current == enabled && m.pending == enabled => m,
            (set, Ok(m)) if m.current != enabled && m.pending == enabled => {
                let said = set.err().map(|e| format!("; {e}")).unwrap_or_default();
                return Err(BackendError::ResetRequired {
                    target,
                    reason: format!(
                        "MIG mode change to {} is pending a GPU reset (MIG mode is still {}{said})",
                        on_off(enabled),
                        on_off(m.current)
                    ),
                });
            }
            (Err(e), _) => return Err(switch_error(target, enabled, &e)),
            (Ok(()), Err(e)) => return Err(map_error(target, &e)),
            (Ok(()), Ok(m)) if m.current != enabled => {
                return Err(BackendError::Other {
                    target,
                    reason: format!(
                        "MIG mode is still {} after nvmlDeviceSetMigMode succeeded (pending {})",
                        on_off(m.current),
                        on_off(m.pending)
                    ),
                });
            }
            (Ok(()), Ok(m)) => m,
        };
        tracing::info!(gpu = gpu_index, mode = on_off(enabled), "MIG mode switched");
        // Enabling MIG mode may re-bind the GPU and change its minor number.
        let id = self
            .api
            .device_identity(gpu_index)
            .map_err(|e| map_error(target.clone(), &e))?;
        if id.minor != gpu.minor {
            let why = format!(
                "the GPU re-bound with minor {} (was {}) when its MIG mode changed: its published device node is wrong, so DAS treats it as lost; restart the plugin so that it reads the GPU again",
                id.minor, gpu.minor
            );
            tracing::warn!(
                gpu = gpu_index,
                old_minor = gpu.minor,
                new_minor = id.minor,
                "the GPU re-bound with another minor after a MIG mode switch; restart the plugin"
            );
            self.note_mode(gpu_index, mode, Some(MigSwitch::Refused(why.clone())));
            if let Some(g) = write(&self.gpus)
                .iter_mut()
                .find(|g| g.info.index == gpu_index)
            {
                g.rebound = Some(why.clone());
            }
            return Err(BackendError::GpuLost {
                target,
                reason: why,
            });
        }
        Ok(())
    }

    /// Keeps GPU `gpu`'s MIG `mode` in the backend's copy, and its switch decision recomputed for
    /// the mode (or `refuse`d for good).
    fn note_mode(&self, gpu: u32, mode: MigModeState, refuse: Option<MigSwitch>) {
        let mut gpus = write(&self.gpus);
        if let Some(g) = gpus.iter_mut().find(|g| g.info.index == gpu) {
            if let Some(r) = refuse {
                g.switch = r;
            }
            apply_mode(g, mode);
        }
    }
}

/// Sets `g`'s mode now and its switch decision for `mode`.
pub(super) fn apply_mode(g: &mut ServedGpu, mode: MigModeState) {
    g.info.mig_enabled = mode.current;
    g.info.mig_switch = with_pending(&g.switch, mode);
}

/// A failed `nvmlDeviceSetMigMode` as a [`BackendError`] that says what it means for a switch.
fn switch_error(target: Target, enabled: bool, e: &NvmlCallError) -> BackendError {
    let to = on_off(enabled);
    match e.code {
        code::IN_USE => BackendError::InUse {
            target,
            reason: format!(
                "MIG mode cannot change to {to}: processes or MIG instances use the GPU ({e})"
            ),
        },
        code::NOT_SUPPORTED => BackendError::NotSupported {
            target,
            reason: format!("the GPU cannot switch MIG mode ({e})"),
        },
        code::RESET_REQUIRED => BackendError::ResetRequired {
            target,
            reason: format!("MIG mode change to {to} needs a GPU reset ({e})"),
        },
        _ => map_error(target, e),
    }
}
