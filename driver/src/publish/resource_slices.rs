//! The desired ResourceSlices of a node, built from its GPU inventory (pure; docs/design.md §3, §4).
//!
//! - One device per `(GPU, profile, placement start)`, named `gpu-<index>-mig-<profile>-<start>`,
//!   with the attributes and capacities of docs/design.md §3, consuming its resources and the memory-slice
//!   counters `[start, start + size)` from its GPU's counter set.
//! - One counter set per GPU, `gpu-<index>-counter-set`: `memory` (bytes), `multiprocessors`, the
//!   engine counters, and `memory-slice-<n>` = 1 per memory slice. Overlapping placements consume
//!   the same memory-slice counter, which stops the allocator from picking both.
//! - Devices are listed in the placement policy's order ([`crate::publish::placement::publish_order`]);
//!   slices carry an index whose zero-padded hex form sorts like the index, so the allocator (which
//!   sorts slices by name from 1.36) walks devices in that order.
//! - Layout by server version (docs/reference/dra.md, "ResourceSlice limits"): 1.34 keeps a GPU's counter set
//!   and its devices in one slice (several GPUs per slice while the limits allow); 1.35+ puts
//!   counter sets in counter-only slices (`devices` unset) and devices in device-only slices.
//!
//! Slices have no `metadata.name` and pool generation 0: naming, generations and owner references
//! are the publisher's job.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use das_api::{DRIVER_NAME, attributes as attr, capacities as cap, counters, device_name};

use crate::gpu::{GiProfile, GpuInfo, GpuModel};
use crate::publish::placement::{GpuView, publish_order};

/// Most devices per slice when devices consume counters (1.35+; DAS applies it on 1.34 too).
pub const MAX_DEVICES_PER_SLICE: usize = 64;
/// Most counter sets per slice (1.35+).
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// Most counters per counter set (1.35+), and per slice in total (1.34).
pub const MAX_COUNTERS_PER_SET: usize = 32;
/// Most device counter consumptions (counters consumed, summed over devices) per slice (1.34).
pub const MAX_DEVICE_COUNTERS_PER_SLICE_1_34: usize = 1024;
/// Most attributes plus capacities per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Longest string attribute value.
pub const MAX_ATTRIBUTE_STRING: usize = 64;

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
    pub fn for_server_version(major: u32, minor: u32) -> Self {
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
    /// Nothing: a node without MIG-capable GPUs still publishes one empty slice so its pool exists.
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
pub fn bytes_quantity(bytes: u64) -> Quantity {
    canonical(bytes, 1024, &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}

/// A count as Kubernetes writes it canonically (decimal suffix for the largest power of 1000
/// dividing it).
pub fn count_quantity(n: u64) -> Quantity {
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

/// Builds the node's desired slices from its inventory: every GPU that offers MIG
/// ([`GpuInfo::offers_mig`]), in the policy's order, laid out for `layout`.
pub fn desired_resource_slices(
    node_name: &str,
    gpus: &[GpuInfo],
    layout: ResourceSliceLayout,
) -> Result<Vec<DesiredResourceSlice>, ResourceSliceError> {
    let offered: Vec<&GpuInfo> = gpus.iter().filter(|g| g.offers_mig()).collect();
    for g in &offered {
        check_counter_set_size(g)?;
    }
    let views: Vec<GpuView<'_>> = offered
        .iter()
        .map(|g| GpuView {
            index: g.index,
            model: &g.model,
        })
        .collect();
    let devices: Vec<(usize, Device)> = publish_order(&views)
        .into_iter()
        .map(|c| (c.gpu, device(offered[c.gpu], c.profile_of(&views), c.start)))
        .collect();
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

/// The counter set of a GPU: its model's counter totals and one `memory-slice-<n>` per slice.
fn counter_set(g: &GpuInfo) -> CounterSet {
    let mut c: BTreeMap<String, Counter> = g
        .model
        .counter_totals
        .counters()
        .into_iter()
        .filter(|(name, _)| g.model.publishes_counter(name))
        .map(|(name, v)| (name.to_string(), counter(name, v)))
        .collect();
    for n in 0..g.model.memory_slices {
        c.insert(counters::memory_slice(n), counter("", 1));
    }
    CounterSet {
        name: counters::counter_set_name(g.index),
        counters: c,
    }
}

fn counter(name: &str, value: u64) -> Counter {
    let value = if name == counters::MEMORY {
        bytes_quantity(value)
    } else {
        count_quantity(value)
    };
    Counter { value }
}

/// One device: `profile` at `start` on `g`.
fn device(g: &GpuInfo, p: &GiProfile, start: u32) -> Device {
    Device {
        name: device_name(g.index, &p.name, start),
        attributes: Some(attributes(g, p, start)),
        capacity: Some(capacity(p)),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counters::counter_set_name(g.index),
            counters: consumption(&g.model, p, start),
        }]),
        ..Default::default()
    }
}

/// The counters a device consumes: its non-zero published resources and its memory slices.
fn consumption(model: &GpuModel, p: &GiProfile, start: u32) -> BTreeMap<String, Counter> {
    let mut c: BTreeMap<String, Counter> = p
        .resources()
        .counters()
        .into_iter()
        .filter(|(name, v)| *v > 0 && model.publishes_counter(name))
        .map(|(name, v)| (name.to_string(), counter(name, v)))
        .collect();
    for n in start..start + p.placement_size {
        c.insert(counters::memory_slice(n), counter("", 1));
    }
    c
}

fn capacity(p: &GiProfile) -> BTreeMap<String, DeviceCapacity> {
    let r = p.resources();
    let entries = [
        (cap::MEMORY, bytes_quantity(r.memory_bytes())),
        (cap::MULTIPROCESSORS, count_quantity(r.multiprocessors)),
        (cap::COPY_ENGINES, count_quantity(r.copy_engines)),
        (cap::DECODERS, count_quantity(r.decoders)),
        (cap::ENCODERS, count_quantity(r.encoders)),
        (cap::JPEG_ENGINES, count_quantity(r.jpeg_engines)),
        (cap::OFA_ENGINES, count_quantity(r.ofa_engines)),
    ];
    entries
        .into_iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                DeviceCapacity {
                    value,
                    request_policy: None,
                },
            )
        })
        .collect()
}

fn attributes(g: &GpuInfo, p: &GiProfile, start: u32) -> BTreeMap<String, DeviceAttribute> {
    let model: &GpuModel = &g.model;
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: DeviceAttribute| {
        a.insert(k.to_string(), v);
    };
    put(attr::TYPE, string(attr::TYPE_MIG));
    put(attr::PROFILE, string(&p.name));
    put(attr::PARENT_UUID, string(&g.uuid));
    put(attr::GPU_INDEX, int(i64::from(g.index)));
    put(attr::PLACEMENT_START, int(i64::from(start)));
    put(attr::PLACEMENT_SIZE, int(i64::from(p.placement_size)));
    put(attr::PRODUCT_NAME, string(&g.product_name));
    put(attr::ARCHITECTURE, string(&model.architecture));
    if let Some(v) = semver(&model.cuda_compute_capability) {
        put(attr::CUDA_COMPUTE_CAPABILITY, version(v));
    }
    if let Some(v) = semver(&g.driver_version) {
        put(attr::DRIVER_VERSION, version(v));
    }
    if let Some(bus) = &g.pci_bus_id {
        put(attr::PCI_BUS_ID, string(bus));
    }
    a
}

/// A string attribute, cut to the API's 64 characters.
fn string(s: &str) -> DeviceAttribute {
    let cut: String = s.chars().take(MAX_ATTRIBUTE_STRING).collect();
    DeviceAttribute {
        string: Some(cut),
        ..Default::default()
    }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}

fn version(v: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
