//! The CDI spec format, the subset DAS uses (container-device-interface `SPEC.md` 1.1.0,
//! `specs-go/config.go` for the field names), and the checks a CDI runtime makes when it loads a
//! spec: a known `cdiVersion` at least the minimum the spec's features need
//! (`specs-go/version.go`), a valid kind and valid, unique device names (`pkg/parser/parser.go`).
//! Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::CdiError;

/// CDI spec versions this module knows, oldest first (CDI `specs-go/version.go`, SPEC.md 1.1.0).
pub const KNOWN_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

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
    /// OCI hooks: DAS's own is the `createRuntime` hook that caps a container's GPU memory
    /// (`crate::claims::memory_limits`); others are kept so specs that have them still parse.
    /// Hooks need no `cdiVersion` above 0.3.0 ([`Spec::minimum_version`]).
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
    pub(crate) fn from_host(path: impl Into<String>) -> Self {
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
    pub(crate) fn char_device(path: impl Into<String>, major: u32, minor: u32) -> Self {
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

/// An OCI hook (OCI runtime spec `config.md`, "POSIX-platform Hooks"; CDI `specs-go/config.go`
/// `Hook`): DAS writes the `createRuntime` hook of a GPU memory limit
/// (`crate::claims::memory_limits::hook::memory_limit_hook`).
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
    /// annotations or a dot in the class part of the kind. Hooks need none (CDI `specs-go/version.go`
    /// has no rule for them). Later versions add fields this module does not model.
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

/// The CDI name rule a vendor, class, kind, device name or claim UID breaks (CDI `parser.go`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameRule {
    /// The name is empty.
    #[error("empty")]
    Empty,
    /// A vendor or class that does not start with an ASCII letter.
    #[error("must start with a letter")]
    StartLetter,
    /// A device name that does not start with an ASCII letter or digit.
    #[error("must start with a letter or digit")]
    StartLetterOrDigit,
    /// A character outside the name's set (ASCII letters, digits and the name's punctuation).
    #[error("invalid character {0:?}")]
    Character(char),
    /// The last character is not an ASCII letter or digit.
    #[error("must end with a letter or digit")]
    End,
    /// A kind without its `/`.
    #[error("must be <vendor>/<class>")]
    KindShape,
}

/// Checks a vendor or class name (CDI `parser.go`): starts with a letter, ends with a letter or
/// digit, and contains only ASCII letters, digits, `_`, `-`, `.`.
///
/// # Errors
/// [`CdiError::InvalidName`] with `what` set to the given label.
fn validate_vendor_or_class(what: &'static str, name: &str) -> Result<(), CdiError> {
    let bad = |reason: NameRule| CdiError::InvalidName {
        what,
        name: name.to_string(),
        reason,
    };
    let first = name.chars().next().ok_or_else(|| bad(NameRule::Empty))?;
    if !first.is_ascii_alphabetic() {
        return Err(bad(NameRule::StartLetter));
    }
    check_chars(name, &['_', '-', '.']).map_err(bad)
}

/// Checks that every character is an ASCII letter, digit or one of `extra`, and that the last
/// one is a letter or digit.
fn check_chars(name: &str, extra: &[char]) -> Result<(), NameRule> {
    if let Some(c) = name
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !extra.contains(c))
    {
        return Err(NameRule::Character(c));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(NameRule::End);
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
        reason: NameRule::KindShape,
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
    let bad = |reason: NameRule| CdiError::InvalidName {
        what: "device name",
        name: name.to_string(),
        reason,
    };
    let first = name.chars().next().ok_or_else(|| bad(NameRule::Empty))?;
    if !first.is_ascii_alphanumeric() {
        return Err(bad(NameRule::StartLetterOrDigit));
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
