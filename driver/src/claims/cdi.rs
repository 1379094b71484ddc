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

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use das_runtime::fs::write_atomically;

/// The dynamic CDI directory the kubelet plugin writes to by default (CDI `DefaultDynamicDir`).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// CDI spec versions this module knows, oldest first (CDI `specs-go/version.go`, SPEC.md 1.1.0).
pub const KNOWN_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// Host path of the NVIDIA control device node, added to every DAS CDI device.
pub const NVIDIACTL_PATH: &str = "/dev/nvidiactl";
/// Host path of the unified-memory device node, added to every DAS CDI device.
pub const NVIDIA_UVM_PATH: &str = "/dev/nvidia-uvm";
/// Host path of the unified-memory tools device node, added to every DAS CDI device.
pub const NVIDIA_UVM_TOOLS_PATH: &str = "/dev/nvidia-uvm-tools";

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
        reason: String,
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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CdiError + '_ {
    move |source| CdiError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A CDI spec file (`SPEC.md` "CDI JSON Specification"), the subset DAS uses.
///
/// Serialized with empty lists and absent options left out, so the output is minimal and the
/// minimum `cdiVersion` ([`Spec::minimum_version`]) only reflects features really used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Spec version, semver without `v` (e.g. `0.5.0`); must be ≥ [`Spec::minimum_version`].
    pub cdi_version: String,
    /// `<vendor>/<class>`, e.g. `das.com/mig`.
    pub kind: String,
    /// Spec-level annotations (0.6.0+).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices; at least one.
    pub devices: Vec<Device>,
    /// Edits applied when any device of the spec is requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_edits: Option<ContainerEdits>,
}

/// One CDI device: the unit a container asks for by its fully-qualified name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Device name, unique in the spec; see [`validate_device_name`].
    pub name: String,
    /// Device-level annotations (0.6.0+).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The edits; must not be empty (CDI rejects "invalid device, empty device edits").
    pub container_edits: ContainerEdits,
}

/// Changes a runtime makes to the container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// Environment entries, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI hooks (DAS writes none; kept so specs that have them still parse).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
    }
}

/// A device node in the container. Fields left out are filled by the runtime from the host node
/// (`hostPath`, or `path` when that is absent), except when `type` and `major` are given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host when it differs from `path` (0.5.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Node type: `c` (char), `b` (block), `u` (unbuffered char), `p` (FIFO).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// Major device number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor device number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Permission bits of the node (a number in JSON, e.g. `292` = `0o444`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup access, a subset of `rwm`; absent means `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner user ID of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Owner group ID of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// A node given by its path only; the runtime takes type, numbers and mode from the host.
    pub fn from_host(path: impl Into<String>) -> Self {
        DeviceNode {
            path: path.into(),
            host_path: None,
            node_type: None,
            major: None,
            minor: None,
            file_mode: None,
            permissions: None,
            uid: None,
            gid: None,
        }
    }

    /// A character device with explicit numbers; the runtime creates it (it need not exist on
    /// the host).
    pub fn char_device(path: impl Into<String>, major: u32, minor: u32) -> Self {
        DeviceNode {
            node_type: Some("c".to_string()),
            major: Some(i64::from(major)),
            minor: Some(i64::from(minor)),
            ..DeviceNode::from_host(path)
        }
    }
}

/// A bind mount in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options, e.g. `ro`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Filesystem type (0.4.0+).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

/// An OCI hook. DAS writes none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `createRuntime`, `createContainer`, `startContainer`, `poststart` or `poststop`.
    pub hook_name: String,
    /// Absolute path of the executable.
    pub path: String,
    /// Arguments, `argv[0]` included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

impl Spec {
    /// The lowest `cdiVersion` that covers the features this spec uses (CDI
    /// `MinimumRequiredVersion`): `0.3.0`; `0.4.0` with a mount `type`; `0.5.0` with a device
    /// node `hostPath` or a device name that does not start with a letter; `0.6.0` with
    /// annotations or a dot in the class part of the kind. Later versions add fields this
    /// module does not model.
    pub fn minimum_version(&self) -> &'static str {
        if self.needs_v060() {
            "0.6.0"
        } else if self.needs_v050() {
            "0.5.0"
        } else if self
            .all_edits()
            .any(|e| e.mounts.iter().any(|m| m.mount_type.is_some()))
        {
            "0.4.0"
        } else {
            "0.3.0"
        }
    }

    fn all_edits(&self) -> impl Iterator<Item = &ContainerEdits> {
        self.devices
            .iter()
            .map(|d| &d.container_edits)
            .chain(self.container_edits.iter())
    }

    fn needs_v060(&self) -> bool {
        let class_has_dot = self
            .kind
            .split_once('/')
            .is_some_and(|(_, class)| class.contains('.'));
        !self.annotations.is_empty()
            || self.devices.iter().any(|d| !d.annotations.is_empty())
            || class_has_dot
    }

    fn needs_v050(&self) -> bool {
        let digit_name = self.devices.iter().any(|d| {
            d.name
                .chars()
                .next()
                .is_some_and(|c| !c.is_ascii_alphabetic())
        });
        let host_path = self
            .all_edits()
            .any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()));
        digit_name || host_path
    }

    /// Checks what a CDI runtime checks on load: a known `cdiVersion` at least
    /// [`Spec::minimum_version`], a valid kind, ≥1 device, valid and unique device names, no
    /// device with empty edits.
    ///
    /// # Errors
    /// [`CdiError::InvalidName`] or [`CdiError::InvalidSpec`] naming the first problem.
    pub fn validate(&self) -> Result<(), CdiError> {
        validate_kind(&self.kind)?;
        self.validate_version()?;
        if self.devices.is_empty() {
            return Err(CdiError::InvalidSpec(format!(
                "kind {}: no devices",
                self.kind
            )));
        }
        let mut seen = BTreeSet::new();
        for device in &self.devices {
            validate_device_name(&device.name)?;
            if !seen.insert(device.name.as_str()) {
                return Err(CdiError::InvalidSpec(format!(
                    "duplicate device name {:?}",
                    device.name
                )));
            }
            if device.container_edits.is_empty() {
                return Err(CdiError::InvalidSpec(format!(
                    "device {:?} has empty container edits",
                    device.name
                )));
            }
        }
        Ok(())
    }

    fn validate_version(&self) -> Result<(), CdiError> {
        let declared = parse_version(&self.cdi_version)
            .filter(|_| KNOWN_VERSIONS.contains(&self.cdi_version.as_str()))
            .ok_or_else(|| {
                CdiError::InvalidSpec(format!("unknown cdiVersion {:?}", self.cdi_version))
            })?;
        let minimum = self.minimum_version();
        if parse_version(minimum) > Some(declared) {
            return Err(CdiError::InvalidSpec(format!(
                "cdiVersion {} is below {minimum}, which the features used need",
                self.cdi_version
            )));
        }
        Ok(())
    }
}

fn parse_version(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let triple = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(triple)
}

/// Checks a vendor or class name (CDI `parser.go`): starts with a letter, ends with a letter or
/// digit, and contains only ASCII letters, digits, `_`, `-`, `.`.
///
/// # Errors
/// [`CdiError::InvalidName`] with `what` set to the given label.
fn validate_vendor_or_class(what: &'static str, name: &str) -> Result<(), CdiError> {
    let bad = |reason: String| CdiError::InvalidName {
        what,
        name: name.to_string(),
        reason,
    };
    let first = name.chars().next().ok_or_else(|| bad("empty".into()))?;
    if !first.is_ascii_alphabetic() {
        return Err(bad("must start with a letter".into()));
    }
    check_chars(name, &['_', '-', '.']).map_err(bad)
}

/// Checks that every character is an ASCII letter, digit or one of `extra`, and that the last
/// one is a letter or digit.
fn check_chars(name: &str, extra: &[char]) -> Result<(), String> {
    if let Some(c) = name
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !extra.contains(c))
    {
        return Err(format!("invalid character {c:?}"));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must end with a letter or digit".into());
    }
    Ok(())
}

/// Checks a kind, `<vendor>/<class>` (CDI `parser.go` `ValidateKind`). Vendor and class each
/// start with an ASCII letter, end with a letter or digit, and contain only letters, digits,
/// `_`, `-`, `.`.
///
/// # Errors
/// [`CdiError::InvalidName`] naming the kind, vendor or class at fault.
pub fn validate_kind(kind: &str) -> Result<(), CdiError> {
    let (vendor, class) = kind.split_once('/').ok_or_else(|| CdiError::InvalidName {
        what: "kind",
        name: kind.to_string(),
        reason: "must be <vendor>/<class>".into(),
    })?;
    validate_vendor_or_class("vendor", vendor)?;
    validate_vendor_or_class("class", class)
}

/// Checks a device name (CDI `parser.go` `ValidateDeviceName`): starts and ends with an ASCII
/// letter or digit, and contains only letters, digits, `_`, `-`, `.`, `:`.
///
/// # Errors
/// [`CdiError::InvalidName`] with `what` = "device name".
pub fn validate_device_name(name: &str) -> Result<(), CdiError> {
    let bad = |reason: String| CdiError::InvalidName {
        what: "device name",
        name: name.to_string(),
        reason,
    };
    let first = name.chars().next().ok_or_else(|| bad("empty".into()))?;
    if !first.is_ascii_alphanumeric() {
        return Err(bad("must start with a letter or digit".into()));
    }
    check_chars(name, &['_', '-', '.', ':']).map_err(bad)
}

/// Checks a claim UID before it goes into a device name and a file name: the device-name rules
/// of [`validate_device_name`] (so no `/`, no leading `.`).
///
/// # Errors
/// [`CdiError::InvalidName`] with `what` = "claim UID".
pub fn validate_claim_uid(uid: &str) -> Result<(), CdiError> {
    validate_device_name(uid).map_err(|e| match e {
        CdiError::InvalidName { name, reason, .. } => CdiError::InvalidName {
            what: "claim UID",
            name,
            reason,
        },
        other => other,
    })
}

/// The fully-qualified CDI device ID `<kind>=<name>`, e.g. `das.com/mig=<uid>-gpu`: what the
/// plugin returns to the kubelet in `cdi_device_ids`.
pub fn qualified_name(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

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

/// File name of a claim's spec: `<vendor>-<class>_<claimUID>.json`, e.g.
/// `das.com-mig_<uid>.json` (the dra-example-driver convention).
pub fn spec_file_name(claim_uid: &str) -> String {
    format!("{}{claim_uid}.json", spec_file_prefix())
}

fn spec_file_prefix() -> String {
    format!("{}_", das_api::CDI_KIND.replace('/', "-"))
}

/// Path of a claim's spec in `dir`.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(spec_file_name(claim_uid))
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

/// One CDI device of a claim's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecDevice {
    /// What the device stands for, and the key of its ID in [`ClaimSpec::device_ids`]: the
    /// allocated device's name (`gpu-0-mig-1g-10gb-6`). The CDI device is `<claimUID>-<key>`.
    pub key: String,
    /// The instances it gives a container: one for an allocated device (checkpoints of the first
    /// release named a CDI device per request, holding all of the request's instances).
    pub instances: Vec<PreparedInstance>,
}

/// A claim's spec and the CDI device IDs to return to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The spec to write with [`write_spec`].
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

/// What `NVIDIA_VISIBLE_DEVICES` is set to in every DAS spec: the NVIDIA container runtime hook
/// then leaves device injection to CDI (the value NVIDIA's CDI generator sets).
pub const NVIDIA_VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";

/// Builds DAS's spec for a claim: kind [`das_api::CDI_KIND`], one CDI device per
/// [`SpecDevice`], named `<claimUID>-<key>`, with the instances' device nodes (parent GPU once per
/// device, GI and CI capability nodes) and one [`mig_uuid_env_key`] variable per instance; the
/// spec-level edits add `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` and
/// [`NVIDIA_VISIBLE_DEVICES_VOID`] (see the module docs for why the edits compose).
/// `cdiVersion` is the minimum the spec needs.
///
/// # Errors
/// [`CdiError::InvalidName`] for a bad claim UID or key; [`CdiError::InvalidSpec`] for no
/// devices, a device without instances, a duplicate key, or an empty MIG UUID.
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

/// Adds `mounts` (the driver's files, [`super::driver_files`]) to the spec-level edits. Every
/// DAS spec carries the same ones, so a container holding devices of several claims gets each
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
    if device.instances.is_empty() {
        return Err(CdiError::InvalidSpec(format!("{}: no slices", context())));
    }
    let mut env = Vec::with_capacity(device.instances.len());
    for instance in &device.instances {
        let uuid = &instance.mig_uuid;
        if uuid.is_empty() || uuid.contains(|c: char| c == ',' || c == '=' || c.is_whitespace()) {
            return Err(CdiError::InvalidSpec(format!(
                "{}: MIG UUID {uuid:?} is empty or has a comma, '=' or blank",
                context()
            )));
        }
        env.push(format!(
            "{}={uuid}",
            mig_uuid_env_key(claim_uid, &instance.request, instance.index)
        ));
    }
    Ok(ContainerEdits {
        env,
        device_nodes: instance_device_nodes(&device.instances),
        mounts: Vec::new(),
        hooks: Vec::new(),
    })
}

/// Parent GPU nodes (first appearance order, no duplicates), then the GI and CI capability nodes
/// of each instance.
fn instance_device_nodes(instances: &[PreparedInstance]) -> Vec<DeviceNode> {
    let mut nodes = Vec::new();
    let mut parents = BTreeSet::new();
    for instance in instances {
        if parents.insert(instance.parent_minor) {
            nodes.push(DeviceNode::from_host(format!(
                "/dev/nvidia{}",
                instance.parent_minor
            )));
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

/// Name of the temp file a write goes through: hidden and without a `.json` suffix, so the CDI
/// cache never scans it; unique per write so two writers never share one.
fn temp_file_name(claim_uid: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{}{claim_uid}.{}-{n}.tmp",
        spec_file_prefix(),
        std::process::id()
    )
}

/// Writes a claim's spec to `dir/das.com-mig_<claimUID>.json` atomically: validate, write a temp
/// file, rename it over the target. A reader (the container runtime) sees the old file or the
/// new one, never a partial one. No fsync: the CDI dir is a tmpfs on real nodes and a spec means
/// nothing after a reboot. Returns the path written.
///
/// # Errors
/// [`CdiError::InvalidName`] / [`CdiError::InvalidSpec`] when the spec is not valid (nothing is
/// written); [`CdiError::Io`] when a file step fails (the temp file is removed).
pub fn write_spec(dir: &Path, claim_uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
    validate_claim_uid(claim_uid)?;
    spec.validate()?;
    let mut bytes = serde_json::to_vec_pretty(spec)
        .map_err(|e| CdiError::InvalidSpec(format!("cannot serialize: {e}")))?;
    bytes.push(b'\n');
    let path = spec_path(dir, claim_uid);
    // The CDI dir is a tmpfs on real nodes: it may be gone after a reboot of the node.
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let temp = dir.join(temp_file_name(claim_uid));
    write_atomically(&path, &temp, &bytes).map_err(io_err(&path))?;
    Ok(path)
}

/// Deletes a claim's spec. Idempotent: returns `Ok(false)` when there was no file.
///
/// # Errors
/// [`CdiError::Io`] when the file exists and cannot be removed.
pub fn delete_spec(dir: &Path, claim_uid: &str) -> Result<bool, CdiError> {
    validate_claim_uid(claim_uid)?;
    let path = spec_path(dir, claim_uid);
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// A DAS spec file found in a CDI directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpecFile {
    /// The claim UID from the file name.
    pub claim_uid: String,
    /// The file.
    pub path: PathBuf,
}

/// Lists DAS's spec files in `dir` (names `das.com-mig_<uid>.json`), sorted by claim UID, so
/// start-up can delete those of claims that no longer exist. Other vendors' files and temp files
/// are skipped. A missing directory lists as empty.
///
/// # Errors
/// [`CdiError::Io`] when the directory cannot be read.
pub fn list_specs(dir: &Path) -> Result<Vec<SpecFile>, CdiError> {
    let prefix = spec_file_prefix();
    let mut found = Vec::new();
    for name in dir_file_names(dir)? {
        let uid = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".json"));
        if let Some(uid) = uid.filter(|u| validate_claim_uid(u).is_ok()) {
            found.push(SpecFile {
                claim_uid: uid.to_string(),
                path: dir.join(&name),
            });
        }
    }
    found.sort();
    Ok(found)
}

/// Removes temp files that an interrupted [`write_spec`] left in `dir`
/// (`.das.com-mig_*.tmp`). Call at start-up, before serving, when no write is in flight.
/// Returns how many were removed.
///
/// # Errors
/// [`CdiError::Io`] when the directory cannot be read or a temp file cannot be removed.
pub fn remove_temp_files(dir: &Path) -> Result<usize, CdiError> {
    let prefix = format!(".{}", spec_file_prefix());
    let mut removed = 0;
    for name in dir_file_names(dir)? {
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let path = dir.join(&name);
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
    }
    Ok(removed)
}

/// UTF-8 names of the entries of `dir`; empty when `dir` does not exist.
fn dir_file_names(dir: &Path) -> Result<Vec<String>, CdiError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}

/// Reads and parses one spec file. Does not [`Spec::validate`] it.
///
/// # Errors
/// [`CdiError::Io`] when it cannot be read; [`CdiError::Parse`] when it is not a CDI spec
/// (corrupt, truncated, wrong shape).
pub fn read_spec(path: &Path) -> Result<Spec, CdiError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&bytes).map_err(|source| CdiError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
