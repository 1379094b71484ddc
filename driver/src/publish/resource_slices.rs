//! The desired ResourceSlices of a node, built from its GPU inventory (pure; docs/design.md §3, §4).
//!
//! - One device per `(GPU, profile, placement start)` of a GPU with MIG mode on, named
//!   `gpu-<index>-mig-<profile>-<start>`, with the attributes and capacities of docs/design.md §3,
//!   consuming its resources and the memory-slice counters `[start, start + size)` from its GPU's
//!   counter set.
//! - One whole-GPU device `gpu-<index>` per GPU with MIG mode off or without MIG (in the
//!   inventory only with `--whole-gpus`; docs/design.md §7, "Whole GPUs"), consuming every
//!   counter of its GPU's counter set at its full value. Devices are built in
//!   `resource_slices/device.rs`.
//! - Shareable twins (`…-shared`, docs/design.md §7, "Shared slices" and "Memory slices of a whole
//!   GPU") of the placements of the profiles `--shared-profiles` lists and, where it lists `gpu`,
//!   of every whole-GPU device, after every exclusive device.
//! - One counter set per GPU, `gpu-<index>-counter-set`: `memory` (bytes), `multiprocessors`, the
//!   engine counters, and `memory-slice-<n>` = 1 per memory slice. Overlapping placements consume
//!   the same memory-slice counter, which stops the allocator from picking both. A GPU without
//!   MIG has `memory` and `memory-slice-0` only.
//! - Devices are listed in the placement policy's order ([`crate::publish::placement::publish_order`],
//!   whole GPUs placed by [`crate::publish::placement::with_whole_gpus`]: GPUs offered only whole
//!   first, a switchable GPU's after the MIG devices of its GPU and of every GPU with a lower
//!   index); slices carry an index whose zero-padded hex form sorts like the index, so the
//!   allocator (which sorts slices by name from 1.36) walks devices in that order.
//! - Layout by server version (docs/reference/dra.md, "ResourceSlice limits"): 1.34 keeps a GPU's counter set
//!   and its devices in one slice (several GPUs per slice while the limits allow); 1.35+ puts
//!   counter sets in counter-only slices (`devices` unset) and devices in device-only slices.
//!
//! Slices have no `metadata.name` and pool generation 0: naming, generations and owner references
//! are the publisher's job.

mod device;
mod shares;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use das_api::DRIVER_NAME;

use crate::gpu::GpuInfo;
use crate::publish::placement::{GpuView, Listed, publish_order, with_whole_gpus};
pub use device::{SharePolicy, shared_device, shared_whole_gpu_device};
use device::{counter_set, device, whole_gpu_device};
pub use dra_plugin::resourceslice::ServerVersion;
pub use shares::{SharedProfiles, shares_supported};

/// Most devices per slice when devices consume counters (1.35+; DAS applies it on 1.34 too).
pub(crate) const MAX_DEVICES_PER_SLICE: usize = 64;
/// Most counter sets per slice (1.35+).
pub(crate) const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// Most counters per counter set (1.35+), and per slice in total (1.34).
pub(crate) const MAX_COUNTERS_PER_SET: usize = 32;
/// Most device counter consumptions (counters consumed, summed over devices) per slice (1.34).
pub(crate) const MAX_DEVICE_COUNTERS_PER_SLICE_1_34: usize = 1024;
/// Most attributes plus capacities per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Longest string attribute value.
pub(crate) const MAX_ATTRIBUTE_STRING: usize = 64;

/// Where counter sets go, by Kubernetes server version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceSliceLayout {
    /// 1.34: a GPU's counter set and its devices share a slice.
    CountersWithDevices,
    /// 1.35 and newer: counter sets in their own slices, devices in others.
    SeparateCounterSlices,
}

impl ResourceSliceLayout {
    /// The layout for a Kubernetes server `major.minor` (1.35+ → separate slices).
    pub(crate) fn for_server_version(major: u32, minor: u32) -> Self {
        if (major, minor) >= (1, 35) {
            ResourceSliceLayout::SeparateCounterSlices
        } else {
            ResourceSliceLayout::CountersWithDevices
        }
    }
}

/// What a slice holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceSliceKind {
    /// Counter sets only (1.35+).
    Counters,
    /// Devices only (1.35+).
    Devices,
    /// Counter sets and the devices that consume them (1.34).
    Combined,
    /// Nothing: a node without GPUs to serve still publishes one empty slice so its pool exists.
    Empty,
}

/// One desired slice.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredResourceSlice {
    /// Position in the pool; slices must be named so that they sort by it ([`Self::name_prefix`]).
    pub index: usize,
    /// What it holds.
    pub kind: ResourceSliceKind,
    /// The slice, without `metadata.name`; `spec.pool.generation` is 0.
    pub slice: ResourceSlice,
}

impl DesiredResourceSlice {
    /// The index as zero-padded lower-case hex (at least 5 digits, like the upstream
    /// resourceslice controller), to start the slice name with.
    pub fn name_prefix(&self) -> String {
        format!("{:05x}", self.index)
    }
}

/// A GPU that cannot be published within the API limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceSliceError {
    /// On 1.34 a GPU's counter set and devices must share one slice, and they exceed its limits.
    #[error("GPU {gpu} ({model}) does not fit in one Kubernetes 1.34 ResourceSlice: {detail}")]
    GpuTooLargeForSlice {
        /// GPU index.
        gpu: u32,
        /// Model name.
        model: String,
        /// Which limit.
        detail: String,
    },
    /// The GPU's counter set has more counters than a set may hold.
    #[error(
        "GPU {gpu} ({model}): its counter set needs {counters} counters, at most {MAX_COUNTERS_PER_SET} are allowed"
    )]
    TooManyCounters {
        /// GPU index.
        gpu: u32,
        /// Model name.
        model: String,
        /// Counters needed.
        counters: usize,
    },
}

/// A version as a semantic version for a `version` attribute: 1 to 3 numeric components, leading
/// zeros dropped, missing ones 0 (`580.95.05` → `580.95.5`, `9.0` → `9.0.0`). `None` otherwise.
pub fn semver(version: &str) -> Option<String> {
    let parts: Vec<&str> = version.trim().split('.').collect();
    if parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut nums = parts
        .iter()
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<Vec<u64>>>()?;
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// A byte count as Kubernetes writes it canonically (binary suffix for the largest power of 1024
/// dividing it; plain below 1024), so the stored object equals the desired one.
pub(crate) fn bytes_quantity(bytes: u64) -> Quantity {
    canonical(bytes, 1024, &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}

/// A count as Kubernetes writes it canonically (decimal suffix for the largest power of 1000
/// dividing it).
pub(crate) fn count_quantity(n: u64) -> Quantity {
    canonical(n, 1000, &["", "k", "M", "G", "T", "P", "E"])
}

fn canonical(mut n: u64, base: u64, suffixes: &[&str]) -> Quantity {
    let mut exp = 0;
    if n >= base {
        while n.is_multiple_of(base) && exp + 1 < suffixes.len() {
            n /= base;
            exp += 1;
        }
    }
    Quantity(format!("{n}{}", suffixes[exp]))
}

/// What the desired slices hold beyond the inventory: the layout of the server's version and the
/// shareable devices (none unless the server supports them, [`shares_supported`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceOptions {
    /// Where counter sets go.
    pub layout: ResourceSliceLayout,
    /// The profiles that also get shareable devices.
    pub shared: SharedProfiles,
}

impl SliceOptions {
    /// The options for a server of `version`: its layout, and `shared` if it supports shareable
    /// devices ([`shares_supported`]); otherwise nothing shared and, when `shared` lists
    /// profiles, why, for the log.
    pub fn for_server(version: ServerVersion, shared: SharedProfiles) -> (Self, Option<String>) {
        let layout = ResourceSliceLayout::for_server_version(version.major, version.minor);
        if shared.selectors.is_empty() {
            return (layout.into(), None);
        }
        match shares_supported(version.major, version.minor, version.patch) {
            Ok(()) => (Self { layout, shared }, None),
            Err(why) => (layout.into(), Some(why)),
        }
    }
}

impl From<ResourceSliceLayout> for SliceOptions {
    /// `layout`, nothing shared.
    fn from(layout: ResourceSliceLayout) -> Self {
        Self {
            layout,
            shared: SharedProfiles::default(),
        }
    }
}

/// Builds the node's desired slices from its inventory, in the policy's order, laid out for
/// `options.layout`: the MIG placements of every GPU that offers MIG ([`GpuInfo::offers_mig`])
/// and the whole-GPU device of every GPU offered whole ([`GpuInfo::offers_whole_gpu`]), each GPU
/// with its counter set, then the shareable device of every placement of a profile
/// `options.shared` lists and, where it lists `gpu`, of every GPU offered whole, in the same
/// order (so shares fill the slice the policy prefers first).
pub fn desired_resource_slices(
    node_name: &str,
    gpus: &[GpuInfo],
    options: impl Into<SliceOptions>,
) -> Result<Vec<DesiredResourceSlice>, ResourceSliceError> {
    let options = options.into();
    let offered: Vec<&GpuInfo> = gpus
        .iter()
        .filter(|g| g.offers_mig() || g.offers_whole_gpu())
        .collect();
    for g in &offered {
        check_counter_set_size(g)?;
    }
    // Positions in `offered` of the GPUs that offer MIG, as the policy's views see them.
    let mig: Vec<usize> = (0..offered.len())
        .filter(|&i| offered[i].offers_mig())
        .collect();
    let views: Vec<GpuView<'_>> = mig
        .iter()
        .map(|&i| GpuView {
            index: offered[i].index,
            model: &offered[i].model,
        })
        .collect();
    let whole: Vec<u32> = offered
        .iter()
        .filter(|g| g.offers_whole_gpu())
        .map(|g| g.index)
        .collect();
    let position = |index: u32| offered.iter().position(|g| g.index == index);
    let order = with_whole_gpus(publish_order(&views), &whole);
    let mut shared = Vec::new();
    let mut devices: Vec<(usize, Device)> = Vec::new();
    for listed in order {
        match listed {
            Listed::Mig(c) => {
                let pos = mig[c.gpu];
                let profile = c.profile_of(&views);
                devices.push((pos, device(offered[pos], profile, c.start)));
                if options.shared.matches(profile) {
                    let d = shared_device(offered[pos], profile, c.start, options.shared.policy);
                    shared.push((pos, d));
                }
            }
            Listed::WholeGpu { gpu_index } => {
                if let Some(pos) = position(gpu_index) {
                    let g = offered[pos];
                    devices.push((pos, whole_gpu_device(g)));
                    if options.shared.whole_gpus() {
                        let enforced = options.shared.memory_enforced.contains(&g.uuid);
                        let d = shared_whole_gpu_device(g, options.shared.policy, enforced);
                        shared.push((pos, d));
                    }
                }
            }
        }
    }
    devices.extend(shared);
    let layout = options.layout;
    let contents = match layout {
        ResourceSliceLayout::SeparateCounterSlices => separate(&offered, devices),
        ResourceSliceLayout::CountersWithDevices => combined(&offered, devices)?,
    };
    Ok(finish(node_name, contents))
}

/// `(kind, counter sets, devices)` of one slice before the pool fields are known.
type Contents = (
    ResourceSliceKind,
    Option<Vec<CounterSet>>,
    Option<Vec<Device>>,
);

fn check_counter_set_size(g: &GpuInfo) -> Result<(), ResourceSliceError> {
    let counters = counter_set(g).counters.len();
    if counters > MAX_COUNTERS_PER_SET {
        return Err(ResourceSliceError::TooManyCounters {
            gpu: g.index,
            model: g.model.name.clone(),
            counters,
        });
    }
    Ok(())
}

/// 1.35+: counter-only slices of up to 8 sets, then device-only slices of up to 64 devices.
fn separate(gpus: &[&GpuInfo], devices: Vec<(usize, Device)>) -> Vec<Contents> {
    let sets: Vec<CounterSet> = gpus.iter().map(|g| counter_set(g)).collect();
    let devices: Vec<Device> = devices.into_iter().map(|(_, d)| d).collect();
    let counter_slices = sets
        .chunks(MAX_COUNTER_SETS_PER_SLICE)
        .map(|c| (ResourceSliceKind::Counters, Some(c.to_vec()), None));
    let device_slices = devices
        .chunks(MAX_DEVICES_PER_SLICE)
        .map(|d| (ResourceSliceKind::Devices, None, Some(d.to_vec())));
    counter_slices.chain(device_slices).collect()
}

/// What one GPU adds to a 1.34 slice.
struct GpuBlock {
    set: CounterSet,
    devices: Vec<Device>,
    counters: usize,
    consumptions: usize,
}

/// 1.34: consecutive GPUs share a slice while devices ≤ 64, counters ≤ 32 and device counter
/// consumptions ≤ 1024; a GPU that alone exceeds them is an error.
fn combined(
    gpus: &[&GpuInfo],
    devices: Vec<(usize, Device)>,
) -> Result<Vec<Contents>, ResourceSliceError> {
    let mut blocks: Vec<GpuBlock> = gpus
        .iter()
        .map(|g| {
            let set = counter_set(g);
            GpuBlock {
                counters: set.counters.len(),
                set,
                devices: Vec::new(),
                consumptions: 0,
            }
        })
        .collect();
    for (gpu, d) in devices {
        blocks[gpu].consumptions += consumption_count(&d);
        blocks[gpu].devices.push(d);
    }
    for (g, b) in gpus.iter().zip(&blocks) {
        check_block(g, b)?;
    }
    let mut packs: Vec<Pack> = Vec::new();
    for b in blocks {
        match packs.last_mut() {
            Some(pack) if pack.fits(&b) => pack.push(b),
            _ => packs.push(Pack::default().with(b)),
        }
    }
    Ok(packs
        .into_iter()
        .map(|p| (ResourceSliceKind::Combined, Some(p.sets), Some(p.devices)))
        .collect())
}

/// Consecutive GPUs sharing one 1.34 slice.
#[derive(Default)]
struct Pack {
    sets: Vec<CounterSet>,
    devices: Vec<Device>,
    counters: usize,
    consumptions: usize,
}

impl Pack {
    fn fits(&self, b: &GpuBlock) -> bool {
        self.devices.len() + b.devices.len() <= MAX_DEVICES_PER_SLICE
            && self.counters + b.counters <= MAX_COUNTERS_PER_SET
            && self.consumptions + b.consumptions <= MAX_DEVICE_COUNTERS_PER_SLICE_1_34
    }

    fn push(&mut self, b: GpuBlock) {
        self.sets.push(b.set);
        self.devices.extend(b.devices);
        self.counters += b.counters;
        self.consumptions += b.consumptions;
    }

    fn with(mut self, b: GpuBlock) -> Self {
        self.push(b);
        self
    }
}

fn check_block(g: &GpuInfo, b: &GpuBlock) -> Result<(), ResourceSliceError> {
    let detail = if b.devices.len() > MAX_DEVICES_PER_SLICE {
        format!(
            "{} devices, at most {MAX_DEVICES_PER_SLICE}",
            b.devices.len()
        )
    } else if b.consumptions > MAX_DEVICE_COUNTERS_PER_SLICE_1_34 {
        format!(
            "{} device counter consumptions, at most {MAX_DEVICE_COUNTERS_PER_SLICE_1_34}",
            b.consumptions
        )
    } else {
        return Ok(());
    };
    Err(ResourceSliceError::GpuTooLargeForSlice {
        gpu: g.index,
        model: g.model.name.clone(),
        detail,
    })
}

fn consumption_count(d: &Device) -> usize {
    d.consumes_counters
        .iter()
        .flatten()
        .map(|c| c.counters.len())
        .sum()
}

fn finish(node_name: &str, mut contents: Vec<Contents>) -> Vec<DesiredResourceSlice> {
    if contents.is_empty() {
        contents.push((ResourceSliceKind::Empty, None, None));
    }
    let count = contents.len() as i64;
    contents
        .into_iter()
        .enumerate()
        .map(
            |(index, (kind, shared_counters, devices))| DesiredResourceSlice {
                index,
                kind,
                slice: ResourceSlice {
                    metadata: Default::default(),
                    spec: ResourceSliceSpec {
                        driver: DRIVER_NAME.to_string(),
                        node_name: Some(node_name.to_string()),
                        pool: ResourcePool {
                            name: node_name.to_string(),
                            generation: 0,
                            resource_slice_count: count,
                        },
                        devices,
                        shared_counters,
                        ..Default::default()
                    },
                },
            },
        )
        .collect()
}

#[cfg(test)]
mod tests;
