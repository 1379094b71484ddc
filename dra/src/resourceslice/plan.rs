//! The pure half of the publisher: slice names, comparison keys and the reconcile plan.
//!
//! Everything here follows the upstream Go controller (kubernetes/dynamic-resource-allocation
//! `resourceslice/resourceslicecontroller.go`, `syncPool`; docs/reference/dra.md, "ResourceSlice publishing"), with
//! one deliberate difference: names are deterministic instead of `generateName`d (see
//! [`slice_name`]).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

/// Fewest hex digits of the index at the start of a slice name (upstream
/// `resourceSliceIndexMinLength`).
pub const INDEX_MIN_WIDTH: usize = 5;

/// Longest object name (a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// Hex digits used for the index when a pool has `count` slices: at least [`INDEX_MIN_WIDTH`],
/// more when `count - 1` needs more, so that every slice of the pool has the same width and
/// lexicographic order equals index order (upstream `getIndexLength`).
pub fn index_width(count: usize) -> usize {
    let digits = format!("{:x}", count.saturating_sub(1)).len();
    digits.max(INDEX_MIN_WIDTH)
}

/// The name of slice `index` of `driver`'s pool on `node`: `<index as zero-padded
/// hex>-<driver>-<node>`, e.g. `00000-dev.example.com-n0`, `0000a-dev.example.com-n0`.
///
/// Why deterministic names and not upstream's `generateName` (`<index hex>-<driver>-<node>-`
/// plus a random suffix): the same index prefix gives the same allocation priority (the 1.36+
/// allocators sort the slices of a pool by name, docs/reference/dra.md, "How the scheduler picks devices"), and a fixed name
/// makes creates idempotent: a create retried after a timeout, or two plugin instances during a
/// rolling update, cannot leave two slices for one index (the second create gets
/// `AlreadyExists`). Upstream needs a mutation cache to avoid exactly that.
///
/// Node names longer than fit in [`MAX_NAME_LEN`] are cut and get `-<crc32 of the node name>`
/// appended, so names stay unique per node and valid DNS subdomains.
pub fn slice_name(driver: &str, node: &str, index: usize, width: usize) -> String {
    let prefix = format!("{index:0width$x}-{driver}-");
    if prefix.len() + node.len() <= MAX_NAME_LEN {
        return format!("{prefix}{node}");
    }
    let hash = format!("{:08x}", crc32fast::hash(node.as_bytes()));
    let room = MAX_NAME_LEN.saturating_sub(prefix.len() + 1 + hash.len());
    let mut cut = room.min(node.len());
    while !node.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = node[..cut].trim_end_matches(['-', '.']);
    format!("{prefix}{head}-{hash}")
}

/// The index encoded in `name` if `name` is exactly [`slice_name`]`(driver, node, index,
/// width)`.
pub fn index_of(name: &str, driver: &str, node: &str, width: usize) -> Option<usize> {
    let (hex, _) = name.split_once('-')?;
    if hex.len() != width {
        return None;
    }
    let index = usize::from_str_radix(hex, 16).ok()?;
    (slice_name(driver, node, index, width) == name).then_some(index)
}

/// The owner reference every slice of `node` carries: the Node, as controller, so the garbage
/// collector deletes the slices with the Node (upstream `Owner{APIVersion: "v1", Kind: "Node"}`).
pub fn node_owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Whether `slice` names the Node `node` with `uid` as its controller.
pub fn owned_by(slice: &ResourceSlice, node: &str, uid: &str) -> bool {
    slice.metadata.owner_references.iter().flatten().any(|o| {
        o.api_version == "v1"
            && o.kind == "Node"
            && o.name == node
            && o.uid == uid
            && o.controller == Some(true)
    })
}

/// The part of a spec that decides whether a stored slice is up to date: the spec as JSON with
/// `pool.generation` set to 0, nulls, empty lists and empty maps removed (the API server omits
/// them, so `Some(vec![])` and `None` compare equal) and taints' server-filled `timeAdded`
/// removed (upstream `DevicesDeepEqual` ignores it too). Map order never matters.
pub fn spec_key(spec: &ResourceSliceSpec) -> Value {
    let mut key = serde_json::to_value(spec).expect("a ResourceSliceSpec serializes to JSON");
    if let Some(pool) = key.get_mut("pool").and_then(Value::as_object_mut) {
        pool.insert("generation".into(), Value::from(0));
    }
    strip_taint_time_added(&mut key);
    prune_empty(&mut key);
    key
}

fn strip_taint_time_added(key: &mut Value) {
    let devices = key.get_mut("devices").and_then(Value::as_array_mut);
    for device in devices.into_iter().flatten() {
        let taints = device.get_mut("taints").and_then(Value::as_array_mut);
        for taint in taints.into_iter().flatten() {
            if let Some(t) = taint.as_object_mut() {
                t.remove("timeAdded");
            }
        }
    }
}

/// Removes nulls, empty arrays and empty objects from every object, bottom-up. Array elements
/// are pruned inside but kept (positions matter).
fn prune_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for child in map.values_mut() {
                prune_empty(child);
            }
            map.retain(|_, child| !is_empty(child));
        }
        Value::Array(items) => items.iter_mut().for_each(prune_empty),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// JSON paths (`devices[0].nodeAllocatableResourceMappings`) where `stored` differs from `sent`,
/// at most `limit` of them, for the dropped-fields log line.
pub fn diff_paths(sent: &Value, stored: &Value, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    diff_into("", sent, stored, limit, &mut out);
    out
}

fn diff_into(path: &str, a: &Value, b: &Value, limit: usize, out: &mut Vec<String>) {
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let (ca, cb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                diff_into(&child, ca, cb, limit, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (ca, cb)) in x.iter().zip(y).enumerate() {
                diff_into(&format!("{path}[{i}]"), ca, cb, limit, out);
            }
        }
        _ => out.push(if path.is_empty() { "." } else { path }.to_string()),
    }
}

/// The feature gates that probably explain dropped fields, guessed from the differing paths
/// like upstream `DroppedFieldsError.DisabledFeatures` (docs/reference/dra.md, "ResourceSlice publishing"); `unknown`
/// when none fits (e.g. the server canonicalized a quantity).
pub fn guess_disabled_features(paths: &[String]) -> Vec<&'static str> {
    const GATES: &[(&str, &str)] = &[
        ("sharedCounters", "DRAPartitionableDevices"),
        ("consumesCounters", "DRAPartitionableDevices"),
        ("perDeviceNodeSelection", "DRAPartitionableDevices"),
        ("taints", "DRADeviceTaints"),
        ("bindingConditions", "DRADeviceBindingConditions"),
        ("bindingFailureConditions", "DRADeviceBindingConditions"),
        ("bindsToNode", "DRADeviceBindingConditions"),
        ("allowMultipleAllocations", "DRAConsumableCapacity"),
        ("requestPolicy", "DRAConsumableCapacity"),
        (
            "nodeAllocatableResourceMappings",
            "DRANodeAllocatableResources",
        ),
    ];
    let mut gates: Vec<&'static str> = GATES
        .iter()
        .filter(|(field, _)| paths.iter().any(|p| p.contains(field)))
        .map(|(_, gate)| *gate)
        .collect();
    gates.dedup();
    if gates.is_empty() {
        gates.push("unknown");
    }
    gates
}

/// A spec the server stored differently from what was sent (dropped fields, canonicalized
/// values), adopted as the baseline for one slice index: while the desired key is still `sent`,
/// a stored slice whose key is `stored` counts as up to date, so publishing does not loop on
/// updates (upstream `sliceStored`).
#[derive(Debug, Clone, PartialEq)]
pub struct Adopted {
    /// Key ([`spec_key`]) of the spec that was sent.
    pub sent: Value,
    /// Key of the spec the server returned.
    pub stored: Value,
}

/// Adopted baselines by slice index.
pub type Baseline = BTreeMap<usize, Adopted>;

/// Why an existing slice is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObsoleteReason {
    /// It belongs to another pool than the node's.
    OtherPool(String),
    /// Its pool generation is below the pool's highest.
    LowerGeneration {
        /// The slice's generation.
        generation: i64,
        /// The pool's highest.
        current: i64,
    },
    /// Its name is not one this publisher gives (e.g. an upstream `generateName`d slice, or an
    /// index width from a pool of another size).
    ForeignName,
    /// Its index is not below the desired slice count.
    BeyondCount {
        /// The slice's index.
        index: usize,
        /// Desired slice count.
        count: usize,
    },
    /// The whole pool is being removed ([`super::Publisher::unpublish`]).
    Unpublished,
}

impl std::fmt::Display for ObsoleteReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OtherPool(p) => write!(f, "belongs to pool {p:?}"),
            Self::LowerGeneration {
                generation,
                current,
            } => write!(f, "generation {generation} is below the pool's {current}"),
            Self::ForeignName => write!(f, "name does not follow <index>-<driver>-<node>"),
            Self::BeyondCount { index, count } => {
                write!(f, "index {index} is not below the slice count {count}")
            }
            Self::Unpublished => write!(f, "the pool is unpublished"),
        }
    }
}

/// An existing slice to delete, with the preconditions of the delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (delete precondition).
    pub uid: Option<String>,
    /// `metadata.resourceVersion` (delete precondition).
    pub resource_version: Option<String>,
    /// Why.
    pub reason: ObsoleteReason,
}

/// What one publish does, in this order: delete, update, create (upstream order: obsolete
/// devices disappear even if the new slices turn out to be invalid).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Pool generation every written slice carries.
    pub generation: i64,
    /// Whether `generation` is above the highest existing one.
    pub bumped: bool,
    /// Obsolete slices.
    pub delete: Vec<Deletion>,
    /// `(desired index, existing slice)` to replace.
    pub update: Vec<(usize, ResourceSlice)>,
    /// Desired indices without an existing slice.
    pub create: Vec<usize>,
    /// Desired indices whose slice is up to date.
    pub unchanged: Vec<usize>,
}

impl Plan {
    /// API writes the plan needs.
    pub fn writes(&self) -> usize {
        self.delete.len() + self.update.len() + self.create.len()
    }
}

/// The generation rule of the upstream controller: keep `current` when no slice is new and at
/// most one existing slice changes (one update is atomic, so consumers never see a mixed pool);
/// otherwise `current + 1`, and every slice is rewritten with it. Returns `(generation, bumped)`.
pub fn decide_generation(current: i64, new_slices: usize, changed: usize) -> (i64, bool) {
    if new_slices == 0 && changed <= 1 {
        (current, false)
    } else {
        (current + 1, true)
    }
}

/// What the publisher must know to plan: the driver, the pool (node) name, the Node UID for the
/// owner reference, the desired specs (already completed with driver, pool and node name,
/// generation 0) and the adopted baselines.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// Driver name (part of every slice name).
    pub driver: &'a str,
    /// Node name = pool name.
    pub node: &'a str,
    /// Node UID.
    pub node_uid: &'a str,
    /// Desired specs in priority order.
    pub desired: &'a [ResourceSliceSpec],
    /// Adopted baselines by index.
    pub baseline: &'a Baseline,
}

/// Plans a publish of `target` over `existing` (this node's slices of the driver, as listed).
///
/// Matching: a slice is matched to desired index `i` when its name is exactly
/// [`slice_name`]`(driver, node, i, width)`; everything else (other pools, lower generations, foreign
/// names, indices beyond the count) is obsolete. A matched slice is changed when its
/// [`spec_key`] differs from the desired one (unless an [`Adopted`] baseline explains the
/// difference) or it lacks the Node controller reference.
pub fn plan(target: PlanInput<'_>, existing: &[ResourceSlice]) -> Plan {
    let count = target.desired.len();
    let width = index_width(count);
    let (in_pool, mut delete) = split_other_pools(target.node, existing);
    let current = in_pool
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let mut matched: BTreeMap<usize, &ResourceSlice> = BTreeMap::new();
    for slice in in_pool {
        match classify(slice, target, width, current) {
            Ok(i) => {
                matched.insert(i, slice);
            }
            Err(reason) => delete.push(deletion(slice, reason)),
        }
    }
    let changed: Vec<usize> = matched
        .iter()
        .filter(|(i, s)| !up_to_date(target, **i, s))
        .map(|(i, _)| *i)
        .collect();
    let (generation, bumped) = decide_generation(current, count - matched.len(), changed.len());
    let mut plan = Plan {
        generation,
        bumped,
        delete,
        update: Vec::new(),
        create: (0..count).filter(|i| !matched.contains_key(i)).collect(),
        unchanged: Vec::new(),
    };
    for (i, slice) in matched {
        if bumped || changed.contains(&i) {
            plan.update.push((i, slice.clone()));
        } else {
            plan.unchanged.push(i);
        }
    }
    plan
}

fn split_other_pools<'a>(
    node: &str,
    existing: &'a [ResourceSlice],
) -> (Vec<&'a ResourceSlice>, Vec<Deletion>) {
    let mut sorted: Vec<&ResourceSlice> = existing.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let (mine, others): (Vec<_>, Vec<_>) =
        sorted.into_iter().partition(|s| s.spec.pool.name == node);
    let deletions = others
        .into_iter()
        .map(|s| deletion(s, ObsoleteReason::OtherPool(s.spec.pool.name.clone())))
        .collect();
    (mine, deletions)
}

/// The desired index `slice` holds, or why it is obsolete. `width`: the pool's index width;
/// `current`: its highest generation.
fn classify(
    slice: &ResourceSlice,
    target: PlanInput<'_>,
    width: usize,
    current: i64,
) -> Result<usize, ObsoleteReason> {
    let count = target.desired.len();
    let generation = slice.spec.pool.generation;
    if generation < current {
        return Err(ObsoleteReason::LowerGeneration {
            generation,
            current,
        });
    }
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let index =
        index_of(name, target.driver, target.node, width).ok_or(ObsoleteReason::ForeignName)?;
    if index >= count {
        return Err(ObsoleteReason::BeyondCount { index, count });
    }
    Ok(index)
}

fn deletion(slice: &ResourceSlice, reason: ObsoleteReason) -> Deletion {
    Deletion {
        name: slice.metadata.name.clone().unwrap_or_default(),
        uid: slice.metadata.uid.clone(),
        resource_version: slice.metadata.resource_version.clone(),
        reason,
    }
}

fn up_to_date(target: PlanInput<'_>, index: usize, slice: &ResourceSlice) -> bool {
    if !owned_by(slice, target.node, target.node_uid) {
        return false;
    }
    let want = spec_key(&target.desired[index]);
    let have = spec_key(&slice.spec);
    want == have
        || target
            .baseline
            .get(&index)
            .is_some_and(|a| a.sent == want && a.stored == have)
}

#[cfg(test)]
mod tests;
