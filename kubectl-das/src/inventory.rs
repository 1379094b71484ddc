//! What DAS has published and what is allocated, read from API objects: the GPUs of every node
//! (one counter set each), the devices (one per profile and placement, and a whole GPU as
//! profile `gpu` over every memory slice of its GPU) with the counters they consume, and the
//! slices held by allocated ResourceClaims. Pure: the objects come in as values, so the picture
//! and the free-placement simulation are unit-tested without a cluster.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use das_api::allocation::AllocationShare;
use das_api::attributes::is_whole_gpu_type;
use das_api::claim_status::{DeviceStatusData, our_result_status, our_results};
use das_api::{DRIVER_NAME, WHOLE_GPU_PROFILE};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube_quantity::ParsedQuantity;
use serde::Serialize;

use crate::fields::{AttributeValue, CounterFields, DeviceFields, SliceFields};

/// Counter name → value (bytes for `memory`, a count for the others).
pub type Counters = BTreeMap<String, i128>;

/// One published MIG device: `profile` at memory slices `start..start + size` of GPU `gpu`. A
/// whole GPU (`gpu-<index>`, docs/design.md §7) is profile [`WHOLE_GPU_PROFILE`] at `0..N`,
/// N the memory slices of its GPU: it has no placement attributes, and covers every slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// Pool (the node's name for DAS) and device name: what an allocation result names.
    pub pool: String,
    pub name: String,
    pub gpu: u32,
    pub profile: String,
    pub start: u32,
    pub size: u32,
    /// Counter set → the counters this device consumes from it.
    pub consumes: BTreeMap<String, Counters>,
    /// The GPU's `productName` and `parentUUID` (a whole GPU's `uuid`) attributes (empty when
    /// unpublished).
    pub product: String,
    pub parent_uuid: String,
    /// A taint with effect `NoSchedule` or `NoExecute` is on the device (an unhealthy GPU):
    /// claims without a toleration do not get it.
    pub tainted: bool,
    /// The `shares` capacity of a shareable device (`type: mig-shared`, docs/design.md §7,
    /// "Shared slices"): several claims hold it at once, each a share; `None` for a device one
    /// claim holds.
    pub shares: Option<u32>,
}

/// One physical GPU of a node, as its counter set and devices describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    pub node: String,
    /// `gpuIndex` of its devices.
    pub index: u32,
    /// `productName` (NVML's name, e.g. `NVIDIA H100 80GB HBM3`), empty when unpublished.
    pub product: String,
    /// `parentUUID`, `GPU-…`.
    pub uuid: String,
    /// Memory slices of the GPU: the `memory-slice-<n>` counters of its counter set.
    pub memory_slices: u32,
    /// Name of its counter set (`gpu-<index>-counter-set`).
    #[serde(skip)]
    pub counter_set: String,
}

/// A slice an allocated ResourceClaim holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub node: String,
    pub gpu: u32,
    pub profile: String,
    /// First memory slice and size, in memory slices.
    pub start: u32,
    pub size: u32,
    pub device: String,
    pub namespace: String,
    pub claim: String,
    /// The pod the claim is reserved for, once the scheduler has reserved it (the first, when
    /// several pods share the claim).
    pub pod: Option<String>,
    /// Every pod the claim is reserved for: several pods may name one ResourceClaim (and share
    /// its slice, e.g. under MPS: docs/design.md §7, "MPS on a slice").
    pub pods: Vec<String>,
    /// The MIG device's UUID, once the node plugin has carved it (the claim's device status);
    /// never for a whole GPU.
    pub mig_uuid: Option<String>,
    /// The claim's share of a shareable device: the other claims holding the same device share
    /// its slice. Absent for a slice or GPU the claim holds alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<HeldShare>,
}

/// A claim's share of a shareable device (KEP-5075 consumable capacity: its allocation
/// result's `shareID` and `consumedCapacity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldShare {
    /// The allocation result's `shareID`.
    #[serde(rename = "shareID")]
    pub share_id: String,
    /// Shares of the slice the claim consumes (1 where the result does not say).
    pub shares: u64,
    /// Shares the slice has (the device's `shares` capacity), where published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of: Option<u32>,
    /// Memory the claim consumes, a quantity as the scheduler wrote it, where it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

impl Held {
    /// Whether this is a whole GPU rather than a MIG slice.
    pub fn is_whole_gpu(&self) -> bool {
        self.profile == WHOLE_GPU_PROFILE
    }
}

/// Everything DAS published (newest generation of every pool) and every slice held.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Sorted by node, then GPU index.
    pub gpus: Vec<GpuInfo>,
    /// In published order: pool by pool (sorted), slice by slice, device by device. The
    /// scheduler's allocator tries devices in this order.
    pub devices: Vec<PublishedDevice>,
    /// (pool, counter set) → the counters' capacity.
    pub capacity: BTreeMap<(String, String), Counters>,
    /// Sorted by node, GPU, start.
    pub held: Vec<Held>,
}

/// What one ResourceSlice of DAS contributes to an [`Inventory`]: its pool, generation and name,
/// its counter sets' capacity and its devices. Far smaller than the slice (no metadata, no
/// attribute or capacity maps beyond what the picture and the simulation read), so a list can be
/// read a page at a time and each page dropped ([`crate::fetch::inventory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedSlice {
    pub pool: String,
    pub generation: i64,
    /// The slice's name: slices of a pool are taken in name order, as the allocator walks them.
    pub name: String,
    /// Counter set name → the counters' capacity.
    pub capacity: Vec<(String, Counters)>,
    /// In the slice's order.
    pub devices: Vec<PublishedDevice>,
}

impl PublishedSlice {
    /// The part of `s` an [`Inventory`] reads; `None` for another driver's slice. Decodes the
    /// slice's JSON as a listed page is ([`PublishedSlice::from_fields`]).
    ///
    /// # Errors
    /// A counter value that is not a Kubernetes quantity.
    pub fn of(s: &ResourceSlice) -> Result<Option<Self>> {
        let fields: SliceFields = serde_json::from_value(serde_json::to_value(s)?)?;
        Self::from_fields(fields)
    }

    /// The slice `s` as listed; `None` for another driver's slice.
    ///
    /// # Errors
    /// A counter value that is not a Kubernetes quantity.
    pub fn from_fields(s: SliceFields) -> Result<Option<Self>> {
        let spec = s.spec;
        if spec.driver != DRIVER_NAME {
            return Ok(None);
        }
        let pool = spec.pool.name;
        let mut capacity = Vec::new();
        for cs in spec.shared_counters.into_iter().flatten() {
            let counters = counter_values(&cs.counters)
                .with_context(|| format!("counter set {} of pool {pool}", cs.name))?;
            capacity.push((cs.name, counters));
        }
        let mut devices = Vec::new();
        for d in spec.devices.into_iter().flatten() {
            if let Some(dev) = published_device(&pool, d)? {
                devices.push(dev);
            }
        }
        Ok(Some(Self {
            pool,
            generation: spec.pool.generation,
            name: s.metadata.name.unwrap_or_default(),
            capacity,
            devices,
        }))
    }
}

impl Inventory {
    /// Reads DAS's ResourceSlices (other drivers' are skipped; of a pool only the newest
    /// generation counts, as in the scheduler) and the allocation results of `claims` that name
    /// our driver.
    ///
    /// # Errors
    /// A counter value that is not a Kubernetes quantity.
    pub fn new(slices: &[ResourceSlice], claims: &[ResourceClaim]) -> Result<Self> {
        let published = slices
            .iter()
            .filter_map(|s| PublishedSlice::of(s).transpose())
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_published(published, claims))
    }

    /// [`Inventory::new`] from slices already cut down to [`PublishedSlice`]s.
    pub fn from_published(slices: Vec<PublishedSlice>, claims: &[ResourceClaim]) -> Self {
        let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
        for s in &slices {
            let g = newest.entry(s.pool.as_str()).or_insert(i64::MIN);
            *g = (*g).max(s.generation);
        }
        let newest: BTreeMap<String, i64> = newest
            .into_iter()
            .map(|(pool, g)| (pool.to_string(), g))
            .collect();
        let mut current: Vec<PublishedSlice> = slices
            .into_iter()
            .filter(|s| newest.get(&s.pool) == Some(&s.generation))
            .collect();
        // The allocator walks pools, then slices, in name order.
        current.sort_by(|a, b| (&a.pool, &a.name).cmp(&(&b.pool, &b.name)));

        let mut inv = Inventory::default();
        for s in current {
            for (set, counters) in s.capacity {
                inv.capacity.insert((s.pool.clone(), set), counters);
            }
            inv.devices.extend(s.devices);
        }
        inv.gpus = gpus_of(&inv.devices, &inv.capacity);
        cover_whole_gpus(&mut inv.devices, &inv.gpus);
        inv.held = held_slices(&inv.devices, claims);
        inv
    }

    /// The device `name` of pool `pool`.
    pub fn device(&self, pool: &str, name: &str) -> Option<&PublishedDevice> {
        self.devices
            .iter()
            .find(|d| d.pool == pool && d.name == name)
    }

    /// Nodes with at least one GPU, sorted.
    pub fn nodes(&self) -> Vec<&str> {
        let mut nodes: Vec<&str> = self.gpus.iter().map(|g| g.node.as_str()).collect();
        nodes.dedup();
        nodes
    }
}

fn counter_values(counters: &BTreeMap<String, CounterFields>) -> Result<Counters> {
    counters
        .iter()
        .map(|(name, c)| Ok((name.clone(), quantity(&c.value)?)))
        .collect()
}

/// A Kubernetes quantity (`80Gi`, `1`, `500m` rounds down) as an integer.
///
/// # Errors
/// Not a quantity, or beyond `i128`.
pub fn quantity(q: &str) -> Result<i128> {
    let parsed = ParsedQuantity::try_from(q).map_err(|e| anyhow::anyhow!("{e}"))?;
    parsed
        .to_bytes_i128()
        .with_context(|| format!("quantity {q:?} out of range"))
}

/// A device of ours with the attributes DAS publishes on every MIG device, or a whole GPU or a
/// share of one (`type: gpu` or `gpu-shared`, profile [`WHOLE_GPU_PROFILE`], placement `0..` the memory slices it consumes
/// until [`cover_whole_gpus`]); `None` for a device without them (a future device type the
/// picture does not know).
fn published_device(pool: &str, d: DeviceFields) -> Result<Option<PublishedDevice>> {
    let Some(attrs) = d.attributes else {
        return Ok(None);
    };
    let int = |a: &Option<AttributeValue>| a.as_ref().and_then(|v| v.int).map(|v| v as u32);
    let string = |a: Option<AttributeValue>| a.and_then(|v| v.string);
    let whole = string(attrs.type_).is_some_and(|t| is_whole_gpu_type(&t));
    let placement = if whole {
        let memory_slices = d
            .consumes_counters
            .iter()
            .flatten()
            .flat_map(|c| c.counters.keys())
            .filter(|k| k.starts_with(MEMORY_SLICE_PREFIX))
            .count() as u32;
        (
            Some(0),
            Some(memory_slices),
            Some(WHOLE_GPU_PROFILE.to_string()),
        )
    } else {
        (
            int(&attrs.placement_start),
            int(&attrs.placement_size),
            string(attrs.profile),
        )
    };
    let (Some(gpu), (Some(start), Some(size), Some(profile))) = (int(&attrs.gpu_index), placement)
    else {
        return Ok(None);
    };
    let uuid = if whole { attrs.uuid } else { attrs.parent_uuid };
    let mut consumes = BTreeMap::new();
    for c in d.consumes_counters.into_iter().flatten() {
        let counters = counter_values(&c.counters)
            .with_context(|| format!("device {} of pool {pool}", d.name))?;
        consumes.insert(c.counter_set, counters);
    }
    let tainted = d
        .taints
        .iter()
        .flatten()
        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
    let shares = d
        .capacity
        .and_then(|c| c.shares)
        .and_then(|q| quantity(&q.value).ok())
        .and_then(|n| u32::try_from(n).ok());
    Ok(Some(PublishedDevice {
        pool: pool.to_string(),
        name: d.name,
        gpu,
        profile,
        start,
        size,
        consumes,
        product: string(attrs.product_name).unwrap_or_default(),
        parent_uuid: string(uuid).unwrap_or_default(),
        tainted,
        shares,
    }))
}

/// One [`GpuInfo`] per (pool, GPU index) that has devices; product and UUID from the devices'
/// attributes, memory slices from the counter set the devices consume.
fn gpus_of(
    devices: &[PublishedDevice],
    capacity: &BTreeMap<(String, String), Counters>,
) -> Vec<GpuInfo> {
    let mut gpus: BTreeMap<(String, u32), GpuInfo> = BTreeMap::new();
    for d in devices {
        gpus.entry((d.pool.clone(), d.gpu)).or_insert_with(|| {
            let counter_set = d.consumes.keys().next().cloned().unwrap_or_default();
            let memory_slices = capacity
                .get(&(d.pool.clone(), counter_set.clone()))
                .map(|c| {
                    c.keys()
                        .filter(|k| k.starts_with(MEMORY_SLICE_PREFIX))
                        .count() as u32
                })
                .unwrap_or(0);
            GpuInfo {
                node: d.pool.clone(),
                index: d.gpu,
                product: d.product.clone(),
                uuid: d.parent_uuid.clone(),
                memory_slices,
                counter_set,
            }
        });
    }
    gpus.into_values().collect()
}

/// Prefix of the per-memory-slice counters, `memory-slice-<n>` (docs/design.md §3).
const MEMORY_SLICE_PREFIX: &str = "memory-slice-";

/// Every whole GPU in `devices` covers every memory slice of its GPU in `gpus` (what its
/// counters say where the GPU's counter set is not published).
fn cover_whole_gpus(devices: &mut [PublishedDevice], gpus: &[GpuInfo]) {
    let slices: BTreeMap<(&str, u32), u32> = gpus
        .iter()
        .map(|g| ((g.node.as_str(), g.index), g.memory_slices))
        .collect();
    for d in devices
        .iter_mut()
        .filter(|d| d.profile == WHOLE_GPU_PROFILE)
    {
        if let Some(&n) = slices.get(&(d.pool.as_str(), d.gpu)).filter(|n| **n > 0) {
            d.start = 0;
            d.size = n;
        }
    }
}

/// The slices `claims` hold on published devices, sorted by node, GPU and start (the shares of
/// one shareable device next to each other, by namespace and claim).
fn held_slices(devices: &[PublishedDevice], claims: &[ResourceClaim]) -> Vec<Held> {
    let by_name: BTreeMap<(&str, &str), &PublishedDevice> = devices
        .iter()
        .map(|d| ((d.pool.as_str(), d.name.as_str()), d))
        .collect();
    let mut held = Vec::new();
    for claim in claims {
        let status = claim.status.as_ref();
        let pods: Vec<String> = status
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| r.name.clone())
            .collect();
        let pod = pods.first().cloned();
        for r in our_results(claim) {
            let Some(d) = by_name.get(&(r.pool.as_str(), r.device.as_str())) else {
                continue;
            };
            // A whole GPU's data carries an empty `migUUID`; a share's entry is that of its
            // shareID.
            let mig_uuid = our_result_status(claim, r)
                .and_then(DeviceStatusData::of)
                .map(|data| data.mig_uuid)
                .filter(|u| !u.is_empty());
            held.push(Held {
                node: d.pool.clone(),
                gpu: d.gpu,
                profile: d.profile.clone(),
                start: d.start,
                size: d.size,
                device: d.name.clone(),
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                claim: claim.metadata.name.clone().unwrap_or_default(),
                pod: pod.clone(),
                pods: pods.clone(),
                mig_uuid,
                share: AllocationShare::of(r).map(|s| HeldShare {
                    share_id: s.share_id,
                    shares: s.shares.and_then(|n| u64::try_from(n).ok()).unwrap_or(1),
                    of: d.shares,
                    memory: s.memory,
                }),
            });
        }
    }
    held.sort_by(|a, b| {
        (&a.node, a.gpu, a.start, &a.device, &a.namespace, &a.claim).cmp(&(
            &b.node,
            b.gpu,
            b.start,
            &b.device,
            &b.namespace,
            &b.claim,
        ))
    });
    held
}
