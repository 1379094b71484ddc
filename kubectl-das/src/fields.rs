//! The part of a ResourceSlice's JSON that [`crate::inventory`] reads, and nothing else: serde
//! skips every other field without building it (metadata, device capacity, the attributes the
//! picture does not print, CEL-only fields). A listed page is decoded straight into these types
//! ([`crate::fetch::published_slices`]); a whole `ResourceSlice` of 64 devices costs several
//! times more to decode and to hold.
//!
//! Field names are those of `resource.k8s.io/v1` (k8s-openapi's `ResourceSlice`); attribute names
//! are DAS's (docs/design.md §3, `das_api::attributes`).

use std::collections::BTreeMap;

use serde::Deserialize;

/// A ResourceSlice: its name and the parts of its spec an inventory reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SliceFields {
    #[serde(default)]
    pub metadata: MetadataFields,
    #[serde(default)]
    pub spec: SpecFields,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct MetadataFields {
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecFields {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: PoolFields,
    #[serde(default)]
    pub shared_counters: Option<Vec<CounterSetFields>>,
    #[serde(default)]
    pub devices: Option<Vec<DeviceFields>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PoolFields {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub generation: i64,
}

/// A shared counter set: name → `{value: <quantity>}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CounterSetFields {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub counters: BTreeMap<String, CounterFields>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct CounterFields {
    /// A Kubernetes quantity (`80Gi`, `1`).
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceFields {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub attributes: Option<AttributeFields>,
    #[serde(default)]
    pub consumes_counters: Option<Vec<ConsumptionFields>>,
    #[serde(default)]
    pub taints: Option<Vec<TaintFields>>,
    /// Of the capacities only `shares` (a shareable device's, docs/design.md §7, "Shared
    /// slices").
    #[serde(default)]
    pub capacity: Option<CapacityFields>,
}

/// A device's capacities: only `shares` is read (`{value: <quantity>}`, the others skipped).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CapacityFields {
    #[serde(default)]
    pub shares: Option<CounterFields>,
}

/// The attributes DAS publishes that the picture and the simulation read
/// (`das_api::attributes`): six on every MIG device, and `type` and `uuid`, which tell a whole
/// GPU (docs/design.md §3); the others are skipped.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AttributeFields {
    #[serde(default, rename = "type")]
    pub type_: Option<AttributeValue>,
    #[serde(default)]
    pub uuid: Option<AttributeValue>,
    #[serde(default)]
    pub profile: Option<AttributeValue>,
    #[serde(default, rename = "gpuIndex")]
    pub gpu_index: Option<AttributeValue>,
    #[serde(default, rename = "placementStart")]
    pub placement_start: Option<AttributeValue>,
    #[serde(default, rename = "placementSize")]
    pub placement_size: Option<AttributeValue>,
    #[serde(default, rename = "productName")]
    pub product_name: Option<AttributeValue>,
    #[serde(default, rename = "parentUUID")]
    pub parent_uuid: Option<AttributeValue>,
}

/// A device attribute: one of `int`, `string` (`bool` and `version` are not read).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AttributeValue {
    #[serde(default)]
    pub int: Option<i64>,
    #[serde(default)]
    pub string: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumptionFields {
    #[serde(default)]
    pub counter_set: String,
    #[serde(default)]
    pub counters: BTreeMap<String, CounterFields>,
}

/// A device taint: only its effect is read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TaintFields {
    #[serde(default)]
    pub effect: String,
}
