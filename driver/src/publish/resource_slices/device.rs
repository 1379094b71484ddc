//! One published device and the counter set it consumes from (pure; docs/design.md §3):
//!
//! - a MIG placement ([`device`]): `gpu-<index>-mig-<profile>-<start>`, type `mig`, the
//!   profile's capacities, consuming its resources and the memory slices `[start, start + size)`;
//! - a whole GPU with MIG mode off, or without MIG ([`whole_gpu_device`]; docs/design.md §7,
//!   "Whole GPUs"): `gpu-<index>`, type `gpu`, the GPU's capacities, consuming every counter of
//!   its GPU's set at its full value, so that nothing else of the GPU can be allocated beside it;
//! - a shareable MIG placement ([`shared_device`]; docs/design.md §7, "Shared slices"):
//!   `gpu-<index>-mig-<profile>-<start>-shared`, type `mig-shared`, `allowMultipleAllocations`,
//!   capacities `memory` and `shares` with request policies, the same counters as the exclusive
//!   device of that placement;
//! - the shareable device of a whole GPU ([`shared_whole_gpu_device`]; docs/design.md §7, "Memory
//!   slices of a whole GPU"): `gpu-<index>-shared`, type `gpu-shared`, `allowMultipleAllocations`,
//!   capacities `memory` (the GPU's) and `shares`, the whole GPU's counters;
//! - the GPU's counter set ([`counter_set`]), the same whatever the GPU's MIG mode; a GPU without
//!   MIG has `memory` (its NVML total) and the one `memory-slice-0`.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use das_api::{
    attributes as attr, capacities as cap, counters, device_name, shared_device_name,
    shared_whole_gpu_device_name, whole_gpu_device_name,
};

use super::{MAX_ATTRIBUTE_STRING, bytes_quantity, count_quantity, semver};
use crate::gpu::{GiProfile, GpuInfo, GpuModel, ResourceAmounts};

/// The counter set of a GPU: its model's counter totals and one `memory-slice-<n>` per slice. A
/// GPU without MIG counts its own memory (NVML's total, [`GpuInfo::whole_gpu_memory_bytes`]) and
/// its one memory slice.
pub(super) fn counter_set(g: &GpuInfo) -> CounterSet {
    let mut totals = g.model.counter_totals;
    if !g.model.mig {
        totals.memory_mib = g.memory_mib;
    }
    let mut c: BTreeMap<String, Counter> = totals
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

/// One MIG device: `profile` at `start` on `g`.
pub(super) fn device(g: &GpuInfo, p: &GiProfile, start: u32) -> Device {
    Device {
        name: device_name(g.index, &p.name, start),
        attributes: Some(attributes(g, Some((p, start)))),
        capacity: Some(capacity(p.resources().memory_bytes(), &p.resources())),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counters::counter_set_name(g.index),
            counters: consumption(&g.model, p, start),
        }]),
        ..Default::default()
    }
}

/// How the shareable devices of a node are cut (docs/design.md §7, "Shared slices").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharePolicy {
    /// `shares` capacity of every shareable device: a claim's share of the slice's compute is
    /// the shares it consumes over this (its MPS active thread percentage).
    pub shares: u32,
    /// Granularity of the `memory` a share may ask for, in bytes (its MPS pinned device memory
    /// limit); also the least a share may ask for.
    pub memory_step_bytes: u64,
    /// Whether claims of different namespaces may hold shares of one slice
    /// (`--shares-across-namespaces`; docs/design.md §7, "Shares are a tenant's own"). Off (the
    /// default): a slice serves the namespace of its first share, its shareable device carries
    /// the `shareNamespace` attribute, and a share from another namespace is refused at prepare.
    pub across_namespaces: bool,
}

impl Default for SharePolicy {
    /// 4 shares per slice, memory in 256 MiB steps, one namespace per slice.
    fn default() -> Self {
        Self {
            shares: 4,
            memory_step_bytes: cap::MEMORY_STEP_BYTES,
            across_namespaces: false,
        }
    }
}

/// The shareable device for profile `p` at `start` on `g` (KEP-5075 consumable capacity):
/// the exclusive device's attributes but `type: mig-shared`, `allowMultipleAllocations`, and
/// only the two capacities a share consumes, each with a request policy (a capacity without one
/// would be consumed whole by every share):
/// - `shares`: `policy.shares`; a claim that names none consumes 1, any whole number up to all;
/// - `memory`: the profile's memory in bytes; a claim that names none consumes an equal share
///   (memory / shares, rounded down to the step), any multiple of the step up to all of it.
///
/// It consumes the same counters as the exclusive device of the placement; the scheduler charges
/// them once for all shares of the device (KEP-5075), so exclusive and shared use exclude each
/// other. Both defaults are non-zero: a device whose shares all consume nothing could lose its
/// in-use mark in the scheduler and have its counters charged twice.
pub fn shared_device(g: &GpuInfo, p: &GiProfile, start: u32, policy: SharePolicy) -> Device {
    let mut attributes = attributes(g, Some((p, start)));
    attributes.insert(attr::TYPE.to_string(), string(attr::TYPE_MIG_SHARED));
    Device {
        name: shared_device_name(g.index, &p.name, start),
        attributes: Some(attributes),
        capacity: Some(share_capacity(p.resources().memory_bytes(), policy)),
        allow_multiple_allocations: Some(true),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counters::counter_set_name(g.index),
            counters: consumption(&g.model, p, start),
        }]),
        ..Default::default()
    }
}

/// The shareable device of whole GPU `g` (memory slices of a whole GPU, docs/design.md §7):
/// the whole GPU's attributes but `type: gpu-shared` and `memoryEnforcement` (`enforced` when
/// the kernel holds each share to its memory, else `mps`), `allowMultipleAllocations`, the two
/// capacities a share consumes as [`shared_device`] cuts them from the GPU's memory (the
/// whole-GPU device's `memory`), and every counter of the GPU, so that MIG use and whole use
/// of the GPU exclude it and the scheduler charges them once for all its shares (KEP-5075).
pub fn shared_whole_gpu_device(g: &GpuInfo, policy: SharePolicy, enforced: bool) -> Device {
    let mut attributes = attributes(g, None);
    attributes.insert(attr::TYPE.to_string(), string(attr::TYPE_GPU_SHARED));
    let level = if enforced {
        attr::MEMORY_ENFORCEMENT_ENFORCED
    } else {
        attr::MEMORY_ENFORCEMENT_MPS
    };
    attributes.insert(attr::MEMORY_ENFORCEMENT.to_string(), string(level));
    Device {
        name: shared_whole_gpu_device_name(g.index),
        attributes: Some(attributes),
        capacity: Some(share_capacity(g.whole_gpu_memory_bytes(), policy)),
        allow_multiple_allocations: Some(true),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counters::counter_set_name(g.index),
            counters: counter_set(g).counters,
        }]),
        ..Default::default()
    }
}

/// The `shares` and `memory` capacities of a shareable device of `memory` bytes, with their
/// request policies ([`shared_device`]).
fn share_capacity(memory: u64, policy: SharePolicy) -> BTreeMap<String, DeviceCapacity> {
    let step = policy.memory_step_bytes.max(1);
    let shares = u64::from(policy.shares.max(1));
    let equal = (memory / shares / step * step).max(step);
    BTreeMap::from([
        (
            cap::SHARES.to_string(),
            ranged(
                count_quantity(shares),
                count_quantity(1),
                count_quantity(1),
                count_quantity(1),
            ),
        ),
        (
            cap::MEMORY.to_string(),
            ranged(
                bytes_quantity(memory),
                bytes_quantity(equal),
                bytes_quantity(step),
                bytes_quantity(step),
            ),
        ),
    ])
}

/// A consumable capacity of `value`: requests default to `default`, and may ask for `min` and
/// then multiples of `step` above it, up to `value` (no `max`: the value bounds it).
fn ranged(value: Quantity, default: Quantity, min: Quantity, step: Quantity) -> DeviceCapacity {
    DeviceCapacity {
        value,
        request_policy: Some(CapacityRequestPolicy {
            default: Some(default),
            valid_range: Some(CapacityRequestPolicyRange {
                min,
                step: Some(step),
                max: None,
            }),
            valid_values: None,
        }),
    }
}

/// The whole-GPU device of `g` (`gpu-<index>`): attributes without profile or placement; of a
/// MIG-capable GPU capacity `memory` = the model's total memory, `multiprocessors` and the
/// engines = the most a MIG layout of the model holds ([`GpuModel::counter_totals`]: the MIG
/// files list no non-MIG totals); of a GPU without MIG `memory` = NVML's total and
/// `multiprocessors` where its data file gives it, as NVIDIA's DRA driver publishes a full GPU
/// (memory only) plus the SM count. It consumes every counter of the GPU's counter set at its
/// full value.
pub(super) fn whole_gpu_device(g: &GpuInfo) -> Device {
    let capacity = if g.model.mig {
        capacity(g.model.memory_bytes(), &g.model.counter_totals)
    } else {
        whole_capacity_without_mig(g)
    };
    Device {
        name: whole_gpu_device_name(g.index),
        attributes: Some(attributes(g, None)),
        capacity: Some(capacity),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counters::counter_set_name(g.index),
            counters: counter_set(g).counters,
        }]),
        ..Default::default()
    }
}

/// The counters a MIG device consumes: its non-zero published resources and its memory slices.
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

/// Capacities of a GPU without MIG: `memory` (bytes, NVML's total) and `multiprocessors` where
/// the model knows it; no engine counts (no data sheet states them per GPU).
fn whole_capacity_without_mig(g: &GpuInfo) -> BTreeMap<String, DeviceCapacity> {
    let plain = |value| DeviceCapacity {
        value,
        request_policy: None,
    };
    let mut c = BTreeMap::from([(
        cap::MEMORY.to_string(),
        plain(bytes_quantity(g.whole_gpu_memory_bytes())),
    )]);
    if let Some(sms) = g.model.multiprocessors {
        c.insert(
            cap::MULTIPROCESSORS.to_string(),
            plain(count_quantity(u64::from(sms))),
        );
    }
    c
}

/// Capacities: `memory` (bytes) and the counts of `r`.
fn capacity(memory_bytes: u64, r: &ResourceAmounts) -> BTreeMap<String, DeviceCapacity> {
    let entries = [
        (cap::MEMORY, bytes_quantity(memory_bytes)),
        (cap::MULTIPROCESSORS, count_quantity(r.multiprocessors)),
        (cap::COPY_ENGINES, count_quantity(r.copy_engines)),
        (cap::DECODERS, count_quantity(r.decoders)),
        (cap::ENCODERS, count_quantity(r.encoders)),
        (cap::JPEG_ENGINES, count_quantity(r.jpeg_engines)),
        (cap::OFA_ENGINES, count_quantity(r.ofa_engines)),
    ];
    entries
        .into_iter()
        .map(|(name, value): (&str, Quantity)| {
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

/// The attributes of a MIG device (`mig` = its profile and start) or of a whole GPU (`None`):
/// those of docs/design.md §3, the GPU's facts on every device of it. Facts the GPU does not
/// know (`None`: brand, CUDA driver version, PCI bus ID, PCIe root, NUMA node) are left out, as
/// is a version that is not a semantic one.
fn attributes(g: &GpuInfo, mig: Option<(&GiProfile, u32)>) -> BTreeMap<String, DeviceAttribute> {
    let model: &GpuModel = &g.model;
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: DeviceAttribute| {
        a.insert(k.to_string(), v);
    };
    match mig {
        Some((p, start)) => {
            put(attr::TYPE, string(attr::TYPE_MIG));
            put(attr::PROFILE, string(&p.name));
            put(attr::PARENT_UUID, string(&g.uuid));
            put(attr::PLACEMENT_START, int(i64::from(start)));
            put(attr::PLACEMENT_SIZE, int(i64::from(p.placement_size)));
        }
        None => {
            put(attr::TYPE, string(attr::TYPE_GPU));
            put(attr::UUID, string(&g.uuid));
        }
    }
    put(attr::GPU_INDEX, int(i64::from(g.index)));
    put(attr::PRODUCT_NAME, string(&g.product_name));
    if let Some(brand) = &g.brand {
        put(attr::BRAND, string(brand));
    }
    put(attr::ARCHITECTURE, string(&model.architecture));
    if let Some(v) = semver(&model.cuda_compute_capability) {
        put(attr::CUDA_COMPUTE_CAPABILITY, version(v));
    }
    if let Some(v) = semver(&g.driver_version) {
        put(attr::DRIVER_VERSION, version(v));
    }
    if let Some(v) = g.cuda_driver_version.as_deref().and_then(semver) {
        put(attr::CUDA_DRIVER_VERSION, version(v));
    }
    if let Some(bus) = &g.pci_bus_id {
        put(attr::PCI_BUS_ID, string(bus));
    }
    if let Some(root) = &g.pcie_root {
        put(attr::PCIE_ROOT, string(root));
    }
    if let Some(node) = g.numa_node {
        put(attr::NUMA_NODE, int(i64::from(node)));
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
