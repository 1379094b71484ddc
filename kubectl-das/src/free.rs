//! Which profiles can still be placed where: the scheduler's first fit, simulated on the live
//! occupancy. A one-device request of a profile gets the first device, in published order, whose
//! consumed counters all fit in what its counter set has left (the allocator of
//! k8s.io/dynamic-resource-allocation, KEP-4815 "Partitionable Devices"); DAS publishes its
//! devices in its placement order (docs/design.md §5), so this is where the next pods would land.

use std::collections::BTreeMap;

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

/// What every counter set has left after the slices held now: capacity minus what each held
/// device consumes.
pub fn remaining(inv: &Inventory) -> BTreeMap<(String, String), Counters> {
    let mut left = inv.capacity.clone();
    for h in &inv.held {
        if let Some(d) = inv.device(&h.node, &h.device) {
            consume(&mut left, d);
        }
    }
    left
}

/// Every profile published on every node, with how many slices of it fit now. Sorted by node,
/// then slice size, then profile name.
pub fn free_profiles(inv: &Inventory) -> Vec<FreeProfile> {
    let left = remaining(inv);
    let mut keys: Vec<(&str, u32, &str)> = Vec::new();
    for d in &inv.devices {
        let key = (d.pool.as_str(), d.size, d.profile.as_str());
        if let Some(k) = keys.iter_mut().find(|k| k.0 == key.0 && k.2 == key.2) {
            k.1 = k.1.min(key.1);
        } else {
            keys.push(key);
        }
    }
    keys.sort();
    keys.into_iter()
        .map(|(node, size, profile)| {
            let per_gpu = first_fit_count(inv, &left, node, profile);
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

/// Places `profile` on `node` again and again by first fit, from the counters `left`, until no
/// device fits. GPU index → slices placed (0 for a GPU that offers the profile but has no room).
fn first_fit_count(
    inv: &Inventory,
    left: &BTreeMap<(String, String), Counters>,
    node: &str,
    profile: &str,
) -> BTreeMap<u32, u32> {
    let mut left = left.clone();
    let mut per_gpu = BTreeMap::new();
    let mut taken: Vec<&str> = Vec::new();
    for d in inv
        .devices
        .iter()
        .filter(|d| d.pool == node && d.profile == profile)
    {
        let n = per_gpu.entry(d.gpu).or_insert(0);
        let held = inv
            .held
            .iter()
            .any(|h| h.node == node && h.device == d.name);
        if d.tainted || held || taken.contains(&d.name.as_str()) || !fits(&left, d) {
            continue;
        }
        consume(&mut left, d);
        taken.push(&d.name);
        *n += 1;
    }
    per_gpu
}

/// Every counter `d` consumes is available in `left` (a counter set or counter the pool does
/// not define does not fit: the allocator refuses such a device too).
fn fits(left: &BTreeMap<(String, String), Counters>, d: &PublishedDevice) -> bool {
    d.consumes.iter().all(|(set, counters)| {
        let Some(have) = left.get(&(d.pool.clone(), set.clone())) else {
            return false;
        };
        counters
            .iter()
            .all(|(name, need)| have.get(name).is_some_and(|h| h >= need))
    })
}

fn consume(left: &mut BTreeMap<(String, String), Counters>, d: &PublishedDevice) {
    for (set, counters) in &d.consumes {
        if let Some(have) = left.get_mut(&(d.pool.clone(), set.clone())) {
            for (name, need) in counters {
                if let Some(h) = have.get_mut(name) {
                    *h -= need;
                }
            }
        }
    }
}
