//! DAS's CDI spec of one claim: one CDI device per allocated device, named
//! `<claimUID>-<device>`, with its MIG instances' device nodes and one environment variable per
//! instance (or, for a whole GPU, the GPU's device node and one variable with its UUID), and
//! spec-level edits that are the same in every DAS spec, so specs of several claims compose in
//! one container (see [`super`]). Also where the device nodes are on this
//! node's host ([`DeviceNodes`]) and the driver's files every spec mounts. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::CdiError;
use super::schema::{
    ContainerEdits, Device, DeviceNode, Hook, Mount, Spec, qualified_name, validate_claim_uid,
    validate_device_name,
};

/// Host path of the NVIDIA control device node, added to every DAS CDI device.
pub const NVIDIACTL_PATH: &str = "/dev/nvidiactl";
/// Host path of the unified-memory device node, added to every DAS CDI device.
pub const NVIDIA_UVM_PATH: &str = "/dev/nvidia-uvm";
/// Host path of the unified-memory tools device node, added to every DAS CDI device.
pub const NVIDIA_UVM_TOOLS_PATH: &str = "/dev/nvidia-uvm-tools";

/// The CDI device name of a device of a claim: `<claimUID>-<key>`, the key being the allocated
/// device's name (or, in specs of the first release, a request name). A `/` (a prioritized-list
/// request, `<request>/<subrequest>`) is replaced by `.`, which device and request names (DNS
/// labels) never contain, so names stay distinct.
///
/// # Errors
/// [`CdiError::InvalidName`] when the result is not a valid CDI device name.
pub fn device_name(claim_uid: &str, key: &str) -> Result<String, CdiError> {
    validate_claim_uid(claim_uid)?;
    let name = format!("{claim_uid}-{}", key.replace('/', "."));
    validate_device_name(&name)?;
    Ok(name)
}

/// A MIG instance prepared for a container: what its device nodes and env need. Minors come from
/// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access` and `…/gi<G>/ci<C>/access`,
/// the major from the `nvidia-caps` line of `/proc/devices` (NVIDIA MIG User Guide, "Device
/// Nodes and Capabilities").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedInstance {
    /// MIG device UUID, `MIG-…`.
    pub mig_uuid: String,
    /// Minor of the parent GPU's device node `/dev/nvidia<minor>`.
    pub parent_minor: u32,
    /// Capability minor of the GPU instance: `/dev/nvidia-caps/nvidia-cap<minor>`.
    pub gi_cap_minor: u32,
    /// Capability minor of the compute instance: `/dev/nvidia-caps/nvidia-cap<minor>`.
    pub ci_cap_minor: u32,
    /// Major of the `nvidia-caps` character device (dynamic, e.g. 238, 508).
    pub caps_major: u32,
    /// Mode of the capability nodes (`DeviceFileMode` of the access files, normally `0o444`);
    /// `None` leaves it to the runtime.
    pub caps_file_mode: Option<u32>,
    /// Base name of the claim request the instance serves (without `/<subrequest>`).
    pub request: String,
    /// Position of the instance among its request's devices, in allocation-result order.
    pub index: usize,
}

/// A whole GPU (MIG mode off) prepared for a container: its device node and its UUID, no
/// capability nodes (docs/design.md §7, "Whole GPUs").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedGpu {
    /// GPU UUID, `GPU-…`.
    pub gpu_uuid: String,
    /// Minor of its device node `/dev/nvidia<minor>`.
    pub minor: u32,
    /// Base name of the claim request the GPU serves (without `/<subrequest>`).
    pub request: String,
    /// Position of the GPU among its request's devices, in allocation-result order.
    pub index: usize,
}

/// One CDI device of a claim's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecDevice {
    /// What the device stands for, and the key of its ID in [`ClaimSpec::device_ids`]: the
    /// allocated device's name (`gpu-0-mig-1g-10gb-6`, `gpu-1`). The CDI device is
    /// `<claimUID>-<key>`.
    pub key: String,
    /// The MIG instances it gives a container: one for an allocated MIG device, none for a whole
    /// GPU (checkpoints of the first release named a CDI device per request, holding all of the
    /// request's instances).
    pub instances: Vec<PreparedInstance>,
    /// The whole GPUs it gives a container: one for an allocated whole GPU, none for a MIG
    /// device.
    pub gpus: Vec<PreparedGpu>,
    /// Its MIG instance's MPS daemon, for a device served with MPS (docs/design.md §7, "MPS on a
    /// slice").
    pub mps: Option<MpsMounts>,
    /// OCI hooks the runtime runs for a container holding the device: the `createRuntime` hook
    /// that caps its GPU memory (`crate::claims::memory_limits`; docs/design.md §7, "Memory
    /// limits the kernel enforces"). Empty for most devices.
    pub hooks: Vec<Hook>,
}

/// What a container of an MPS device gets of its MIG instance's MPS control daemon: the daemon's pipe
/// directory at [`crate::mps::layout::CONTAINER_PIPE_DIR`] with `CUDA_MPS_PIPE_DIRECTORY`
/// naming it, and the MIG instance's shm directory as `/dev/shm` (MPS clients and their server share
/// memory there), as NVIDIA's DRA driver gives its MPS claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsMounts {
    /// Host path of the pipe directory the container mounts: the daemon's (MPS protocol 2), or
    /// its namespace's (protocol 3).
    pub pipe_dir: String,
    /// Whether that mount is read-only (`--mps-pipe-mount=ro`, the default).
    pub pipe_read_only: bool,
    /// Host path of the MIG instance's shm directory.
    pub shm_dir: String,
    /// The limits of one share of a shared slice (docs/design.md §7, "Shared slices"), given
    /// to its MPS clients in their environment; `None` for a MIG instance one claim holds.
    pub share: Option<ShareLimits>,
}

/// What one share of a shared slice may take of it, as an MPS client's environment says
/// (NVIDIA's MPS documentation: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` constrain a client below its daemon's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// Active thread percentage, 1..=100.
    pub thread_percentage: u64,
    /// Device memory the client may pin, in MiB.
    pub pinned_memory_mib: u64,
}

impl MpsMounts {
    /// The variables of an MPS client: the pipe directory, and a share's limits (device ordinal
    /// 0: the container sees its MIG instance only).
    pub fn env(&self) -> Vec<String> {
        let mut env = vec![format!(
            "{}={}",
            crate::mps::layout::PIPE_DIR_ENV,
            crate::mps::layout::CONTAINER_PIPE_DIR
        )];
        if let Some(share) = &self.share {
            env.push(format!(
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}",
                share.thread_percentage
            ));
            env.push(format!(
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M",
                share.pinned_memory_mib
            ));
        }
        env
    }

    /// The two bind mounts: the pipe directory and the shm directory (without exec, as
    /// `/dev/shm` is mounted). The pipe directory is read-only by default
    /// (docs/design.md §7, "MPS on a slice"): MPS clients connect to the sockets the daemon and
    /// its server (both root) create there, and a connect needs write permission on the
    /// socket's inode, which a read-only mount does not take away, while creating, renaming or
    /// removing anything there fails (`EROFS`), for root in the container too. It stays root's
    /// with mode 0755 ([`crate::mps::daemon::make_dirs`]) under `--mps-pipe-mount=rw` as well.
    pub fn mounts(&self) -> Vec<Mount> {
        let options = |access: &str, extra: &[&str]| {
            [access, "nosuid", "nodev"]
                .iter()
                .chain(extra)
                .chain(&["bind"])
                .map(|o| o.to_string())
                .collect()
        };
        let pipe_access = if self.pipe_read_only { "ro" } else { "rw" };
        vec![
            Mount {
                host_path: self.pipe_dir.clone(),
                container_path: crate::mps::layout::CONTAINER_PIPE_DIR.to_string(),
                options: options(pipe_access, &[]),
                mount_type: None,
            },
            Mount {
                host_path: self.shm_dir.clone(),
                container_path: crate::mps::layout::CONTAINER_SHM_DIR.to_string(),
                options: options("rw", &["noexec"]),
                mount_type: None,
            },
        ]
    }
}

/// A claim's spec and the CDI device IDs to return to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The spec to write with [`super::write_spec`].
    pub spec: Spec,
    /// Fully-qualified CDI device ID per [`SpecDevice::key`], e.g.
    /// `das.com/mig=<uid>-gpu-0-mig-1g-10gb-6`.
    pub device_ids: BTreeMap<String, String>,
}

/// Prefix of the per-instance environment variables ([`mig_uuid_env_key`]).
pub const MIG_UUID_ENV_PREFIX: &str = "DAS_MIG_UUID_";

/// Name of the variable that holds the MIG UUID of instance `index` of `request` in claim
/// `claim_uid`: `DAS_MIG_UUID_<claim UID>_<request>_<index>` with `-` and `/` turned into `_`
/// (claim UIDs are hex and dashes, request names DNS labels, so the name is a valid POSIX
/// variable name and unique per claim, request and instance).
pub fn mig_uuid_env_key(claim_uid: &str, request: &str, index: usize) -> String {
    let clean = |s: &str| s.replace(['-', '/', '.'], "_");
    format!(
        "{MIG_UUID_ENV_PREFIX}{}_{}_{index}",
        clean(claim_uid),
        clean(request)
    )
}

/// Prefix of the per-GPU environment variables of whole GPUs ([`gpu_uuid_env_key`]).
pub const GPU_UUID_ENV_PREFIX: &str = "DAS_GPU_UUID_";

/// Name of the variable that holds the UUID of whole GPU `index` of `request` in claim
/// `claim_uid`: `DAS_GPU_UUID_<claim UID>_<request>_<index>`, with the escaping of
/// [`mig_uuid_env_key`].
pub fn gpu_uuid_env_key(claim_uid: &str, request: &str, index: usize) -> String {
    let mig = mig_uuid_env_key(claim_uid, request, index);
    format!("{GPU_UUID_ENV_PREFIX}{}", &mig[MIG_UUID_ENV_PREFIX.len()..])
}

/// What `NVIDIA_VISIBLE_DEVICES` is set to in every DAS spec: the NVIDIA container runtime hook
/// then leaves device injection to CDI (the value NVIDIA's CDI generator sets).
pub const NVIDIA_VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";

/// Builds DAS's spec for a claim: kind [`das_api::CDI_KIND`], one CDI device per
/// [`SpecDevice`], named `<claimUID>-<key>`, with the instances' device nodes (parent GPU once per
/// device, GI and CI capability nodes) and one [`mig_uuid_env_key`] variable per instance, or a
/// whole GPU's device node and one [`gpu_uuid_env_key`] variable, for a device served with
/// MPS its [`MpsMounts`], and the device's hooks; the spec-level edits add `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` and
/// [`NVIDIA_VISIBLE_DEVICES_VOID`] (see [`super`] for why the edits compose).
/// `cdiVersion` is the minimum the spec needs.
///
/// # Errors
/// [`CdiError::InvalidName`] for a bad claim UID or key; [`CdiError::InvalidSpec`] for no
/// devices, a device without instances or GPUs, a duplicate key, or an empty MIG or GPU UUID.
pub fn build_claim_spec(claim_uid: &str, devices: &[SpecDevice]) -> Result<ClaimSpec, CdiError> {
    if devices.is_empty() {
        return Err(CdiError::InvalidSpec(format!(
            "claim {claim_uid}: no devices"
        )));
    }
    let mut spec_devices = Vec::with_capacity(devices.len());
    let mut device_ids = BTreeMap::new();
    for device in devices {
        let name = device_name(claim_uid, &device.key)?;
        let id = qualified_name(das_api::CDI_KIND, &name);
        if device_ids.insert(device.key.clone(), id).is_some() {
            return Err(CdiError::InvalidSpec(format!(
                "claim {claim_uid}: device {:?} listed twice",
                device.key
            )));
        }
        spec_devices.push(Device {
            name,
            annotations: BTreeMap::new(),
            container_edits: device_edits(claim_uid, device)?,
        });
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: das_api::CDI_KIND.to_string(),
        annotations: BTreeMap::new(),
        devices: spec_devices,
        container_edits: Some(ContainerEdits {
            env: vec![NVIDIA_VISIBLE_DEVICES_VOID.to_string()],
            device_nodes: [NVIDIACTL_PATH, NVIDIA_UVM_PATH, NVIDIA_UVM_TOOLS_PATH]
                .into_iter()
                .map(DeviceNode::from_host)
                .collect(),
            mounts: Vec::new(),
            hooks: Vec::new(),
        }),
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate()?;
    Ok(ClaimSpec { spec, device_ids })
}

/// Where the device nodes of DAS CDI specs are on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceNodes {
    /// The NVIDIA driver's nodes under `/dev` (real GPUs): `hostPath` is left out, so the
    /// runtime looks at the node of the same path.
    Host,
    /// No device nodes at all (emulated GPUs on a node without NVIDIA devices): see
    /// [`without_device_nodes`].
    Omitted,
    /// Stand-in nodes of the emulated GPUs below this directory
    /// (`gpu::emulated::device_nodes`): every node's `hostPath` is `<dir>/<path below /dev>`.
    StandIn(PathBuf),
}

/// Applies `nodes` to a spec built by [`build_claim_spec`] (whose nodes are [`DeviceNodes::Host`]).
pub fn place_device_nodes(spec: &mut Spec, nodes: &DeviceNodes) {
    match nodes {
        DeviceNodes::Host => {}
        DeviceNodes::Omitted => without_device_nodes(spec),
        DeviceNodes::StandIn(dir) => rehost_device_nodes(spec, dir),
    }
}

/// Adds `mounts` (the driver's files, [`crate::claims::driver_files`]) to the spec-level edits.
/// Every DAS spec carries the same ones, so a container holding devices of several claims gets each
/// file once: a runtime applying CDI edits replaces a mount of the same container path
/// (container-device-interface `ContainerEdits.Apply`: `RemoveMount`, then `AddMount`).
pub fn add_spec_mounts(spec: &mut Spec, mounts: &[Mount]) {
    if mounts.is_empty() {
        return;
    }
    let edits = spec
        .container_edits
        .get_or_insert_with(ContainerEdits::default);
    edits.mounts.extend(mounts.iter().cloned());
    spec.cdi_version = spec.minimum_version().to_string();
}

/// Points every device node below `/dev` at the same path below `dir` (`hostPath`), keeping its
/// path in the container; raises `cdiVersion` to what `hostPath` needs.
pub fn rehost_device_nodes(spec: &mut Spec, dir: &Path) {
    let edits = spec
        .devices
        .iter_mut()
        .map(|d| &mut d.container_edits)
        .chain(spec.container_edits.as_mut());
    for e in edits {
        for node in &mut e.device_nodes {
            if let Some(rest) = node.path.strip_prefix("/dev/") {
                node.host_path = Some(dir.join(rest).display().to_string());
            }
        }
    }
    spec.cdi_version = spec.minimum_version().to_string();
}

/// Removes every device node from `spec` (and lowers `cdiVersion` to what is left needs).
///
/// For emulated GPUs on a node that has no NVIDIA devices: a CDI-enabled runtime stats each
/// host device node it injects and refuses to start the container when one is missing
/// (container-device-interface `fillMissingInfo`), while the environment alone lets the
/// container start and shows which MIG UUIDs it was given.
pub fn without_device_nodes(spec: &mut Spec) {
    for d in &mut spec.devices {
        d.container_edits.device_nodes.clear();
    }
    if let Some(e) = &mut spec.container_edits {
        e.device_nodes.clear();
    }
    spec.cdi_version = spec.minimum_version().to_string();
}

fn device_edits(claim_uid: &str, device: &SpecDevice) -> Result<ContainerEdits, CdiError> {
    let context = || format!("claim {claim_uid} device {:?}", device.key);
    if device.instances.is_empty() && device.gpus.is_empty() {
        return Err(CdiError::InvalidSpec(format!("{}: no slices", context())));
    }
    let checked = |what: &str, uuid: &str| {
        if uuid.is_empty() || uuid.contains(|c: char| c == ',' || c == '=' || c.is_whitespace()) {
            return Err(CdiError::InvalidSpec(format!(
                "{}: {what} UUID {uuid:?} is empty or has a comma, '=' or blank",
                context()
            )));
        }
        Ok(())
    };
    let mut env = Vec::with_capacity(device.instances.len() + device.gpus.len());
    for gpu in &device.gpus {
        checked("GPU", &gpu.gpu_uuid)?;
        let key = gpu_uuid_env_key(claim_uid, &gpu.request, gpu.index);
        env.push(format!("{key}={}", gpu.gpu_uuid));
    }
    for instance in &device.instances {
        let uuid = &instance.mig_uuid;
        checked("MIG", uuid)?;
        env.push(format!(
            "{}={uuid}",
            mig_uuid_env_key(claim_uid, &instance.request, instance.index)
        ));
    }
    let mut mounts = Vec::new();
    if let Some(mps) = &device.mps {
        env.extend(mps.env());
        mounts = mps.mounts();
    }
    Ok(ContainerEdits {
        env,
        device_nodes: instance_device_nodes(&device.gpus, &device.instances),
        mounts,
        hooks: device.hooks.clone(),
    })
}

/// GPU nodes of the whole GPUs and the instances' parents (first appearance order, no
/// duplicates), then the GI and CI capability nodes of each instance (a whole GPU has none).
fn instance_device_nodes(gpus: &[PreparedGpu], instances: &[PreparedInstance]) -> Vec<DeviceNode> {
    let mut nodes = Vec::new();
    let mut parents = BTreeSet::new();
    let minors = gpus.iter().map(|g| g.minor);
    for minor in minors.chain(instances.iter().map(|i| i.parent_minor)) {
        if parents.insert(minor) {
            nodes.push(DeviceNode::from_host(format!("/dev/nvidia{minor}")));
        }
    }
    for instance in instances {
        for minor in [instance.gi_cap_minor, instance.ci_cap_minor] {
            let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
            nodes.push(DeviceNode {
                file_mode: instance.caps_file_mode,
                ..DeviceNode::char_device(path, instance.caps_major, minor)
            });
        }
    }
    nodes
}
