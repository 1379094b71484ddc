//! The emulated GPU backend (docs/design.md §7 "Emulated mode"): GPUs described by a spec string such as
//! `A100-SXM4-40GB:2,H100-80GB:2`, real profile and placement tables from the model data files,
//! NVML-like rules and errors, and the "hardware" state (which GPU and compute instances exist)
//! kept on disk so a restarted plugin sees the instances that exist.
//!
//! - GPU UUIDs are derived from the node name and the GPU index, so they are stable across
//!   restarts; MIG UUIDs are derived from the GPU UUID and a serial number kept in the state, so
//!   every creation gets a fresh one (as on hardware, docs/reference/mig.md, "Create and destroy").
//! - GI IDs are allocated by the "driver": the lowest free ID in `0..15`, never derived from the
//!   placement.
//! - The state file is written atomically (temp file, fsync, rename, fsync of the directory).
//!   A corrupt or mismatching file is an error; the caller decides (see [`move_state_aside`]).
//! - Faults (fail the next N creates or destroys on a GPU with a given error), latency (a sleep
//!   per create and destroy) and lost GPUs (every call on the GPU fails with
//!   [`BackendError::GpuLost`], the inventory leaves it out; its instances are kept for when it
//!   comes back) can be injected from code for unit tests, and through a control file
//!   ([`CONTROL_FILE`], [`Control`]) for tests that drive a running plugin.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::catalog::{ModelError, builtin_models, find_model, model_names};
use super::layout::{Conflict, Occupancy, Placement};
use super::model::GpuModel;
use super::{BackendError, GpuBackend, GpuInfo, MigInstance, Target, ci_cap_minor, gi_cap_minor};
use das_runtime::fs::Durability;
use das_runtime::hash::fnv1a64_from;

/// File name of the emulated hardware state inside the state directory.
pub const STATE_FILE: &str = "emulated-gpus.json";

/// File name of the fault-injection control file, beside the state file (see [`Control`]).
pub const CONTROL_FILE: &str = "control.json";

/// Version of the state file format.
pub const STATE_VERSION: u32 = 1;

/// Driver version the emulated GPUs report.
pub const EMULATED_DRIVER_VERSION: &str = "580.95.05";

/// GI IDs are `0..GI_ID_SPACE` (docs/reference/mig.md, "Create and destroy": GI ID space 0–14).
const GI_ID_SPACE: u32 = 15;

/// Most emulated GPUs per node: the `mig-minors` listing covers `gpu0..gpu31` (docs/reference/mig.md, "Device nodes and capabilities").
pub const MAX_EMULATED_GPUS: u32 = 32;

/// A bad emulated-GPU spec, or state on disk that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EmulatedError {
    /// The `--emulated-gpus` spec does not parse.
    #[error(
        "invalid emulated GPU spec {spec:?}: {problem} (expected MODEL[:COUNT][,MODEL[:COUNT]...]; models: {models})"
    )]
    Spec {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        problem: String,
        /// The valid model names.
        models: String,
    },
    /// The embedded model data is invalid (a build defect).
    #[error(transparent)]
    Models(#[from] ModelError),
    /// Reading or writing the state failed.
    #[error("emulated GPU state {path}: {source}")]
    Io {
        /// The state file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The state file does not parse or describes impossible hardware state.
    #[error("emulated GPU state {path} is corrupt: {detail}")]
    CorruptState {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The state file was written for other GPUs (another spec or node name).
    #[error("emulated GPU state {path} does not match the configured GPUs: {detail}")]
    StateMismatch {
        /// The state file.
        path: PathBuf,
        /// The difference.
        detail: String,
    },
}

/// One entry of the spec: `count` GPUs of `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatedGpuSpec {
    /// The model.
    pub model: Arc<GpuModel>,
    /// How many GPUs of it.
    pub count: u32,
}

/// Parses `MODEL[:COUNT][,MODEL[:COUNT]...]` (count defaults to 1; model names and aliases are
/// case-insensitive). GPUs get indices in spec order.
pub fn parse_emulated_spec(spec: &str) -> Result<Vec<EmulatedGpuSpec>, EmulatedError> {
    let models = model_names()?;
    let bad = |problem: String| EmulatedError::Spec {
        spec: spec.to_string(),
        problem,
        models: models.clone(),
    };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(bad("empty entry".into()));
        }
        let (name, count) = match entry.split_once(':') {
            Some((n, c)) => (
                n.trim(),
                parse_count(c.trim()).map_err(|p| bad(format!("{entry}: {p}")))?,
            ),
            None => (entry, 1),
        };
        let model = find_model(name)?.ok_or_else(|| bad(format!("unknown GPU model {name}")))?;
        out.push(EmulatedGpuSpec { model, count });
    }
    let total: u32 = out.iter().map(|s| s.count).sum();
    if total > MAX_EMULATED_GPUS {
        return Err(bad(format!("{total} GPUs, at most {MAX_EMULATED_GPUS}")));
    }
    Ok(out)
}

fn parse_count(c: &str) -> Result<u32, String> {
    match c.parse::<u32>() {
        Ok(n) if (1..=MAX_EMULATED_GPUS).contains(&n) => Ok(n),
        _ => Err(format!(
            "count {c:?} is not an integer in 1..={MAX_EMULATED_GPUS}"
        )),
    }
}

/// The error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultKind {
    /// [`BackendError::InsufficientResources`].
    InsufficientResources,
    /// [`BackendError::InvalidArgument`].
    InvalidArgument,
    /// [`BackendError::NotSupported`].
    NotSupported,
    /// [`BackendError::NotFound`].
    NotFound,
    /// [`BackendError::InUse`].
    InUse,
    /// [`BackendError::GpuLost`] (for one call; see [`EmulatedBackend::set_gpu_lost`] for a GPU
    /// that stays lost).
    GpuLost,
    /// [`BackendError::Other`].
    Other,
}

impl FaultKind {
    fn error(self, target: Target) -> BackendError {
        let reason = "injected fault".to_string();
        match self {
            FaultKind::InsufficientResources => {
                BackendError::InsufficientResources { target, reason }
            }
            FaultKind::InvalidArgument => BackendError::InvalidArgument { target, reason },
            FaultKind::NotSupported => BackendError::NotSupported { target, reason },
            FaultKind::NotFound => BackendError::NotFound { target, reason },
            FaultKind::InUse => BackendError::InUse { target, reason },
            FaultKind::GpuLost => BackendError::GpuLost { target, reason },
            FaultKind::Other => BackendError::Other { target, reason },
        }
    }
}

/// Injected latency: a sleep before every create and destroy (outside any lock, so GPUs stay
/// independent). No public per-call figures exist (docs/reference/mig.md, "Timing"); a few hundred
/// milliseconds per create and about a second per destroy are plausible for realism.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// Sleep per `create_instance`.
    pub create: Duration,
    /// Sleep per `destroy_instance`.
    pub destroy: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Create,
    Destroy,
}

/// The fault-injection control file, `<state dir>/control.json`, for tests that drive a running
/// plugin (the e2e tests and the chaos soak). The backend reads it again whenever its content
/// changes (checked on every call, a `stat` and, on a change, a read). `latencyMs` and
/// `lostGpus` replace the current settings; each fault list is queued once per new content.
/// Write it atomically (temp file and rename). A file that does not parse is logged and ignored.
///
/// ```json
/// {"latencyMs": {"create": 2000, "destroy": 0}, "lostGpus": [1],
///  "createFaults": [{"gpu": 0, "count": 1, "kind": "Other"}],
///  "destroyFaults": [{"gpu": 1, "count": 3, "kind": "InUse"}]}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Control {
    /// Sleep per create and destroy, in milliseconds.
    #[serde(default)]
    pub latency_ms: LatencyMs,
    /// GPUs that are lost (fell off the bus) until the file says otherwise.
    #[serde(default)]
    pub lost_gpus: Vec<u32>,
    /// Faults for the next creates.
    #[serde(default)]
    pub create_faults: Vec<ControlFault>,
    /// Faults for the next destroys.
    #[serde(default)]
    pub destroy_faults: Vec<ControlFault>,
}

/// [`Latency`] in the control file, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyMs {
    /// Milliseconds per create.
    #[serde(default)]
    pub create: u64,
    /// Milliseconds per destroy.
    #[serde(default)]
    pub destroy: u64,
}

/// `count` faults of `kind` on GPU `gpu`, in the control file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlFault {
    /// GPU index.
    pub gpu: u32,
    /// How many of the next operations fail.
    pub count: usize,
    /// With which error.
    pub kind: FaultKind,
}

impl Control {
    /// Writes the control file into `state_dir` atomically.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write(&self, state_dir: &Path) -> io::Result<()> {
        let path = state_dir.join(CONTROL_FILE);
        let bytes = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        das_runtime::fs::write_atomically(
            &path,
            &path.with_extension("json.tmp"),
            &bytes,
            Durability::Atomic,
        )
    }
}

/// The last control-file content applied, by modification time and length (and the content
/// itself, so an edit within one timestamp tick is still seen).
#[derive(Debug, Default)]
struct ControlSeen {
    stamp: Option<(SystemTime, u64)>,
    content: Vec<u8>,
}

/// On-disk state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StateFile {
    version: u32,
    node_name: String,
    /// Serial of the next MIG UUID (never reused).
    next_serial: u64,
    gpus: Vec<GpuState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GpuState {
    index: u32,
    model: String,
    uuid: String,
    instances: Vec<InstanceState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InstanceState {
    gi_id: u32,
    ci_id: u32,
    profile: String,
    start: u32,
    mig_uuid: String,
    created_by_das: bool,
}

/// One emulated GPU's identity.
#[derive(Debug, Clone)]
struct EmuGpu {
    index: u32,
    uuid: String,
    model: Arc<GpuModel>,
}

/// The emulated backend. Thread-safe; see the module docs.
#[derive(Debug)]
pub struct EmulatedBackend {
    gpus: Vec<EmuGpu>,
    state_path: PathBuf,
    state: Mutex<StateFile>,
    faults: Mutex<HashMap<(Op, u32), VecDeque<FaultKind>>>,
    latency: Mutex<Latency>,
    lost: Mutex<BTreeSet<u32>>,
    control_path: PathBuf,
    control_seen: Mutex<ControlSeen>,
}

impl EmulatedBackend {
    /// Opens the emulated GPUs of `spec` (see [`parse_emulated_spec`]) on node `node_name`, with
    /// state in `state_dir/emulated-gpus.json`: loads it if it exists, else starts with empty GPUs
    /// and writes it.
    pub fn open(spec: &str, node_name: &str, state_dir: &Path) -> Result<Self, EmulatedError> {
        Self::from_specs(&parse_emulated_spec(spec)?, node_name, state_dir)
    }

    /// Like [`Self::open`], with a parsed spec.
    pub fn from_specs(
        specs: &[EmulatedGpuSpec],
        node_name: &str,
        state_dir: &Path,
    ) -> Result<Self, EmulatedError> {
        let gpus = build_gpus(specs, node_name);
        fs::create_dir_all(state_dir).map_err(|source| EmulatedError::Io {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let state_path = state_dir.join(STATE_FILE);
        let state = match fs::read(&state_path) {
            Ok(bytes) => load_state(&state_path, &bytes, &gpus, node_name)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let fresh = fresh_state(&gpus, node_name);
                write_atomically(&state_path, &fresh).map_err(|source| EmulatedError::Io {
                    path: state_path.clone(),
                    source,
                })?;
                fresh
            }
            Err(source) => {
                return Err(EmulatedError::Io {
                    path: state_path,
                    source,
                });
            }
        };
        Ok(Self {
            gpus,
            state_path,
            state: Mutex::new(state),
            faults: Mutex::new(HashMap::new()),
            latency: Mutex::new(Latency::default()),
            lost: Mutex::new(BTreeSet::new()),
            control_path: state_dir.join(CONTROL_FILE),
            control_seen: Mutex::new(ControlSeen::default()),
        })
    }

    /// [`Self::open`], but a state file that is corrupt or was written for other GPUs (another
    /// spec or node name) is moved aside (`emulated-gpus.json.corrupt-<secs>`) and the GPUs start
    /// empty, as a corrupt checkpoint is handled: never a crash loop. Returns what was moved
    /// aside and why.
    ///
    /// # Errors
    /// A bad spec, or the state directory cannot be read or written.
    pub fn open_or_reset(
        spec: &str,
        node_name: &str,
        state_dir: &Path,
    ) -> Result<(Self, Option<(PathBuf, EmulatedError)>), EmulatedError> {
        match Self::open(spec, node_name, state_dir) {
            Err(e @ (EmulatedError::CorruptState { .. } | EmulatedError::StateMismatch { .. })) => {
                let aside = move_state_aside(state_dir)
                    .map_err(|source| EmulatedError::Io {
                        path: state_dir.join(STATE_FILE),
                        source,
                    })?
                    .unwrap_or_default();
                let fresh = Self::open(spec, node_name, state_dir)?;
                Ok((fresh, Some((aside, e))))
            }
            other => other.map(|b| (b, None)),
        }
    }

    /// Path of the state file.
    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    /// Makes the next `count` creates on GPU `gpu_index` fail with `kind` (before any check).
    pub fn inject_create_faults(&self, gpu_index: u32, count: usize, kind: FaultKind) {
        self.inject(Op::Create, gpu_index, count, kind);
    }

    /// Makes the next `count` destroys on GPU `gpu_index` fail with `kind` (before any check).
    pub fn inject_destroy_faults(&self, gpu_index: u32, count: usize, kind: FaultKind) {
        self.inject(Op::Destroy, gpu_index, count, kind);
    }

    /// Injected faults not yet used up.
    pub fn pending_faults(&self) -> usize {
        lock(&self.faults).values().map(VecDeque::len).sum()
    }

    /// Drops every pending injected fault.
    pub fn clear_faults(&self) {
        lock(&self.faults).clear();
    }

    /// Sets the injected latency.
    pub fn set_latency(&self, latency: Latency) {
        *lock(&self.latency) = latency;
    }

    /// Marks GPU `gpu_index` lost (every call on it fails with [`BackendError::GpuLost`] and the
    /// inventory leaves it out) or back. Its instances are kept while it is lost.
    pub fn set_gpu_lost(&self, gpu_index: u32, lost: bool) {
        let mut set = lock(&self.lost);
        if lost {
            set.insert(gpu_index);
        } else {
            set.remove(&gpu_index);
        }
    }

    /// Applies the control file when its content changed since the last call (see [`Control`]).
    fn apply_control_file(&self) {
        let stamp = match fs::metadata(&self.control_path) {
            Ok(m) => Some((m.modified().unwrap_or(UNIX_EPOCH), m.len())),
            Err(_) => None,
        };
        let mut seen = lock(&self.control_seen);
        if stamp.is_none() || (stamp == seen.stamp && stamp.is_some_and(|(t, _)| !recent(t))) {
            return;
        }
        let Ok(content) = fs::read(&self.control_path) else {
            return;
        };
        seen.stamp = stamp;
        if content == seen.content {
            return;
        }
        seen.content = content.clone();
        drop(seen);
        match serde_json::from_slice::<Control>(&content) {
            Ok(control) => self.apply(&control),
            Err(e) => tracing::warn!(path = %self.control_path.display(), error = %e,
                "ignoring an emulated-GPU control file that does not parse"),
        }
    }

    fn apply(&self, control: &Control) {
        tracing::info!(?control, "emulated GPUs: applying the control file");
        self.set_latency(Latency {
            create: Duration::from_millis(control.latency_ms.create),
            destroy: Duration::from_millis(control.latency_ms.destroy),
        });
        *lock(&self.lost) = control.lost_gpus.iter().copied().collect();
        for f in &control.create_faults {
            self.inject(Op::Create, f.gpu, f.count, f.kind);
        }
        for f in &control.destroy_faults {
            self.inject(Op::Destroy, f.gpu, f.count, f.kind);
        }
    }

    fn is_lost(&self, gpu_index: u32) -> bool {
        lock(&self.lost).contains(&gpu_index)
    }

    /// The GPU, unless it is lost.
    fn live_gpu(&self, index: u32, target: Target) -> Result<&EmuGpu, BackendError> {
        let gpu = self.gpu(index, target.clone())?;
        if self.is_lost(index) {
            return Err(BackendError::GpuLost {
                target,
                reason: "the emulated GPU is marked lost".into(),
            });
        }
        Ok(gpu)
    }

    /// Creates an instance as an administrator would with `nvidia-smi` (marked `created_by_das =
    /// false`), without latency or faults: for tests of start-up reconciliation.
    pub fn create_foreign_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let gpu = self.gpu(gpu_index, Target::gpu(gpu_index))?;
        self.create(gpu, profile, start, false)
    }

    fn inject(&self, op: Op, gpu: u32, count: usize, kind: FaultKind) {
        lock(&self.faults)
            .entry((op, gpu))
            .or_default()
            .extend(std::iter::repeat_n(kind, count));
    }

    fn take_fault(&self, op: Op, gpu: u32) -> Option<FaultKind> {
        lock(&self.faults)
            .get_mut(&(op, gpu))
            .and_then(VecDeque::pop_front)
    }

    fn gpu(&self, index: u32, target: Target) -> Result<&EmuGpu, BackendError> {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .ok_or_else(|| BackendError::NotFound {
                target,
                reason: format!(
                    "no GPU with index {index} (the node has {})",
                    self.gpus.len()
                ),
            })
    }

    fn create(
        &self,
        gpu: &EmuGpu,
        profile: &str,
        start: u32,
        by_das: bool,
    ) -> Result<MigInstance, BackendError> {
        let (profile_idx, size) = match gpu.model.profile(profile) {
            Some((i, p)) => (i, p.placement_size),
            None => {
                return Err(BackendError::InvalidArgument {
                    target: Target::at(gpu.index, profile, Placement { start, size: 0 }),
                    reason: format!(
                        "{} has no profile {profile}; valid: {}",
                        gpu.model.name,
                        gpu.model.profile_names()
                    ),
                });
            }
        };
        let target = Target::at(gpu.index, profile, Placement { start, size });
        let mut state = lock(&self.state);
        let gs = gpu_state(&state, gpu.index);
        check_create(gpu, gs, profile_idx, start, &target)?;
        let gi_id = lowest_free_gi(gs).ok_or_else(|| BackendError::InsufficientResources {
            target: target.clone(),
            reason: format!("all {GI_ID_SPACE} GPU-instance IDs are in use"),
        })?;
        let mut next = state.clone();
        let instance = InstanceState {
            gi_id,
            ci_id: 0,
            profile: profile.to_string(),
            start,
            mig_uuid: format_uuid(
                "MIG-",
                &[gpu.uuid.as_bytes(), &next.next_serial.to_le_bytes()],
            ),
            created_by_das: by_das,
        };
        next.next_serial += 1;
        gpu_state_mut(&mut next, gpu.index)
            .instances
            .push(instance.clone());
        self.persist(&next, &target)?;
        *state = next;
        Ok(to_slice(gpu, &instance))
    }

    fn destroy(&self, gpu: &EmuGpu, gi_id: u32) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        let gs = gpu_state(&state, gpu.index);
        let Some(pos) = gs.instances.iter().position(|i| i.gi_id == gi_id) else {
            return Err(BackendError::NotFound {
                target: Target {
                    gi_id: Some(gi_id),
                    ..Target::gpu(gpu.index)
                },
                reason: "no such GPU instance".into(),
            });
        };
        let inst = &gs.instances[pos];
        let target = Target {
            gi_id: Some(gi_id),
            ..instance_target(gpu, inst)
        };
        let mut next = state.clone();
        // The compute instance goes first, then the GPU instance (docs/reference/mig.md, "Create and destroy"); both are
        // one record here.
        gpu_state_mut(&mut next, gpu.index).instances.remove(pos);
        self.persist(&next, &target)?;
        *state = next;
        Ok(())
    }

    fn persist(&self, state: &StateFile, target: &Target) -> Result<(), BackendError> {
        write_atomically(&self.state_path, state).map_err(|e| BackendError::Other {
            target: target.clone(),
            reason: format!(
                "writing emulated GPU state {}: {e}",
                self.state_path.display()
            ),
        })
    }

    fn sleep(&self, op: Op) {
        let latency = *lock(&self.latency);
        let d = match op {
            Op::Create => latency.create,
            Op::Destroy => latency.destroy,
        };
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

impl GpuBackend for EmulatedBackend {
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.apply_control_file();
        Ok(self
            .gpus
            .iter()
            .filter(|g| !self.is_lost(g.index))
            .map(gpu_info)
            .collect())
    }

    fn create_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        self.apply_control_file();
        self.sleep(Op::Create);
        let target = Target::at(gpu_index, profile, Placement { start, size: 0 });
        let gpu = self.live_gpu(gpu_index, target.clone())?;
        if let Some(kind) = self.take_fault(Op::Create, gpu_index) {
            return Err(kind.error(target));
        }
        self.create(gpu, profile, start, true)
    }

    fn destroy_instance(&self, gpu_index: u32, gi_id: u32) -> Result<(), BackendError> {
        self.apply_control_file();
        self.sleep(Op::Destroy);
        let target = Target {
            gi_id: Some(gi_id),
            ..Target::gpu(gpu_index)
        };
        let gpu = self.live_gpu(gpu_index, target.clone())?;
        if let Some(kind) = self.take_fault(Op::Destroy, gpu_index) {
            return Err(kind.error(target));
        }
        self.destroy(gpu, gi_id)
    }

    fn gpu_indices(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.index).collect()
    }

    fn instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.apply_control_file();
        let gpu = self.live_gpu(gpu_index, Target::gpu(gpu_index))?;
        let state = lock(&self.state);
        let mut out: Vec<MigInstance> = gpu_state(&state, gpu.index)
            .instances
            .iter()
            .map(|i| to_slice(gpu, i))
            .collect();
        out.sort_by_key(|s| s.placement.start);
        Ok(out)
    }
}

/// The GPUs of `spec` on node `node_name` as the emulated backend reports them, without opening
/// (or creating) any state: what `das-kubelet-plugin --print-inventory` shows.
///
/// # Errors
/// A bad spec.
pub fn emulated_inventory(spec: &str, node_name: &str) -> Result<Vec<GpuInfo>, EmulatedError> {
    Ok(build_gpus(&parse_emulated_spec(spec)?, node_name)
        .iter()
        .map(gpu_info)
        .collect())
}

fn gpu_info(g: &EmuGpu) -> GpuInfo {
    GpuInfo {
        index: g.index,
        uuid: g.uuid.clone(),
        model: g.model.clone(),
        product_name: g.model.product_name.clone(),
        minor: g.index,
        pci_bus_id: None,
        driver_version: EMULATED_DRIVER_VERSION.to_string(),
        mig_enabled: true,
    }
}

/// Whether a modification time is within the last two seconds: the file system's timestamp
/// granularity may hide an edit made in the same tick, so a recent file is re-read.
fn recent(t: SystemTime) -> bool {
    SystemTime::now()
        .duration_since(t)
        .map_or(true, |age| age < Duration::from_secs(2))
}

/// Moves a state file that cannot be used out of the way (`emulated-gpus.json.corrupt-<secs>`)
/// so the next [`EmulatedBackend::open`] starts with empty GPUs. Returns the new path, or `None`
/// when there was no state file.
pub fn move_state_aside(state_dir: &Path) -> io::Result<Option<PathBuf>> {
    let path = state_dir.join(STATE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = state_dir.join(format!("{STATE_FILE}.corrupt-{secs}"));
    fs::rename(&path, &aside)?;
    Ok(Some(aside))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (state is swapped in whole).
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn build_gpus(specs: &[EmulatedGpuSpec], node_name: &str) -> Vec<EmuGpu> {
    let models = specs
        .iter()
        .flat_map(|s| std::iter::repeat_n(&s.model, s.count as usize));
    models
        .enumerate()
        .map(|(i, model)| {
            let index = i as u32;
            EmuGpu {
                index,
                uuid: format_uuid("GPU-", &[node_name.as_bytes(), &index.to_le_bytes()]),
                model: model.clone(),
            }
        })
        .collect()
}

fn fresh_state(gpus: &[EmuGpu], node_name: &str) -> StateFile {
    StateFile {
        version: STATE_VERSION,
        node_name: node_name.to_string(),
        next_serial: 0,
        gpus: gpus
            .iter()
            .map(|g| GpuState {
                index: g.index,
                model: g.model.name.clone(),
                uuid: g.uuid.clone(),
                instances: Vec::new(),
            })
            .collect(),
    }
}

fn load_state(
    path: &Path,
    bytes: &[u8],
    gpus: &[EmuGpu],
    node_name: &str,
) -> Result<StateFile, EmulatedError> {
    let corrupt = |detail: String| EmulatedError::CorruptState {
        path: path.to_path_buf(),
        detail,
    };
    let state: StateFile = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if state.version != STATE_VERSION {
        return Err(corrupt(format!(
            "version {} (expected {STATE_VERSION})",
            state.version
        )));
    }
    let expected = fresh_state(gpus, node_name);
    let describe = |s: &StateFile| {
        let gpus: Vec<String> = s
            .gpus
            .iter()
            .map(|g| format!("{}:{}", g.index, g.model))
            .collect();
        format!("node {}, GPUs [{}]", s.node_name, gpus.join(", "))
    };
    let same_gpus = state.gpus.len() == expected.gpus.len()
        && state
            .gpus
            .iter()
            .zip(&expected.gpus)
            .all(|(a, b)| (a.index, &a.model, &a.uuid) == (b.index, &b.model, &b.uuid));
    if state.node_name != node_name || !same_gpus {
        return Err(EmulatedError::StateMismatch {
            path: path.to_path_buf(),
            detail: format!(
                "file has {}, configured {}",
                describe(&state),
                describe(&expected)
            ),
        });
    }
    for (gpu, gs) in gpus.iter().zip(&state.gpus) {
        replay_instances(gpu, gs).map_err(corrupt)?;
    }
    Ok(state)
}

/// Checks that a GPU's recorded instances are a layout the hardware accepts, with unique IDs.
fn replay_instances(gpu: &EmuGpu, gs: &GpuState) -> Result<(), String> {
    let mut occ = Occupancy::empty(&gpu.model);
    let mut gi_ids = Vec::new();
    for inst in &gs.instances {
        let (idx, _) = gpu
            .model
            .profile(&inst.profile)
            .ok_or_else(|| format!("GPU {}: unknown profile {}", gpu.index, inst.profile))?;
        occ.check_hardware(&gpu.model, idx, inst.start)
            .map_err(|c| format!("GPU {}: {} at {}: {c}", gpu.index, inst.profile, inst.start))?;
        if inst.gi_id >= GI_ID_SPACE || gi_ids.contains(&inst.gi_id) {
            return Err(format!(
                "GPU {}: invalid or duplicate GI ID {}",
                gpu.index, inst.gi_id
            ));
        }
        gi_ids.push(inst.gi_id);
        occ.add(&gpu.model, idx, inst.start);
    }
    Ok(())
}

fn gpu_state(state: &StateFile, index: u32) -> &GpuState {
    // The state was checked against the GPUs on load, and only ever gains or loses instances.
    &state.gpus[index as usize]
}

fn gpu_state_mut(state: &mut StateFile, index: u32) -> &mut GpuState {
    &mut state.gpus[index as usize]
}

fn occupancy(gpu: &EmuGpu, gs: &GpuState) -> Occupancy {
    let mut occ = Occupancy::empty(&gpu.model);
    for inst in &gs.instances {
        if let Some((idx, _)) = gpu.model.profile(&inst.profile) {
            occ.add(&gpu.model, idx, inst.start);
        }
    }
    occ
}

fn check_create(
    gpu: &EmuGpu,
    gs: &GpuState,
    profile: usize,
    start: u32,
    target: &Target,
) -> Result<(), BackendError> {
    let occ = occupancy(gpu, gs);
    match occ.check_hardware(&gpu.model, profile, start) {
        Ok(()) => Ok(()),
        Err(Conflict::StartNotAllowed { starts }) => Err(BackendError::InvalidArgument {
            target: target.clone(),
            reason: format!("placement start {start} not allowed; valid starts: {starts:?}"),
        }),
        Err(Conflict::Overlap(mask)) => Err(BackendError::InsufficientResources {
            target: target.clone(),
            reason: format!("{}{}", Conflict::Overlap(mask), occupants(gpu, gs, mask)),
        }),
        Err(c) => Err(BackendError::InsufficientResources {
            target: target.clone(),
            reason: c.to_string(),
        }),
    }
}

/// ` by GI 3 (1g.10gb at 6:2)` for the instances covering `mask`.
fn occupants(gpu: &EmuGpu, gs: &GpuState, mask: u64) -> String {
    let names: Vec<String> = gs
        .instances
        .iter()
        .filter_map(|i| {
            let size = gpu.model.profile(&i.profile)?.1.placement_size;
            let p = Placement {
                start: i.start,
                size,
            };
            (p.mask() & mask != 0).then(|| format!("GI {} ({} at {p})", i.gi_id, i.profile))
        })
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" by {}", names.join(", "))
    }
}

fn lowest_free_gi(gs: &GpuState) -> Option<u32> {
    (0..GI_ID_SPACE).find(|id| gs.instances.iter().all(|i| i.gi_id != *id))
}

fn instance_target(gpu: &EmuGpu, inst: &InstanceState) -> Target {
    let size = gpu
        .model
        .profile(&inst.profile)
        .map_or(0, |(_, p)| p.placement_size);
    Target::at(
        gpu.index,
        &inst.profile,
        Placement {
            start: inst.start,
            size,
        },
    )
}

fn to_slice(gpu: &EmuGpu, inst: &InstanceState) -> MigInstance {
    let (profile_id, size) = gpu
        .model
        .profile(&inst.profile)
        .map_or((0, 0), |(_, p)| (p.id, p.placement_size));
    let minor = gpu.index;
    MigInstance {
        gpu_index: gpu.index,
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: minor,
        profile: inst.profile.clone(),
        profile_id,
        placement: Placement {
            start: inst.start,
            size,
        },
        gi_id: inst.gi_id,
        ci_id: inst.ci_id,
        mig_uuid: inst.mig_uuid.clone(),
        gi_cap_minor: gi_cap_minor(minor, inst.gi_id),
        ci_cap_minor: ci_cap_minor(minor, inst.gi_id, inst.ci_id),
        created_by_das: Some(inst.created_by_das),
    }
}

/// Writes `state` as JSON to `path` atomically (temp file, rename), without fsync: MIG
/// instances never survive a reboot, so neither need their emulation's records
/// ([`Durability::Atomic`]). A crashed plugin still finds the last complete state.
fn write_atomically(path: &Path, state: &StateFile) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    das_runtime::fs::write_atomically(
        path,
        &path.with_extension("json.tmp"),
        &bytes,
        Durability::Atomic,
    )
}

/// SplitMix64 finaliser: spreads FNV's weak low bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable 128-bit hash of length-prefixed `parts`, formatted as
/// `<prefix>xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (NVML's UUID format). Implemented here, not with
/// `std`'s hasher, so UUIDs never change across Rust versions.
fn format_uuid(prefix: &str, parts: &[&[u8]]) -> String {
    let mut a = 0xcbf2_9ce4_8422_2325u64;
    let mut b = 0x6c62_272e_07bb_0142u64;
    for part in parts {
        let len = (part.len() as u64).to_le_bytes();
        a = fnv1a64_from(fnv1a64_from(a, &len), part);
        b = fnv1a64_from(fnv1a64_from(b, part), &len);
    }
    let hex = format!("{:016x}{:016x}", mix(a), mix(b ^ a.rotate_left(17)));
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The models an emulated spec may name, for `--help` texts.
pub fn emulated_model_help() -> Result<String, ModelError> {
    Ok(builtin_models()?
        .iter()
        .map(|m| {
            let mut names = vec![m.name.clone()];
            names.extend(m.aliases.iter().cloned());
            names.join("|")
        })
        .collect::<Vec<_>>()
        .join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path, spec: &str) -> EmulatedBackend {
        EmulatedBackend::open(spec, "node-a", dir).unwrap()
    }

    #[test]
    fn spec_parsing() {
        let s = parse_emulated_spec("A100-SXM4-40GB:2, h100-80gb:3,A30").unwrap();
        let summary: Vec<(String, u32)> =
            s.iter().map(|e| (e.model.name.clone(), e.count)).collect();
        assert_eq!(
            summary,
            vec![
                ("A100-SXM4-40GB".to_string(), 2),
                ("H100-SXM5-80GB".to_string(), 3),
                ("A30-24GB".to_string(), 1)
            ]
        );
        let e = parse_emulated_spec("V100:1").unwrap_err().to_string();
        assert!(
            e.contains("unknown GPU model V100") && e.contains("A100-SXM4-40GB"),
            "{e}"
        );
        assert!(parse_emulated_spec("A30:0").is_err());
        assert!(parse_emulated_spec("A30:x").is_err());
        assert!(parse_emulated_spec("A30,,A30").is_err());
        assert!(parse_emulated_spec("A30:33").is_err());
        assert!(parse_emulated_spec("A30:20,A30:20").is_err());
    }

    #[test]
    fn uuids_are_deterministic_and_well_formed() {
        let a = format_uuid("GPU-", &[b"node-a", &0u32.to_le_bytes()]);
        assert_eq!(a, format_uuid("GPU-", &[b"node-a", &0u32.to_le_bytes()]));
        assert_ne!(a, format_uuid("GPU-", &[b"node-a", &1u32.to_le_bytes()]));
        assert_ne!(a, format_uuid("GPU-", &[b"node-b", &0u32.to_le_bytes()]));
        let groups: Vec<usize> = a
            .trim_start_matches("GPU-")
            .split('-')
            .map(str::len)
            .collect();
        assert_eq!(groups, vec![8, 4, 4, 4, 12]);
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30:2");
        let inv = b.inventory().unwrap();
        assert_eq!(
            inv[1].uuid,
            format_uuid("GPU-", &[b"node-a", &1u32.to_le_bytes()])
        );
        assert_eq!(inv[1].model.name, "A30-24GB");
        assert!(inv.iter().all(|g| g.mig_enabled && g.pci_bus_id.is_none()));
    }

    #[test]
    fn create_list_destroy_and_restart() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A100-SXM4-40GB:1,H100-80GB:1");
        let s = b.create_instance(1, "1g.20gb", 6).unwrap();
        assert_eq!(
            (s.gpu_index, s.placement, s.gi_id, s.ci_id, s.profile_id),
            (1, Placement { start: 6, size: 2 }, 0, 0, 15)
        );
        assert_eq!(s.gi_cap_minor, gi_cap_minor(1, 0));
        assert_eq!(s.ci_cap_minor, s.gi_cap_minor + 1);
        assert_eq!(s.created_by_das, Some(true));
        assert!(s.mig_uuid.starts_with("MIG-"));
        let t = b.create_instance(1, "1g.10gb", 0).unwrap();
        assert_eq!(t.gi_id, 1);
        assert_ne!(s.mig_uuid, t.mig_uuid);
        drop(b);

        let b = open(dir.path(), "A100-SXM4-40GB:1,H100-80GB:1");
        assert_eq!(b.all_instances().unwrap(), vec![t.clone(), s.clone()]);
        b.destroy_instance(1, 0).unwrap();
        // GI 0 is free again: the lowest free ID is reused, the MIG UUID is fresh.
        let u = b.create_instance(1, "1g.20gb", 6).unwrap();
        assert_eq!(u.gi_id, 0);
        assert_ne!(u.mig_uuid, s.mig_uuid);
        assert!(matches!(
            b.destroy_instance(1, 9),
            Err(BackendError::NotFound { .. })
        ));
    }

    #[test]
    fn nvml_like_errors() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "H100-80GB:1");
        b.create_instance(0, "1g.10gb", 5).unwrap();
        let e = b.create_instance(0, "3g.40gb", 4).unwrap_err();
        assert!(
            matches!(e, BackendError::InsufficientResources { .. }),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("GPU 0, profile 3g.40gb, placement 4:4"),
            "{e}"
        );
        assert!(e.to_string().contains("GI 0 (1g.10gb at 5:1)"), "{e}");
        let e = b.create_instance(0, "2g.20gb", 6).unwrap_err();
        assert!(matches!(e, BackendError::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("[0, 2, 4]"), "{e}");
        let e = b.create_instance(0, "9g.99gb", 0).unwrap_err();
        assert!(matches!(e, BackendError::InvalidArgument { .. }), "{e}");
        b.create_instance(0, "1g.10gb+me", 0).unwrap();
        let e = b.create_instance(0, "1g.10gb+me", 1).unwrap_err();
        assert!(e.to_string().contains("+me"), "{e}");
        let e = b.create_instance(3, "1g.10gb", 0).unwrap_err();
        assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
    }

    #[test]
    fn profile_max_count_is_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A100-SXM4-40GB");
        for start in [0, 1, 2, 3, 4, 5, 6] {
            b.create_instance(0, "1g.5gb", start).unwrap();
        }
        assert_eq!(b.all_instances().unwrap().len(), 7);
        let e = b.create_instance(0, "1g.5gb", 6).unwrap_err();
        assert!(matches!(e, BackendError::InsufficientResources { .. }));
    }

    #[test]
    fn faults_and_latency() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30:2");
        b.inject_create_faults(1, 2, FaultKind::Other);
        b.inject_destroy_faults(0, 1, FaultKind::InUse);
        assert!(matches!(
            b.create_instance(1, "1g.6gb", 0),
            Err(BackendError::Other { .. })
        ));
        assert!(b.create_instance(0, "1g.6gb", 0).is_ok());
        assert!(matches!(
            b.create_instance(1, "1g.6gb", 0),
            Err(BackendError::Other { .. })
        ));
        assert!(b.create_instance(1, "1g.6gb", 0).is_ok());
        assert!(matches!(
            b.destroy_instance(0, 0),
            Err(BackendError::InUse { .. })
        ));
        b.destroy_instance(0, 0).unwrap();
        b.set_latency(Latency {
            create: Duration::from_millis(20),
            destroy: Duration::ZERO,
        });
        let t = std::time::Instant::now();
        b.create_instance(0, "1g.6gb", 1).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_lost_gpu_fails_only_its_own_calls_and_keeps_its_instances() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30:2");
        let s = b.create_instance(1, "1g.6gb", 0).unwrap();
        b.set_gpu_lost(1, true);
        assert_eq!(
            b.inventory().unwrap().len(),
            1,
            "the lost GPU is not listed"
        );
        for e in [
            b.instances_on(1).unwrap_err(),
            b.create_instance(1, "1g.6gb", 1).unwrap_err(),
            b.destroy_instance(1, s.gi_id).unwrap_err(),
        ] {
            assert!(matches!(e, BackendError::GpuLost { .. }), "{e}");
        }
        assert!(b.all_instances().is_err(), "the whole-node listing fails");
        b.create_instance(0, "1g.6gb", 0).unwrap();
        assert_eq!(b.instances_on(0).unwrap().len(), 1, "the other GPU works");
        b.set_gpu_lost(1, false);
        assert_eq!(b.instances_on(1).unwrap(), vec![s]);
    }

    #[test]
    fn the_control_file_injects_latency_lost_gpus_and_faults_once_per_content() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30:2");
        let control = Control {
            latency_ms: LatencyMs {
                create: 30,
                destroy: 0,
            },
            lost_gpus: vec![1],
            create_faults: vec![ControlFault {
                gpu: 0,
                count: 1,
                kind: FaultKind::InUse,
            }],
            destroy_faults: vec![],
        };
        control.write(dir.path()).unwrap();
        let t = std::time::Instant::now();
        assert!(matches!(
            b.create_instance(0, "1g.6gb", 0),
            Err(BackendError::InUse { .. })
        ));
        assert!(t.elapsed() >= Duration::from_millis(30), "latency applied");
        // The same content again queues no second fault.
        b.create_instance(0, "1g.6gb", 0).unwrap();
        assert!(matches!(
            b.instances_on(1),
            Err(BackendError::GpuLost { .. })
        ));
        Control::default().write(dir.path()).unwrap();
        assert!(b.instances_on(1).unwrap().is_empty(), "GPU 1 is back");
        // A file that does not parse changes nothing.
        fs::write(dir.path().join(CONTROL_FILE), b"{nope").unwrap();
        assert!(b.instances_on(1).is_ok());
    }

    #[test]
    fn foreign_slices_are_marked() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30");
        let s = b.create_foreign_instance(0, "4g.24gb", 0).unwrap();
        assert_eq!(s.created_by_das, Some(false));
    }

    #[test]
    fn corrupt_and_mismatching_state_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path(), "A30"));
        let e = EmulatedBackend::open("A30:2", "node-a", dir.path()).unwrap_err();
        assert!(matches!(e, EmulatedError::StateMismatch { .. }), "{e}");
        let e = EmulatedBackend::open("A30", "node-b", dir.path()).unwrap_err();
        assert!(matches!(e, EmulatedError::StateMismatch { .. }), "{e}");
        fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
        let e = EmulatedBackend::open("A30", "node-a", dir.path()).unwrap_err();
        assert!(matches!(e, EmulatedError::CorruptState { .. }), "{e}");
        let aside = move_state_aside(dir.path()).unwrap().unwrap();
        assert!(aside.exists());
        assert!(EmulatedBackend::open("A30", "node-a", dir.path()).is_ok());
    }

    #[test]
    fn a_state_of_other_gpus_or_corrupt_is_moved_aside_and_started_empty() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30");
        b.create_instance(0, "1g.6gb", 0).unwrap();
        drop(b);
        let (b, reset) = EmulatedBackend::open_or_reset("A30:2", "node-a", dir.path()).unwrap();
        let (aside, why) = reset.expect("moved aside");
        assert!(matches!(why, EmulatedError::StateMismatch { .. }), "{why}");
        assert!(aside.exists());
        assert!(b.all_instances().unwrap().is_empty());
        fs::write(dir.path().join(STATE_FILE), b"{garbage").unwrap();
        let (_, reset) = EmulatedBackend::open_or_reset("A30:2", "node-a", dir.path()).unwrap();
        assert!(matches!(
            reset,
            Some((_, EmulatedError::CorruptState { .. }))
        ));
        let (_, reset) = EmulatedBackend::open_or_reset("A30:2", "node-a", dir.path()).unwrap();
        assert!(reset.is_none(), "a good state is kept");
    }

    #[test]
    fn overlapping_instances_in_state_are_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path(), "A30");
        b.create_instance(0, "2g.12gb", 0).unwrap();
        drop(b);
        let path = dir.path().join(STATE_FILE);
        let mut state: StateFile = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        let mut dup = state.gpus[0].instances[0].clone();
        dup.gi_id = 5;
        dup.start = 0;
        state.gpus[0].instances.push(dup);
        write_atomically(&path, &state).unwrap();
        let e = EmulatedBackend::open("A30", "node-a", dir.path()).unwrap_err();
        assert!(e.to_string().contains("already occupied"), "{e}");
    }

    #[test]
    fn different_gpus_work_in_parallel() {
        let dir = tempfile::tempdir().unwrap();
        let b = Arc::new(open(dir.path(), "H100-80GB:4"));
        let handles: Vec<_> = (0..4u32)
            .map(|g| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for s in 0..7 {
                        b.create_instance(g, "1g.10gb", s).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(b.all_instances().unwrap().len(), 28);
    }

    #[test]
    fn help_lists_aliases() {
        assert!(
            emulated_model_help()
                .unwrap()
                .contains("H100-SXM5-80GB|H100-80GB")
        );
    }
}
