//! Which pod and container hold each prepared MIG device: the rows of the
//! `das_mig_device_info` gauge, a pure function of a ResourceClaim and the pods it is reserved
//! for (docs/operations.md, "Metrics").
//!
//! A row exists once the node plugin reported the device ready with its MIG UUID and instance
//! ids ([`DeviceStatusData`]), and goes with the allocation. Its labels join with
//! dcgm-exporter's (`UUID` = GPU UUID, `GPU_I_ID` = GPU-instance id), which cannot name the
//! pod of a MIG device it did not see created. A prepared whole GPU (docs/design.md §7, "Whole
//! GPUs") has rows too: profile `gpu`, the GPU's UUID, and empty `mig_uuid` and instance ids.
//! A share of a shared slice (docs/design.md §7, "Shared slices") has its own rows, one per
//! container of each claim holding a share, all with the slice's MIG UUID, and a `share_id`
//! label (the allocation result's `shareID`) that rows of other devices lack.

use das_api::claim_status::{DeviceStatusData, is_ready, our_result_status, our_results};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::cache::pods_named_by;

/// One prepared MIG device as seen by one container (or by no container: `container` empty when
/// the pod reserves the claim but none of its containers names it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceInfo {
    /// Namespace of the pod and the claim.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name (init containers included).
    pub container: String,
    /// ResourceClaim name.
    pub claim: String,
    /// Parent GPU UUID, `GPU-…`.
    pub gpu_uuid: String,
    /// MIG device UUID, `MIG-…`; empty for a whole GPU.
    pub mig_uuid: String,
    /// GPU-instance id (empty when the plugin did not report it).
    pub gpu_instance_id: String,
    /// Compute-instance id (empty when the plugin did not report it).
    pub compute_instance_id: String,
    /// GPU-instance profile, e.g. `1g.10gb`; `gpu` for a whole GPU.
    pub profile: String,
    /// Node name (DAS pools are named after their node).
    pub node: String,
    /// The allocation result's `shareID` for a share of a shared slice (KEP-5075); empty for
    /// an exclusive slice or a whole GPU.
    pub share_id: String,
}

impl DeviceInfo {
    /// The labels of the gauge, in the documented order; `share_id` only on a share's row
    /// (rows of exclusive devices keep the label set they always had).
    pub fn labels(&self) -> Vec<(String, String)> {
        let share = (!self.share_id.is_empty()).then_some(("share_id", &self.share_id));
        [
            ("namespace", &self.namespace),
            ("pod", &self.pod),
            ("container", &self.container),
            ("claim", &self.claim),
            ("gpu_uuid", &self.gpu_uuid),
            ("mig_uuid", &self.mig_uuid),
            ("gpu_instance_id", &self.gpu_instance_id),
            ("compute_instance_id", &self.compute_instance_id),
            ("profile", &self.profile),
            ("node", &self.node),
        ]
        .into_iter()
        .chain(share)
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
    }
}

/// Rows for `claim`'s ready devices of our driver and the pods in `pods` it is reserved for.
pub fn device_info(claim: &ResourceClaim, pods: &[Pod]) -> Vec<DeviceInfo> {
    let name = claim.name_any();
    let namespace = claim.namespace().unwrap_or_default();
    let pods: Vec<&Pod> = crate::mirror::reserving_pods(claim, pods)
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    let mut rows = Vec::new();
    for r in our_results(claim) {
        let Some(status) = our_result_status(claim, r).filter(|s| is_ready(s)) else {
            continue;
        };
        let Some(data) = DeviceStatusData::of(status) else {
            continue;
        };
        for pod in &pods {
            let containers = containers_using(pod, &name, &r.request);
            let containers = if containers.is_empty() {
                vec![String::new()]
            } else {
                containers
            };
            for container in containers {
                rows.push(DeviceInfo {
                    namespace: namespace.clone(),
                    pod: pod.name_any(),
                    container,
                    claim: name.clone(),
                    gpu_uuid: data.gpu_uuid.clone(),
                    mig_uuid: data.mig_uuid.clone(),
                    gpu_instance_id: id(data.gpu_instance_id),
                    compute_instance_id: id(data.compute_instance_id),
                    profile: data.profile.clone(),
                    node: r.pool.clone(),
                    share_id: r.share_id.clone().unwrap_or_default(),
                });
            }
        }
    }
    rows.sort();
    rows
}

/// Rows for every claim in `claims` and the pods in `pods` that reserve it: the gauge as it is
/// now, computed on each scrape from the controller's caches.
pub fn cached_rows(claims: &Store<ResourceClaim>, pods: &Store<Pod>) -> Vec<DeviceInfo> {
    claims
        .state()
        .iter()
        .flat_map(|claim| device_info(claim, &pods_named_by(claim, pods)))
        .collect()
}

fn id(v: Option<u32>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// `pod`'s pod-level claim entries with the ResourceClaim each resolves to, as (entry name,
/// claim name): generated ones from `status.resourceClaimStatuses`, named ones from
/// `spec.resourceClaims[].resourceClaimName`.
pub fn pod_claims(pod: &Pod) -> impl Iterator<Item = (&str, &str)> {
    let generated = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s.name.as_str(), s.resource_claim_name.as_deref()?)));
    let named = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c.name.as_str(), c.resource_claim_name.as_deref()?)));
    generated.chain(named)
}

/// Names of `pod`'s containers (init containers first) that use request `request` of the
/// ResourceClaim named `claim`: through a pod-level claim entry that resolves to it
/// (`resourceClaimName`, or the generated name in `status.resourceClaimStatuses`), and without
/// a container-level `request` or with this request (or its parent, for a subrequest
/// `<request>/<subrequest>`).
pub fn containers_using(pod: &Pod, claim: &str, request: &str) -> Vec<String> {
    let entries: Vec<&str> = pod_claims(pod)
        .filter(|(_, name)| *name == claim)
        .map(|(entry, _)| entry)
        .collect();
    let parent = request.split('/').next().unwrap_or(request);
    let uses = |c: &Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
            .any(|rc| {
                entries.contains(&rc.name.as_str())
                    && rc
                        .request
                        .as_deref()
                        .is_none_or(|want| want == request || want == parent)
            })
    };
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter(|c| uses(c))
        .map(|c| c.name.clone())
        .collect()
}

#[cfg(test)]
mod tests;
