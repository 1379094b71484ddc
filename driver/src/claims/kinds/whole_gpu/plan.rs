//! Whether a whole GPU can be prepared (pure; docs/design.md §7, "Whole GPUs"): it must be a GPU
//! of this node's inventory, the one it was published as, with MIG mode off or one DAS may
//! switch off (`crate::claims::gpu_mode` decides the switch, under the GPU's lock). DAS
//! creates no instance for it.

use crate::claims::error::WholeGpuRefusal;
use crate::claims::kinds::Planned;
use crate::gpu::{GpuInfo, MigSwitch};

/// Whether `device` is a whole GPU's name, `gpu-<index>` (das_api::whole_gpu_device_name).
pub(crate) fn is_whole_gpu_name(device: &str) -> bool {
    device
        .strip_prefix("gpu-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Why the whole GPU `p` cannot be prepared, given the GPUs as the backend lists them now (a
/// [`WholeGpuRefusal`]'s text); `None` when it can (the GPU answers, has the UUID it was
/// published with, and MIG mode off or [`MigSwitch::Allowed`]).
pub(crate) fn whole_gpu_unavailable(p: &Planned, inventory: &[GpuInfo]) -> Option<String> {
    let (index, uuid) = (p.at.gpu_index, p.at.gpu_uuid.clone());
    let refusal = match inventory.iter().find(|g| g.index == index) {
        None => WholeGpuRefusal::NotInInventory { index, uuid },
        Some(gpu) if gpu.uuid != uuid => WholeGpuRefusal::UuidChanged {
            index,
            now: gpu.uuid.clone(),
            published: uuid,
        },
        Some(gpu) => match (gpu.mig_enabled, &gpu.mig_switch) {
            (true, MigSwitch::Refused(why)) => WholeGpuRefusal::MigModeOn {
                index,
                uuid,
                why: why.clone(),
            },
            _ => return None,
        },
    };
    Some(refusal.to_string())
}
