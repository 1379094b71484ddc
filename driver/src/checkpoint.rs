//! The node plugin's checkpoint: the claims it prepared, kept on disk so unprepare works after a
//! plugin restart and a half-done prepare can be finished or rolled back (`shared/DESIGN.md` §7).
//!
//! The file is a versioned JSON document, rewritten whole and atomically on every change (temp
//! file, fsync, rename, fsync directory); fine for the few hundred claims a node holds:
//!
//! ```json
//! {
//!   "version": 1,
//!   "bootId": "0b7e…",
//!   "checksum": "crc32:1a2b3c4d",
//!   "claims": {
//!     "<claimUID>": {
//!       "namespace": "ns", "name": "claim",
//!       "state": "PrepareStarted" | "PrepareCompleted",
//!       "devices": [{"request": "gpu", "pool": "node-a", "device": "gpu-0-mig-1g-10gb-6",
//!                    "gpuIndex": 0, "gpuUUID": "GPU-…", "profile": "1g.10gb",
//!                    "placementStart": 6, "placementSize": 2,
//!                    "giId": 13, "ciId": 0, "migUUID": "MIG-…"}],
//!       "cdiDeviceIds": {"gpu": ["das.com/mig=<claimUID>-gpu"]},
//!       "updatedAt": 1767225600
//!     }
//!   }
//! }
//! ```
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
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Version of the document this module writes and the only one it reads.
pub const CHECKPOINT_VERSION: u64 = 1;

/// Default file name of the checkpoint in the plugin's state directory.
pub const CHECKPOINT_FILE_NAME: &str = "checkpoint.json";

/// Where Linux exposes the ID of the current boot (a UUID, new on every boot).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Errors that stop a load or save. Bad file *content* is not an error: see
/// [`LoadOutcome::Corrupt`].
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed (read, write, fsync, rename, create directory).
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

/// How far the prepare of a claim got (`DESIGN.md` §7: checkpoint "started" → create slices →
/// write CDI → checkpoint "completed").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareState {
    /// Recorded before any slice was created: slices may or may not exist, the CDI spec may or
    /// may not be written. A retried prepare finishes it; an unprepare rolls it back.
    PrepareStarted,
    /// Slices exist and the CDI spec is written; the CDI device IDs were (or can be) returned.
    PrepareCompleted,
}

/// One allocated device of a claim, as prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedDevice {
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
    /// GPU instance ID, once created (driver-assigned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    /// Compute instance ID, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
    /// MIG device UUID, once created (changes on every re-creation).
    #[serde(default, rename = "migUUID", skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
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
    pub devices: Vec<PreparedDevice>,
    /// Fully-qualified CDI device IDs per request name, as returned to the kubelet; empty until
    /// [`PrepareState::PrepareCompleted`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cdi_device_ids: BTreeMap<String, Vec<String>>,
    /// Last change, seconds since the Unix epoch.
    pub updated_at: u64,
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
            Ok(cp) if cp.boot_id == boot_id => Ok(LoadOutcome::Loaded(cp)),
            Ok(previous) => Ok(LoadOutcome::NewBoot { previous }),
            Err(reason) => {
                let moved_to = move_aside(path)?;
                Ok(LoadOutcome::Corrupt { moved_to, reason })
            }
        }
    }

    /// Writes the checkpoint to `path` atomically (temp file `.<name>.tmp` beside it, fsync,
    /// rename, fsync directory), creating the directory if needed. Saves of one file must not
    /// run concurrently (they share the temp file): keep one writer, e.g. behind a mutex.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when a file step fails; the old file is then left intact.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let bytes = self.to_bytes()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        write_atomically(path, &temp_path(path), &bytes, Durability::Durable).map_err(io_err(path))
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
    /// allocated devices, with GI/CI IDs and MIG UUIDs where already known. Callers check
    /// [`Checkpoint::get`] first so a retried prepare of a completed claim does not downgrade it.
    pub fn set_started(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<PreparedDevice>,
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

    /// Records that prepare of a claim completed: its devices (GI/CI IDs and MIG UUIDs filled
    /// in) and the CDI device IDs per request. Replaces any earlier record, so it also works
    /// when the claim was never recorded as started (state rebuilt after a corrupt file).
    pub fn set_completed(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<PreparedDevice>,
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
        devices: Vec<PreparedDevice>,
        cdi_device_ids: BTreeMap<String, Vec<String>>,
    ) {
        let record = ClaimRecord {
            namespace: namespace.to_string(),
            name: name.to_string(),
            state,
            devices,
            cdi_device_ids,
            updated_at: unix_now(),
        };
        self.claims.insert(claim_uid.to_string(), record);
    }

    /// Forgets a claim (after unprepare). Idempotent: returns the removed record, `None` when
    /// there was none.
    pub fn remove(&mut self, claim_uid: &str) -> Option<ClaimRecord> {
        self.claims.remove(claim_uid)
    }
}

/// Parses and verifies file content; the error says why it is corrupt.
fn parse(bytes: &[u8]) -> Result<Checkpoint, CorruptReason> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| CorruptReason::InvalidJson(e.to_string()))?;
    let version = value.get("version");
    if version.and_then(serde_json::Value::as_u64) != Some(CHECKPOINT_VERSION) {
        let found = version.map_or_else(|| "(missing)".to_string(), |v| v.to_string());
        return Err(CorruptReason::UnknownVersion(found));
    }
    let doc: Document =
        serde_json::from_value(value).map_err(|e| CorruptReason::BadShape(e.to_string()))?;
    let computed = doc
        .compute_checksum()
        .map_err(|e| CorruptReason::BadShape(e.to_string()))?;
    let stored = doc.checksum.clone().unwrap_or_default();
    if stored != computed {
        return Err(CorruptReason::ChecksumMismatch { stored, computed });
    }
    Ok(Checkpoint {
        boot_id: doc.boot_id,
        claims: doc.claims,
    })
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
    sync_parent(&target).map_err(io_err(&target))?;
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

/// Replaces `path` with `bytes` atomically: write `temp_path` (same directory, truncated if it
/// exists), rename it over `path`; with [`Durability::Durable`] the file is fsynced before the
/// rename and the directory after it. A reader sees the old content or the new, never a mix;
/// after a crash at most a stale temp file is left. On error the temp file is removed. Shared
/// with [`crate::cdi`] and the emulated backend.
///
/// # Errors
/// The first failing step's I/O error.
pub fn write_atomically(
    path: &Path,
    temp_path: &Path,
    bytes: &[u8],
    durability: Durability,
) -> io::Result<()> {
    let result = write_and_rename(path, temp_path, bytes, durability);
    if result.is_err() {
        let _ = fs::remove_file(temp_path);
    }
    result
}

fn write_and_rename(
    path: &Path,
    temp_path: &Path,
    bytes: &[u8],
    durability: Durability,
) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp_path)?;
    file.write_all(bytes)?;
    if durability == Durability::Durable {
        file.sync_all()?;
    }
    drop(file);
    fs::rename(temp_path, path)?;
    if durability == Durability::Durable {
        sync_parent(path)?;
    }
    Ok(())
}

/// What a write of [`write_atomically`] must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Also a power loss: the file and its directory are fsynced (the checkpoint).
    Durable,
    /// Only a crash of the process: readers see the old or the new content, never a mix, but
    /// the write may be lost with the host. For files a reboot makes meaningless anyway: CDI
    /// specs (in `/var/run/cdi`, a tmpfs on real nodes) and the emulated GPUs' MIG state (MIG
    /// instances never survive a reboot). Saves two fsyncs per write.
    Atomic,
}

/// Fsyncs the directory holding `path`, so a rename in it survives a crash.
fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "3f1b2c4d-1111-2222-3333-444455556666";

    fn device(request: &str, start: u32) -> PreparedDevice {
        PreparedDevice {
            request: request.to_string(),
            pool: "node-a".into(),
            device: format!("gpu-0-mig-1g-10gb-{start}"),
            gpu_index: 0,
            gpu_uuid: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
            profile: "1g.10gb".into(),
            placement_start: start,
            placement_size: 2,
            gi_id: None,
            ci_id: None,
            mig_uuid: None,
        }
    }

    fn sample() -> Checkpoint {
        let mut cp = Checkpoint::new(BOOT);
        cp.set_started("uid-1", "ns", "claim-1", vec![device("gpu", 6)]);
        let mut done = device("gpu", 4);
        done.gi_id = Some(5);
        done.ci_id = Some(0);
        done.mig_uuid = Some("MIG-12345678-aaaa-bbbb-cccc-dddddddddddd".into());
        let ids = BTreeMap::from([("gpu".to_string(), vec!["das.com/mig=uid-2-gpu".to_string()])]);
        cp.set_completed("uid-2", "ns", "claim-2", vec![done], ids);
        cp
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn saved(dir: &Path) -> PathBuf {
        let path = dir.join(CHECKPOINT_FILE_NAME);
        sample().save(&path).unwrap();
        path
    }

    fn expect_corrupt(path: &Path) -> CorruptReason {
        match Checkpoint::load(path, BOOT).unwrap() {
            LoadOutcome::Corrupt { moved_to, reason } => {
                assert!(!path.exists(), "corrupt file left in place");
                assert!(moved_to.exists());
                let name = moved_to.file_name().unwrap().to_str().unwrap();
                assert!(name.starts_with("checkpoint.json.corrupt-"), "{name}");
                // The next load starts fresh instead of failing again.
                assert_eq!(Checkpoint::load(path, BOOT).unwrap(), LoadOutcome::Fresh);
                reason
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let cp = sample();
        assert_eq!(
            Checkpoint::load(&path, BOOT).unwrap(),
            LoadOutcome::Loaded(cp.clone())
        );
        let record = cp.get("uid-2").unwrap();
        assert_eq!(record.state, PrepareState::PrepareCompleted);
        assert_eq!(cp.get("uid-1").unwrap().state, PrepareState::PrepareStarted);
        // The documented JSON names.
        let text = fs::read_to_string(&path).unwrap();
        for key in [
            "\"version\": 1",
            "\"bootId\"",
            "\"checksum\": \"crc32:",
            "\"gpuUUID\"",
            "\"migUUID\"",
            "\"placementStart\"",
            "\"cdiDeviceIds\"",
            "\"updatedAt\"",
            "\"PrepareStarted\"",
        ] {
            assert!(text.contains(key), "{key} missing in {text}");
        }
    }

    #[test]
    fn save_leaves_no_temp_file_and_replaces_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let mut cp = sample();
        cp.remove("uid-1");
        cp.save(&path).unwrap();
        assert_eq!(names_in(dir.path()), vec![CHECKPOINT_FILE_NAME.to_string()]);
        assert_eq!(
            Checkpoint::load(&path, BOOT).unwrap(),
            LoadOutcome::Loaded(cp)
        );
    }

    #[test]
    fn save_creates_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/plugin").join(CHECKPOINT_FILE_NAME);
        Checkpoint::new(BOOT).save(&path).unwrap();
        assert!(matches!(
            Checkpoint::load(&path, BOOT).unwrap(),
            LoadOutcome::Loaded(_)
        ));
    }

    #[test]
    fn missing_file_is_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE_NAME);
        assert_eq!(Checkpoint::load(&path, BOOT).unwrap(), LoadOutcome::Fresh);
    }

    #[test]
    fn new_boot_id_reports_previous_and_keeps_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let outcome = Checkpoint::load(&path, "another-boot").unwrap();
        assert_eq!(outcome, LoadOutcome::NewBoot { previous: sample() });
        assert!(path.exists());
    }

    #[test]
    fn corrupt_json_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert!(matches!(
            expect_corrupt(&path),
            CorruptReason::InvalidJson(_)
        ));
    }

    #[test]
    fn checksum_mismatch_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace("claim-1", "claim-9")).unwrap();
        let reason = expect_corrupt(&path);
        assert!(
            matches!(reason, CorruptReason::ChecksumMismatch { .. }),
            "{reason}"
        );
    }

    #[test]
    fn unknown_version_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace("\"version\": 1", "\"version\": 2")).unwrap();
        assert_eq!(
            expect_corrupt(&path),
            CorruptReason::UnknownVersion("2".into())
        );
    }

    #[test]
    fn unexpected_field_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace("\"pool\"", "\"poolX\"")).unwrap();
        assert!(matches!(expect_corrupt(&path), CorruptReason::BadShape(_)));
    }

    #[test]
    fn two_corrupt_files_get_distinct_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE_NAME);
        fs::write(&path, b"garbage").unwrap();
        expect_corrupt(&path);
        fs::write(&path, b"garbage").unwrap();
        expect_corrupt(&path);
        assert_eq!(names_in(dir.path()).len(), 2);
    }

    #[test]
    fn remove_is_idempotent() {
        let mut cp = sample();
        assert!(cp.remove("uid-1").is_some());
        assert!(cp.remove("uid-1").is_none());
        assert!(cp.remove("never-seen").is_none());
        assert_eq!(cp.claims.len(), 1);
    }

    #[test]
    fn boot_id_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        fs::write(&path, format!("{BOOT}\n")).unwrap();
        assert_eq!(read_boot_id_from(&path).unwrap(), BOOT);
        fs::write(&path, "\n").unwrap();
        assert!(read_boot_id_from(&path).is_err());
        assert!(read_boot_id_from(&dir.path().join("none")).is_err());
    }
}
