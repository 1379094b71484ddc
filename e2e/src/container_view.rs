//! What a container got from its DAS devices ([`ContainerView`]): filled by CDI resolution as a
//! runtime does it (`das::container_view`, hollow nodes) or read back from a real container's
//! probe (`runtime::probe_view`). Uses no other module of the crate.

use std::collections::BTreeMap;

/// What one container would get from its CDI devices: the environment of the CDI edits merged
/// by key, the device node paths, the mounts (container path → host path) and the device IDs;
/// or, read back from a container's probe (`runtime::probe_view`), what it got, with
/// the first line of each file below `/usr/local/nvidia` in `files` and what an MPS client could
/// do in `mps`.
#[derive(Debug, Default, Clone)]
pub struct ContainerView {
    pub env: BTreeMap<String, String>,
    pub device_nodes: Vec<String>,
    pub mounts: BTreeMap<String, String>,
    pub files: BTreeMap<String, String>,
    pub cdi_devices: Vec<String>,
    /// Read back from a probe only: what an MPS client of the container could do, by fact
    /// (`shm`, `shm-fill`, `pipe`, `pipe-create`, `pipe-remove-control`, `connect`; the probe's
    /// `das-probe: mps <fact> <value>` lines, e2e/containerd/probe).
    pub mps: BTreeMap<String, String>,
}

/// Prefix of the per-slice variables DAS's CDI devices set to their MIG UUIDs.
pub const MIG_UUID_ENV_PREFIX: &str = "DAS_MIG_UUID_";

impl ContainerView {
    /// The MIG UUIDs the container holds: the values of its `DAS_MIG_UUID_*` variables, sorted.
    pub fn mig_uuids(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .env
            .iter()
            .filter(|(k, _)| k.starts_with(MIG_UUID_ENV_PREFIX))
            .map(|(_, v)| v.clone())
            .collect();
        out.sort();
        out
    }
}
