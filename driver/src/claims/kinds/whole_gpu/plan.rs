//! Whether a whole GPU can be prepared (pure; docs/design.md §7, "Whole GPUs"): it must be a GPU
//! of this node's inventory, the one it was published as, with MIG mode off or one DAS may
//! switch off (`crate::claims::gpu_mode` decides the switch, under the GPU's lock). DAS
//! creates no instance for it.

use crate::claims::kinds::Planned;
use crate::gpu::{GpuInfo, MigSwitch};

/// Why a device named like a whole GPU (`gpu-<index>`) that this node does not publish cannot be
/// prepared, and what to do.
pub(super) const UNPUBLISHED: &str = "this node does not publish it: the plugin serves whole GPUs only with --whole-gpus (chart wholeGpus.enabled), and only GPUs whose MIG mode was off when it started or that it may switch (--mig-mode-switching, chart wholeGpus.switchMigMode); check `kubectl get resourceslices` for this node, then delete the pod so that its claim is allocated again";

/// Whether `device` is a whole GPU's name, `gpu-<index>` (das_api::whole_gpu_device_name).
pub fn is_whole_gpu_name(device: &str) -> bool {
    device
        .strip_prefix("gpu-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Why the whole GPU `p` cannot be prepared, given the GPUs as the backend lists them now;
/// `None` when it can (the GPU answers, has the UUID it was published with, and MIG mode off or
/// [`MigSwitch::Allowed`]).
pub fn whole_gpu_unavailable(p: &Planned, inventory: &[GpuInfo]) -> Option<String> {
    let (index, uuid) = (p.at.gpu_index, &p.at.gpu_uuid);
    let Some(gpu) = inventory.iter().find(|g| g.index == index) else {
        return Some(format!(
            "GPU {index} ({uuid}) is not in this node's inventory: it does not answer or was removed; the kubelet retries, and the device is published again once the GPU answers"
        ));
    };
    if &gpu.uuid != uuid {
        return Some(format!(
            "GPU {index} now has UUID {}, not {uuid} as published: the GPUs changed since the plugin started; restart the plugin so that it publishes them again",
            gpu.uuid
        ));
    }
    if let (true, MigSwitch::Refused(why)) = (gpu.mig_enabled, &gpu.mig_switch) {
        return Some(format!(
            "GPU {index} ({uuid}) has MIG mode on, and a whole GPU is served only with MIG mode off; DAS does not switch it ({why}): switch it off (`nvidia-smi -i {index} -mig 0`, then reset the GPU where needed) and restart the plugin, or ask for a MIG slice (DeviceClass {})",
            das_api::DEVICE_CLASS_ALL
        ));
    }
    None
}
