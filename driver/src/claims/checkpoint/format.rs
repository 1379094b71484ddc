//! The checkpoint document (version 11; see [`super`] for the JSON): the record types, the
//! checksum, encoding in the oldest version that holds the content ([`Checkpoint::format_version`],
//! so a rolled-back binary still reads it) and decoding with the upgrades of versions 1 to 10, and
//! the in-memory changes the request path makes. Pure: the file is [`super::store`]'s.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use crate::publish::devices::DeviceKind;

mod changes;
mod kind;
pub(super) mod v1;

/// The newest version of the document this module writes and reads. It also reads versions 1
/// to 10, and writes each checkpoint in the oldest version that can hold its content
/// ([`Checkpoint::format_version`]; see [`super`]).
pub const CHECKPOINT_VERSION: u64 = 11;
/// The oldest version [`Checkpoint::format_version`] gives: version 1 had another shape and is
/// only read.
pub(crate) const OLDEST_WRITTEN: u64 = 2;

/// Where a claim is in its life on this node: checkpoint "started" → create instances → write CDI
/// → checkpoint "completed" → … → unprepare destroys the instances → record dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareState {
    /// Recorded before any instance was created: instances may or may not exist, the CDI spec may or
    /// may not be written. Seen outside a running prepare only after a crash; it is rolled back.
    PrepareStarted,
    /// MIG instances exist and the CDI spec is written; the CDI device IDs were (or can be) returned.
    PrepareCompleted,
    /// The claim's instances must go (its unprepare, or the roll-back of a failed prepare, could
    /// not destroy them all): `devices` are the ones not yet confirmed destroyed. The reaper
    /// retries until they are gone; only then is the record dropped.
    Releasing,
    /// Carved before bind (issue 34; version 8): the instances exist and are recorded, the
    /// claim's `status.devices` says `mig.das.com/SliceReady`, but the kubelet has not prepared
    /// the claim yet, so no CDI spec is written, no MPS daemon runs and no container was ever
    /// given the instances. Its prepare checks them and completes the record; a claim that is
    /// deleted, deallocated or allocated otherwise first releases it at once.
    Carved,
    /// A guard without instances (version 9; docs/design.md §7, "A slice leaves its claim"):
    /// the kubelet holds the claim as prepared (its devices were handed to it) but the record's
    /// instances are gone: a repair destroyed them (an instance or its compute instance was lost)
    /// and creating them again failed or was cut short by a restart. The pod's containers may
    /// still hold the old instances' device nodes, so the record keeps holding its placements
    /// (and its GPUs' MIG mode) until the kubelet unprepares the claim or the orphan rule
    /// releases it; the claim's next prepare creates the instances again. Its devices have no
    /// `instance` and it has no `cdiDeviceIds`.
    Repairing,
}

/// The identity of one MIG instance (a GPU instance with its compute instance) on the GPU named
/// by the device's `gpuUUID`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceId {
    /// GPU-instance ID, assigned by the driver (NVML reuses it after a destroy).
    pub gi_id: u32,
    /// Compute-instance ID inside the GPU instance.
    pub ci_id: u32,
    /// MIG device UUID, `MIG-…`: new on every creation.
    #[serde(rename = "migUUID")]
    pub mig_uuid: String,
}

/// One allocated device of a claim, as prepared on this node: a MIG device, whose instance is
/// created for it, or a whole GPU, which holds no instance (its profile is
/// [`das_api::WHOLE_GPU_PROFILE`] and its placement every memory slice of the GPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedDevice {
    /// What the device is: `"kind": "gpu"` for a whole GPU; absent for a MIG device (every
    /// device of a file before version 4 is one), so a MIG device serializes as in version 3.
    #[serde(default, with = "kind", skip_serializing_if = "kind::is_mig")]
    pub kind: DeviceKind,
    /// Request name from the allocation result (`<request>` or `<request>/<subrequest>`).
    pub request: String,
    /// Pool of the allocated device (the node name).
    pub pool: String,
    /// Published device name, e.g. `gpu-0-mig-1g-10gb-6`.
    pub device: String,
    /// Index of the parent GPU.
    pub gpu_index: u32,
    /// UUID of the parent GPU, `GPU-…`.
    #[serde(rename = "gpuUUID")]
    pub gpu_uuid: String,
    /// MIG profile, e.g. `1g.10gb`; [`das_api::WHOLE_GPU_PROFILE`] for a whole GPU.
    pub profile: String,
    /// First memory slice of the placement (0 for a whole GPU).
    pub placement_start: u32,
    /// Number of memory slices of the placement (all of the GPU's for a whole GPU).
    pub placement_size: u32,
    /// The MIG instance created for the device, once created; always absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceId>,
    /// The limits of the device's MPS control daemon, for a device whose claim asks for MPS
    /// sharing (docs/design.md §7, "MPS on a slice"; version 6): its daemon runs while the
    /// record does. Absent for an exclusive device, which so serializes as in version 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<crate::mps::MpsLimits>,
    /// The claim's share of a shareable device (`…-shared`; docs/design.md §7, "Shared
    /// slices"; version 7): several records hold the one instance, each with its share. Absent
    /// for a device the claim holds alone, which so serializes as in version 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Share>,
    /// The time slice its claim's config set on the whole GPU (docs/design.md §7,
    /// "Time-slicing"; version 10): set at prepare, back to the driver's default at release.
    /// Absent for a device without one, which so serializes as in version 9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slice: Option<das_api::device_config::TimeSliceInterval>,
    /// Whether its share of a whole GPU was acquired (docs/design.md §7, "Memory slices of a
    /// whole GPU"; version 11): set under the GPU's lock in the change of the records that
    /// decides it, so that of two first shares of different namespaces the second sees the first
    /// as a holder of the GPU (a share of a MIG instance says the same by its recorded
    /// instance). Absent (false) for every other device, which so serializes as in version 10.
    #[serde(default, skip_serializing_if = "is_false")]
    pub acquired: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One claim's share of a shareable device, as the scheduler allocated it (KEP-5075 consumable
/// capacity: the allocation result's `shareID` and `consumedCapacity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Share {
    /// The allocation result's `shareID` (a UUID the scheduler assigns; the key of the claim's
    /// `status.devices` entry and of the kubelet's device).
    #[serde(rename = "shareID")]
    pub id: String,
    /// The `shares` capacity consumed (at least 1).
    pub shares: u64,
    /// The device's `shares` capacity (the plugin's shares per MIG instance when it was prepared): the
    /// share's MPS active thread percentage is `shares` over this.
    pub of: u64,
    /// The `memory` capacity consumed, in bytes: the share's MPS pinned device memory limit.
    pub memory_bytes: u64,
}

impl Share {
    /// The share's MPS active thread percentage: its shares over the device's, rounded up to a
    /// whole percent (1..=100).
    pub(crate) fn thread_percentage(&self) -> u64 {
        (self.shares * 100).div_ceil(self.of.max(1)).clamp(1, 100)
    }

    /// The share's pinned device memory limit in MiB, rounded down (at least 1).
    pub(crate) fn memory_mib(&self) -> u64 {
        (self.memory_bytes >> 20).max(1)
    }
}

impl RecordedDevice {
    /// The MIG UUID of the device's instance, once created.
    pub fn mig_uuid(&self) -> Option<&str> {
        self.instance.as_ref().map(|i| i.mig_uuid.as_str())
    }

    /// Whether the device is a whole GPU ([`DeviceKind::WholeGpu`]): preparing it created no
    /// MIG instance and releasing it destroys none.
    pub fn is_whole_gpu(&self) -> bool {
        self.kind == DeviceKind::WholeGpu
    }
}

/// What the checkpoint knows about one claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRecord {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// How far prepare got.
    pub state: PrepareState,
    /// The claim's devices on this node.
    pub devices: Vec<RecordedDevice>,
    /// Fully-qualified CDI device IDs per device name (version 1: per request name), as
    /// returned to the kubelet; empty until [`PrepareState::PrepareCompleted`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cdi_device_ids: BTreeMap<String, Vec<String>>,
    /// UIDs of the pods the claim was reserved for at its prepares (`status.reservedFor`),
    /// kept while the record lives: the orphan rule releases the record's MIG instances only when the
    /// container runtime has no sandbox or container of any of them. Empty in records of
    /// version 2 and in records rebuilt after a lost checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    /// Whether the kubelet holds the claim as prepared, in a state that does not say so by
    /// itself (version 9): a record that was [`PrepareState::PrepareCompleted`] (its devices
    /// were handed to the kubelet) and is now being repaired ([`PrepareState::PrepareStarted`])
    /// or released other than by the kubelet's unprepare or the orphan rule
    /// ([`PrepareState::Releasing`]). Such a record stays a guard of its placements when its
    /// instances are gone ([`PrepareState::Repairing`]) instead of being dropped. Always `false`
    /// in a completed or repairing record, which is handed by its state ([`Self::is_handed`]),
    /// so a checkpoint without repairs is written as version 8 or older.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handed_to_kubelet: bool,
    /// Last change, seconds since the Unix epoch.
    pub updated_at: u64,
}

impl ClaimRecord {
    /// Whether the kubelet holds the claim as prepared: its devices were handed to the kubelet
    /// and it has not unprepared the claim (nor has the orphan rule released it). Such a record
    /// guards its placements and its GPUs' MIG mode whatever its instances' state
    /// (docs/design.md §7, "A slice leaves its claim").
    pub(crate) fn is_handed(&self) -> bool {
        matches!(
            self.state,
            PrepareState::PrepareCompleted | PrepareState::Repairing
        ) || self.handed_to_kubelet
    }

    /// The record's devices whose instance is known.
    pub fn instances(&self) -> impl Iterator<Item = (&RecordedDevice, &InstanceId)> {
        self.devices
            .iter()
            .filter_map(|d| d.instance.as_ref().map(|i| (d, i)))
    }
}

/// A MIG mode switch the plugin started on one GPU and has not seen finish (docs/design.md §7,
/// "MIG mode follows demand"): written before `nvmlDeviceSetMigMode`, removed once the mode is
/// known. Found at start-up, it means the plugin stopped mid-switch; start-up reads the GPU's
/// mode and recovers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigModeSwitch {
    /// UUID of the GPU, `GPU-…` (the index alone could name another GPU after a change).
    #[serde(rename = "gpuUUID")]
    pub gpu_uuid: String,
    /// The mode being switched to: `true` for MIG mode on.
    pub mig_enabled: bool,
    /// UID of the claim whose prepare asked for the switch.
    pub claim: String,
    /// When the switch started, seconds since the Unix epoch.
    pub started_at: u64,
}

/// The in-memory checkpoint. Change it with the `set_*`/[`Checkpoint::remove`] methods, then
/// [`Checkpoint::save`] it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Boot ID the records belong to (see [`super::read_boot_id`]).
    pub boot_id: String,
    /// Records by claim UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// MIG mode switches under way, by GPU index (at most one per GPU: switches run under the
    /// GPU's lock).
    pub mig_mode_switches: BTreeMap<u32, MigModeSwitch>,
}

/// Why a checkpoint file was judged corrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorruptReason {
    /// The file is not JSON (truncated, garbage); the parser's message.
    InvalidJson(String),
    /// `version` is missing or not [`CHECKPOINT_VERSION`]; the value found, as JSON.
    UnknownVersion(String),
    /// Version 1 JSON of the wrong shape (missing or unknown field, wrong type); the message.
    BadShape(String),
    /// The content does not match `checksum` (or `checksum` is missing).
    ChecksumMismatch {
        /// The checksum in the file (empty when missing).
        stored: String,
        /// The checksum of the content.
        computed: String,
    },
}

impl fmt::Display for CorruptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorruptReason::InvalidJson(e) => write!(f, "not valid JSON: {e}"),
            CorruptReason::UnknownVersion(v) => {
                write!(f, "unknown version {v} (expected {CHECKPOINT_VERSION})")
            }
            CorruptReason::BadShape(e) => write!(f, "unexpected content: {e}"),
            CorruptReason::ChecksumMismatch { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch: file says {stored:?}, content gives {computed:?}"
                )
            }
        }
    }
}

/// The on-disk document. Field order is the serialization order.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Document {
    pub(super) version: u64,
    pub(super) boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) checksum: Option<String>,
    pub(super) claims: BTreeMap<String, ClaimRecord>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) mig_mode_switches: BTreeMap<u32, MigModeSwitch>,
}

impl Document {
    /// `crc32:<8 hex digits>` of the compact serialization without the checksum field.
    pub(super) fn compute_checksum(&self) -> Result<String, serde_json::Error> {
        let unsummed = Document {
            version: self.version,
            boot_id: self.boot_id.clone(),
            checksum: None,
            claims: self.claims.clone(),
            mig_mode_switches: self.mig_mode_switches.clone(),
        };
        let bytes = serde_json::to_vec(&unsummed)?;
        Ok(format!("crc32:{:08x}", crc32fast::hash(&bytes)))
    }
}

impl Checkpoint {
    /// An empty checkpoint for the given boot.
    pub fn new(boot_id: impl Into<String>) -> Self {
        Checkpoint {
            boot_id: boot_id.into(),
            claims: BTreeMap::new(),
            mig_mode_switches: BTreeMap::new(),
        }
    }

    /// The oldest version of the document that holds this content, which is the version it is
    /// written in: a binary of an earlier release reads every version up to its own, so after a
    /// rollback (`helm rollback` of a failed upgrade) it still reads the file unless the file
    /// holds something only a newer release knows. Each version added one field or state:
    /// 10 a device's `timeSlice`, 9 a repair's guard ([`PrepareState::Repairing`], [`ClaimRecord::handed_to_kubelet`]),
    /// 8 [`PrepareState::Carved`], 7 a device's `share`, 6 a device's `mps`, 5 MIG mode
    /// switches, 4 a whole GPU (`kind`), 3 `pods`; 2 is the oldest this module writes.
    pub(crate) fn format_version(&self) -> u64 {
        let records = || self.claims.values();
        let devices = || records().flat_map(|r| &r.devices);
        if devices().any(|d| d.share.is_some() && d.is_whole_gpu()) {
            11
        } else if devices().any(|d| d.time_slice.is_some()) {
            10
        } else if records().any(|r| r.state == PrepareState::Repairing || r.handed_to_kubelet) {
            9
        } else if records().any(|r| r.state == PrepareState::Carved) {
            8
        } else if devices().any(|d| d.share.is_some()) {
            7
        } else if devices().any(|d| d.mps.is_some()) {
            6
        } else if !self.mig_mode_switches.is_empty() {
            5
        } else if devices().any(RecordedDevice::is_whole_gpu) {
            4
        } else if records().any(|r| !r.pods.is_empty()) {
            3
        } else {
            OLDEST_WRITTEN
        }
    }

    /// The file content: pretty JSON with the checksum, ending in a newline, as version
    /// [`Self::format_version`].
    pub(super) fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut doc = Document {
            version: self.format_version(),
            boot_id: self.boot_id.clone(),
            checksum: None,
            claims: self.claims.clone(),
            mig_mode_switches: self.mig_mode_switches.clone(),
        };
        doc.checksum = Some(doc.compute_checksum()?);
        let mut bytes = serde_json::to_vec_pretty(&doc)?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// The record of a claim, if any.
    pub fn get(&self, claim_uid: &str) -> Option<&ClaimRecord> {
        self.claims.get(claim_uid)
    }
}

/// Parses and verifies file content; returns the checkpoint (upgraded to the current version)
/// and the version the file had, or why it is corrupt.
pub(super) fn parse(bytes: &[u8]) -> Result<(Checkpoint, u64), CorruptReason> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| CorruptReason::InvalidJson(e.to_string()))?;
    let version = value.get("version");
    match version.and_then(serde_json::Value::as_u64) {
        // Version 2 is version 3 without `pods`, version 3 is version 4 without a device's
        // `kind` (every device a MIG one), version 4 is version 5 without `migModeSwitches`,
        // version 5 is version 6 without a device's `mps`, version 6 is version 7 without a
        // device's `share`, version 7 is version 8 without the state `Carved`, version 8 is
        // version 9 without the state `Repairing` and `handedToKubelet`, version 9 is version 10
        // without a device's `timeSlice`: the same document type reads all nine, and its checksum covers the version the file has (a MIG device
        // serializes as it did, an exclusive one without `mps`, one held alone without
        // `share`, a record the kubelet holds by its state without `handedToKubelet`, a device
        // without a time slice without `timeSlice`, and no
        // switch is left out). This binary writes the oldest of them that holds the content.
        Some(v @ OLDEST_WRITTEN..=CHECKPOINT_VERSION) => {
            let doc: Document = serde_json::from_value(value)
                .map_err(|e| CorruptReason::BadShape(e.to_string()))?;
            verify(&doc.checksum, doc.compute_checksum())?;
            Ok((
                Checkpoint {
                    boot_id: doc.boot_id,
                    claims: doc.claims,
                    mig_mode_switches: doc.mig_mode_switches,
                },
                v,
            ))
        }
        Some(1) => {
            let doc: v1::Document = serde_json::from_value(value)
                .map_err(|e| CorruptReason::BadShape(e.to_string()))?;
            verify(&doc.checksum, doc.compute_checksum())?;
            Ok((doc.upgrade(), 1))
        }
        _ => {
            let found = version.map_or_else(|| "(missing)".to_string(), |v| v.to_string());
            Err(CorruptReason::UnknownVersion(found))
        }
    }
}

/// Compares a stored checksum with the computed one.
fn verify(
    stored: &Option<String>,
    computed: Result<String, serde_json::Error>,
) -> Result<(), CorruptReason> {
    let computed = computed.map_err(|e| CorruptReason::BadShape(e.to_string()))?;
    let stored = stored.clone().unwrap_or_default();
    if stored != computed {
        return Err(CorruptReason::ChecksumMismatch { stored, computed });
    }
    Ok(())
}

/// Seconds since the Unix epoch (0 before it).
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
