//! `nvidia.com/gpu: N` (NVIDIA's device-plugin resource of whole GPUs) as a claim for N whole
//! GPUs of the DeviceClass `gpu.das.com` (docs/design.md §3, "legacy webhook"; §7, "Whole
//! GPUs"). Only with `--translate-whole-gpus` ([`super::Offered::whole_gpus`] is `Some`);
//! otherwise such requests are left alone. Same checks as for MIG slices: a positive integer,
//! requests equal to limits, no more than one node offers, no DAS claim for whole GPUs already.
//!
//! Names: pod claim `gpu-<container>`, template `das-gpu-x<N>` with one request `gpu`.

use das_api::{DEVICE_CLASS_WHOLE_GPU, LEGACY_WHOLE_GPU_RESOURCE, WHOLE_GPU_PROFILE};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::json;

use super::names::{dns_label, fit_label};
use super::{LegacyRequest, MANAGED_BY_LABEL, MAX_DEVICES_PER_CLAIM};

/// Prefix of the templates for whole GPUs: `das-gpu-x<count>`.
const TEMPLATE_PREFIX: &str = "das-gpu-x";

/// Name of the device request inside a whole-GPU template.
pub const REQUEST_NAME: &str = "gpu";

/// What the cluster offers of whole GPUs, when the webhook translates them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WholeGpus {
    /// Whether the DeviceClass `gpu.das.com` exists (chart `wholeGpus.enabled`).
    pub class: bool,
    /// Most whole-GPU devices one node publishes (the largest node); `None` while no node
    /// publishes one (then only the claim limit, 32, applies, as for a MIG profile).
    pub max_per_node: Option<u32>,
}

/// Name of the template that asks for `count` whole GPUs: `das-gpu-x2`.
pub fn whole_gpu_template_name(count: u32) -> String {
    format!("{TEMPLATE_PREFIX}{count}")
}

/// The ResourceClaimTemplate named [`whole_gpu_template_name`]: `count` devices of
/// `gpu.das.com`.
pub fn whole_gpu_template(count: u32) -> ResourceClaimTemplate {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": whole_gpu_template_name(count),
            "labels": {MANAGED_BY_LABEL.0: MANAGED_BY_LABEL.1},
            "annotations": {"mig.das.com/legacy-resource": LEGACY_WHOLE_GPU_RESOURCE},
        },
        "spec": {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": {
            "deviceClassName": DEVICE_CLASS_WHOLE_GPU,
            "allocationMode": "ExactCount", "count": count}}]}}}
    }))
    .expect("a ResourceClaimTemplate deserializes")
}

/// Pod claim name for `container`'s whole GPUs: `gpu-<container>`, kept a DNS label.
pub(super) fn claim_name(container: &str) -> String {
    let full = format!("gpu-{}", dns_label(container));
    fit_label(&full, &full)
}

/// Whether `c` names `nvidia.com/gpu` in its limits or requests.
pub(super) fn asks(c: &Container) -> bool {
    let r = c.resources.as_ref();
    let has = |m: Option<&std::collections::BTreeMap<String, _>>| {
        m.is_some_and(|m| m.contains_key(LEGACY_WHOLE_GPU_RESOURCE))
    };
    has(r.and_then(|r| r.limits.as_ref())) || has(r.and_then(|r| r.requests.as_ref()))
}

/// The validated request of `count` whole GPUs of container `c`.
pub(super) fn request(c: &Container, count: u32) -> LegacyRequest {
    LegacyRequest {
        container: c.name.clone(),
        profile: WHOLE_GPU_PROFILE.to_string(),
        spelled: WHOLE_GPU_PROFILE.to_string(),
        count,
        whole_gpu: true,
    }
}

/// Validates `c`'s `nvidia.com/gpu` request against `offered`; its count, or the problem.
pub(super) fn check_request(pod: &Pod, c: &Container, offered: &WholeGpus) -> Result<u32, String> {
    let key = LEGACY_WHOLE_GPU_RESOURCE;
    let who = format!("container {:?}: {key}", c.name);
    if !offered.class {
        return Err(format!(
            "{who}: this cluster has no DeviceClass {DEVICE_CLASS_WHOLE_GPU}; DAS serves whole GPUs only when installed with wholeGpus.enabled"
        ));
    }
    let count = super::count_of(c, key, &who, "whole GPUs", "GPUs")?;
    let max = offered
        .max_per_node
        .unwrap_or(MAX_DEVICES_PER_CLAIM)
        .min(MAX_DEVICES_PER_CLAIM);
    if count > max {
        return Err(format!(
            "{who}: {count} GPUs cannot be allocated to one pod; at most {max} whole GPUs fit on one node of this cluster (and a claim holds at most {MAX_DEVICES_PER_CLAIM} devices)"
        ));
    }
    if let Some(claim) = super::das_claim_from(pod, c, TEMPLATE_PREFIX) {
        return Err(format!(
            "{who}: the container already holds DAS claim {claim:?} for whole GPUs; \
             ask for them either through {key} or through the claim, not both"
        ));
    }
    Ok(count)
}
