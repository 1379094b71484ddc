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
//! - The state file is written atomically (temp file, rename; no fsync: MIG instances do not
//!   survive a reboot, so neither need their records).
//!   A corrupt or mismatching file is an error; the caller decides (see [`move_state_aside`]).
//! - Faults (fail the next N creates or destroys on a GPU with a given error), latency (a sleep
//!   per create and destroy) and lost GPUs (every call on the GPU fails with
//!   [`BackendError::GpuLost`], the inventory leaves it out; its instances are kept for when it
//!   comes back) can be injected from code for unit tests, and through a control file
//!   ([`CONTROL_FILE`], [`Control`]) for tests that drive a running plugin.
//!
//! Files: this one holds the backend; `emulated/spec.rs` the `--emulated-gpus` spec,
//! `emulated/control.rs` faults, latency and the control file, `emulated/state.rs` the state on
//! disk.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::catalog::ModelError;
use super::layout::{Conflict, Occupancy, Placement};
use super::model::GpuModel;
use super::{
    BackendError, GpuBackend, GpuInfo, HealthEvent, MigInstance, Target, ci_cap_minor, gi_cap_minor,
};
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
    health_events: Mutex<VecDeque<HealthEvent>>,
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
            health_events: Mutex::new(VecDeque::new()),
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

    /// Raises `event`: the next [`GpuBackend::wait_health_events`] reports it.
    pub fn raise_health_event(&self, event: HealthEvent) {
        lock(&self.health_events).push_back(event);
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
        for x in &control.xid_events {
            self.raise_health_event(HealthEvent::Xid {
                gpu: x.gpu,
                xid: x.xid,
                gpu_instance: x.gpu_instance,
            });
        }
        for &gpu in &control.uncorrectable_ecc_gpus {
            self.raise_health_event(HealthEvent::UncorrectableEcc { gpu });
        }
        for i in &control.foreign_instances {
            match self.create_foreign_instance(i.gpu, &i.profile, i.start) {
                Ok(m) => {
                    tracing::info!(mig = %m.mig_uuid, ?i, "emulated GPUs: created a foreign MIG instance")
                }
                Err(e) => {
                    tracing::warn!(?i, error = %e, "emulated GPUs: could not create a foreign MIG instance")
                }
            }
        }
        for p in &control.destroy_instances {
            if let Err(e) = self.destroy_at(p.gpu, p.start) {
                tracing::warn!(?p, error = %e, "emulated GPUs: could not destroy a MIG instance");
            }
        }
    }

    /// Destroys the instance at memory slice `start` of GPU `gpu_index` as an administrator
    /// would (no latency, no faults).
    fn destroy_at(&self, gpu_index: u32, start: u32) -> Result<(), BackendError> {
        let gpu = self.gpu(gpu_index, Target::gpu(gpu_index))?;
        let gi_id = {
            let state = lock(&self.state);
            gpu_state(&state, gpu.index)
                .instances
                .iter()
                .find(|i| i.start == start)
                .map(|i| i.gi_id)
        };
        let Some(gi_id) = gi_id else {
            return Err(BackendError::NotFound {
                target: Target::gpu(gpu_index),
                reason: format!("no instance at memory slice {start}"),
            });
        };
        self.destroy(gpu, gi_id)
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
        Ok(to_instance(gpu, &instance))
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

    /// Events raised by [`EmulatedBackend::raise_health_event`] or the control file, polled every
    /// 100 ms until `timeout`.
    fn wait_health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, BackendError> {
        const POLL: Duration = Duration::from_millis(100);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.apply_control_file();
            let events: Vec<HealthEvent> = lock(&self.health_events).drain(..).collect();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !events.is_empty() || left.is_zero() {
                return Ok(events);
            }
            std::thread::sleep(left.min(POLL));
        }
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
            .map(|i| to_instance(gpu, i))
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

fn to_instance(gpu: &EmuGpu, inst: &InstanceState) -> MigInstance {
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

mod control;
pub mod device_nodes;
pub mod driver_files;
mod spec;
mod state;

pub use control::{Control, ControlFault, ControlXid, FaultKind, Latency, LatencyMs};
use control::{ControlSeen, Op};
pub use spec::{EmulatedGpuSpec, emulated_model_help, parse_emulated_spec};
pub use state::move_state_aside;
use state::{
    GpuState, InstanceState, StateFile, fresh_state, gpu_state, gpu_state_mut, load_state,
    write_atomically,
};

#[cfg(test)]
mod tests;
