//! The node plugin's checkpoint: the claims it prepared and the exact MIG instances it created
//! for them, kept on disk so unprepare works after a plugin restart, a half-done prepare can be
//! rolled back, and an instance is only ever destroyed by the claim that owns it
//! (docs/architecture.md, "Prepare and unprepare").
//!
//! The file is a versioned JSON document, rewritten whole and atomically on every change (temp
//! file, rename); fine for the few hundred claims a node holds. It is not fsynced: only a
//! kernel crash or a power loss can lose a write that a reader has seen, and both reboot the
//! node, which destroys every MIG instance the file describes and makes [`Checkpoint::load`]
//! discard it (new boot ID). A restarted plugin process always reads the last write. After a
//! power loss the file may also be found incomplete; it is then moved aside as corrupt (below),
//! which loses nothing, since none of the instances it described survived. (Fsyncs of the file
//! and its directory were a fifth of the plugin's CPU per prepare and the tail of its latency;
//! docs/benchmarks.md.)
//!
//! ```json
//! {
//!   "version": 3,
//!   "bootId": "0b7e…",
//!   "checksum": "crc32:1a2b3c4d",
//!   "claims": {
//!     "<claimUID>": {
//!       "namespace": "ns", "name": "claim",
//!       "state": "PrepareStarted" | "PrepareCompleted" | "Releasing",
//!       "devices": [{"request": "gpu", "pool": "node-a", "device": "gpu-0-mig-1g-10gb-6",
//!                    "gpuIndex": 0, "gpuUUID": "GPU-…", "profile": "1g.10gb",
//!                    "placementStart": 6, "placementSize": 2,
//!                    "instance": {"giId": 13, "ciId": 0, "migUUID": "MIG-…"}}],
//!       "cdiDeviceIds": {"gpu-0-mig-1g-10gb-6": ["das.com/mig=<claimUID>-gpu-0-mig-1g-10gb-6"]},
//!       "pods": ["<podUID>"],
//!       "updatedAt": 1767225600
//!     }
//!   }
//! }
//! ```
//!
//! A device's `instance` is the identity of the MIG instance created for it: GPU UUID (the
//! device's `gpuUUID`), GPU-instance ID, compute-instance ID and MIG UUID. NVML reuses GI IDs
//! after a destroy and a MIG UUID is new on every creation, so together they name one instance
//! and never its successor at the same placement. `instance` is absent only while a prepare is
//! creating the instance (and in a record left by a crash in that window).
//!
//! Version 1 (the first release) had the instance fields flat on the device (`giId`, `ciId`,
//! `migUUID`), CDI device IDs per request, and no `Releasing` state; it is read and upgraded
//! ([`LoadOutcome::Upgraded`]), never treated as corrupt. Version 2 lacked `pods` (the UIDs of
//! the pods the claim was reserved for when it was prepared, which the orphan rule asks the
//! container runtime about); it is read as version 3 with no pods known. An older binary moves a
//! newer file aside as corrupt and rebuilds from the GPUs and the API server (a downgrade loses
//! no instance the API server still allocates; see docs/design.md for what it costs).
//!
//! `checksum` is CRC-32 (IEEE, the `crc32fast` crate) of the compact JSON serialization of the
//! same document without the `checksum` field; map keys are sorted, so the serialization is
//! canonical and the checksum does not depend on the file's whitespace or on the Rust version.
//!
//! [`Checkpoint::load`] never panics and never fails on bad content: a new boot ID (MIG instances
//! do not survive a reboot) is reported as [`LoadOutcome::NewBoot`]; a file with unknown version,
//! bad JSON, unexpected fields or a wrong checksum is moved aside to `<name>.corrupt-<unix time>`
//! and reported as [`LoadOutcome::Corrupt`], so the caller rebuilds state from the GPU backend and
//! the API server instead of crash-looping.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use das_runtime::fs::write_atomically;
use serde::{Deserialize, Serialize};

/// Version of the document this module writes. It also reads version 1 (see the module docs).
pub const CHECKPOINT_VERSION: u64 = 3;

/// Default file name of the checkpoint in the plugin's state directory.
pub const CHECKPOINT_FILE_NAME: &str = "checkpoint.json";

/// Where Linux exposes the ID of the current boot (a UUID, new on every boot).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Errors that stop a load or save. Bad file *content* is not an error: see
/// [`LoadOutcome::Corrupt`].
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed (read, write, rename, create directory).
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The checkpoint could not be serialized (not expected with these types).
    #[error("checkpoint cannot be serialized: {0}")]
    Serialize(#[from] serde_json::Error),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a claim is in its life on this node: checkpoint "started" → create instances → write CDI
/// → checkpoint "completed" → … → unprepare destroys the instances → record dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareState {
    /// Recorded before any instance was created: instances may or may not exist, the CDI spec may or
    /// may not be written. Seen outside a running prepare only after a crash; it is rolled back.
    PrepareStarted,
    /// Slices exist and the CDI spec is written; the CDI device IDs were (or can be) returned.
    PrepareCompleted,
    /// The claim's instances must go (its unprepare, or the roll-back of a failed prepare, could
    /// not destroy them all): `devices` are the ones not yet confirmed destroyed. The reaper
    /// retries until they are gone; only then is the record dropped.
    Releasing,
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

/// One allocated device of a claim, as prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedDevice {
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
    /// MIG profile, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Number of memory slices of the placement.
    pub placement_size: u32,
    /// The MIG instance created for the device, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceId>,
}

impl RecordedDevice {
    /// The MIG UUID of the device's instance, once created.
    pub fn mig_uuid(&self) -> Option<&str> {
        self.instance.as_ref().map(|i| i.mig_uuid.as_str())
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
    /// kept while the record lives: the orphan rule releases the record's slices only when the
    /// container runtime has no sandbox or container of any of them. Empty in records of
    /// version 2 and in records rebuilt after a lost checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    /// Last change, seconds since the Unix epoch.
    pub updated_at: u64,
}

impl ClaimRecord {
    /// The record's devices whose instance is known.
    pub fn instances(&self) -> impl Iterator<Item = (&RecordedDevice, &InstanceId)> {
        self.devices
            .iter()
            .filter_map(|d| d.instance.as_ref().map(|i| (d, i)))
    }
}

/// The in-memory checkpoint. Change it with the `set_*`/[`Checkpoint::remove`] methods, then
/// [`Checkpoint::save`] it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Boot ID the records belong to (see [`read_boot_id`]).
    pub boot_id: String,
    /// Records by claim UID.
    pub claims: BTreeMap<String, ClaimRecord>,
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

/// Result of [`Checkpoint::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// The file was valid and from this boot.
    Loaded(Checkpoint),
    /// The file was a valid older version from this boot, upgraded in memory (the next save
    /// writes [`CHECKPOINT_VERSION`]).
    Upgraded {
        /// The upgraded checkpoint.
        checkpoint: Checkpoint,
        /// The version the file had.
        from: u64,
    },
    /// There was no file: first start on this node (or the state dir was wiped).
    Fresh,
    /// The file was valid but written in an earlier boot: MIG instances and `/var/run/cdi` are
    /// gone, so the caller starts from [`Checkpoint::new`]. The old records, for logging.
    NewBoot {
        /// The checkpoint of the earlier boot.
        previous: Checkpoint,
    },
    /// The file was unreadable as a checkpoint and was moved aside; the caller rebuilds state
    /// from the backend and the API server.
    Corrupt {
        /// Where the file now is, `<path>.corrupt-<unix time>`.
        moved_to: PathBuf,
        /// What was wrong with it.
        reason: CorruptReason,
    },
}

/// The on-disk document. Field order is the serialization order.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    version: u64,
    boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
    claims: BTreeMap<String, ClaimRecord>,
}

impl Document {
    /// `crc32:<8 hex digits>` of the compact serialization without the checksum field.
    fn compute_checksum(&self) -> Result<String, serde_json::Error> {
        let unsummed = Document {
            version: self.version,
            boot_id: self.boot_id.clone(),
            checksum: None,
            claims: self.claims.clone(),
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
        }
    }

    /// Loads the checkpoint at `path` for the current `boot_id` (see [`read_boot_id`]). Bad
    /// content is moved aside and reported, never returned as an error (see [`LoadOutcome`]).
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the file exists but cannot be read, or a corrupt file cannot
    /// be moved aside.
    pub fn load(path: &Path, boot_id: &str) -> Result<LoadOutcome, CheckpointError> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LoadOutcome::Fresh),
            Err(e) => return Err(io_err(path)(e)),
        };
        match parse(&bytes) {
            Ok((cp, _)) if cp.boot_id != boot_id => Ok(LoadOutcome::NewBoot { previous: cp }),
            Ok((cp, CHECKPOINT_VERSION)) => Ok(LoadOutcome::Loaded(cp)),
            Ok((checkpoint, from)) => Ok(LoadOutcome::Upgraded { checkpoint, from }),
            Err(reason) => {
                let moved_to = move_aside(path)?;
                Ok(LoadOutcome::Corrupt { moved_to, reason })
            }
        }
    }

    /// Writes the checkpoint to `path` atomically (temp file `.<name>.tmp` beside it, rename;
    /// no fsync, see the module docs), creating the directory if needed. Saves of one file must
    /// not run concurrently (they share the temp file): keep one writer, e.g. behind a mutex.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when a file step fails; the old file is then left intact.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let bytes = self.to_bytes()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        write_atomically(path, &temp_path(path), &bytes).map_err(io_err(path))
    }

    /// The file content: pretty JSON with the checksum, ending in a newline.
    fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut doc = Document {
            version: CHECKPOINT_VERSION,
            boot_id: self.boot_id.clone(),
            checksum: None,
            claims: self.claims.clone(),
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

    /// Records that prepare of a claim started, replacing any earlier record; `devices` are the
    /// allocated devices, with their instances where already known. Callers check
    /// [`Checkpoint::get`] first so a retried prepare of a completed claim does not downgrade it.
    pub fn set_started(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::PrepareStarted,
            devices,
            BTreeMap::new(),
        );
    }

    /// Records that prepare of a claim completed: its devices (instances filled in) and the CDI
    /// device IDs per device name. Replaces any earlier record, so it also works
    /// when the claim was never recorded as started (state rebuilt after a corrupt file).
    pub fn set_completed(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
        cdi_device_ids: BTreeMap<String, Vec<String>>,
    ) {
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::PrepareCompleted,
            devices,
            cdi_device_ids,
        );
    }

    fn upsert(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        state: PrepareState,
        devices: Vec<RecordedDevice>,
        cdi_device_ids: BTreeMap<String, Vec<String>>,
    ) {
        // The pods a claim was prepared for stay known across its states: a container of any of
        // them may use its slices until the kubelet unprepares it.
        let pods = self
            .claims
            .get(claim_uid)
            .map(|r| r.pods.clone())
            .unwrap_or_default();
        let record = ClaimRecord {
            namespace: namespace.to_string(),
            name: name.to_string(),
            state,
            devices,
            cdi_device_ids,
            pods,
            updated_at: unix_now(),
        };
        self.claims.insert(claim_uid.to_string(), record);
    }

    /// Sets the pods the claim's record knows (see [`ClaimRecord::pods`]); returns whether that
    /// changed anything. No-op without a record.
    pub fn set_pods(&mut self, claim_uid: &str, pods: Vec<String>) -> bool {
        match self.claims.get_mut(claim_uid) {
            Some(r) if r.pods != pods => {
                r.pods = pods;
                true
            }
            _ => false,
        }
    }

    /// Records that the claim's instances in `devices` must still be destroyed
    /// ([`PrepareState::Releasing`]); keeps the claim's namespace and name.
    pub fn set_releasing(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::Releasing,
            devices,
            BTreeMap::new(),
        );
    }

    /// Forgets a claim (after unprepare). Idempotent: returns the removed record, `None` when
    /// there was none.
    pub fn remove(&mut self, claim_uid: &str) -> Option<ClaimRecord> {
        self.claims.remove(claim_uid)
    }
}

/// Parses and verifies file content; returns the checkpoint (upgraded to the current version)
/// and the version the file had, or why it is corrupt.
fn parse(bytes: &[u8]) -> Result<(Checkpoint, u64), CorruptReason> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| CorruptReason::InvalidJson(e.to_string()))?;
    let version = value.get("version");
    match version.and_then(serde_json::Value::as_u64) {
        // Version 2 is version 3 without `pods`: the same document type reads both, and its
        // checksum covers the version the file has.
        Some(v @ (2 | CHECKPOINT_VERSION)) => {
            let doc: Document = serde_json::from_value(value)
                .map_err(|e| CorruptReason::BadShape(e.to_string()))?;
            verify(&doc.checksum, doc.compute_checksum())?;
            Ok((
                Checkpoint {
                    boot_id: doc.boot_id,
                    claims: doc.claims,
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

/// Version 1 of the document (the first release), read to upgrade it.
mod v1 {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::{Checkpoint, ClaimRecord, InstanceId, PrepareState};

    /// A version-1 device: the instance fields are flat and each optional.
    #[derive(Serialize, Deserialize, Clone)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub(super) struct DeviceV1 {
        request: String,
        pool: String,
        device: String,
        gpu_index: u32,
        #[serde(rename = "gpuUUID")]
        gpu_uuid: String,
        profile: String,
        placement_start: u32,
        placement_size: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gi_id: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ci_id: Option<u32>,
        #[serde(default, rename = "migUUID", skip_serializing_if = "Option::is_none")]
        mig_uuid: Option<String>,
    }

    /// Version 1 had only the two prepare states.
    #[derive(Serialize, Deserialize, Clone, Copy)]
    pub(super) enum State {
        PrepareStarted,
        PrepareCompleted,
    }

    #[derive(Serialize, Deserialize, Clone)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub(super) struct ClaimRecordV1 {
        namespace: String,
        name: String,
        state: State,
        devices: Vec<DeviceV1>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        cdi_device_ids: BTreeMap<String, Vec<String>>,
        updated_at: u64,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub(super) struct Document {
        pub(super) version: u64,
        pub(super) boot_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) checksum: Option<String>,
        pub(super) claims: BTreeMap<String, ClaimRecordV1>,
    }

    impl Document {
        /// The version-1 checksum: the same rule as version 2, over the version-1 document.
        pub(super) fn compute_checksum(&self) -> Result<String, serde_json::Error> {
            let unsummed = Document {
                version: self.version,
                boot_id: self.boot_id.clone(),
                checksum: None,
                claims: self.claims.clone(),
            };
            let bytes = serde_json::to_vec(&unsummed)?;
            Ok(format!("crc32:{:08x}", crc32fast::hash(&bytes)))
        }

        /// The same records in version 2: an instance is known when all three of its fields
        /// were. CDI device IDs were per request: a completed record's spec is written again,
        /// per device, by the next prepare retry or start-up (they check it), so the old IDs are
        /// kept as they are until then.
        pub(super) fn upgrade(self) -> Checkpoint {
            let claims = self
                .claims
                .into_iter()
                .map(|(uid, r)| {
                    let devices = r
                        .devices
                        .into_iter()
                        .map(|d| super::RecordedDevice {
                            instance: match (d.gi_id, d.ci_id, d.mig_uuid) {
                                (Some(gi_id), Some(ci_id), Some(mig_uuid)) => Some(InstanceId {
                                    gi_id,
                                    ci_id,
                                    mig_uuid,
                                }),
                                _ => None,
                            },
                            request: d.request,
                            pool: d.pool,
                            device: d.device,
                            gpu_index: d.gpu_index,
                            gpu_uuid: d.gpu_uuid,
                            profile: d.profile,
                            placement_start: d.placement_start,
                            placement_size: d.placement_size,
                        })
                        .collect();
                    let state = match r.state {
                        State::PrepareStarted => PrepareState::PrepareStarted,
                        State::PrepareCompleted => PrepareState::PrepareCompleted,
                    };
                    let record = ClaimRecord {
                        namespace: r.namespace,
                        name: r.name,
                        state,
                        devices,
                        cdi_device_ids: r.cdi_device_ids,
                        pods: Vec::new(),
                        updated_at: r.updated_at,
                    };
                    (uid, record)
                })
                .collect();
            Checkpoint {
                boot_id: self.boot_id,
                claims,
            }
        }
    }
}

/// Renames a corrupt file to `<path>.corrupt-<unix time>` (with `.<n>` added if that exists).
fn move_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
    let base = format!("{}.corrupt-{}", path.display(), unix_now());
    let mut target = PathBuf::from(&base);
    let mut n = 1;
    while target.exists() {
        target = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    fs::rename(path, &target).map_err(io_err(path))?;
    Ok(target)
}

/// `dir/.<name>.tmp` for `dir/<name>`.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp"))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads the current boot ID from [`BOOT_ID_PATH`].
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be read or is empty.
pub fn read_boot_id() -> Result<String, CheckpointError> {
    read_boot_id_from(Path::new(BOOT_ID_PATH))
}

/// Reads a boot ID from `path` (tests and emulated nodes point this elsewhere), trimmed.
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be read or is empty.
pub fn read_boot_id_from(path: &Path) -> Result<String, CheckpointError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    let id = text.trim();
    if id.is_empty() {
        return Err(io_err(path)(io::Error::new(
            io::ErrorKind::InvalidData,
            "empty boot ID",
        )));
    }
    Ok(id.to_string())
}

/// The checkpoint in memory and on disk. Changes are made under a short lock and numbered;
/// [`Self::persist`] makes sure a change is on disk by writing the newest state, so changes made
/// at the same time share one write (group commit) instead of queueing one each.
pub struct CheckpointStore {
    state: std::sync::Mutex<(Checkpoint, u64)>,
    /// Number of the newest change on disk; held while writing.
    written: tokio::sync::Mutex<u64>,
    path: PathBuf,
    blocking: crate::blocking::BlockingCalls,
}

impl CheckpointStore {
    /// A store for `checkpoint`, saved to `path` ([`Checkpoint::save`]) on the calling task.
    pub fn new(checkpoint: Checkpoint, path: PathBuf) -> Self {
        Self {
            state: std::sync::Mutex::new((checkpoint, 0)),
            written: tokio::sync::Mutex::new(0),
            path,
            blocking: crate::blocking::BlockingCalls::Threads,
        }
    }

    /// Writes on the calling task as `blocking` says: for tests that drive thousands of changes
    /// through chosen interleavings.
    pub fn for_tests(mut self, blocking: crate::blocking::BlockingCalls) -> Self {
        self.blocking = blocking;
        self
    }

    /// The file the store saves to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the checkpoint.
    pub fn read<R>(&self, f: impl FnOnce(&Checkpoint) -> R) -> R {
        f(&self.state.lock().expect("checkpoint lock").0)
    }

    /// Changes the checkpoint in memory only; returns the change's number for
    /// [`Self::persist`].
    pub fn change<R>(&self, f: impl FnOnce(&mut Checkpoint) -> R) -> (R, u64) {
        let mut g = self.state.lock().expect("checkpoint lock");
        g.1 += 1;
        (f(&mut g.0), g.1)
    }

    /// Makes sure change `version` (and every earlier one) is on disk.
    ///
    /// # Errors
    /// The file could not be written; the message names it.
    pub async fn persist(&self, version: u64) -> Result<(), String> {
        let mut written = self.written.lock().await;
        if *written >= version {
            return Ok(()); // someone else's write carried it
        }
        let (snapshot, newest) = {
            let g = self.state.lock().expect("checkpoint lock");
            (g.0.clone(), g.1)
        };
        // A write without fsync: brief enough to do on this task (see `run_brief`).
        self.blocking
            .run_brief(|| snapshot.save(&self.path))
            .await
            .map_err(|e| e.to_string())?;
        *written = newest;
        Ok(())
    }

    /// Changes the checkpoint and waits until the change is on disk.
    ///
    /// # Errors
    /// As [`Self::persist`]; the change stays in memory (the next successful write saves it).
    pub async fn commit<R>(&self, f: impl FnOnce(&mut Checkpoint) -> R) -> Result<R, String> {
        let (r, version) = self.change(f);
        self.persist(version).await?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests;
