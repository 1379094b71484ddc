//! Which watch events start a reconcile.
//!
//! A reconcile reads a few fields of a ResourceClaim (its allocation results of our driver,
//! `reservedFor`, the readiness and data of our devices in `status.devices`, whether it is being
//! deleted) and of the pods that reserve it (their name and `spec.nodeName`). Most events
//! in a pod's life change none of them: the scheduler's finalizer update, the resourceclaim
//! controller's claim create, every kubelet pod-status update, and the controller's own
//! AllocationClaim writes coming back through the watch. Reconciling on each of those cost about
//! ten reconciles per claim in a 200-pod burst, where three change anything: allocated and
//! reserved (`staged`), pod bound (`created`), device ready (`inUse`); see docs/benchmarks.md,
//! "AllocationClaim controller".
//!
//! So each trigger source is filtered by a fingerprint of what the mirror reads
//! ([`claim_fingerprint`], [`pod_fingerprint`]), kept per object in [`Fingerprints`]; and the
//! AllocationClaim source drops an object whose content is what the controller itself wrote
//! ([`OwnWrites`]). An object is first seen with the fingerprint "nothing to
//! mirror" (`None`), so a claim that is not allocated to our driver starts nothing until it is.
//!
//! What the filters must never lose is covered by the periodic sweep
//! ([`crate::sweep`]): AllocationClaims whose claim is gone or no longer allocated to that
//! device are deleted there, also after a restart that missed the change.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use das_api::DRIVER_NAME;
use das_api::allocation::AllocationClaim;
use das_api::claim_status::{DeviceStatusData, is_ready, our_results};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

/// A stable 64-bit fingerprint of a JSON value (FNV-1a of its serialization; object keys come
/// out in a fixed order, so equal values give equal fingerprints).
fn fingerprint(value: &serde_json::Value) -> u64 {
    das_runtime::hash::fnv1a64(&serde_json::to_vec(value).unwrap_or_default())
}

/// Fingerprint of what [`crate::mirror::desired_allocation_claims`] reads from `claim`:
/// whether it is being deleted, its allocation results of our driver, `reservedFor`, and of
/// each of our devices in `status.devices` its readiness and the plugin's data (MIG UUID,
/// profile, GPU, placement). `None` when there is nothing to mirror: no result of our driver and
/// no deletion. Finalizers, labels, other drivers' results and conditions other than `Ready` do
/// not count.
pub fn claim_fingerprint(claim: &ResourceClaim) -> Option<u64> {
    let deleting = claim.metadata.deletion_timestamp.is_some();
    let results: Vec<_> = our_results(claim)
        .map(|r| json!([r.request, r.pool, r.device]))
        .collect();
    if results.is_empty() && !deleting {
        return None;
    }
    let status = claim.status.as_ref();
    let reserved: Vec<_> = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .map(|r| json!([r.resource, r.name, r.uid]))
        .collect();
    let devices: Vec<_> = status
        .and_then(|s| s.devices.as_ref())
        .into_iter()
        .flatten()
        .filter(|d| d.driver == DRIVER_NAME)
        .map(|d| {
            let data = DeviceStatusData::of(d).map(|x| {
                json!([
                    x.mig_uuid,
                    x.gpu_uuid,
                    x.profile,
                    x.placement.start,
                    x.placement.size
                ])
            });
            json!([d.pool, d.device, is_ready(d), data])
        })
        .collect();
    Some(fingerprint(&json!([deleting, results, reserved, devices])))
}

/// Fingerprint of what the mirror reads from a pod: the node it is bound to. The mirror finds a
/// claim's pods by the UIDs in `reservedFor` and reads only their name and node, so an unbound
/// pod, or one that uses no claim, is `None`: its creation, its claims being recorded and every
/// kubelet status update (phase, conditions, container statuses) start nothing. Binding is the
/// one pod change that moves an AllocationClaim (`staged` → `created`).
pub fn pod_fingerprint(pod: &Pod) -> Option<u64> {
    crate::device_info::pod_claims(pod).next()?;
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    Some(fingerprint(&json!(node)))
}

/// The last fingerprint seen per object (by UID). Shared by a watch's event handler and the
/// sweep, hence the mutex; each call holds it for one map operation.
#[derive(Debug, Default)]
pub struct Fingerprints(Mutex<HashMap<String, u64>>);

impl Fingerprints {
    /// Records `now` as the fingerprint of object `uid` and says whether it differs from the
    /// one recorded before. An object never seen counts as `None` before, so a first sight with
    /// `None` (nothing to mirror) is not a change.
    pub fn changed(&self, uid: &str, now: Option<u64>) -> bool {
        let mut map = self.0.lock().expect("not poisoned");
        let before = map.get(uid).copied();
        match now {
            Some(f) => map.insert(uid.to_string(), f),
            None => map.remove(uid),
        };
        before != now
    }

    /// Forgets the objects for which `live` is false (deleted ones: a shared watch stream
    /// reports no deletions).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.0.lock().expect("not poisoned").retain(|k, _| live(k));
    }

    /// Number of objects with a recorded fingerprint.
    pub fn len(&self) -> usize {
        self.0.lock().expect("not poisoned").len()
    }

    /// Whether no fingerprint is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many of its own writes per AllocationClaim the controller remembers: a reconcile writes
/// at most two (object, then status), each recorded before it is sent and again as the API
/// server's response, and the watch may deliver either after the next write.
const OWN_WRITES_KEPT: usize = 8;

/// How long a write's response stands in for an AllocationClaim the cache has not shown yet
/// (the watch is seconds behind at most; an object deleted before the cache saw it is then
/// forgotten).
const UNSEEN_KEPT: Duration = Duration::from_secs(60);

/// Fingerprint of what the controller owns in an AllocationClaim: spec, status, labels and
/// owner references (not `resourceVersion` or managed fields), of the typed object, so the
/// object as written and as read back from the watch compare equal.
pub fn content_fingerprint(a: &AllocationClaim) -> u64 {
    fingerprint(&json!([
        a.spec,
        a.status,
        a.metadata.labels,
        a.metadata.owner_references
    ]))
}

/// What the controller knows of its own writes to one AllocationClaim.
#[derive(Debug, Default)]
struct WriteLog {
    /// [`content_fingerprint`]s of the last [`OWN_WRITES_KEPT`] writes, intended and as
    /// answered.
    contents: VecDeque<u64>,
    /// The API server's answer to the last write and when it came, until the cache shows it.
    latest: Option<(Arc<AllocationClaim>, Instant)>,
}

impl WriteLog {
    fn push(&mut self, content: u64) {
        // A response usually has the content recorded before the write.
        if self.contents.contains(&content) {
            return;
        }
        if self.contents.len() == OWN_WRITES_KEPT {
            self.contents.pop_front();
        }
        self.contents.push_back(content);
    }
}

/// What the controller's own writes leave in each AllocationClaim (`<namespace>/<name>`).
///
/// - Echoes: [`content_fingerprint`]s recorded *before* each write (the watch may deliver a
///   write's event before the write's response arrives) and of each response. An
///   AllocationClaim event whose object has one of these contents is the echo of a write whose
///   reconcile already saw everything it needed; any other writer's change gives other content
///   and still triggers the owner's reconcile (drift is put back).
/// - The freshest view ([`OwnWrites::freshest`]): the last write's response, for the
///   reconcile that runs before the watch has delivered it. Without it a reconcile right after
///   a write (pod bound just after the claim was allocated, in a burst) reads the cache from
///   before the write, creates the object a second time and rewrites its status, and the
///   echoes of those writes then carry contents nobody recorded (docs/benchmarks.md,
///   "AllocationClaim controller").
#[derive(Debug, Default)]
pub struct OwnWrites(Mutex<HashMap<String, WriteLog>>);

fn key_of(a: &AllocationClaim) -> String {
    format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any())
}

impl OwnWrites {
    /// Remembers `intended`, the object as a write about to be sent will leave it.
    pub fn record(&self, intended: &AllocationClaim) {
        let mut map = self.0.lock().expect("not poisoned");
        map.entry(key_of(intended))
            .or_default()
            .push(content_fingerprint(intended));
    }

    /// Remembers the API server's answer to a write: its content is an echo, and it is the
    /// freshest view of the object until the cache shows it.
    pub fn wrote(&self, response: AllocationClaim) {
        let mut map = self.0.lock().expect("not poisoned");
        let log = map.entry(key_of(&response)).or_default();
        log.push(content_fingerprint(&response));
        log.latest = Some((Arc::new(response), Instant::now()));
    }

    /// Forgets the last response of `<namespace>/<name>` (a write failed, so the object may
    /// not be what it said, or the object was deleted); the cache is the view again.
    pub fn forget_latest(&self, key: &str) {
        if let Some(log) = self.0.lock().expect("not poisoned").get_mut(key) {
            log.latest = None;
        }
    }

    /// Whether `a` (as the watch cache has it now) is what one of our writes left.
    pub fn is_echo(&self, a: &AllocationClaim) -> bool {
        let content = content_fingerprint(a);
        self.0
            .lock()
            .expect("not poisoned")
            .get(&key_of(a))
            .is_some_and(|v| v.contents.contains(&content))
    }

    /// The freshest known state of AllocationClaim `key` of the ResourceClaim `owner_uid`,
    /// given `cached`, the cache's copy. The last write's response wins while the cache has
    /// nothing or an older copy of our own writes; the cache wins once it has that response
    /// (same `resourceVersion`) or someone else's change (a content we did not write).
    pub fn freshest(
        &self,
        key: &str,
        owner_uid: &str,
        cached: Option<Arc<AllocationClaim>>,
    ) -> Option<Arc<AllocationClaim>> {
        let map = self.0.lock().expect("not poisoned");
        let Some(log) = map.get(key) else {
            return cached;
        };
        let Some((latest, _)) = log
            .latest
            .as_ref()
            .filter(|(l, _)| l.owner_references().iter().any(|o| o.uid == owner_uid))
        else {
            return cached;
        };
        match cached {
            None => Some(latest.clone()),
            Some(c)
                if c.metadata.resource_version != latest.metadata.resource_version
                    && log.contents.contains(&content_fingerprint(&c)) =>
            {
                Some(latest.clone())
            }
            Some(c) => Some(c),
        }
    }

    /// Given `cached` (the cache's `resourceVersion` per `<namespace>/<name>`): drops each
    /// response the cache has caught up with or that is older than `UNSEEN_KEPT`, and
    /// forgets AllocationClaims that are neither cached nor waiting for such a response.
    pub fn retain(&self, cached: &HashMap<String, Option<String>>) {
        let mut map = self.0.lock().expect("not poisoned");
        map.retain(|key, log| {
            let seen = cached.get(key);
            let done = log.latest.as_ref().is_some_and(|(latest, at)| {
                seen == Some(&latest.metadata.resource_version) || at.elapsed() >= UNSEEN_KEPT
            });
            if done {
                log.latest = None;
            }
            seen.is_some() || log.latest.is_some()
        });
    }
}

/// `<namespace>/<name>` of an AllocationClaim, the key [`OwnWrites::retain`] is given.
pub fn allocation_claim_key(a: &AllocationClaim) -> String {
    key_of(a)
}

/// Claims a pod uses: its generated (`status.resourceClaimStatuses`) and named claims.
pub fn claims_of_pod(pod: &Pod) -> Vec<ObjectRef<ResourceClaim>> {
    let ns = pod.namespace().unwrap_or_default();
    crate::device_info::pod_claims(pod)
        .map(|(_, n)| ObjectRef::new(n).within(&ns))
        .collect()
}

/// The three filters of the controller's trigger sources, in one place.
#[derive(Debug, Default)]
pub struct Triggers {
    /// Last [`claim_fingerprint`] per ResourceClaim UID.
    pub claims: Fingerprints,
    /// Last [`pod_fingerprint`] per pod UID.
    pub pods: Fingerprints,
    /// What the controller's own AllocationClaim writes left.
    pub own_writes: OwnWrites,
}

impl Triggers {
    /// Whether a ResourceClaim event reconciles the claim: what the mirror reads of it changed.
    pub fn on_claim(&self, claim: &ResourceClaim) -> bool {
        self.claims
            .changed(&claim.uid().unwrap_or_default(), claim_fingerprint(claim))
    }

    /// The claims a pod event reconciles: none unless what the mirror reads of the pod changed,
    /// and then only the pod's claims that `mirrored` (the claim cache) says have results of our
    /// driver. A claim allocated later is reconciled by its own event, which then reads this
    /// pod from the pod cache, updated before this event was delivered.
    pub fn on_pod(
        &self,
        pod: &Pod,
        mirrored: impl Fn(&ObjectRef<ResourceClaim>) -> bool,
    ) -> Vec<ObjectRef<ResourceClaim>> {
        if !self
            .pods
            .changed(&pod.uid().unwrap_or_default(), pod_fingerprint(pod))
        {
            return Vec::new();
        }
        claims_of_pod(pod)
            .into_iter()
            .filter(|r| mirrored(r))
            .collect()
    }

    /// Whether an AllocationClaim event reconciles its owner: not when it is the echo of our
    /// own write.
    pub fn on_allocation_claim(&self, a: &AllocationClaim) -> bool {
        !self.own_writes.is_echo(a)
    }
}

#[cfg(test)]
mod own_writes_tests;
#[cfg(test)]
mod tests;
