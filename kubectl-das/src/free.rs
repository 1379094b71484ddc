//! Which profiles can still be placed where: the scheduler's first fit, simulated on the live
//! occupancy. A one-device request of a profile gets the first device, in published order, whose
//! consumed counters all fit in what its counter set has left (the allocator of
//! k8s.io/dynamic-resource-allocation, KEP-4815 "Partitionable Devices"); DAS publishes its
//! devices in its placement order (docs/design.md §5), so this is where the next pods would land.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::inventory::{Counters, Inventory, PublishedDevice};

/// How many slices of `profile` node `node` can still take, each profile counted on its own
/// (two profiles' counts compete for the same memory slices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FreeProfile {
    pub node: String,
    pub profile: String,
    /// Memory slices of one slice of the profile (the smallest, where GPU models differ).
    pub size: u32,
    /// Slices of the profile that fit now, on all GPUs of the node.
    pub count: u32,
    /// GPU index → slices that fit on that GPU (GPUs that offer the profile).
    pub per_gpu: BTreeMap<u32, u32>,
}

/// Counter set name → what it has left, of one pool.
type PoolCounters = BTreeMap<String, Counters>;

/// What every counter set has left after the slices held now: capacity minus what each held
/// device consumes, once per device however many claims hold a share of it (the scheduler
/// charges a shareable device's counters once for all its shares).
pub fn remaining(inv: &Inventory) -> BTreeMap<(String, String), Counters> {
    let mut left = inv.capacity.clone();
    let devices = device_index(inv);
    let held: HashSet<(&str, &str)> = inv
        .held
        .iter()
        .map(|h| (h.node.as_str(), h.device.as_str()))
        .collect();
    for (node, device) in held {
        if let Some(d) = devices.get(&(node, device)) {
            for (set, counters) in &d.consumes {
                if let Some(have) = left.get_mut(&(d.pool.clone(), set.clone())) {
                    subtract(have, counters);
                }
            }
        }
    }
    left
}

/// (pool, device name) → the device; the first one where a name repeats, as
/// [`Inventory::device`] finds it.
fn device_index(inv: &Inventory) -> HashMap<(&str, &str), &PublishedDevice> {
    let mut index = HashMap::with_capacity(inv.devices.len());
    for d in &inv.devices {
        index.entry((d.pool.as_str(), d.name.as_str())).or_insert(d);
    }
    index
}

/// Every profile published on every node, with how many slices of it fit now. Sorted by node,
/// then slice size, then profile name.
///
/// Each (node, profile) is simulated on that node's devices and counter sets only: the work
/// grows with the devices of the cluster, not with nodes × devices (1000 nodes of 8 H100 took
/// minutes when every count walked every device and copied every counter set).
pub fn free_profiles(inv: &Inventory) -> Vec<FreeProfile> {
    // Pool → counter set → what it has left.
    let mut left: BTreeMap<String, PoolCounters> = BTreeMap::new();
    for ((pool, set), counters) in remaining(inv) {
        left.entry(pool).or_default().insert(set, counters);
    }
    let held: HashSet<(&str, &str)> = inv
        .held
        .iter()
        .map(|h| (h.node.as_str(), h.device.as_str()))
        .collect();
    // (node, profile) → its devices in published order.
    let mut groups: BTreeMap<(&str, &str), Vec<&PublishedDevice>> = BTreeMap::new();
    for d in &inv.devices {
        groups
            .entry((d.pool.as_str(), d.profile.as_str()))
            .or_default()
            .push(d);
    }
    let mut keys: Vec<(&str, u32, &str, &[&PublishedDevice])> = groups
        .iter()
        .map(|((node, profile), devices)| {
            let size = devices.iter().map(|d| d.size).min().unwrap_or(0);
            (*node, size, *profile, devices.as_slice())
        })
        .collect();
    keys.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    let empty = PoolCounters::new();
    keys.into_iter()
        .map(|(node, size, profile, devices)| {
            let per_gpu = first_fit_count(left.get(node).unwrap_or(&empty), &held, devices);
            FreeProfile {
                node: node.to_string(),
                profile: profile.to_string(),
                size,
                count: per_gpu.values().sum(),
                per_gpu,
            }
        })
        .collect()
}

/// Places one profile on one node again and again by first fit, from the node's counters `left`,
/// until no device fits. `devices`: the node's devices of the profile, in published order.
/// GPU index → slices placed (0 for a GPU that offers the profile but has no room).
fn first_fit_count(
    left: &PoolCounters,
    held: &HashSet<(&str, &str)>,
    devices: &[&PublishedDevice],
) -> BTreeMap<u32, u32> {
    let mut left = left.clone();
    let mut per_gpu = BTreeMap::new();
    let mut taken: HashSet<&str> = HashSet::new();
    for d in devices {
        let n = per_gpu.entry(d.gpu).or_insert(0);
        let is_held = held.contains(&(d.pool.as_str(), d.name.as_str()));
        if d.tainted || is_held || taken.contains(d.name.as_str()) || !fits(&left, d) {
            continue;
        }
        for (set, counters) in &d.consumes {
            if let Some(have) = left.get_mut(set) {
                subtract(have, counters);
            }
        }
        taken.insert(&d.name);
        *n += 1;
    }
    per_gpu
}

/// Every counter `d` consumes is available in `left`, its pool's counter sets (a counter set or
/// counter the pool does not define does not fit: the allocator refuses such a device too).
fn fits(left: &PoolCounters, d: &PublishedDevice) -> bool {
    d.consumes.iter().all(|(set, counters)| {
        let Some(have) = left.get(set) else {
            return false;
        };
        counters
            .iter()
            .all(|(name, need)| have.get(name).is_some_and(|h| h >= need))
    })
}

fn subtract(have: &mut Counters, need: &Counters) {
    for (name, n) in need {
        if let Some(h) = have.get_mut(name) {
            *h -= n;
        }
    }
}
