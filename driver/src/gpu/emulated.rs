//! The emulated GPU backend (docs/design.md §7 "Emulated mode"): GPUs described by a spec string such as
//! `A100-SXM4-40GB:2,H100-80GB:2:mig-off`, real profile and placement tables from the model data
//! files, NVML-like rules and errors, and the "hardware" state (which GPU and compute instances
//! exist, each GPU's MIG mode) kept on disk so a restarted plugin sees the instances that exist.
//!
//! - MIG mode starts as the spec gives it (in a fresh state) and is kept in the state file. A
//!   GPU with MIG mode off takes no MIG instance ([`BackendError::NotSupported`], as NVML
//!   answers `NOT_SUPPORTED`), and is in the inventory only with `--whole-gpus`
//!   ([`EmulatedBackend::with_whole_gpus`]), to be served whole. [`GpuBackend::set_mig_mode`]
//!   switches it as NVML would: at once on Hopper and newer, pending a GPU reset on Ampere
//!   ([`BackendError::ResetRequired`]), refused while MIG instances exist
//!   ([`BackendError::InUse`]); the inventory reports whether DAS may switch it
//!   ([`EmulatedBackend::with_mig_mode_switching`], `emulated/mig_mode.rs`).
//!
//! - GPU UUIDs are derived from the node name and the GPU index, so they are stable across
//!   restarts; MIG UUIDs are derived from the GPU UUID and a serial number kept in the state, so
//!   every creation gets a fresh one (as on hardware, docs/reference/mig.md, "Create and destroy").
//! - GI IDs are allocated by the "driver": the lowest free ID in `0..15`, never derived from the
//!   placement.
//! - The state file is written atomically (temp file, rename; no fsync: MIG instances do not
//!   survive a reboot, so neither need their records).
//!   A corrupt or mismatching file is an error; the caller decides (see [`move_state_aside`]).
//! - Faults (fail the next N creates, destroys or MIG mode switches on a GPU with a given
//!   error), latency (a sleep per create, destroy and MIG mode switch) and lost GPUs (every call
//!   on the GPU fails with [`BackendError::GpuLost`], the inventory leaves it out; its instances
//!   are kept for when it comes back) can be injected from code for unit tests, and through a
//!   control file ([`CONTROL_FILE`], [`Control`]) for tests that drive a running plugin.
//!
//! Files: this one holds the backend, its [`GpuBackend`] face and its errors;
//! `emulated/gpus_flag.rs` the `--emulated-gpus` spec; `emulated/identity.rs` GPU and MIG UUIDs and
//! the inventory; `emulated/instances.rs` instance create, destroy and records;
//! `emulated/mig_mode.rs` MIG mode switches and whether DAS may make them;
//! `emulated/control.rs` faults, latency, lost GPUs and the control file; `emulated/state.rs`
//! the state on disk; `emulated/device_nodes.rs` and `emulated/driver_files.rs` the stand-in
//! device nodes and driver files.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::catalog::ModelError;
use super::layout::Placement;
use super::model::GpuModel;
use super::{BackendError, GpuBackend, GpuInfo, HealthEvent, MigInstance, MigModeState, Target};

/// File name of the emulated hardware state inside the state directory.
pub const STATE_FILE: &str = "emulated-gpus.json";

/// File name of the fault-injection control file, beside the state file (see [`Control`]).
pub const CONTROL_FILE: &str = "control.json";

/// Version of the state file format.
pub(crate) const STATE_VERSION: u32 = 1;

/// Driver version the emulated GPUs report.
pub const EMULATED_DRIVER_VERSION: &str = "580.95.05";

/// CUDA driver version the emulated GPUs report (`cudaDriverVersion` `13.0.0`): the version
/// NVML reports with driver [`EMULATED_DRIVER_VERSION`] (`13000`, "CUDA Version: 13.0" in
/// `nvidia-smi`).
pub(crate) const EMULATED_CUDA_DRIVER_VERSION: &str = "13.0";

/// Brand the emulated GPUs report: `NVML_BRAND_NVIDIA` by NVIDIA's DRA driver's name, what
/// data-center GPUs (A100, H100, H200, B200) report.
pub(crate) const EMULATED_BRAND: &str = "Nvidia";

/// GI IDs are `0..GI_ID_SPACE` (docs/reference/mig.md, "Create and destroy": GI ID space 0–14).
const GI_ID_SPACE: u32 = 15;

/// Most emulated GPUs per node: the `mig-minors` listing covers `gpu0..gpu31` (docs/reference/mig.md, "Device nodes and capabilities").
pub(crate) const MAX_EMULATED_GPUS: u32 = 32;

/// A bad emulated-GPU spec, or state on disk that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EmulatedError {
    /// The `--emulated-gpus` spec does not parse.
    #[error(
        "invalid emulated GPU spec {spec:?}: {problem} (expected MODEL[:COUNT[:mig-on|mig-off]][,...]; models: {models})"
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
    /// MIG mode when the backend opened: the spec's for a fresh state, else the state file's.
    /// Decides whether the GPU is served without `--whole-gpus` ([`EmulatedBackend::serves`]);
    /// the mode now is in the state ([`state::GpuState::mode`]).
    mig_enabled: bool,
}

/// The emulated backend. Thread-safe; see the module docs.
#[derive(Debug)]
pub struct EmulatedBackend {
    gpus: Vec<EmuGpu>,
    /// `--whole-gpus`: GPUs with MIG mode off are served (whole) rather than skipped.
    whole_gpus: bool,
    /// `--mig-mode-switching`: the inventory allows switches where the model needs no reset.
    mig_mode_switching: bool,
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
    pub(crate) fn from_specs(
        specs: &[EmulatedGpuSpec],
        node_name: &str,
        state_dir: &Path,
    ) -> Result<Self, EmulatedError> {
        let mut gpus = build_gpus(specs, node_name);
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
        for (g, gs) in gpus.iter_mut().zip(&state.gpus) {
            g.mig_enabled = gs.mig_enabled;
        }
        Ok(Self {
            gpus,
            whole_gpus: false,
            mig_mode_switching: false,
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

    /// Serves the GPUs whose MIG mode is off as whole GPUs (`--whole-gpus`): they are in the
    /// inventory with `GpuInfo::mig_enabled` false. Without it (the default) they are skipped, as
    /// the NVML backend skips them: not in the inventory, and calls naming them answer
    /// [`BackendError::NotFound`].
    pub fn with_whole_gpus(mut self, whole_gpus: bool) -> Self {
        self.whole_gpus = whole_gpus;
        self
    }

    /// Lets DAS switch MIG mode to follow demand (`--mig-mode-switching`): the inventory reports
    /// [`MigSwitch::Allowed`](super::MigSwitch::Allowed) for GPUs whose model switches without a
    /// reset and that have no change pending; without it (the default) every GPU reports
    /// [`MigSwitch::off`](super::MigSwitch::off). [`GpuBackend::set_mig_mode`] works either way
    /// (it is the "hardware").
    pub fn with_mig_mode_switching(mut self, mig_mode_switching: bool) -> Self {
        self.mig_mode_switching = mig_mode_switching;
        self
    }

    /// Path of the state file.
    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    /// Whether the backend serves GPU `g` ([`GpuInfo::served`]).
    fn serves(&self, g: &EmuGpu) -> bool {
        g.mig_enabled || self.whole_gpus
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

    fn gpu(&self, index: u32, target: Target) -> Result<&EmuGpu, BackendError> {
        match self.gpus.iter().find(|g| g.index == index) {
            Some(g) if self.serves(g) => Ok(g),
            Some(_) => Err(BackendError::NotFound {
                target,
                reason: "the GPU has MIG mode off and is not served (no --whole-gpus)".into(),
            }),
            None => Err(BackendError::NotFound {
                target,
                reason: format!(
                    "no GPU with index {index} (the node has {})",
                    self.gpus.len()
                ),
            }),
        }
    }
}

impl GpuBackend for EmulatedBackend {
    /// The served GPUs that are not lost, each with its MIG mode now (from the state) and
    /// whether DAS may switch it (`emulated/mig_mode.rs`).
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.apply_control_file();
        let live: Vec<&EmuGpu> = self
            .gpus
            .iter()
            .filter(|g| self.serves(g) && !self.is_lost(g.index))
            .collect();
        let state = lock(&self.state);
        Ok(live
            .into_iter()
            .map(|g| {
                let mode = gpu_state(&state, g.index).mode();
                gpu_info(g, mode.current, self.mig_switch(g, mode))
            })
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
        self.gpus
            .iter()
            .filter(|g| self.serves(g))
            .map(|g| g.index)
            .collect()
    }

    fn mig_mode(&self, gpu_index: u32) -> Result<MigModeState, BackendError> {
        self.apply_control_file();
        let gpu = self.live_gpu(gpu_index, Target::gpu(gpu_index))?;
        Ok(gpu_state(&lock(&self.state), gpu.index).mode())
    }

    /// See `emulated/mig_mode.rs`.
    fn set_mig_mode(&self, gpu_index: u32, enabled: bool) -> Result<(), BackendError> {
        self.apply_control_file();
        let target = Target::gpu(gpu_index);
        let gpu = self.live_gpu(gpu_index, target.clone())?;
        if let Some(kind) = self.take_fault(Op::SetMigMode, gpu_index) {
            return self.injected_mig_mode_fault(gpu, enabled, kind, target);
        }
        self.switch_mig_mode(gpu, enabled)
    }

    /// See `emulated/time_slice.rs`.
    fn set_time_slice(
        &self,
        gpu_index: u32,
        interval: das_api::device_config::TimeSliceInterval,
    ) -> Result<(), BackendError> {
        self.apply_control_file();
        let target = Target::gpu(gpu_index);
        let gpu = self.live_gpu(gpu_index, target.clone())?;
        if let Some(kind) = self.take_fault(Op::SetTimeSlice, gpu_index) {
            return Err(kind.error(target));
        }
        self.store_time_slice(gpu, interval.level())
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (state is swapped in whole).
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

mod control;
pub mod device_nodes;
pub mod driver_files;
mod gpus_flag;
mod identity;
mod instances;
mod mig_mode;
mod state;
mod time_slice;

pub use control::{Control, ControlFault, ControlXid, FaultKind, Latency, LatencyMs};
use control::{ControlSeen, Op};
pub use gpus_flag::{
    EmulatedGpuSpec, MODE_MIG_OFF, MODE_MIG_ON, emulated_model_help, parse_emulated_spec,
};
pub use identity::emulated_inventory;
use identity::{build_gpus, gpu_info};
use instances::to_instance;
pub use state::move_state_aside;
use state::{StateFile, fresh_state, gpu_state, load_state, write_atomically};

#[cfg(test)]
mod tests;
