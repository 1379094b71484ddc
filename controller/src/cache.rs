//! The controller's caches: shared reflector stores of pods, AllocationClaims and our
//! ResourceSlices, each object reduced to what the mirror reads before it is cached (pods:
//! [`keep_what_the_mirror_needs`]; slices: decoded straight into [`PublishedSlice`], listed
//! [`SLICE_PAGE_SIZE`] at a time), and the lookups a reconcile makes in them.
//!
//! The stores are shared with the trigger streams, so a reconcile always sees the change that
//! caused it
//! (<https://docs.rs/kube/latest/kube/runtime/struct.Controller.html#method.owns_shared_stream>).

use std::future::Future;

use das_api::allocation::AllocationClaim;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::mirror::{DeviceIndex, results_to_mirror};
use crate::published::{self, PublishedSlice, SLICE_PAGE_SIZE};

/// The stores a reconcile reads (the ResourceClaims' own store is the controller's).
#[derive(Clone)]
pub struct Caches {
    /// Pods, trimmed by [`keep_what_the_mirror_needs`].
    pub pods: Store<Pod>,
    /// Our ResourceSlices, as [`PublishedSlice`]s.
    pub slices: Store<PublishedSlice>,
    /// Every AllocationClaim.
    pub allocs: Store<AllocationClaim>,
}

/// The cached pods the claim's `reservedFor` names (by namespace and name). The mirror keeps
/// those whose UID matches too ([`crate::mirror::reserving_pods`]): a pod re-created under the
/// same name does not count.
pub fn pods_named_by(claim: &ResourceClaim, pods: &Store<Pod>) -> Vec<Pod> {
    let ns = claim.namespace().unwrap_or_default();
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods")
        .filter_map(|r| pods.get(&ObjectRef::new(&r.name).within(&ns)))
        .map(|p| (*p).clone())
        .collect()
}

/// The published devices of the pools the claim's results are in.
pub fn device_index(claim: &ResourceClaim, slices: &Store<PublishedSlice>) -> DeviceIndex {
    let pools: Vec<&str> = results_to_mirror(claim)
        .iter()
        .map(|r| r.pool.as_str())
        .collect();
    if pools.is_empty() {
        return DeviceIndex::default();
    }
    let relevant = slices.state_filter(|s| pools.contains(&s.pool.as_str()));
    published::device_index(relevant.iter().map(|s| s.as_ref()))
}

/// The claims allocated devices in the pool of `slice`: a change of the slice (published again
/// after a kubelet restart wiped it) re-triggers them, so their AllocationClaims get the device
/// facts back.
pub fn claims_in_pool(
    slice: &PublishedSlice,
    claims: &Store<ResourceClaim>,
) -> Vec<ObjectRef<ResourceClaim>> {
    let pool = slice.pool.as_str();
    claims
        .state()
        .iter()
        .filter(|c| results_to_mirror(c).iter().any(|r| r.pool == pool))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// A container reduced to its name and the claims it uses.
fn claims_only(c: Container) -> Container {
    Container {
        name: c.name,
        resources: c.resources.and_then(|r| {
            r.claims.map(|claims| ResourceRequirements {
                claims: Some(claims),
                ..Default::default()
            })
        }),
        ..Default::default()
    }
}

/// What the controller keeps of a pod: name, namespace, UID, `spec.nodeName`,
/// `spec.resourceClaims`, `status.resourceClaimStatuses` and, of each (init) container, its
/// name and `resources.claims` (for `das_mig_device_info`). Everything else (images, env,
/// volumes, managed fields, labels, annotations, other status) is dropped before the pod enters
/// the cache, so the cache's memory per pod stays small in a cluster of many pods.
pub fn keep_what_the_mirror_needs(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata.name = meta.name;
    pod.metadata.namespace = meta.namespace;
    pod.metadata.uid = meta.uid;
    pod.metadata.resource_version = meta.resource_version;
    pod.metadata.deletion_timestamp = meta.deletion_timestamp;
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            resource_claims: spec.resource_claims,
            containers: spec.containers.into_iter().map(claims_only).collect(),
            init_containers: spec
                .init_containers
                .map(|cs| cs.into_iter().map(claims_only).collect()),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            resource_claim_statuses: status.resource_claim_statuses,
            ..Default::default()
        });
    }
}

/// A reflector over `api`, shared: returns its store, the trigger stream of its changes and the
/// future that drives it. `trim` reduces each object before it is cached.
pub fn shared<K>(
    api: Api<K>,
    cfg: watcher::Config,
    trim: fn(&mut K),
) -> (
    Store<K>,
    reflector::ReflectHandle<K>,
    impl Future<Output = ()> + Send,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
{
    let (reader, writer) = reflector::store_shared(1024);
    let subscriber = writer.subscribe().expect("a shared store has subscribers");
    let drive = watcher(api, cfg)
        .default_backoff()
        .modify(trim)
        .reflect_shared(writer)
        .for_each(|ev| async move {
            if let Err(e) = ev {
                tracing::warn!(error = %e, "watch");
            }
        });
    (reader, subscriber, drive)
}

/// The watch of our ResourceSlices: the DAS driver's only, the initial list in pages of
/// [`SLICE_PAGE_SIZE`] (each decoded straight into [`PublishedSlice`]s).
pub fn slice_watch_config() -> watcher::Config {
    watcher::Config::default()
        .fields(&format!("spec.driver={}", das_api::DRIVER_NAME))
        .page_size(SLICE_PAGE_SIZE)
}

#[cfg(test)]
mod tests;
