//! What marks a container that can still reach a claim's instances (pure; docs/design.md §7, "A
//! slice leaves its claim"): the orphan rule releases a claim the API server no longer allocates
//! only when, besides the pods its record knows, no live container on the node carries one of
//! the claim's marks in its OCI runtime spec. That covers a pod the record never heard of: a
//! second pod that reserved an already-prepared claim (the kubelet calls NodePrepareResources
//! once per claim), or a container that kept the device nodes of a repaired instance.
//!
//! Two marks, because each covers what the other cannot:
//! - the claim's own CDI variables (`DAS_MIG_UUID_<claim UID>_…`, `DAS_GPU_UUID_<claim UID>_…`):
//!   every container given one of the claim's CDI devices has them, whatever became of the
//!   instances since (a guard after a repair has no instance, hence no device node to look
//!   for), and in emulated mode, where containers get no device nodes;
//! - the device nodes only this claim's instances have: each MIG instance's GPU-instance and
//!   compute-instance capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`; never the parent
//!   `/dev/nvidia<N>`, which every MIG instance of the GPU shares), a whole GPU's `/dev/nvidia<N>`.
//!   A container of another claim holding the capability node of a GPU-instance ID that was
//!   reused can reach this instance too (NVML reuses GI IDs: docs/reference/mig.md, "Create
//!   and destroy"). A privileged container has every node of the host and says nothing about
//!   this claim: only its variables count for it.
//!
//! Why the runtime spec: the container runtime applied the CDI edits to it (the device nodes and
//! environment the container really has), and CRI gives it back in a verbose ContainerStatus
//! (containerd and CRI-O: `info["info"]`'s `runtimeSpec`). Why not the cgroup's device list:
//! cgroup v2, the default of current distributions, has no readable list (device access is an
//! eBPF program attached to the cgroup), and a container's cgroup would also have to be found
//! from outside its runtime.

use std::collections::BTreeMap;

use super::cdi::{GPU_UUID_ENV_PREFIX, MIG_UUID_ENV_PREFIX, Spec};
use super::checkpoint::ClaimRecord;
use super::kinds::{Kind, Kinds};

/// The marks of one claim (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimMarks {
    /// Prefixes of the claim's CDI environment variables, each ending in `_`.
    pub env_prefixes: Vec<String>,
    /// Container paths of the device nodes only the claim's instances have.
    pub device_paths: Vec<String>,
}

/// The marks of claim `uid`, recorded as `record`, from its CDI spec on disk (`spec`; `None`
/// once deleted, e.g. for a guard whose instances are gone: its variables alone then).
pub(crate) fn claim_marks(uid: &str, record: &ClaimRecord, spec: Option<&Spec>) -> ClaimMarks {
    let escaped = uid.replace(['-', '/', '.'], "_");
    let env_prefixes = [MIG_UUID_ENV_PREFIX, GPU_UUID_ENV_PREFIX]
        .iter()
        .map(|p| format!("{p}{escaped}_"))
        .collect();
    // The CDI device of each recorded device is `<claim UID>-<device>` (docs/design.md §3);
    // which of its nodes only it has is its kind's to say.
    let kinds = Kinds::standard();
    let kind_of: BTreeMap<String, &dyn Kind> = record
        .devices
        .iter()
        .map(|d| (format!("{uid}-{}", d.device), kinds.of_record(d)))
        .collect();
    let mut device_paths: Vec<String> = spec
        .map(|s| s.devices.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|d| kind_of.get(&d.name).map(|k| (d, *k)))
        .flat_map(|(d, kind)| {
            d.container_edits
                .device_nodes
                .iter()
                .filter(move |n| kind.own_node(&n.path))
                .map(|n| n.path.clone())
        })
        .collect();
    device_paths.sort();
    device_paths.dedup();
    ClaimMarks {
        env_prefixes,
        device_paths,
    }
}

/// Which of `marks` the OCI runtime spec `spec` (JSON, as the runtime reports it) carries, if
/// any: `Some("its CDI variable DAS_…")` or `Some("device node /dev/…")`.
pub(crate) fn spec_mark(spec: &serde_json::Value, marks: &ClaimMarks) -> Option<String> {
    let env = spec
        .pointer("/process/env")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str);
    for e in env {
        if let Some(p) = marks
            .env_prefixes
            .iter()
            .find(|p| e.starts_with(p.as_str()))
        {
            let name = e.split('=').next().unwrap_or(p);
            return Some(format!("its CDI variable {name}"));
        }
    }
    if privileged(spec) {
        return None;
    }
    spec.pointer("/linux/devices")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("path").and_then(serde_json::Value::as_str))
        .find(|p| marks.device_paths.iter().any(|m| m == p))
        .map(|p| format!("device node {p}"))
}

/// Whether the runtime spec lets the container use every device (a privileged container: its
/// device cgroup rules allow all, with no type or number): it holds every node of the host.
fn privileged(spec: &serde_json::Value) -> bool {
    spec.pointer("/linux/resources/devices")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| {
            r.get("allow").and_then(serde_json::Value::as_bool) == Some(true)
                && r.get("major").is_none_or(serde_json::Value::is_null)
                && r.get("minor").is_none_or(serde_json::Value::is_null)
                && r.get("type")
                    .and_then(serde_json::Value::as_str)
                    .is_none_or(|t| t == "a")
        })
}

#[cfg(test)]
mod tests;
