//! Carve before bind (issue 34; KEP-5007 binding conditions), the decisions of the request path
//! (pure). With `--carve-before-bind` the plugin publishes its MIG devices with the binding
//! condition [`SLICE_READY`] and the failure condition [`SLICE_FAILED`]
//! ([`crate::publish::binding`]); the scheduler then waits in PreBind until the claim's
//! `status.devices` says one of them. The plugin watches the claims allocated to its node
//! (`super::carve_watch`), and for a claim that waits for it creates the instances exactly as a prepare
//! would, records the claim `Carved` in its checkpoint and writes [`SLICE_READY`] True (reason
//! [`REASON_CARVED`]), or, when a create fails, rolls back and writes [`SLICE_FAILED`] True
//! (reason [`REASON_CARVE_FAILED`], the error as message), so the scheduler allocates the
//! claim again. The kubelet's prepare of a carved claim checks the instances and only starts
//! the MPS daemons, writes the CDI spec and completes the record. A carved MIG instance that never
//! reaches a prepare (the claim deleted, deallocated or allocated otherwise) is destroyed at
//! once: no container was ever given it.

use das_api::DRIVER_NAME;
use das_api::claim_status::our_results;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::PrepareError;
use super::handler::ClaimRef;
use super::plan;
use crate::claims::checkpoint::{ClaimRecord, PrepareState, RecordedDevice, Share};
pub use crate::publish::binding::{SLICE_FAILED, SLICE_READY};

/// Reason of [`SLICE_READY`] True: the MIG instance was carved.
pub(crate) const REASON_CARVED: &str = "SliceCarved";
/// Reason of [`SLICE_FAILED`] True: the MIG instance could not be carved.
pub(crate) const REASON_CARVE_FAILED: &str = "CarveFailed";

/// What a carve came to, as written into the claim's `status.devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarveOutcome {
    /// The instances exist: [`SLICE_READY`] True.
    Ready,
    /// They could not be created (the message): [`SLICE_FAILED`] True.
    Failed(String),
}

/// What the watch does about one claim it sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnClaimSeen {
    /// Allocated to this node with [`SLICE_READY`] to wait for, not answered, not recorded:
    /// carve it.
    Carve,
    /// Its record is `Carved` but the claim is no longer allocated here as recorded: release it.
    ReleaseCarved,
    /// Its record is `Carved` and the claim is allocated here as recorded, but its status does
    /// not say so (a stop between the carve and its status write): write [`SLICE_READY`] again.
    Announce,
    /// Nothing to do.
    Nothing,
}

/// The claim `rc` names (its UID, `<none>` without one).
pub fn claim_ref(rc: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        namespace: rc.metadata.namespace.clone().unwrap_or_default(),
        name: rc.metadata.name.clone().unwrap_or_default(),
        uid: rc.metadata.uid.clone().unwrap_or_else(|| "<none>".into()),
    }
}

/// Whether `rc` has a result of the DAS driver in `node`'s pool that waits for [`SLICE_READY`].
pub(crate) fn waits_for_carve(rc: &ResourceClaim, node: &str) -> bool {
    our_results(rc).any(|r| {
        r.pool == node
            && r.binding_conditions
                .iter()
                .flatten()
                .any(|c| c == SLICE_READY)
    })
}

/// Whether `rc`'s `status.devices` already answers the carve of its current allocation in
/// `node`'s pool: an entry of the DAS driver for one of its results (device and share) with
/// [`SLICE_READY`] or [`SLICE_FAILED`] set no earlier than the allocation (an entry an earlier
/// allocation of the same device left is no answer; times are in whole seconds, and the
/// scheduler waits at least a second before it allocates a claim again).
pub(crate) fn carve_answered(rc: &ResourceClaim, node: &str) -> bool {
    let allocation = rc.status.as_ref().and_then(|s| s.allocation.as_ref());
    let since = allocation.and_then(|a| a.allocation_timestamp.as_ref());
    let results: Vec<_> = our_results(rc).filter(|r| r.pool == node).collect();
    let entries = rc.status.as_ref().and_then(|s| s.devices.as_ref());
    entries.into_iter().flatten().any(|d| {
        let current = results
            .iter()
            .any(|r| r.device == d.device && r.share_id == d.share_id);
        d.driver == DRIVER_NAME
            && d.pool == node
            && current
            && d.conditions.iter().flatten().any(|c| {
                (c.type_ == SLICE_READY || c.type_ == SLICE_FAILED)
                    && since.is_none_or(|t| c.last_transition_time.0 >= t.0)
            })
    })
}

/// Decides [`OnClaimSeen`] for `rc` as the watch saw it, with the checkpoint's record of its UID.
pub(crate) fn on_claim_seen(
    rc: &ResourceClaim,
    node: &str,
    record: Option<&ClaimRecord>,
) -> OnClaimSeen {
    match record {
        Some(r) if r.state == PrepareState::Carved => {
            if !plan::still_allocated(&claim_ref(rc), r, Some(rc), node) {
                OnClaimSeen::ReleaseCarved
            } else if waits_for_carve(rc, node) && !carve_answered(rc, node) {
                OnClaimSeen::Announce
            } else {
                OnClaimSeen::Nothing
            }
        }
        Some(_) => OnClaimSeen::Nothing,
        None if rc.metadata.deletion_timestamp.is_none()
            && waits_for_carve(rc, node)
            && !carve_answered(rc, node) =>
        {
            OnClaimSeen::Carve
        }
        None => OnClaimSeen::Nothing,
    }
}

/// Whether a carve that failed with `e` is answered with [`SLICE_FAILED`] (the scheduler then
/// allocates the claim again). Not when the claim changed under the carve (gone, replaced, no
/// longer allocated here: nothing waits for it) or the claim could not be read, nor after a
/// handover (the next instance carves).
pub(crate) fn fails_the_carve(e: &PrepareError) -> bool {
    !matches!(
        e,
        PrepareError::ApiRead(_)
            | PrepareError::ClaimGone
            | PrepareError::ClaimReplaced { .. }
            | PrepareError::NotAllocated
            | PrepareError::NoDeviceOfOurs
            | PrepareError::HandedOver
    )
}

/// The devices `rc` allocates in `node`'s pool, as far as a status entry needs them (request,
/// pool, device, share ID): the entries of a carve whose allocation could not be resolved.
pub(crate) fn allocated_devices(rc: Option<&ResourceClaim>, node: &str) -> Vec<RecordedDevice> {
    let results = rc.into_iter().flat_map(our_results);
    results
        .filter(|r| r.pool == node)
        .map(|r| RecordedDevice {
            time_slice: None,
            acquired: false,
            kind: Default::default(),
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            gpu_index: 0,
            gpu_uuid: String::new(),
            profile: String::new(),
            placement_start: 0,
            placement_size: 0,
            instance: None,
            mps: None,
            share: r.share_id.as_ref().map(|id| Share {
                id: id.clone(),
                shares: 0,
                of: 0,
                memory_bytes: 0,
            }),
        })
        .collect()
}

/// A condition of type `type_`, `True`, at `now`.
fn condition(type_: &str, reason: &str, message: String, now: &Time) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: "True".to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: now.clone(),
        observed_generation: None,
    }
}

/// The [`SLICE_READY`] condition of a carved device.
pub(crate) fn slice_ready(d: &RecordedDevice, now: &Time) -> Condition {
    let message = format!(
        "MIG {} at memory slice {} on GPU {} carved: {}",
        d.profile,
        d.placement_start,
        d.gpu_index,
        d.mig_uuid().unwrap_or("(no MIG instance)")
    );
    condition(SLICE_READY, REASON_CARVED, message, now)
}

/// The server-side-apply body of a carve's `status.devices` entries (field manager
/// `das-kubelet-plugin`, as the prepare's, so the prepare's write later replaces them): per
/// device only the condition of `outcome`; no `data` (the MIG instance is not prepared yet).
/// `metadata.uid` makes the API server refuse the write when the name now belongs to another
/// claim.
pub(crate) fn carve_status_body(
    claim: &ClaimRef,
    devices: &[RecordedDevice],
    outcome: &CarveOutcome,
    now: Time,
) -> serde_json::Value {
    let entries: Vec<AllocatedDeviceStatus> = devices
        .iter()
        .map(|d| {
            let c = match outcome {
                CarveOutcome::Ready => slice_ready(d, &now),
                CarveOutcome::Failed(message) => {
                    condition(SLICE_FAILED, REASON_CARVE_FAILED, message.clone(), &now)
                }
            };
            AllocatedDeviceStatus {
                driver: DRIVER_NAME.to_string(),
                pool: d.pool.clone(),
                device: d.device.clone(),
                share_id: d.share.as_ref().map(|s| s.id.clone()),
                conditions: Some(vec![c]),
                ..Default::default()
            }
        })
        .collect();
    das_api::claim_status::status_devices_apply(&claim.name, &claim.namespace, &claim.uid, &entries)
}

#[cfg(test)]
mod tests;
