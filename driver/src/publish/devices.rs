//! The devices this node publishes, by name, with where each lives (pure): the request path
//! resolves a claim's allocated devices against it (`crate::claims::plan`), the health monitor
//! reports health and taints per device from it (`crate::health`).

use std::collections::HashMap;

use das_api::device_name;

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
    /// MIG profile, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the placement.
    pub start: u32,
    /// Memory instances of the placement.
    pub size: u32,
}

/// Every device the plugin publishes, by device name (`gpu-0-mig-1g-10gb-6`): one per
/// (MIG-capable GPU, profile, placement start), as in [`super::resource_slices`].
pub fn device_index(inventory: &[GpuInfo]) -> HashMap<String, DeviceRef> {
    let mut map = HashMap::new();
    for gpu in inventory.iter().filter(|g| g.offers_mig()) {
        for p in &gpu.model.profiles {
            for &start in &p.placement_starts {
                map.insert(
                    device_name(gpu.index, &p.name, start),
                    DeviceRef {
                        kind: DeviceKind::Mig,
                        gpu_index: gpu.index,
                        gpu_uuid: gpu.uuid.clone(),
                        gpu_minor: gpu.minor,
                        profile: p.name.clone(),
                        start,
                        size: p.placement_size,
                    },
                );
            }
        }
    }
    map
}
