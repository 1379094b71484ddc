//! Whether a prepare must switch its GPU's MIG mode before it can serve a device, and whether it
//! may (pure; docs/design.md §7, "MIG mode follows demand"). Each device's kind says which mode
//! it needs ([`crate::claims::kinds::Kind::gpu_mode`]): a MIG instance on, a whole GPU off. A GPU is switched only when switching is allowed for it
//! ([`MigSwitch::Allowed`]), no other claim's record holds a device of it that needs the other
//! mode, and, to switch it off, no MIG instance exists on it: the caller reads all of this under the GPU's lock, so no
//! create, destroy or other switch on that GPU runs in between.

use crate::claims::checkpoint::{Checkpoint, RecordedDevice};
use crate::claims::error::ModeRefusal;
use crate::claims::kinds::{GpuMode, Kinds};
use crate::gpu::{MigModeState, MigSwitch, on_off};

/// What the GPU looks like to a prepare that needs a mode on it, read under the GPU's lock.
#[derive(Debug, Clone)]
pub(crate) struct GpuNow<'a> {
    /// The GPU's index.
    pub gpu: u32,
    /// Its MIG mode now (`nvmlDeviceGetMigMode`).
    pub mode: MigModeState,
    /// Whether DAS may switch it (at start-up from the backend; refused after a failed switch).
    pub switch: &'a MigSwitch,
    /// The other claims whose records hold a device on it that needs the other mode
    /// ([`holders_on_gpu`]).
    pub holders: Vec<String>,
    /// How many MIG instances exist on it now (read only when switching off).
    pub instances: usize,
}

/// What to do before serving a device that needs MIG mode `want_mig` on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ModeStep {
    /// The GPU is in that mode: go on.
    Ready,
    /// Switch the GPU, then go on.
    Switch,
    /// Do not switch; fail the prepare with this reason (what is wrong and what to do): a
    /// [`ModeRefusal`]'s text.
    Refuse(String),
}

/// The step for a device needing MIG mode `want_mig` on the GPU `now` describes. A change
/// pending a reset (`pending` differs from `current`) does not matter when the mode now is
/// right: the device is served in the mode the GPU has.
pub(crate) fn mode_step(want_mig: bool, now: &GpuNow<'_>) -> ModeStep {
    if now.mode.current == want_mig {
        return ModeStep::Ready;
    }
    let gpu = now.gpu;
    let have = on_off(now.mode.current);
    let refusal = if let MigSwitch::Refused(why) = now.switch {
        let why = why.clone();
        if want_mig {
            ModeRefusal::NotSwitchedOn { gpu, have, why }
        } else {
            ModeRefusal::NotSwitchedOff { gpu, have, why }
        }
    } else if !now.holders.is_empty() {
        ModeRefusal::Held {
            have,
            holders: now.holders.clone(),
        }
    } else if !want_mig && now.instances > 0 {
        ModeRefusal::UnclaimedInstances {
            gpu,
            count: now.instances,
        }
    } else {
        return ModeStep::Switch;
    };
    ModeStep::Refuse(refusal.to_string())
}

/// The other claims (not `uid`) whose records hold a device on GPU `gpu` that needs the mode
/// other than `want_mig` (a whole GPU when MIG mode is wanted on, a MIG device when it is wanted
/// off), in any state, as `claim <namespace>/<name> (<uid>)`, in UID order. Claims with devices
/// of the wanted kind do not stand in the way: two MIG instances prepared at once on a GPU with MIG
/// mode off both need it on.
pub(crate) fn holders_on_gpu(cp: &Checkpoint, uid: &str, gpu: u32, want_mig: bool) -> Vec<String> {
    let kinds = Kinds::standard();
    let other_kind = |d: &RecordedDevice| {
        d.gpu_index == gpu && (kinds.of_record(d).gpu_mode() == GpuMode::MigOn) != want_mig
    };
    cp.claims
        .iter()
        .filter(|(u, r)| *u != uid && r.devices.iter().any(other_kind))
        .map(|(u, r)| format!("claim {}/{} ({u})", r.namespace, r.name))
        .collect()
}

#[cfg(test)]
mod tests;
