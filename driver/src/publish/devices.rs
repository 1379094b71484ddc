//! The devices this node publishes, by name, with where each lives (pure): the request path
//! resolves a claim's allocated devices against it (`crate::claims::plan`), the health monitor
//! reports health and taints per device from it (`crate::health`).

use std::collections::HashMap;

use das_api::{
    WHOLE_GPU_PROFILE, device_name, shared_device_name, shared_whole_gpu_device_name,
    whole_gpu_device_name,
};

use crate::gpu::GpuInfo;

/// What a published device is (docs/design.md §7, "Whole GPUs").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A MIG placement (`gpu-<index>-mig-<profile>-<start>`): preparing it creates a MIG
    /// instance.
    #[default]
    Mig,
    /// A whole GPU with MIG mode off (`gpu-<index>`): preparing it creates nothing. Its
    /// profile is `das_api::WHOLE_GPU_PROFILE` and its placement every memory slice of the GPU
    /// (start 0), so it overlaps every MIG placement of the GPU.
    WholeGpu,
}

/// Where a published device lives: GPU, profile and placement (in memory slices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRef {
    /// A MIG placement or a whole GPU.
    pub kind: DeviceKind,
    /// GPU index on the node.
    pub gpu_index: u32,
    /// GPU UUID, `GPU-…`.
    pub gpu_uuid: String,
    /// Minor of `/dev/nvidia<minor>`.
    pub gpu_minor: u32,
    /// MIG profile, e.g. `1g.10gb`; [`WHOLE_GPU_PROFILE`] (`gpu`) for a whole GPU.
    pub profile: String,
    /// First memory slice of the placement (0 for a whole GPU).
    pub start: u32,
    /// Memory slices of the placement (every memory slice of the GPU for a whole GPU).
    pub size: u32,
    /// Whether the device is the shareable device of its placement (`…-shared`, docs/design.md
    /// §7, "Shared slices"): several claims may be allocated it, each with a share; the first
    /// share's prepare creates the slice, the last share's release destroys it.
    pub shared: bool,
}

/// Every device the plugin publishes, by device name, as in [`super::resource_slices`]: one per
/// (GPU that offers MIG, profile, placement start), `gpu-0-mig-1g-10gb-6`, with its shareable
/// twin `gpu-0-mig-1g-10gb-6-shared` (listed whether or not its profile is shared: a claim is
/// only ever allocated what is published), and one per GPU
/// offered whole, `gpu-3` ([`DeviceKind::WholeGpu`], profile [`WHOLE_GPU_PROFILE`], start 0, size
/// the model's memory slices), with its shareable twin `gpu-3-shared` (listed whether or not
/// whole GPUs are shared, as the MIG twins are).
pub fn device_index(inventory: &[GpuInfo]) -> HashMap<String, DeviceRef> {
    let mut map = HashMap::new();
    for gpu in inventory {
        let at = |kind, profile: &str, start, size| DeviceRef {
            kind,
            shared: false,
            gpu_index: gpu.index,
            gpu_uuid: gpu.uuid.clone(),
            gpu_minor: gpu.minor,
            profile: profile.to_string(),
            start,
            size,
        };
        if gpu.offers_mig() {
            for p in &gpu.model.profiles {
                for &start in &p.placement_starts {
                    let exclusive = at(DeviceKind::Mig, &p.name, start, p.placement_size);
                    map.insert(
                        shared_device_name(gpu.index, &p.name, start),
                        DeviceRef {
                            shared: true,
                            ..exclusive.clone()
                        },
                    );
                    map.insert(device_name(gpu.index, &p.name, start), exclusive);
                }
            }
        }
        if gpu.offers_whole_gpu() {
            let whole = at(
                DeviceKind::WholeGpu,
                WHOLE_GPU_PROFILE,
                0,
                gpu.model.memory_slices,
            );
            map.insert(
                shared_whole_gpu_device_name(gpu.index),
                DeviceRef {
                    shared: true,
                    ..whole.clone()
                },
            );
            map.insert(whole_gpu_device_name(gpu.index), whole);
        }
    }
    map
}

#[cfg(test)]
mod tests;
