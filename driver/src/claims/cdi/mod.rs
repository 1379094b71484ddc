//! CDI (Container Device Interface) specs: the types, DAS's per-claim spec, and spec files.
//!
//! The kubelet hands the container runtime the fully-qualified CDI device IDs the plugin returns
//! from `NodePrepareResources`; the runtime looks them up in spec files in its CDI directories
//! (`/etc/cdi`, `/var/run/cdi`) and applies the device's container edits (env, device nodes,
//! mounts, hooks).
//!
//! DAS writes one spec file per claim: kind [`das_api::CDI_KIND`], file
//! `das.com-mig_<claimUID>.json`, one CDI device per allocated device (MIG instance) named
//! `<claimUID>-<device>`.
//!
//! Specs compose: a container may get any number of DAS devices from any number of claims, and
//! runtimes merge the environment of all of them by key, the last one winning
//! (container-device-interface `ContainerEdits.Apply`). So no two DAS devices set one key to
//! different values:
//! - each device carries its own device nodes (the parent GPU's `/dev/nvidia<N>` and the GI and
//!   CI capability nodes `/dev/nvidia-caps/nvidia-cap<M>`), which is what gives CUDA access to
//!   exactly its MIG instances;
//! - each device sets one variable of its own, [`mig_uuid_env_key`] (claim UID, request and the
//!   device's position in the request), to its MIG UUID: users and tests read which instances a
//!   container holds with `env | grep ^DAS_MIG_UUID_`;
//! - a whole GPU (MIG mode off; docs/design.md §7, "Whole GPUs") carries its GPU's
//!   `/dev/nvidia<N>` and no capability nodes, and sets [`gpu_uuid_env_key`] (same naming) to the
//!   GPU's UUID;
//! - a device served with MPS (docs/design.md §7, "MPS on a slice") also sets
//!   `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps` and mounts its MIG instance's MPS pipe directory there
//!   and its shm directory at `/dev/shm` ([`MpsMounts`]); a claim has at most one such device,
//!   so within a claim the key is never set twice;
//! - the spec-level edits, the same in every DAS spec, add `/dev/nvidiactl` and the UVM nodes and
//!   set `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's own CDI generator does (`nvidia-ctk cdi
//!   generate`), so the NVIDIA container runtime hook adds no GPUs of its own (a CUDA image's
//!   `NVIDIA_VISIBLE_DEVICES=all` would otherwise expose every GPU); no `CUDA_VISIBLE_DEVICES`.
//!
//! Sources: cncf-tags/container-device-interface `SPEC.md` (spec 1.1.0), `specs-go/config.go`
//! (field names), `specs-go/version.go` (minimum version by feature), `pkg/parser/parser.go` (name
//! rules), `pkg/cdi/spec.go` (temp file without `.json` suffix, then rename). Summary in
//! docs/reference/dra.md, "CDI"; device nodes of a MIG device in
//! docs/reference/mig.md, "Device nodes and capabilities"
//!
//! - [`schema`]: the CDI spec format (the subset DAS uses) and the checks a CDI runtime makes
//!   when it loads a spec: version, kind and device-name rules. Pure.
//! - [`spec`]: DAS's per-claim spec built from the claim's MIG instances and whole GPUs, and where its device
//!   nodes and driver mounts come from on this node. Pure.
//! - [`files`]: the spec files: [`CdiWriter`] (a node's CDI directory and what every spec of it
//!   carries), atomic writes, reads, deletes, and the start-up listing and clean-up. All of this
//!   module's file I/O.
//!
//! [`CdiError`] is every part's error.

use std::io;
use std::path::PathBuf;

pub(crate) mod files;
pub(crate) mod schema;
pub(crate) mod spec;

pub use files::{
    CdiWriter, DEFAULT_CDI_DIR, SpecFile, delete_spec, list_specs, read_spec, remove_temp_files,
    spec_file_name, spec_path, write_spec,
};
pub use schema::{
    ContainerEdits, Device, DeviceNode, Hook, KNOWN_VERSIONS, Mount, NameRule, Spec,
    qualified_name, validate_claim_uid, validate_device_name, validate_kind,
};
pub use spec::{
    ClaimSpec, DeviceNodes, GPU_UUID_ENV_PREFIX, MIG_UUID_ENV_PREFIX, MpsMounts, NVIDIA_UVM_PATH,
    NVIDIA_UVM_TOOLS_PATH, NVIDIA_VISIBLE_DEVICES_VOID, NVIDIACTL_PATH, PreparedGpu,
    PreparedInstance, ShareLimits, SpecDevice, add_spec_mounts, build_claim_spec, device_name,
    gpu_uuid_env_key, mig_uuid_env_key, place_device_nodes, rehost_device_nodes,
    without_device_nodes,
};

/// Errors of this module. Every variant says which name, spec or file is at fault.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A vendor, class, device name or claim UID breaks the CDI name rules.
    #[error("invalid CDI {what} {name:?}: {reason}")]
    InvalidName {
        /// Which kind of name: "vendor", "class", "kind", "device name", "claim UID", ...
        what: &'static str,
        /// The offending name.
        name: String,
        /// Which rule it breaks.
        reason: NameRule,
    },
    /// The spec as a whole is not valid (no devices, duplicate names, bad version, ...).
    #[error("invalid CDI spec: {0}")]
    InvalidSpec(String),
    /// Reading, writing, renaming or deleting a spec file failed.
    #[error("CDI spec file {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A spec file exists but is not a parseable CDI spec (corrupt or truncated).
    #[error("CDI spec file {path} is corrupt: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error, with line and column.
        source: serde_json::Error,
    },
}

#[cfg(test)]
mod tests;
