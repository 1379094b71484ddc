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
//!
//! A share of a shareable device (`…-shared`, docs/design.md §7, "Shared slices") is mirrored
//! like a slice of its own: each claim holding a share gets its AllocationClaim
//! `<claim>-<device>`, with the same device facts as the other shares' and `spec.share` from
//! its allocation result (`shareID`, consumed `shares` and `memory`). The plugin writes one
//! `status.devices` entry per claim and device (keyed by the shareID too), so the state reads
//! as for an exclusive slice.
//!
//! A whole GPU (device `gpu-<index>`, docs/design.md §7, "Whole GPUs") is mirrored the same way:
//! profile `gpu`, placement `{0, N}` over every memory slice of the GPU (the plugin's status
//! data, else the memory-slice counters the published device consumes), no MIG UUID. Its
//! `Ready` condition has reason `GpuPrepared`; the state reads the condition's status only.
//!
//! - [`facts`] (re-exported here): the device facts and their index ([`DeviceIndex`]);
//! - [`writes`] (re-exported here): what must be written to make a stored AllocationClaim the
//!   desired one ([`writes_needed`], [`carry_transition_time`], [`object_apply`]).

pub mod facts;
pub mod writes;

use das_api::WHOLE_GPU_PROFILE;
use das_api::allocation::{
    AllocationClaim, AllocationClaimSpec, AllocationClaimStatus, AllocationShare, AllocationState,
    CONDITION_DEVICE_HEALTHY, CONDITION_STATE, PodRef, ResourceClaimRef, StateCondition,
};
use das_api::claim_status::{
    DeviceStatusData, is_carved, is_ready, our_result_status, our_results,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

use facts::facts_of_status;
pub use facts::{Attributes, DeviceFacts, DeviceHealth, DeviceIndex, facts_of, is_memory_slice};
pub use writes::{Writes, carry_transition_time, object_apply, writes_needed};

/// Label on every AllocationClaim: UID of the ResourceClaim it mirrors (for `-l` selection).
pub const CLAIM_UID_LABEL: &str = "mig.das.com/claim-uid";

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
        // A share's entry is the one with its shareID (the plugin keys it so).
        let status = our_result_status(claim, r);
        let data = status.and_then(DeviceStatusData::of);
        let Some(facts) = devices
            .get(&r.pool, &r.device)
            .cloned()
            .map(|f| reported_placement(f, data.as_ref()))
            .or_else(|| status.and_then(facts_of_status))
        else {
            mirror.unmirrored.push(format!(
                "device {} in pool {} (request {}) is neither published nor reported by the node plugin",
                r.device, r.pool, r.request
            ));
            continue;
        };
        // Ready=True whatever its reason (`SliceCreated`, `GpuPrepared` for a whole GPU).
        let ready = status.filter(|s| is_ready(s));
        // A slice carved before the pod is bound (docs/design.md §7, "Carve before bind") exists
        // already: `created`, as the seed operator meant it.
        let carved = status.is_some_and(is_carved);
        let state = match (ready, bound || carved) {
            (Some(_), _) => AllocationState::InUse,
            (None, true) => AllocationState::Created,
            (None, false) => AllocationState::Staged,
        };
        // A whole GPU has no MIG device: its data carries an empty `migUUID`.
        let mig_uuid = data.map(|d| d.mig_uuid).filter(|u| !u.is_empty());
        mirror
            .claims
            .push(build(claim, pod.copied(), r, facts, state, mig_uuid, now));
    }
    mirror
}

/// `f` with a whole GPU's placement as the node plugin reported it, when it has: the published
/// device says it only through the memory-slice counters it consumes.
fn reported_placement(mut f: DeviceFacts, data: Option<&DeviceStatusData>) -> DeviceFacts {
    if f.profile == WHOLE_GPU_PROFILE
        && let Some(d) = data.filter(|d| d.profile == WHOLE_GPU_PROFILE)
    {
        f.placement = d.placement;
    }
    f
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
        share: AllocationShare::of(r),
    };
    let health = health_condition(facts.health.as_ref(), now);
    let what = if facts.profile == WHOLE_GPU_PROFILE {
        "whole GPU"
    } else {
        "slice"
    };
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
            message: format!("{what} is {}", state.as_str()),
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

#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
