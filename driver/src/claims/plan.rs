//! The transaction's rules, as pure functions of what the API server, the checkpoint and the
//! GPUs say: which allocation results are ours, which live instance is which recorded
//! instance, what a retried prepare may reuse, what the CDI spec of a claim holds ([`spec`]),
//! what start-up releases and destroys. [`super::Preparer`] carries them out. What differs
//! between kinds of device is each kind's ([`super::kinds`]), asked through the registry.
//!
//! A device whose kind makes no instance (a whole GPU, docs/design.md §7, "Whole GPUs") is
//! recorded like a MIG device without an instance: a whole GPU's profile is `gpu`, its
//! placement every memory slice of its GPU. So it overlaps every placement of its GPU
//! ([`placement_holders`]), and it is never matched to a live instance ([`is_instance`],
//! [`match_devices`]): nothing is created, looked for or destroyed for it.

use std::collections::{BTreeMap, HashMap};

use das_api::claim_status::our_results;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::PrepareError;
use super::handler::ClaimRef;
use super::kinds::{Kinds, PlanCx};
use super::layers;
use super::orphans::RuntimeError;
use crate::claims::checkpoint::{Checkpoint, ClaimRecord, PrepareState, RecordedDevice};
use crate::gpu::MigInstance;

pub(crate) mod handed;

// The published devices' index lives with what is published; re-exported for the request path.
pub use super::kinds::{Holding, Planned, is_instance, record, with_instance};
pub use crate::publish::devices::{DeviceRef, device_index};
// The tests of the request path name a device's kind as published through here.
#[cfg(test)]
pub use crate::publish::devices::DeviceKind;
pub use handed::{holdings, kubelet_devices, legacy_cdi_keys, spec_devices};

/// Resolves the allocation of `claim` (read from the API server as `rc`) for this node: each
/// result planned by its device's kind ([`crate::claims::kinds::Kind::plan`]; a shareable
/// device's share is of `shares_per_slice`, the `shares` capacity this node publishes), the
/// claim's configs applied by the layers ([`layers::plan`]: MPS), then each checked by its kind.
///
/// # Errors
/// [`PrepareError::ClaimGone`], [`PrepareError::ClaimReplaced`] (another UID),
/// [`PrepareError::NotAllocated`], [`PrepareError::NoDeviceOfOurs`],
/// [`PrepareError::InvalidConfig`] (a config for DAS that does not decode, or one a device
/// cannot wear: MPS where DAS does not serve it, [`layers::plan`]),
/// [`PrepareError::ForeignPool`] (a device of another node), [`PrepareError::UnknownDevice`],
/// [`PrepareError::WholeGpuUnavailable`] (a whole GPU's name this node does not publish),
/// [`PrepareError::AdminAccess`], [`PrepareError::Share`] (a share without `shareID`, or not
/// served with MPS).
pub(crate) fn resolve_allocation(
    claim: &ClaimRef,
    rc: Option<&ResourceClaim>,
    node: &str,
    devices: &HashMap<String, DeviceRef>,
    shares_per_slice: u64,
) -> Result<Vec<Planned>, PrepareError> {
    let rc = rc.ok_or(PrepareError::ClaimGone)?;
    let uid = rc.metadata.uid.as_deref().unwrap_or("<none>");
    if uid != claim.uid {
        return Err(PrepareError::ClaimReplaced {
            found: uid.to_string(),
        });
    }
    if rc
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .is_none()
    {
        return Err(PrepareError::NotAllocated);
    }
    let ours: Vec<_> = our_results(rc).cloned().collect();
    if ours.is_empty() {
        return Err(PrepareError::NoDeviceOfOurs);
    }
    // Every config for DAS must decode: a config DAS does not understand fails the claim
    // instead of being ignored.
    let configs = das_api::device_config::resolve(rc)
        .map_err(|reason| PrepareError::InvalidConfig { reason })?;
    let kinds = Kinds::standard();
    let cx = PlanCx { shares_per_slice };
    let planned = ours
        .into_iter()
        .map(|r| {
            if r.admin_access == Some(true) {
                return Err(PrepareError::AdminAccess { device: r.device });
            }
            if r.pool != node {
                return Err(PrepareError::ForeignPool {
                    device: r.device,
                    pool: r.pool,
                    node: node.to_string(),
                });
            }
            let Some(at) = devices.get(&r.device).cloned() else {
                return Err(kinds.unpublished(r.device));
            };
            kinds.of(&at).plan(r, at, &cx)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let planned = layers::plan(planned, &configs)?;
    for p in &planned {
        kinds.of(&p.at).check(p)?;
    }
    Ok(planned)
}

/// Whether preparing recorded device `d` made a MIG instance that its record names (its kind
/// says; a whole GPU makes none).
fn creates_instance(d: &RecordedDevice) -> bool {
    Kinds::standard().of_record(d).creates_instance()
}

/// The memory slices of `d`'s placement as a mask ([`crate::gpu::Placement::mask`]).
fn placement_mask(d: &RecordedDevice) -> u64 {
    crate::gpu::Placement {
        start: d.placement_start,
        size: d.placement_size,
    }
    .mask()
}

/// Whether several claims' records may hold `d`'s instance (each a share): its kind says.
fn shared_by_claims(d: &RecordedDevice) -> bool {
    Kinds::standard().of_record(d).shared_by_claims()
}

/// Whether `s` is recorded as an instance of any claim but `except`.
pub(crate) fn recorded_elsewhere(cp: &Checkpoint, except: &str, s: &MigInstance) -> bool {
    cp.claims
        .iter()
        .filter(|(uid, _)| uid.as_str() != except)
        .any(|(_, r)| r.devices.iter().any(|d| is_instance(d, s)))
}

/// Whether `s` is recorded as the instance of a device some claim but `except` holds alone (of
/// a kind not several claims share): when a lost checkpoint is rebuilt, a share may match a
/// MIG instance that another share of it already recorded.
pub(crate) fn recorded_unshared_elsewhere(cp: &Checkpoint, except: &str, s: &MigInstance) -> bool {
    cp.claims
        .iter()
        .filter(|(uid, _)| uid.as_str() != except)
        .any(|(_, r)| {
            r.devices
                .iter()
                .any(|d| !shared_by_claims(d) && is_instance(d, s))
        })
}

/// For each recorded device, the live instance that is it, if any. A device with its instance
/// recorded matches only that instance ([`is_instance`]). A device without (a crash between
/// creating the instance and completing the record) claims the instance at its placement, unless the
/// backend says DAS did not create it or another claim records it (`elsewhere`). A whole GPU
/// matches nothing (its entry is `None`: callers take it from [`holdings`]).
pub(crate) fn match_devices(
    devices: &[RecordedDevice],
    live: &[MigInstance],
    elsewhere: impl Fn(&MigInstance) -> bool,
) -> Vec<Option<MigInstance>> {
    devices
        .iter()
        .map(|d| {
            if !creates_instance(d) {
                return None;
            }
            live.iter()
                .find(|s| match &d.instance {
                    Some(_) => is_instance(d, s),
                    None => {
                        s.gpu_uuid == d.gpu_uuid
                            && s.profile == d.profile
                            && s.placement.start == d.placement_start
                            && s.created_by_das != Some(false)
                            && !elsewhere(s)
                    }
                })
                .cloned()
        })
        .collect()
}

/// The other claims whose records hold an instance overlapping one of `planned`'s placements (same
/// GPU, shared memory slices; a whole GPU's placement is every memory slice of its GPU, so it
/// blocks and is blocked by every device of its GPU): holder's claim UID → the first planned
/// device it blocks. Normally
/// none: the scheduler never gives one placement to two allocated claims. After a force delete
/// it does: the old pod's claim is deallocated before the kubelet has unprepared it, and its
/// containers may still run (the prepare then waits, and fails with
/// [`PrepareError::PlacementHeld`]; it never destroys the holder's MIG instance).
pub(crate) fn placement_holders(
    cp: &Checkpoint,
    uid: &str,
    planned: &[Planned],
) -> BTreeMap<String, String> {
    // Another holder of the same device of a kind several claims share is no holder: it
    // joins (its kind decides, under the GPU's lock).
    let kinds = Kinds::standard();
    let overlaps = |d: &RecordedDevice, p: &Planned| {
        d.gpu_uuid == p.at.gpu_uuid
            && d.placement_start < p.at.start + p.at.size
            && p.at.start < d.placement_start + d.placement_size
            && !(shared_by_claims(d) && kinds.of(&p.at).shared_by_claims() && d.device == p.device)
    };
    cp.claims
        .iter()
        .filter(|(other, _)| other.as_str() != uid)
        .filter_map(|(other, r)| {
            planned
                .iter()
                .find(|p| r.devices.iter().any(|d| overlaps(d, p)))
                .map(|p| (other.clone(), p.device.clone()))
        })
        .collect()
}

/// The UIDs of the pods a claim is reserved for (`status.reservedFor` entries of resource
/// `pods`), in the claim's order. The orphan rule asks the container runtime about them
/// (docs/design.md, "A slice leaves its claim").
pub fn reserving_pods(rc: &ResourceClaim) -> Vec<String> {
    rc.status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| r.uid.clone())
        .collect()
}

/// `known` with the pods of `more` that it lacks appended (a shared claim gains pods; a pod that
/// ended is kept: its containers may outlive it).
pub(crate) fn with_pods(known: &[String], more: &[String]) -> Vec<String> {
    let mut all = known.to_vec();
    for p in more {
        if !all.contains(p) {
            all.push(p.clone());
        }
    }
    all
}

/// What a prepare does with the checkpoint's record of the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnPrepare {
    /// No record: create the instances.
    Create,
    /// A completed record of this very allocation: check that its instances and CDI spec still
    /// exist, then answer with it.
    Verify,
    /// A record carved before bind for this very allocation (issue 34): check that its
    /// instances still exist, then finish the prepare without creating anything.
    FinishCarved,
    /// A half-done, releasing, or stale record (another allocation of the same claim UID):
    /// destroy what it holds first, then create.
    ReleaseFirst,
}

/// Decides [`OnPrepare`] from the record and the claim's current allocation.
pub(crate) fn on_prepare(record: Option<&ClaimRecord>, planned: &[Planned]) -> OnPrepare {
    match record {
        None => OnPrepare::Create,
        Some(r) if r.state == PrepareState::PrepareCompleted && same_devices(r, planned) => {
            OnPrepare::Verify
        }
        Some(r) if r.state == PrepareState::Carved && same_devices(r, planned) => {
            OnPrepare::FinishCarved
        }
        Some(_) => OnPrepare::ReleaseFirst,
    }
}

/// Whether a record holds exactly the planned allocation (request, pool, device and its kind,
/// its MPS limits and its share, in order).
pub(crate) fn same_devices(r: &ClaimRecord, planned: &[Planned]) -> bool {
    r.devices.len() == planned.len()
        && r.devices.iter().zip(planned).all(|(d, p)| {
            d.request == p.request
                && d.pool == p.pool
                && d.device == p.device
                && d.gpu_uuid == p.at.gpu_uuid
                && d.kind == p.at.kind
                && d.mps == p.mps
                && d.share == p.share
        })
}

/// Whether the claim recorded as `record` is still allocated, as recorded, to this node. When it
/// is not (deleted, replaced or deallocated), the kubelet may still hold it and its containers
/// may still run: the record is kept until the kubelet unprepares it, or until the orphan rule
/// ([`orphan_verdict`]) proves no container of its pods is left. A share is still allocated
/// only under its recorded `shareID`.
pub(crate) fn still_allocated(
    claim: &ClaimRef,
    record: &ClaimRecord,
    rc: Option<&ResourceClaim>,
    node: &str,
) -> bool {
    let Some(rc) = rc else { return false };
    if rc.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
        return false;
    }
    let ours: Vec<_> = our_results(rc).filter(|r| r.pool == node).collect();
    ours.len() == record.devices.len()
        && ours.iter().zip(&record.devices).all(|(r, d)| {
            r.request == d.request
                && r.device == d.device
                && d.share
                    .as_ref()
                    .is_none_or(|s| r.share_id.as_ref() == Some(&s.id))
        })
}

/// What the orphan rule concludes about a prepared claim's record (docs/design.md, "A slice
/// leaves its claim").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OrphanVerdict {
    /// The API server allocates the claim to this node as recorded: it is no orphan.
    Allocated,
    /// Keep the MIG instances; why, for the log and the Node event.
    Keep(String),
    /// The container runtime has no sandbox and no container of any pod the claim was prepared
    /// for, and no live container that carries the claim's marks: no process can reach its
    /// MIG instances, so they may go.
    Release,
}

/// What the container runtime answered for an orphan check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuntimeEvidence {
    /// Per pod the record knows: whether it still has a sandbox or container, or why the
    /// runtime could not tell.
    pub pods: Vec<(String, Result<bool, RuntimeError>)>,
    /// The live containers of any pod that carry the claim's marks
    /// ([`crate::claims::container_marks`]), or why the runtime could not tell.
    pub holding: Result<Vec<String>, RuntimeError>,
}

/// The orphan rule, for a record the kubelet holds whose claim was checked against the API
/// server (`allocated`): a claim the API server no longer allocates keeps its MIG instances until the
/// kubelet unprepares it, unless the container runtime answered (`evidence`; `None` when no
/// runtime is configured) that no sandbox or container of any recorded pod is left **and** no
/// live container of any pod carries the claim's marks (a pod the record never heard of, or a
/// container holding a reused GPU-instance ID's node). Positive evidence only: no pods recorded,
/// no runtime, an error, a single pod with containers or a single container holding a mark
/// keeps it.
pub(crate) fn orphan_verdict(
    allocated: bool,
    pods: &[String],
    evidence: Option<&RuntimeEvidence>,
) -> OrphanVerdict {
    if allocated {
        return OrphanVerdict::Allocated;
    }
    if pods.is_empty() {
        return OrphanVerdict::Keep(
            "no pod is recorded for it (a record rebuilt or written before pods were recorded), so nothing proves its containers are gone".into(),
        );
    }
    let Some(evidence) = evidence else {
        return OrphanVerdict::Keep(
            "no container runtime endpoint is configured (--container-runtime-endpoint), so nothing proves its containers are gone".into(),
        );
    };
    for pod in pods {
        match evidence.pods.iter().find(|(p, _)| p == pod).map(|(_, r)| r) {
            None => return OrphanVerdict::Keep(format!("pod {pod} was not asked about")),
            Some(Err(e)) => {
                return OrphanVerdict::Keep(format!(
                    "the container runtime could not say whether pod {pod} has containers: {e}"
                ));
            }
            Some(Ok(true)) => {
                return OrphanVerdict::Keep(format!(
                    "the container runtime still has a sandbox or container of pod {pod}"
                ));
            }
            Some(Ok(false)) => {}
        }
    }
    match &evidence.holding {
        Err(e) => OrphanVerdict::Keep(format!(
            "the container runtime could not say which containers hold its devices: {e}"
        )),
        Ok(holders) if !holders.is_empty() => OrphanVerdict::Keep(format!(
            "{} still holds its devices (a pod its record never heard of, or a container that kept a device node)",
            holders.join(", ")
        )),
        Ok(_) => OrphanVerdict::Release,
    }
}

/// What start-up does with a live instance no record claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Orphans {
    /// MIG instances to destroy: DAS created them (or `--reclaim-foreign-instances`).
    pub destroy: Vec<MigInstance>,
    /// MIG instances left alone: created by someone else (or unknown, on NVML).
    pub foreign: Vec<MigInstance>,
}

/// Sorts the live instances of the GPUs that answered into those some record claims (kept) and the
/// rest ([`Orphans`]). Call after the records without instances were rolled back.
pub fn orphans(live: &[MigInstance], cp: &Checkpoint, reclaim_foreign: bool) -> Orphans {
    let mut out = Orphans::default();
    for s in live {
        let claimed = cp
            .claims
            .values()
            .any(|r| r.devices.iter().any(|d| is_instance(d, s)));
        if claimed {
            continue;
        }
        if s.created_by_das == Some(true) || reclaim_foreign {
            out.destroy.push(s.clone());
        } else {
            out.foreign.push(s.clone());
        }
    }
    out
}

/// Per profile of `model`, how many of its placements a new instance could take right now on a
/// GPU holding `devices` (one at a time: NVML's rules of
/// [`crate::gpu::layout::Occupancy::check_hardware`] against the recorded placements). Tells why
/// a pod waits: 0 for its profile on every GPU. A device that makes no instance takes the
/// placements its own overlaps, so a GPU held whole has none.
pub(crate) fn free_placements<'a>(
    model: &crate::gpu::GpuModel,
    devices: impl Iterator<Item = &'a RecordedDevice>,
) -> Vec<(String, u64)> {
    let mut occ = crate::gpu::layout::Occupancy::empty(model);
    let mut taken = 0u64;
    for d in devices {
        if !creates_instance(d) {
            taken |= placement_mask(d);
        } else if let Some((i, _)) = model.profile(&d.profile) {
            occ.add(model, i, d.placement_start);
        }
    }
    model
        .profiles
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n = p
                .placement_starts
                .iter()
                .filter(|&&start| {
                    let at = crate::gpu::Placement {
                        start,
                        size: p.placement_size,
                    };
                    at.mask() & taken == 0 && occ.check_hardware(model, i, start).is_ok()
                })
                .count();
            (p.name.clone(), n as u64)
        })
        .collect()
}

/// The live instances no claim holds: neither recorded as a claim's instance nor overlapping a
/// placement some record holds (a prepare records the placement before it creates the
/// instance, so an instance being created is not listed). Such an instance, foreign or left
/// over, makes every overlapping device impossible to prepare; the publisher withdraws them.
/// A device of a kind that makes no instance (a whole GPU) claims none, even on its own GPU:
/// nothing is ever created for it.
pub fn unclaimed(live: &[MigInstance], cp: &Checkpoint) -> Vec<MigInstance> {
    let devices: Vec<&RecordedDevice> = cp
        .claims
        .values()
        .flat_map(|r| &r.devices)
        .filter(|d| creates_instance(d))
        .collect();
    live.iter()
        .filter(|s| {
            !devices.iter().any(|d| {
                is_instance(d, s)
                    || (d.gpu_index == s.gpu_index && placement_mask(d) & s.placement.mask() != 0)
            })
        })
        .cloned()
        .collect()
}

/// What the prepared devices of one GPU take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GpuUse {
    /// MIG instances (a device of a kind that makes none, such as a whole GPU, is none).
    pub instances: u64,
    /// Memory slices their placements cover (a whole GPU: all of its GPU's).
    pub memory_slices: u64,
}

/// What `devices` take, per GPU index.
pub fn per_gpu<'a>(devices: impl Iterator<Item = &'a RecordedDevice>) -> BTreeMap<u32, GpuUse> {
    let mut m: BTreeMap<u32, GpuUse> = BTreeMap::new();
    for d in devices {
        let u = m.entry(d.gpu_index).or_default();
        u.instances += u64::from(creates_instance(d));
        u.memory_slices += u64::from(d.placement_size);
    }
    m
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod whole_gpu_tests;
