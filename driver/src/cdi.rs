//! CDI (Container Device Interface) specs: the types, DAS's per-claim spec, and spec files.
//!
//! The kubelet hands the container runtime the fully-qualified CDI device IDs the plugin returns
//! from `NodePrepareResources`; the runtime looks them up in spec files in its CDI directories
//! (`/etc/cdi`, `/var/run/cdi`) and applies the device's container edits (env, device nodes,
//! mounts, hooks).
//!
//! DAS writes one spec file per claim (`shared/DESIGN.md` §3): kind [`das_api::CDI_KIND`], file
//! `das.com-mig_<claimUID>.json`, one CDI device per claim request named `<claimUID>-<request>`.
//!
//! Sources: cncf-tags/container-device-interface `SPEC.md` (spec 1.1.0), `specs-go/config.go`
//! (field names), `specs-go/version.go` (minimum version by feature), `pkg/parser/parser.go` (name
//! rules), `pkg/cdi/spec.go` (temp file without `.json` suffix, then rename). Summary in
//! `shared/reference/dra-kubelet-plugin.md` §7; device nodes of a MIG device in
//! `shared/reference/mig-facts.md` §0 fact 8 and §4.1.1.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Durability, write_atomically};

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

/// The CDI device name of a claim request: `<claimUID>-<request>`. A request of a prioritized
/// list (`<request>/<subrequest>`) has its `/` replaced by `.`, which request names (DNS labels)
/// never contain, so names stay distinct.
///
/// # Errors
/// [`CdiError::InvalidName`] when the result is not a valid CDI device name.
pub fn device_name(claim_uid: &str, request: &str) -> Result<String, CdiError> {
    validate_claim_uid(claim_uid)?;
    let name = format!("{claim_uid}-{}", request.replace('/', "."));
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

/// A MIG slice prepared for a container: what its device nodes and env need. Minors come from
/// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access` and `…/gi<G>/ci<C>/access`,
/// the major from the `nvidia-caps` line of `/proc/devices` (`mig-facts.md` §4.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedSlice {
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
}

/// The slices prepared for one request of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSlices {
    /// Request name as in the allocation result (`<request>` or `<request>/<subrequest>`).
    pub request: String,
    /// The slices, in the order the container should number them (`CUDA_VISIBLE_DEVICES`).
    pub slices: Vec<PreparedSlice>,
}

/// A claim's spec and the CDI device IDs to return to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The spec to write with [`write_spec`].
    pub spec: Spec,
    /// Fully-qualified CDI device ID per request name, e.g. `das.com/mig=<uid>-gpu`.
    pub device_ids: BTreeMap<String, String>,
}

/// Builds DAS's spec for a claim: kind [`das_api::CDI_KIND`], one device per request named
/// [`device_name`], with `NVIDIA_VISIBLE_DEVICES` = the MIG UUIDs (comma-separated),
/// `CUDA_VISIBLE_DEVICES` = `0,…,n-1`, the parent GPU nodes (once each), `/dev/nvidiactl`,
/// `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, and the GI and CI capability nodes of each slice
/// (`DESIGN.md` §3 CDI). `cdiVersion` is the minimum the spec needs.
///
/// # Errors
/// [`CdiError::InvalidName`] for a bad claim UID or request name; [`CdiError::InvalidSpec`] for
/// no requests, a request without slices, a duplicate request, or a MIG UUID that cannot go
/// into a comma-separated list.
pub fn build_claim_spec(
    claim_uid: &str,
    requests: &[RequestSlices],
) -> Result<ClaimSpec, CdiError> {
    if requests.is_empty() {
        return Err(CdiError::InvalidSpec(format!(
            "claim {claim_uid}: no requests"
        )));
    }
    let mut devices = Vec::with_capacity(requests.len());
    let mut device_ids = BTreeMap::new();
    for request in requests {
        let name = device_name(claim_uid, &request.request)?;
        let id = qualified_name(das_api::CDI_KIND, &name);
        if device_ids.insert(request.request.clone(), id).is_some() {
            return Err(CdiError::InvalidSpec(format!(
                "claim {claim_uid}: request {:?} listed twice",
                request.request
            )));
        }
        devices.push(Device {
            name,
            annotations: BTreeMap::new(),
            container_edits: request_edits(claim_uid, request)?,
        });
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: das_api::CDI_KIND.to_string(),
        annotations: BTreeMap::new(),
        devices,
        container_edits: None,
    };
    spec.cdi_version = spec.minimum_version().to_string();
    spec.validate()?;
    Ok(ClaimSpec { spec, device_ids })
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

fn request_edits(claim_uid: &str, request: &RequestSlices) -> Result<ContainerEdits, CdiError> {
    let context = || format!("claim {claim_uid} request {:?}", request.request);
    if request.slices.is_empty() {
        return Err(CdiError::InvalidSpec(format!("{}: no slices", context())));
    }
    for slice in &request.slices {
        let uuid = &slice.mig_uuid;
        if uuid.is_empty() || uuid.contains(|c: char| c == ',' || c.is_whitespace()) {
            return Err(CdiError::InvalidSpec(format!(
                "{}: MIG UUID {uuid:?} is empty or has a comma or blank",
                context()
            )));
        }
    }
    Ok(ContainerEdits {
        env: visible_devices_env(&request.slices),
        device_nodes: slice_device_nodes(&request.slices),
        mounts: Vec::new(),
        hooks: Vec::new(),
    })
}

fn visible_devices_env(slices: &[PreparedSlice]) -> Vec<String> {
    let uuids: Vec<&str> = slices.iter().map(|s| s.mig_uuid.as_str()).collect();
    let indexes: Vec<String> = (0..slices.len()).map(|i| i.to_string()).collect();
    vec![
        format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(",")),
        format!("CUDA_VISIBLE_DEVICES={}", indexes.join(",")),
    ]
}

/// Parent GPU nodes (first appearance order, no duplicates), the control and UVM nodes, then the
/// GI and CI capability nodes of each slice.
fn slice_device_nodes(slices: &[PreparedSlice]) -> Vec<DeviceNode> {
    let mut nodes = Vec::new();
    let mut parents = BTreeSet::new();
    for slice in slices {
        if parents.insert(slice.parent_minor) {
            nodes.push(DeviceNode::from_host(format!(
                "/dev/nvidia{}",
                slice.parent_minor
            )));
        }
    }
    for path in [NVIDIACTL_PATH, NVIDIA_UVM_PATH, NVIDIA_UVM_TOOLS_PATH] {
        nodes.push(DeviceNode::from_host(path));
    }
    for slice in slices {
        for minor in [slice.gi_cap_minor, slice.ci_cap_minor] {
            let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
            nodes.push(DeviceNode {
                file_mode: slice.caps_file_mode,
                ..DeviceNode::char_device(path, slice.caps_major, minor)
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
/// new one, never a partial one. No fsync ([`Durability::Atomic`]): the CDI dir is a tmpfs on
/// real nodes and a spec means nothing after a reboot. Returns the path written.
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
    let temp = dir.join(temp_file_name(claim_uid));
    write_atomically(&path, &temp, &bytes, Durability::Atomic).map_err(io_err(&path))?;
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
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "8f2c1a7e-0b1d-4c55-9a0e-3d2f6b7c8d9e";

    fn slice(n: u32, parent: u32) -> PreparedSlice {
        PreparedSlice {
            mig_uuid: format!("MIG-0000000{n}-aaaa-bbbb-cccc-dddddddddddd"),
            parent_minor: parent,
            gi_cap_minor: 3 + 135 * parent + 9 * n,
            ci_cap_minor: 3 + 135 * parent + 9 * n + 1,
            caps_major: 508,
            caps_file_mode: None,
        }
    }

    fn request(name: &str, slices: Vec<PreparedSlice>) -> RequestSlices {
        RequestSlices {
            request: name.to_string(),
            slices,
        }
    }

    #[test]
    fn one_slice_request_has_the_documented_shape() {
        let built = build_claim_spec(UID, &[request("gpu", vec![slice(1, 0)])]).unwrap();
        let value = serde_json::to_value(&built.spec).unwrap();
        let expected = json!({
            "cdiVersion": "0.5.0",
            "kind": "das.com/mig",
            "devices": [{
                "name": format!("{UID}-gpu"),
                "containerEdits": {
                    "env": [
                        "NVIDIA_VISIBLE_DEVICES=MIG-00000001-aaaa-bbbb-cccc-dddddddddddd",
                        "CUDA_VISIBLE_DEVICES=0"
                    ],
                    "deviceNodes": [
                        {"path": "/dev/nvidia0"},
                        {"path": "/dev/nvidiactl"},
                        {"path": "/dev/nvidia-uvm"},
                        {"path": "/dev/nvidia-uvm-tools"},
                        {"path": "/dev/nvidia-caps/nvidia-cap12", "type": "c", "major": 508, "minor": 12},
                        {"path": "/dev/nvidia-caps/nvidia-cap13", "type": "c", "major": 508, "minor": 13}
                    ]
                }
            }]
        });
        assert_eq!(value, expected);
        assert_eq!(
            built.device_ids,
            BTreeMap::from([("gpu".to_string(), format!("das.com/mig={UID}-gpu"))])
        );
    }

    #[test]
    fn without_device_nodes_keeps_the_environment_and_validates() {
        let mut built = build_claim_spec(UID, &[request("gpu", vec![slice(1, 0)])]).unwrap();
        let env = built.spec.devices[0].container_edits.env.clone();
        without_device_nodes(&mut built.spec);
        let edits = &built.spec.devices[0].container_edits;
        assert!(edits.device_nodes.is_empty());
        assert_eq!(edits.env, env);
        built.spec.validate().unwrap();
        let value = serde_json::to_value(&built.spec).unwrap();
        assert!(value["devices"][0]["containerEdits"]["deviceNodes"].is_null());
    }

    #[test]
    fn three_slice_request_lists_every_slice_and_dedups_parents() {
        let slices = vec![slice(1, 0), slice(2, 1), slice(3, 0)];
        let built = build_claim_spec(UID, &[request("big", slices.clone())]).unwrap();
        let device = &built.spec.devices[0];
        assert_eq!(
            device.container_edits.env,
            vec![
                format!(
                    "NVIDIA_VISIBLE_DEVICES={},{},{}",
                    slices[0].mig_uuid, slices[1].mig_uuid, slices[2].mig_uuid
                ),
                "CUDA_VISIBLE_DEVICES=0,1,2".to_string(),
            ]
        );
        let paths: Vec<&str> = device
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            paths,
            vec![
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia-caps/nvidia-cap12",
                "/dev/nvidia-caps/nvidia-cap13",
                "/dev/nvidia-caps/nvidia-cap156",
                "/dev/nvidia-caps/nvidia-cap157",
                "/dev/nvidia-caps/nvidia-cap30",
                "/dev/nvidia-caps/nvidia-cap31",
            ]
        );
        let caps = &device.container_edits.device_nodes[5];
        assert_eq!(caps.node_type.as_deref(), Some("c"));
        assert_eq!((caps.major, caps.minor), (Some(508), Some(12)));
    }

    #[test]
    fn one_device_per_request_and_subrequest_names_are_valid() {
        let built = build_claim_spec(
            UID,
            &[
                request("a", vec![slice(1, 0)]),
                request("b/small", vec![slice(2, 0)]),
            ],
        )
        .unwrap();
        let names: Vec<&str> = built.spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec![format!("{UID}-a"), format!("{UID}-b.small")]);
        assert_eq!(
            built.device_ids["b/small"],
            format!("das.com/mig={UID}-b.small")
        );
    }

    #[test]
    fn caps_file_mode_is_written_when_known() {
        let mut s = slice(1, 0);
        s.caps_file_mode = Some(0o444);
        let built = build_claim_spec(UID, &[request("gpu", vec![s])]).unwrap();
        let value = serde_json::to_value(&built.spec).unwrap();
        assert_eq!(
            value["devices"][0]["containerEdits"]["deviceNodes"][4]["fileMode"],
            292
        );
    }

    #[test]
    fn minimum_version_follows_features() {
        let letter_uid = "c0ffee00-0000-4000-8000-000000000000";
        let mut spec = build_claim_spec(letter_uid, &[request("gpu", vec![slice(1, 0)])])
            .unwrap()
            .spec;
        // The dot of `das.com/mig` is in the vendor, not the class: no 0.6.0.
        assert_eq!(spec.minimum_version(), "0.3.0");
        assert_eq!(spec.cdi_version, "0.3.0");
        spec.devices[0].container_edits.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/b".into(),
            options: vec![],
            mount_type: Some("bind".into()),
        });
        assert_eq!(spec.minimum_version(), "0.4.0");
        spec.devices[0].container_edits.device_nodes[0].host_path = Some("/dev/x".into());
        assert_eq!(spec.minimum_version(), "0.5.0");
        spec.kind = "example.com/gpu.mig".into();
        assert_eq!(spec.minimum_version(), "0.6.0");
        spec.kind = das_api::CDI_KIND.into();
        spec.annotations.insert("a".into(), "b".into());
        assert_eq!(spec.minimum_version(), "0.6.0");
    }

    #[test]
    fn digit_first_device_name_needs_050() {
        let spec = build_claim_spec("1abc", &[request("gpu", vec![slice(1, 0)])])
            .unwrap()
            .spec;
        assert_eq!(spec.cdi_version, "0.5.0");
    }

    #[test]
    fn validate_rejects_old_or_unknown_versions() {
        let mut spec = build_claim_spec(UID, &[request("gpu", vec![slice(1, 0)])])
            .unwrap()
            .spec;
        spec.cdi_version = "0.3.0".into();
        assert!(matches!(spec.validate(), Err(CdiError::InvalidSpec(m)) if m.contains("0.5.0")));
        spec.cdi_version = "0.9.0".into();
        assert!(matches!(spec.validate(), Err(CdiError::InvalidSpec(m)) if m.contains("unknown")));
        spec.cdi_version = "1.1.0".into();
        assert!(spec.validate().is_ok());
    }

    #[test]
    fn names_follow_cdi_rules() {
        assert!(validate_kind("das.com/mig").is_ok());
        assert!(validate_kind("das.com").is_err());
        assert!(validate_kind("1das.com/mig").is_err());
        assert!(validate_kind("das.com/mig-").is_err());
        assert!(validate_kind("das.com/m:g").is_err());
        assert!(validate_device_name("0a:b_c.d-e").is_ok());
        assert!(validate_device_name("").is_err());
        assert!(validate_device_name("-a").is_err());
        assert!(validate_device_name("a-").is_err());
        assert!(validate_device_name("a/b").is_err());
        let err = device_name("../etc", "gpu").unwrap_err().to_string();
        assert!(err.contains("claim UID"), "{err}");
        assert!(device_name(UID, "gpu_").is_err());
    }

    #[test]
    fn builder_rejects_bad_input() {
        assert!(build_claim_spec(UID, &[]).is_err());
        assert!(build_claim_spec(UID, &[request("gpu", vec![])]).is_err());
        let twice = [
            request("gpu", vec![slice(1, 0)]),
            request("gpu", vec![slice(2, 0)]),
        ];
        assert!(build_claim_spec(UID, &twice).is_err());
        let mut s = slice(1, 0);
        s.mig_uuid = "MIG-a,MIG-b".into();
        assert!(build_claim_spec(UID, &[request("gpu", vec![s])]).is_err());
    }

    #[test]
    fn write_read_list_delete_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let built = build_claim_spec(UID, &[request("gpu", vec![slice(1, 0)])]).unwrap();
        let path = write_spec(dir.path(), UID, &built.spec).unwrap();
        assert_eq!(path, dir.path().join(format!("das.com-mig_{UID}.json")));
        assert_eq!(read_spec(&path).unwrap(), built.spec);
        // Only the spec is left: the temp file was renamed away.
        let names = dir_file_names(dir.path()).unwrap();
        assert_eq!(names, vec![format!("das.com-mig_{UID}.json")]);
        // Another vendor's spec is not listed.
        fs::write(dir.path().join("example.com-gpu_x.json"), b"{}").unwrap();
        let listed = list_specs(dir.path()).unwrap();
        assert_eq!(
            listed,
            vec![SpecFile {
                claim_uid: UID.into(),
                path: path.clone()
            }]
        );
        // Rewriting replaces the file in place.
        write_spec(dir.path(), UID, &built.spec).unwrap();
        assert_eq!(list_specs(dir.path()).unwrap().len(), 1);
        assert!(delete_spec(dir.path(), UID).unwrap());
        assert!(!delete_spec(dir.path(), UID).unwrap());
        assert!(list_specs(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn invalid_spec_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = build_claim_spec(UID, &[request("gpu", vec![slice(1, 0)])])
            .unwrap()
            .spec;
        spec.devices.clear();
        assert!(write_spec(dir.path(), UID, &spec).is_err());
        assert!(dir_file_names(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn corrupt_spec_is_a_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = spec_path(dir.path(), UID);
        fs::write(&path, b"{\"cdiVersion\": \"0.3.0\", \"kind\": ").unwrap();
        let err = read_spec(&path).unwrap_err();
        assert!(matches!(err, CdiError::Parse { .. }));
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    #[test]
    fn missing_dir_lists_empty_and_temp_files_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        assert!(list_specs(&dir.path().join("nope")).unwrap().is_empty());
        fs::write(dir.path().join(temp_file_name(UID)), b"partial").unwrap();
        assert!(list_specs(dir.path()).unwrap().is_empty());
        assert_eq!(remove_temp_files(dir.path()).unwrap(), 1);
        assert!(dir_file_names(dir.path()).unwrap().is_empty());
    }
}
