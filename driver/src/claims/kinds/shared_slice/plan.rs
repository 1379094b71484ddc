//! Shares of a shareable device (pure; docs/design.md §7, "Shared slices"): what a claim's
//! share is (the allocation result's `shareID` and consumed capacity), whether a prepare creates
//! the MIG instance or joins the one other shares hold, and whether a release leaves the MIG instance to
//! them. The records of the checkpoint are the shares' reference count: a MIG instance lives while a
//! record holds it.
//!
//! A MIG instance serves one namespace unless the admin lets shares cross namespaces (docs/design.md
//! §7, "Shares are a tenant's own"): [`check_namespace`] refuses, before anything is recorded,
//! a share of a MIG instance that claims of another namespace hold, [`on_share`] decides the same
//! under the GPU's lock, and [`share_namespaces`] is what the publisher puts on each shareable
//! device (`shareNamespace`) so that das-webhook's selector steers the scheduler away.

use std::collections::{BTreeMap, BTreeSet};

use das_api::capacities;
use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;

use crate::claims::checkpoint::{
    Checkpoint, ClaimRecord, InstanceId, PrepareState, RecordedDevice, Share,
};
use crate::claims::kinds::Planned;
use crate::claims::{PrepareError, ShareRefusal};

/// The share `r` gives its claim of shareable device `device`, whose `shares` capacity is `of`.
///
/// # Errors
/// [`PrepareError::Share`]: no `shareID` (a scheduler without consumable capacity allocated
/// it), or a consumed capacity that is no count or size.
pub(crate) fn share_of(
    device: &str,
    r: &DeviceRequestAllocationResult,
    of: u64,
) -> Result<Share, PrepareError> {
    let fail = |reason: ShareRefusal| PrepareError::Share {
        device: device.to_string(),
        reason,
    };
    let id = r
        .share_id
        .clone()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| fail(ShareRefusal::NoShareId))?;
    let consumed = |name: &str| -> Result<Option<u64>, PrepareError> {
        let Some(q) = r.consumed_capacity.as_ref().and_then(|c| c.get(name)) else {
            return Ok(None);
        };
        das_api::device_config::quantity_bytes(&q.0)
            .map(Some)
            .map_err(|error| {
                fail(ShareRefusal::BadCapacity {
                    name: name.to_string(),
                    value: q.0.clone(),
                    error,
                })
            })
    };
    // The scheduler lists every capacity, consumed or not; a missing one is its default.
    let shares = consumed(capacities::SHARES)?.unwrap_or(1).max(1);
    let memory_bytes = consumed(capacities::MEMORY)?.unwrap_or(0);
    Ok(Share {
        id,
        shares,
        of: of.max(1),
        memory_bytes,
    })
}

/// Allocation result `r` of shareable device `at` planned with its share ([`share_of`]), of the
/// `shares` this node publishes.
///
/// # Errors
/// As [`share_of`].
pub(crate) fn planned_share(
    r: DeviceRequestAllocationResult,
    at: crate::publish::devices::DeviceRef,
    cx: &crate::claims::kinds::PlanCx,
) -> Result<Planned, PrepareError> {
    let share = share_of(&r.device, &r, cx.shares_per_slice)?;
    Ok(Planned {
        share: Some(share),
        ..Planned::of(r, at)
    })
}

/// Checks that every share of the claim is served with MPS: a shared slice's clients reach it
/// through its MPS control daemon only (its DeviceClass sets `sharing.strategy: MPS`).
///
/// # Errors
/// [`PrepareError::Share`]: a share whose config asks for another strategy.
pub(crate) fn check_mps(planned: &[Planned]) -> Result<(), PrepareError> {
    match planned
        .iter()
        .find(|p| p.share.is_some() && p.mps.is_none())
    {
        Some(p) => Err(PrepareError::Share {
            device: p.device.clone(),
            reason: ShareRefusal::NotMps {
                request: p.request.clone(),
                shared_class: das_api::shared_profile_device_class(&p.at.profile),
                exclusive_class: if p.at.profile == das_api::WHOLE_GPU_PROFILE {
                    das_api::DEVICE_CLASS_WHOLE_GPU.to_string()
                } else {
                    das_api::profile_device_class(&p.at.profile)
                },
            },
        }),
        None => Ok(()),
    }
}

/// Whether `d` is a share of the shareable device `device` of GPU `gpu_uuid`.
fn is_share_of(d: &RecordedDevice, gpu_uuid: &str, device: &str) -> bool {
    d.share.is_some() && d.gpu_uuid == gpu_uuid && d.device == device
}

/// The other claims' records that hold a share of `p`'s device with its instance (a share of a
/// whole GPU: marked acquired), with that share: (claim UID, record, device).
fn instance_holders<'a>(
    cp: &'a Checkpoint,
    uid: &str,
    gpu_uuid: &str,
    device: &str,
) -> impl Iterator<Item = (&'a String, &'a ClaimRecord, &'a RecordedDevice)> {
    share_holders(cp, uid, gpu_uuid, device).filter(|(_, _, d)| d.instance.is_some() || d.acquired)
}

/// The other claims' records that hold a share of `device` of GPU `gpu_uuid`, whatever their
/// state and whether or not its instance is recorded yet: (claim UID, record, device).
fn share_holders<'a>(
    cp: &'a Checkpoint,
    uid: &str,
    gpu_uuid: &str,
    device: &str,
) -> impl Iterator<Item = (&'a String, &'a ClaimRecord, &'a RecordedDevice)> {
    let (uid, gpu_uuid, device) = (uid.to_string(), gpu_uuid.to_string(), device.to_string());
    cp.claims
        .iter()
        .filter(move |(other, _)| **other != uid)
        .flat_map(|(other, r)| r.devices.iter().map(move |d| (other, r, d)))
        .filter(move |(_, _, d)| is_share_of(d, &gpu_uuid, &device))
}

/// Before anything is recorded for claim `uid`: refuses a planned share of a MIG instance that claims
/// of a namespace other than `only` hold shares of (any state: a prepare under way, a share
/// being released). `only` is the claim's namespace, or `None` where shares may cross
/// namespaces (nothing is refused). A retried prepare of a completed claim never comes here.
///
/// # Errors
/// [`PrepareError::Share`] naming the namespace the MIG instance serves, its holders and what to do.
pub(crate) fn check_namespace(
    cp: &Checkpoint,
    uid: &str,
    only: Option<&str>,
    planned: &[Planned],
) -> Result<(), PrepareError> {
    let Some(ns) = only else {
        return Ok(());
    };
    for p in planned.iter().filter(|p| p.share.is_some()) {
        let holders: Vec<_> = share_holders(cp, uid, &p.at.gpu_uuid, &p.device).collect();
        if let Some(e) = other_namespace(&p.device, ns, &holders) {
            return Err(e);
        }
    }
    Ok(())
}

/// The refusal of a share from namespace `ns` of `device`, whose other `holders` include
/// claims of another namespace; `None` when they are all of `ns`.
fn other_namespace(
    device: &str,
    ns: &str,
    holders: &[(&String, &ClaimRecord, &RecordedDevice)],
) -> Option<PrepareError> {
    if holders.iter().all(|(_, r, _)| r.namespace == ns) {
        return None;
    }
    let serves: BTreeSet<&str> = holders
        .iter()
        .map(|(_, r, _)| r.namespace.as_str())
        .collect();
    let serves = serves.into_iter().collect::<Vec<_>>().join(" and ");
    Some(PrepareError::Share {
        device: device.to_string(),
        reason: ShareRefusal::OtherNamespace {
            serves,
            holders: names(holders),
            namespace: ns.to_string(),
        },
    })
}

/// What each shareable device published now carries as its `shareNamespace` attribute: by
/// device name, the namespace of the claims whose records hold a share of it (any state: a
/// share being prepared or released holds it too), or
/// [`das_api::attributes::SHARE_NAMESPACE_SEVERAL`] where claims of several namespaces do.
/// Devices no record shares are absent. Device names are unique on a node.
pub fn share_namespaces(cp: &Checkpoint) -> BTreeMap<String, String> {
    let mut by_device: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in cp.claims.values() {
        for d in r.devices.iter().filter(|d| d.share.is_some()) {
            by_device
                .entry(d.device.as_str())
                .or_default()
                .insert(r.namespace.as_str());
        }
    }
    by_device
        .into_iter()
        .map(|(device, namespaces)| {
            let value = match namespaces.first() {
                Some(ns) if namespaces.len() == 1 => ns.to_string(),
                _ => das_api::attributes::SHARE_NAMESPACE_SEVERAL.to_string(),
            };
            (device.to_string(), value)
        })
        .collect()
}

/// What a prepare does for a planned share, decided under its GPU's lock (where instances are
/// recorded, and shares of whole GPUs marked acquired, so the records say who holds what).
#[derive(Debug, Clone)]
pub(crate) enum OnShare {
    /// No other share holds the MIG instance: create it.
    Create,
    /// Join the MIG instance other shares hold (same config): record its instance.
    Join(InstanceId),
    /// Join the whole GPU other shares hold (same config): mark the share acquired.
    JoinGpu,
    /// Neither: the MIG instance serves another namespace, its config differs, or its only holders
    /// are being released (the kubelet retries the prepare once they are gone).
    Refuse(PrepareError),
}

/// Decides [`OnShare`] for planned share `p` of claim `uid`, whose MIG instance may serve namespace
/// `only` alone (`None`: shares may cross namespaces). A share joins only a MIG instance some share
/// holds that is not being released: a release decides whether it is the last holder after it
/// marks its record `Releasing`, so no share joins a MIG instance whose release has begun. Only the
/// holders with the instance recorded count here: of two claims of different namespaces that
/// passed [`check_namespace`] at once, the first to take the GPU's lock creates the MIG instance and
/// the other is refused, never both.
pub(crate) fn on_share(cp: &Checkpoint, uid: &str, only: Option<&str>, p: &Planned) -> OnShare {
    let holders: Vec<_> = instance_holders(cp, uid, &p.at.gpu_uuid, &p.device).collect();
    if holders.is_empty() {
        return OnShare::Create;
    }
    if let Some(e) = only.and_then(|ns| other_namespace(&p.device, ns, &holders)) {
        return OnShare::Refuse(e);
    }
    let live = holders
        .iter()
        .find(|(_, r, _)| r.state != PrepareState::Releasing);
    let Some((_, _, d)) = live else {
        return OnShare::Refuse(PrepareError::Share {
            device: p.device.clone(),
            reason: ShareRefusal::Releasing {
                holders: names(&holders),
            },
        });
    };
    if d.mps != p.mps {
        return OnShare::Refuse(PrepareError::Share {
            device: p.device.clone(),
            reason: ShareRefusal::OtherConfig {
                holders: names(&holders),
                theirs: limits(d.mps.as_ref()),
                ours: limits(p.mps.as_ref()),
            },
        });
    }
    match &d.instance {
        Some(i) => OnShare::Join(i.clone()),
        None if d.acquired => OnShare::JoinGpu,
        None => OnShare::Create,
    }
}

/// Whether another claim's share, not being released, holds the instance of `d` (a share of
/// claim `uid`): then releasing `d` leaves the MIG instance and its MPS daemon to it.
pub(crate) fn kept_by_other_shares(cp: &Checkpoint, uid: &str, d: &RecordedDevice) -> bool {
    d.share.is_some()
        && instance_holders(cp, uid, &d.gpu_uuid, &d.device)
            .any(|(_, r, _)| r.state != PrepareState::Releasing)
}

/// The claims of `holders`, for messages: `ns/name` each.
fn names(holders: &[(&String, &ClaimRecord, &RecordedDevice)]) -> String {
    holders
        .iter()
        .map(|(_, r, _)| format!("claim {}/{}", r.namespace, r.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// MPS limits as a message shows them.
fn limits(l: Option<&crate::mps::MpsLimits>) -> String {
    match l {
        None => "none (not MPS)".into(),
        Some(l) => format!(
            "activeThreadPercentage {}, pinnedDeviceMemoryLimit {}",
            l.active_thread_percentage
                .map_or("unset".into(), |p| p.to_string()),
            l.pinned_device_memory_limit_mib
                .map_or("unset".into(), |m| format!("{m}Mi"))
        ),
    }
}

#[cfg(test)]
mod tests;
