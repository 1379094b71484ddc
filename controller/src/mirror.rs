//! What the AllocationClaims of one ResourceClaim should be: a pure function of the claim, the
//! pods that reserve it and the devices DAS publishes (docs/design.md §6).
//!
//! One AllocationClaim per allocation result of our driver (`mig.das.com`), named
//! `<claim>-<device>`, in the claim's namespace, owned by the claim. Its state is
//! - `inUse` when the claim's `status.devices` has the device with condition `Ready=True`
//!   (written by the node plugin after it created the slice; `migUUID` comes from its `data`),
//! - `created` when a reserving pod is bound to a node (`spec.nodeName` set),
//! - `staged` otherwise (allocated by the scheduler, pod not bound yet).
//!
//! Device facts (profile, parent GPU UUID, placement) come from the published ResourceSlices
//! (attributes of docs/design.md §3) and, when the slice is gone or not yet seen, from the device status
//! data the node plugin wrote.

use std::collections::BTreeMap;

use das_api::DRIVER_NAME;
use das_api::allocation::{
    AllocationClaim, AllocationClaimSpec, AllocationClaimStatus, AllocationState,
    CONDITION_DEVICE_HEALTHY, CONDITION_STATE, MigPlacement, PodRef, ResourceClaimRef,
    StateCondition,
};
use das_api::attributes as attr;
use das_api::claim_status::{DeviceStatusData, is_ready, our_device_status, our_results};
use das_api::health_taints;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, Device, DeviceAttribute, DeviceRequestAllocationResult, DeviceTaint,
    ResourceClaim, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

/// Label on every AllocationClaim: UID of the ResourceClaim it mirrors (for `-l` selection).
pub const CLAIM_UID_LABEL: &str = "mig.das.com/claim-uid";

/// Where a published device is: the facts an AllocationClaim needs from the ResourceSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// MIG profile, e.g. `1g.10gb`.
    pub profile: String,
    /// UUID of the parent GPU.
    pub gpu_uuid: String,
    /// Placement on the GPU.
    pub placement: MigPlacement,
    /// Health from the device's DAS taints; `None` when the device is not published (facts
    /// from the plugin's status data).
    pub health: Option<DeviceHealth>,
}

/// Health of a published device, read from the taints the node plugin puts on every device of
/// an unhealthy GPU ([`das_api::health_taints`], docs/design.md §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceHealth {
    /// No DAS health taint.
    Healthy,
    /// At least one DAS health taint: the condition's reason and message.
    Unhealthy {
        /// `GPULost`, `XID` or `UncorrectableECC` (the first taint's).
        reason: String,
        /// Every DAS taint, as `key=value:effect`.
        message: String,
    },
}

impl DeviceHealth {
    /// Health from `d`'s taints; taints of other owners do not count.
    pub fn of_device(d: &Device) -> Self {
        Self::of_taints(d.taints.as_deref().unwrap_or_default())
    }

    /// Health from a device's taints (`spec.devices[].taints`); taints of other owners do not
    /// count.
    pub fn of_taints(taints: &[DeviceTaint]) -> Self {
        let ours: Vec<_> = taints
            .iter()
            .filter_map(|t| Some((health_reason(&t.key)?, t)))
            .collect();
        let Some((reason, _)) = ours.first() else {
            return Self::Healthy;
        };
        let message = ours
            .iter()
            .map(|(_, t)| {
                format!(
                    "{}={}:{}",
                    t.key,
                    t.value.as_deref().unwrap_or(""),
                    t.effect
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        Self::Unhealthy {
            reason: (*reason).to_string(),
            message: format!("the GPU of this device is unhealthy: {message}"),
        }
    }
}

/// Condition reason for a DAS health taint key; `None` for another key.
fn health_reason(key: &str) -> Option<&'static str> {
    match key {
        health_taints::GPU_LOST => Some("GPULost"),
        health_taints::XID => Some("XID"),
        health_taints::ECC => Some("UncorrectableECC"),
        _ => None,
    }
}

/// Published devices of our driver by (pool, device name).
#[derive(Debug, Default, Clone)]
pub struct DeviceIndex(BTreeMap<(String, String), DeviceFacts>);

impl DeviceIndex {
    /// Indexes the devices of our driver in `slices` (other drivers' slices are skipped).
    pub fn from_slices<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>) -> Self {
        let mut index = BTreeMap::new();
        for s in slices.into_iter().filter(|s| s.spec.driver == DRIVER_NAME) {
            for d in s.spec.devices.iter().flatten() {
                if let Some(f) = facts_of_device(d) {
                    index.insert((s.spec.pool.name.clone(), d.name.clone()), f);
                }
            }
        }
        Self(index)
    }

    /// Indexes facts gathered elsewhere (the controller's compact slice cache,
    /// `crate::published`), by (pool, device name).
    pub fn from_facts(facts: impl IntoIterator<Item = ((String, String), DeviceFacts)>) -> Self {
        Self(facts.into_iter().collect())
    }

    /// Facts of `device` in `pool`, if published.
    pub fn get(&self, pool: &str, device: &str) -> Option<&DeviceFacts> {
        self.0.get(&(pool.to_string(), device.to_string()))
    }

    /// Number of indexed devices.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no device is indexed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A device's attributes (`spec.devices[].attributes`), by name.
pub type Attributes = BTreeMap<String, DeviceAttribute>;

/// An attribute by its short name or fully qualified (`mig.das.com/<name>`).
fn attribute<'a>(attrs: &'a Attributes, name: &str) -> Option<&'a DeviceAttribute> {
    attrs
        .get(name)
        .or_else(|| attrs.get(&format!("{DRIVER_NAME}/{name}")))
}

fn int_attribute(attrs: &Attributes, name: &str) -> Option<i32> {
    attribute(attrs, name)?
        .int
        .and_then(|v| i32::try_from(v).ok())
}

fn string_attribute(attrs: &Attributes, name: &str) -> Option<String> {
    attribute(attrs, name)?.string.clone()
}

/// Facts from a device's attributes (docs/design.md §3); `None` if one is missing.
fn facts_of_device(d: &Device) -> Option<DeviceFacts> {
    facts_of(d.attributes.as_ref(), d.taints.as_deref())
}

/// Facts from a device's attributes and taints: the attributes `profile`, `parentUUID`,
/// `placementStart` and `placementSize` (short or qualified names, docs/design.md §3) and the
/// DAS health taints; `None` if an attribute is missing. Everything the mirror reads of a
/// published device.
pub fn facts_of(attrs: Option<&Attributes>, taints: Option<&[DeviceTaint]>) -> Option<DeviceFacts> {
    let attrs = attrs?;
    Some(DeviceFacts {
        profile: string_attribute(attrs, attr::PROFILE)?,
        gpu_uuid: string_attribute(attrs, attr::PARENT_UUID)?,
        placement: MigPlacement {
            start: int_attribute(attrs, attr::PLACEMENT_START)?,
            size: int_attribute(attrs, attr::PLACEMENT_SIZE)?,
        },
        health: Some(DeviceHealth::of_taints(taints.unwrap_or_default())),
    })
}

/// Facts from the node plugin's device status data.
fn facts_of_status(s: &AllocatedDeviceStatus) -> Option<DeviceFacts> {
    let data = DeviceStatusData::of(s)?;
    Some(DeviceFacts {
        profile: data.profile,
        gpu_uuid: data.gpu_uuid,
        placement: data.placement,
        health: None,
    })
}

/// The result of mirroring one claim: the objects to keep, and the results that cannot be
/// mirrored (with the reason, for an Event).
#[derive(Debug, Default)]
pub struct Mirror {
    /// Desired AllocationClaims, in allocation-result order.
    pub claims: Vec<AllocationClaim>,
    /// Results of our driver that lack the facts an AllocationClaim needs.
    pub unmirrored: Vec<String>,
}

/// Longest object name, in bytes: a DNS subdomain's.
const MAX_NAME: usize = 253;

/// Name of the AllocationClaim of `device` in claim `claim`: `<claim>-<device>`, shortened with
/// a hash when longer than a DNS subdomain allows (253). A valid DNS subdomain whenever the
/// claim's name is one (the API server checks) and the device's a DNS label (docs/design.md §3).
pub fn allocation_claim_name(claim: &str, device: &str) -> String {
    let name = format!("{claim}-{device}");
    if name.len() <= MAX_NAME {
        return name;
    }
    shortened(&name)
}

/// `name` cut to [`MAX_NAME`] bytes, the last 17 being `-` and the FNV-1a hash of the whole
/// name in 16 hex digits: names that share their first 236 bytes stay apart.
fn shortened(name: &str) -> String {
    // FNV-1a: stable across releases, unlike `DefaultHasher`.
    let hash = das_runtime::hash::fnv1a64(name.as_bytes());
    let mut cut = MAX_NAME - 17;
    while !name.is_char_boundary(cut) {
        cut -= 1; // never panics on a name the API server would have refused anyway
    }
    // A cut just after a `.` would leave `.-`, a label that starts with `-`: not a DNS
    // subdomain, so the API server refuses it. A cut after a `-` leaves `--`, which is valid
    // and what earlier releases named such objects, so it stays.
    let prefix = name[..cut].trim_end_matches('.');
    format!("{prefix}-{hash:016x}")
}

/// Names of the AllocationClaims the claim should have: one per allocation result of our
/// driver, whether or not its device facts are known right now. An existing AllocationClaim of
/// a result still allocated is never deleted because its ResourceSlice is momentarily missing
/// (a kubelet restart wipes a node's slices until the plugin publishes them again).
pub fn desired_names(claim: &ResourceClaim) -> Vec<String> {
    let name = claim.name_any();
    results_to_mirror(claim)
        .iter()
        .map(|r| allocation_claim_name(&name, &r.device))
        .collect()
}

/// The pods in `pods` that the claim is reserved for.
pub fn reserving_pods<'a>(claim: &ResourceClaim, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let uids: Vec<&str> = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| r.uid.as_str())
        .collect();
    pods.iter()
        .filter(|p| p.metadata.uid.as_deref().is_some_and(|u| uids.contains(&u)))
        .collect()
}

/// The claim's allocation results of our driver to mirror: none when it is not allocated or is
/// being deleted (its AllocationClaims go with it).
pub fn results_to_mirror(claim: &ResourceClaim) -> Vec<&DeviceRequestAllocationResult> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    our_results(claim).collect()
}

/// The owner reference of an AllocationClaim: its ResourceClaim, so the garbage collector
/// deletes it with the claim.
fn owner_of(claim: &ResourceClaim) -> OwnerReference {
    OwnerReference {
        api_version: "resource.k8s.io/v1".into(),
        kind: "ResourceClaim".into(),
        name: claim.name_any(),
        uid: claim.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The desired AllocationClaims of `claim` (docs/design.md §6): one per allocation result of our driver.
///
/// `pods` may hold any pods; only those the claim is reserved for count. `now` (RFC 3339) is the
/// `lastTransitionTime` of the state condition; the caller keeps the stored one when the state
/// did not change (see [`carry_transition_time`]).
pub fn desired_allocation_claims(
    claim: &ResourceClaim,
    pods: &[Pod],
    devices: &DeviceIndex,
    now: &str,
) -> Mirror {
    let mut mirror = Mirror::default();
    let pods = reserving_pods(claim, pods);
    let pod = pods.first();
    let bound = pods
        .iter()
        .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
    for r in results_to_mirror(claim) {
        let status = our_device_status(claim, &r.pool, &r.device);
        let Some(facts) = devices
            .get(&r.pool, &r.device)
            .cloned()
            .or_else(|| status.and_then(facts_of_status))
        else {
            mirror.unmirrored.push(format!(
                "device {} in pool {} (request {}) is neither published nor reported by the node plugin",
                r.device, r.pool, r.request
            ));
            continue;
        };
        let ready = status.filter(|s| is_ready(s));
        let state = match (ready, bound) {
            (Some(_), _) => AllocationState::InUse,
            (None, true) => AllocationState::Created,
            (None, false) => AllocationState::Staged,
        };
        let mig_uuid = status.and_then(DeviceStatusData::of).map(|d| d.mig_uuid);
        mirror
            .claims
            .push(build(claim, pod.copied(), r, facts, state, mig_uuid, now));
    }
    mirror
}

/// One AllocationClaim.
fn build(
    claim: &ResourceClaim,
    pod: Option<&Pod>,
    r: &DeviceRequestAllocationResult,
    facts: DeviceFacts,
    state: AllocationState,
    mig_uuid: Option<String>,
    now: &str,
) -> AllocationClaim {
    let namespace = claim.namespace().unwrap_or_default();
    let claim_uid = claim.uid().unwrap_or_default();
    let spec = AllocationClaimSpec {
        profile: facts.profile.clone(),
        gpu_uuid: facts.gpu_uuid.clone(),
        mig_placement: facts.placement,
        // DAS pools are named after their node (docs/design.md §3).
        nodename: r.pool.clone(),
        pod_ref: pod.map(|p| PodRef {
            kind: "Pod".into(),
            namespace: namespace.clone(),
            name: p.name_any(),
            uid: p.uid().unwrap_or_default(),
        }),
        resource_claim_ref: ResourceClaimRef {
            name: claim.name_any(),
            uid: claim_uid.clone(),
        },
        request: r.request.clone(),
        pool: r.pool.clone(),
        device: r.device.clone(),
    };
    let health = health_condition(facts.health.as_ref(), now);
    let mut a = AllocationClaim::new(&allocation_claim_name(&claim.name_any(), &r.device), spec);
    a.metadata = ObjectMeta {
        namespace: Some(namespace),
        labels: Some([(CLAIM_UID_LABEL.to_string(), claim_uid)].into()),
        owner_references: Some(vec![owner_of(claim)]),
        ..a.metadata
    };
    a.status = Some(AllocationClaimStatus {
        state,
        mig_uuid,
        conditions: vec![StateCondition {
            type_: CONDITION_STATE.into(),
            status: "True".into(),
            reason: state.as_str().into(),
            message: format!("slice is {}", state.as_str()),
            last_transition_time: now.into(),
        }]
        .into_iter()
        .chain(health)
        .collect(),
    });
    a
}

/// The [`CONDITION_DEVICE_HEALTHY`] condition for a device of known health; none while the
/// device is not published (its health is unknown, and a kubelet restart that briefly wipes
/// the slices should not flap the condition).
fn health_condition(health: Option<&DeviceHealth>, now: &str) -> Option<StateCondition> {
    let (status, reason, message) = match health? {
        DeviceHealth::Healthy => (
            "True",
            "Healthy",
            "no health taint on the device".to_string(),
        ),
        DeviceHealth::Unhealthy { reason, message } => ("False", reason.as_str(), message.clone()),
    };
    Some(StateCondition {
        type_: CONDITION_DEVICE_HEALTHY.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: now.into(),
    })
}

/// Keeps each of `existing`'s conditions (and so its transition time) in `desired` where the
/// condition of that type has the same status and reason, so an unchanged claim compares equal
/// and is not written. A condition `desired` lacks is kept too when the device's health is
/// merely unknown for now (its slice is not published).
pub fn carry_transition_time(desired: &mut AllocationClaim, existing: &AllocationClaim) {
    let (Some(d), Some(e)) = (desired.status.as_mut(), existing.status.as_ref()) else {
        return;
    };
    for c in &mut d.conditions {
        if let Some(old) = e
            .conditions
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        {
            *c = old.clone();
        }
    }
    let health_known = d
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_DEVICE_HEALTHY);
    if !health_known {
        d.conditions.extend(
            e.conditions
                .iter()
                .filter(|c| c.type_ == CONDITION_DEVICE_HEALTHY)
                .cloned(),
        );
    }
}

/// The object apply of `desired`: the body (status left out, the status subresource is written
/// apart) and the object as the apply will leave it, `current`'s status kept (what the
/// controller records as its own write before sending it).
pub fn object_apply(
    desired: &AllocationClaim,
    current: Option<&AllocationClaim>,
) -> (AllocationClaim, AllocationClaim) {
    let mut body = desired.clone();
    body.status = None;
    let mut intended = body.clone();
    intended.status = current.and_then(|c| c.status.clone());
    (body, intended)
}

/// What must be written to make `existing` (if any) look like `desired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writes {
    /// Spec, labels or owner references differ (or the object does not exist).
    pub object: bool,
    /// Status differs.
    pub status: bool,
}

/// Compares the fields the controller owns.
pub fn writes_needed(desired: &AllocationClaim, existing: Option<&AllocationClaim>) -> Writes {
    let Some(e) = existing else {
        return Writes {
            object: true,
            status: true,
        };
    };
    let labels_ok = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| e.labels().get(k) == Some(v));
    let owners_ok = desired.metadata.owner_references == e.metadata.owner_references;
    Writes {
        object: desired.spec != e.spec || !labels_ok || !owners_ok,
        status: desired.status != e.status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-01-01T00:00:00Z";

    fn slice() -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "n0-slice"},
            "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
                "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0-mig-1g-10gb-6", "attributes": {
                        "profile": {"string": "1g.10gb"}, "parentUUID": {"string": "GPU-a"},
                        "gpuIndex": {"int": 0}, "placementStart": {"int": 6}, "placementSize": {"int": 1}}},
                    {"name": "gpu-0-mig-3g-40gb-0", "attributes": {
                        "profile": {"string": "3g.40gb"}, "parentUUID": {"string": "GPU-a"},
                        "gpuIndex": {"int": 0}, "placementStart": {"int": 0}, "placementSize": {"int": 4}}}
                ]}
        }))
        .unwrap()
    }

    fn claim(devices: &[&str], reserved: bool, status_devices: serde_json::Value) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|d| json!({"request": "mig", "driver": DRIVER_NAME, "pool": "n0", "device": d}))
            .collect();
        let reserved_for = if reserved {
            json!([{"resource": "pods", "name": "p", "uid": "pod-uid"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}},
                "reservedFor": reserved_for, "devices": status_devices}
        }))
        .unwrap()
    }

    fn pod(node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
            "spec": {"containers": [], "nodeName": node}
        }))
        .unwrap()
    }

    fn ready(device: &str, status: &str) -> serde_json::Value {
        json!({"driver": DRIVER_NAME, "pool": "n0", "device": device,
            "conditions": [{"type": "Ready", "status": status, "reason": "SliceCreated",
                "message": "", "lastTransitionTime": NOW}],
            "data": {"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
                "placement": {"start": 6, "size": 1}}})
    }

    fn index() -> DeviceIndex {
        DeviceIndex::from_slices([&slice()])
    }

    #[test]
    fn allocated_claim_without_bound_pod_is_staged() {
        let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
        let m = desired_allocation_claims(&c, &[pod(None)], &index(), NOW);
        assert_eq!(m.claims.len(), 1);
        let a = &m.claims[0];
        assert_eq!(a.metadata.name.as_deref(), Some("c-gpu-0-mig-1g-10gb-6"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(a.spec.profile, "1g.10gb");
        assert_eq!(a.spec.gpu_uuid, "GPU-a");
        assert_eq!(a.spec.mig_placement, MigPlacement { start: 6, size: 1 });
        assert_eq!(a.spec.nodename, "n0");
        assert_eq!(a.spec.pod_ref.as_ref().unwrap().uid, "pod-uid");
        assert_eq!(a.spec.resource_claim_ref.uid, "claim-uid");
        let owner = &a.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ResourceClaim", "claim-uid")
        );
        let s = a.status.as_ref().unwrap();
        assert_eq!(s.state, AllocationState::Staged);
        assert_eq!(s.conditions[0].reason, "staged");
        assert_eq!(s.mig_uuid, None);
    }

    #[test]
    fn bound_pod_makes_it_created() {
        let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
        let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
        assert_eq!(
            m.claims[0].status.as_ref().unwrap().state,
            AllocationState::Created
        );
    }

    #[test]
    fn unreserved_pods_do_not_count() {
        let c = claim(&["gpu-0-mig-1g-10gb-6"], false, json!([]));
        let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
        let a = &m.claims[0];
        assert_eq!(a.status.as_ref().unwrap().state, AllocationState::Staged);
        assert!(a.spec.pod_ref.is_none());
    }

    #[test]
    fn ready_device_is_in_use_with_mig_uuid() {
        let c = claim(
            &["gpu-0-mig-1g-10gb-6"],
            true,
            json!([ready("gpu-0-mig-1g-10gb-6", "True")]),
        );
        let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
        let s = m.claims[0].status.as_ref().unwrap();
        assert_eq!(s.state, AllocationState::InUse);
        assert_eq!(s.mig_uuid.as_deref(), Some("MIG-1"));
        assert_eq!(s.conditions[0].reason, "inUse");
    }

    #[test]
    fn not_ready_device_is_not_in_use() {
        let c = claim(
            &["gpu-0-mig-1g-10gb-6"],
            true,
            json!([ready("gpu-0-mig-1g-10gb-6", "False")]),
        );
        let m = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW);
        assert_eq!(
            m.claims[0].status.as_ref().unwrap().state,
            AllocationState::Created
        );
    }

    #[test]
    fn one_per_result_of_our_driver_only() {
        let mut c = claim(
            &["gpu-0-mig-1g-10gb-6", "gpu-0-mig-3g-40gb-0"],
            true,
            json!([]),
        );
        let other: DeviceRequestAllocationResult = serde_json::from_value(
            json!({"request": "net", "driver": "other.example.com", "pool": "n0", "device": "x"}),
        )
        .unwrap();
        let results = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
        results
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()
            .push(other);
        let m = desired_allocation_claims(&c, &[pod(None)], &index(), NOW);
        let placements: Vec<_> = m.claims.iter().map(|a| a.spec.mig_placement).collect();
        assert_eq!(
            placements,
            [
                MigPlacement { start: 6, size: 1 },
                MigPlacement { start: 0, size: 4 }
            ]
        );
        assert!(m.unmirrored.is_empty());
    }

    #[test]
    fn unallocated_or_deleting_claim_has_none() {
        let mut c = claim(&[], true, json!([]));
        assert!(
            desired_allocation_claims(&c, &[], &index(), NOW)
                .claims
                .is_empty()
        );
        c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
        c.metadata.deletion_timestamp = Some(serde_json::from_value(json!(NOW)).unwrap());
        assert!(
            desired_allocation_claims(&c, &[], &index(), NOW)
                .claims
                .is_empty()
        );
    }

    #[test]
    fn status_data_stands_in_for_a_missing_slice() {
        let c = claim(
            &["gpu-0-mig-1g-10gb-6"],
            true,
            json!([ready("gpu-0-mig-1g-10gb-6", "True")]),
        );
        let m = desired_allocation_claims(&c, &[], &DeviceIndex::default(), NOW);
        assert_eq!(m.claims[0].spec.gpu_uuid, "GPU-a");
        let c = claim(&["gpu-9-mig-1g-10gb-0"], true, json!([]));
        let m = desired_allocation_claims(&c, &[], &DeviceIndex::default(), NOW);
        assert!(m.claims.is_empty());
        assert_eq!(m.unmirrored.len(), 1);
    }

    /// A result whose device facts are momentarily unknown (its slice wiped by a kubelet
    /// restart, no status yet) cannot be mirrored now, but its existing AllocationClaim is kept.
    #[test]
    fn an_allocated_result_keeps_its_allocation_claim_while_its_slice_is_missing() {
        let c = claim(&["gpu-9-mig-1g-10gb-0"], true, json!([]));
        let m = desired_allocation_claims(&c, &[], &DeviceIndex::default(), NOW);
        assert!(m.claims.is_empty());
        let names = desired_names(&c);
        assert_eq!(names.len(), 1);
        assert!(names[0].ends_with("gpu-9-mig-1g-10gb-0"), "{names:?}");
        let mut deleting = c.clone();
        deleting.metadata.deletion_timestamp = Some(serde_json::from_value(json!(NOW)).unwrap());
        assert!(desired_names(&deleting).is_empty());
    }

    #[test]
    fn unchanged_object_needs_no_write() {
        let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
        let existing = desired_allocation_claims(&c, &[pod(None)], &index(), NOW)
            .claims
            .remove(0);
        let mut later =
            desired_allocation_claims(&c, &[pod(None)], &index(), "2026-01-02T00:00:00Z")
                .claims
                .remove(0);
        carry_transition_time(&mut later, &existing);
        assert_eq!(
            writes_needed(&later, Some(&existing)),
            Writes {
                object: false,
                status: false
            }
        );
        let mut bound = desired_allocation_claims(&c, &[pod(Some("n0"))], &index(), NOW)
            .claims
            .remove(0);
        carry_transition_time(&mut bound, &existing);
        assert_eq!(
            writes_needed(&bound, Some(&existing)),
            Writes {
                object: false,
                status: true
            }
        );
        assert_eq!(
            writes_needed(&bound, None),
            Writes {
                object: true,
                status: true
            }
        );
    }

    fn health_of(a: &AllocationClaim) -> Option<&StateCondition> {
        a.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEVICE_HEALTHY)
    }

    #[test]
    fn a_das_health_taint_makes_the_device_unhealthy_and_others_do_not() {
        let c = claim(&["gpu-0-mig-1g-10gb-6"], true, json!([]));
        let healthy = desired_allocation_claims(&c, &[pod(None)], &index(), NOW)
            .claims
            .remove(0);
        let h = health_of(&healthy).unwrap();
        assert_eq!((h.status.as_str(), h.reason.as_str()), ("True", "Healthy"));

        let mut tainted = slice();
        let device = &mut tainted.spec.devices.as_mut().unwrap()[0];
        device.taints = Some(
            serde_json::from_value(json!([
                {"key": "example.com/other", "value": "x", "effect": "NoSchedule"},
                {"key": health_taints::XID, "value": "79", "effect": "NoExecute"},
                {"key": health_taints::GPU_LOST, "value": "true", "effect": "NoExecute"}
            ]))
            .unwrap(),
        );
        let index = DeviceIndex::from_slices([&tainted]);
        let later = "2026-01-02T00:00:00Z";
        let mut sick = desired_allocation_claims(&c, &[pod(None)], &index, later)
            .claims
            .remove(0);
        carry_transition_time(&mut sick, &healthy);
        let h = health_of(&sick).unwrap();
        assert_eq!((h.status.as_str(), h.reason.as_str()), ("False", "XID"));
        assert!(
            h.message.contains("mig.das.com/xid=79:NoExecute"),
            "{}",
            h.message
        );
        assert!(
            h.message.contains("mig.das.com/gpu-lost=true:NoExecute"),
            "{}",
            h.message
        );
        assert!(!h.message.contains("example.com"), "{}", h.message);
        assert_eq!(
            h.last_transition_time, later,
            "a new status is a transition"
        );
        assert_eq!(
            sick.status.as_ref().unwrap().conditions[0].last_transition_time,
            NOW,
            "the unchanged state condition keeps its time"
        );
        assert!(writes_needed(&sick, Some(&healthy)).status);
    }

    #[test]
    fn health_is_kept_while_the_slice_is_not_published() {
        let c = claim(
            &["gpu-0-mig-1g-10gb-6"],
            true,
            json!([ready("gpu-0-mig-1g-10gb-6", "True")]),
        );
        let published = desired_allocation_claims(&c, &[pod(None)], &index(), NOW)
            .claims
            .remove(0);
        let mut unpublished = desired_allocation_claims(
            &c,
            &[pod(None)],
            &DeviceIndex::default(),
            "2026-01-02T00:00:00Z",
        )
        .claims
        .remove(0);
        assert!(
            health_of(&unpublished).is_none(),
            "unknown while unpublished"
        );
        carry_transition_time(&mut unpublished, &published);
        assert_eq!(health_of(&unpublished), health_of(&published));
        assert!(!writes_needed(&unpublished, Some(&published)).status);
    }

    /// Kubernetes' DNS-1123 subdomain: at most 253 bytes, dot-separated labels of `[a-z0-9-]`
    /// that start and end with a letter or digit.
    fn is_dns_subdomain(s: &str) -> bool {
        let label_ok = |l: &str| {
            let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            l.starts_with(alnum) && l.ends_with(alnum) && l.chars().all(|c| alnum(c) || c == '-')
        };
        s.len() <= MAX_NAME && s.split('.').all(label_ok)
    }

    /// Issue 30 item 8: a cut that lands just after a `.` of a long claim name gave `….-<hash>`,
    /// which the API server refuses. (Only the claim's and the device's names make the name: the
    /// object lives in the claim's namespace, and pods do not enter it.)
    #[test]
    fn shortened_names_stay_dns_subdomains_and_apart() {
        let devices = ["gpu-0-mig-1g-10gb-6", "gpu-15-mig-1g-24gb--me-3"];
        let mut seen = std::collections::HashSet::new();
        // Every position of a `.` around the cut (236), in claims of up to 253 bytes.
        for dot in 200..252 {
            let lens: std::collections::BTreeSet<usize> = [dot + 2, 240, 253].into();
            for len in lens.into_iter().filter(|l| *l >= dot + 2) {
                let claim = format!("{}.{}", "a".repeat(dot), "b".repeat(len - dot - 1));
                assert!(is_dns_subdomain(&claim), "{claim}");
                for d in devices {
                    let n = allocation_claim_name(&claim, d);
                    assert!(is_dns_subdomain(&n), "{claim} {d}: {n}");
                    assert_eq!(n, allocation_claim_name(&claim, d), "stable");
                    assert!(seen.insert(n.clone()), "{claim} {d}: {n} given twice");
                }
            }
        }
        // A cut after a `-` keeps the name earlier releases gave.
        let claim = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        let full = format!("{claim}-{}", devices[0]);
        let hash = das_runtime::hash::fnv1a64(full.as_bytes());
        assert_eq!(
            allocation_claim_name(&claim, devices[0]),
            format!("{}-{hash:016x}", &full[..236])
        );
    }

    #[test]
    fn long_names_are_shortened_stably() {
        let long = "c".repeat(250);
        let n = allocation_claim_name(&long, "gpu-0-mig-1g-10gb-6");
        assert_eq!(n.len(), 253);
        assert_eq!(n, allocation_claim_name(&long, "gpu-0-mig-1g-10gb-6"));
        assert_ne!(n, allocation_claim_name(&long, "gpu-0-mig-1g-10gb-5"));
    }
}
