//! Faults, latency and lost GPUs injected into the emulated backend: from code (unit tests) and
//! through the control file [`super::CONTROL_FILE`] (tests that drive a running plugin;
//! docs/emulated-mode.md, "Injecting faults into a running plugin").

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{CONTROL_FILE, EmulatedBackend, lock};
#[cfg(doc)]
use crate::gpu::GpuBackend;
use crate::gpu::{BackendError, HealthEvent, Target};

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
    /// [`BackendError::ResetRequired`]. For a MIG mode switch it is emulated faithfully: the
    /// requested mode becomes the pending one, the mode now stays (as `nvmlDeviceSetMigMode`
    /// leaves a GPU that cannot be reset).
    ResetRequired,
    /// [`BackendError::GpuLost`] (for one call; see [`super::EmulatedBackend::set_gpu_lost`] for a GPU
    /// that stays lost).
    GpuLost,
    /// [`BackendError::Other`].
    Other,
}

impl FaultKind {
    pub(super) fn error(self, target: Target) -> BackendError {
        let reason = "injected fault".to_string();
        match self {
            FaultKind::InsufficientResources => {
                BackendError::InsufficientResources { target, reason }
            }
            FaultKind::InvalidArgument => BackendError::InvalidArgument { target, reason },
            FaultKind::NotSupported => BackendError::NotSupported { target, reason },
            FaultKind::NotFound => BackendError::NotFound { target, reason },
            FaultKind::InUse => BackendError::InUse { target, reason },
            FaultKind::ResetRequired => BackendError::ResetRequired { target, reason },
            FaultKind::GpuLost => BackendError::GpuLost { target, reason },
            FaultKind::Other => BackendError::Other { target, reason },
        }
    }
}

/// Injected latency: a sleep before every create and destroy, and in every MIG mode switch that
/// changes the mode (outside any lock, so GPUs stay independent). No public per-call figures
/// exist for creates and destroys (docs/reference/mig.md, "Timing"); a few hundred milliseconds
/// per create and about a second per destroy are plausible for realism.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// Sleep per `create_instance`.
    pub create: Duration,
    /// Sleep per `destroy_instance`.
    pub destroy: Duration,
    /// Sleep per `set_mig_mode` that switches the mode now (not one that is a no-op, reverts a
    /// pending change, or leaves the change pending a reset). For realism: about 1 ms on an H100
    /// (as NVIDIA's DRA driver measured its toggle); 4–5 s per GPU on an A100-80GB, whose switch
    /// goes through a GPU reset (docs/reference/mig.md, "Timing").
    pub mig_mode_switch: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Op {
    Create,
    Destroy,
    SetMigMode,
    SetTimeSlice,
}

/// The fault-injection control file, `<state dir>/control.json`, for tests that drive a running
/// plugin (the e2e tests and the chaos soak). The backend reads it again whenever its content
/// changes (checked on every call, a `stat` and, on a change, a read). `latencyMs` and
/// `lostGpus` replace the current settings; each fault list and each health event is queued once
/// per new content (write new content, e.g. another event, to raise the same event again).
/// Write it atomically (temp file and rename). A file that does not parse is logged and ignored.
///
/// Fault kinds: `InsufficientResources`, `InvalidArgument`, `NotSupported`, `NotFound`, `InUse`,
/// `ResetRequired`, `GpuLost`, `Other` ([`FaultKind`]).
///
/// ```json
/// {"latencyMs": {"create": 2000, "destroy": 0, "migModeSwitch": 1}, "lostGpus": [1],
///  "createFaults": [{"gpu": 0, "count": 1, "kind": "Other"}],
///  "destroyFaults": [{"gpu": 1, "count": 3, "kind": "InUse"}],
///  "setMigModeFaults": [{"gpu": 2, "count": 1, "kind": "ResetRequired"}],
///  "setTimeSliceFaults": [{"gpu": 3, "count": 1, "kind": "NotSupported"}],
///  "xidEvents": [{"gpu": 0, "xid": 79}, {"gpu": 1, "xid": 94, "gpuInstance": 2}],
///  "uncorrectableEccGpus": [1]}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Control {
    /// Sleep per create, destroy and MIG mode switch, in milliseconds.
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
    /// Faults for the next MIG mode switches (`set_mig_mode`), e.g. `InUse` (the GPU is busy)
    /// or `ResetRequired` (the change stays pending a reset).
    #[serde(default)]
    pub set_mig_mode_faults: Vec<ControlFault>,
    /// Faults for the next time-slice settings (`set_time_slice`), e.g. `NotSupported` (as
    /// `nvidia-smi compute-policy` answers on a GPU that refuses it).
    #[serde(default)]
    pub set_time_slice_faults: Vec<ControlFault>,
    /// XID events to raise (as NVML's `nvmlEventTypeXidCriticalError`).
    #[serde(default)]
    pub xid_events: Vec<ControlXid>,
    /// GPUs that report an uncorrectable ECC error (`nvmlEventTypeDoubleBitEccError`).
    #[serde(default)]
    pub uncorrectable_ecc_gpus: Vec<u32>,
    /// MIG instances to create as an administrator would with `nvidia-smi` (not by DAS).
    #[serde(default)]
    pub foreign_instances: Vec<ControlInstance>,
    /// MIG instances to destroy as an administrator would, by GPU and placement start.
    #[serde(default)]
    pub destroy_instances: Vec<ControlPlacement>,
}

/// A MIG instance of `profile` at memory slice `start` of GPU `gpu`, in the control file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlInstance {
    /// GPU index.
    pub gpu: u32,
    /// GPU-instance profile, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the placement.
    pub start: u32,
}

/// The instance at memory slice `start` of GPU `gpu`, in the control file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlPlacement {
    /// GPU index.
    pub gpu: u32,
    /// First memory slice of the instance's placement.
    pub start: u32,
}

/// An XID event on GPU `gpu`, in the control file; with `gpuInstance`, attributed to that GPU
/// instance, as NVML's `gpuInstanceId` would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlXid {
    /// GPU index.
    pub gpu: u32,
    /// The XID number.
    pub xid: u32,
    /// GPU-instance ID the event names (a GI id of a live instance on `gpu` to scope it to that
    /// instance's devices); absent for an event about the whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}

/// [`Latency`] in the control file, in milliseconds: `create`, `destroy`, `migModeSwitch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LatencyMs {
    /// Milliseconds per create.
    #[serde(default)]
    pub create: u64,
    /// Milliseconds per destroy.
    #[serde(default)]
    pub destroy: u64,
    /// Milliseconds per MIG mode switch ([`Latency::mig_mode_switch`]).
    #[serde(default)]
    pub mig_mode_switch: u64,
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
        das_runtime::fs::write_atomically(&path, &path.with_extension("json.tmp"), &bytes)
    }
}

/// The last control-file content applied, by modification time and length (and the content
/// itself, so an edit within one timestamp tick is still seen).
#[derive(Debug, Default)]
pub(super) struct ControlSeen {
    pub(super) stamp: Option<(SystemTime, u64)>,
    pub(super) content: Vec<u8>,
}

impl EmulatedBackend {
    /// Makes the next `count` creates on GPU `gpu_index` fail with `kind` (before any check).
    pub fn inject_create_faults(&self, gpu_index: u32, count: usize, kind: FaultKind) {
        self.inject(Op::Create, gpu_index, count, kind);
    }

    /// Makes the next `count` destroys on GPU `gpu_index` fail with `kind` (before any check).
    pub fn inject_destroy_faults(&self, gpu_index: u32, count: usize, kind: FaultKind) {
        self.inject(Op::Destroy, gpu_index, count, kind);
    }

    /// Makes the next `count` MIG mode switches (`set_mig_mode`) on GPU `gpu_index` fail with
    /// `kind` (before any check; [`FaultKind::ResetRequired`] leaves the requested mode
    /// pending).
    pub fn inject_set_mig_mode_faults(&self, gpu_index: u32, count: usize, kind: FaultKind) {
        self.inject(Op::SetMigMode, gpu_index, count, kind);
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
    pub(crate) fn set_latency(&self, latency: Latency) {
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
    pub(crate) fn raise_health_event(&self, event: HealthEvent) {
        lock(&self.health_events).push_back(event);
    }

    /// Applies the control file when its content changed since the last call (see [`Control`]).
    pub(super) fn apply_control_file(&self) {
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
            mig_mode_switch: Duration::from_millis(control.latency_ms.mig_mode_switch),
        });
        *lock(&self.lost) = control.lost_gpus.iter().copied().collect();
        for f in &control.create_faults {
            self.inject(Op::Create, f.gpu, f.count, f.kind);
        }
        for f in &control.destroy_faults {
            self.inject(Op::Destroy, f.gpu, f.count, f.kind);
        }
        for f in &control.set_mig_mode_faults {
            self.inject(Op::SetMigMode, f.gpu, f.count, f.kind);
        }
        for f in &control.set_time_slice_faults {
            self.inject(Op::SetTimeSlice, f.gpu, f.count, f.kind);
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

    pub(super) fn inject(&self, op: Op, gpu: u32, count: usize, kind: FaultKind) {
        lock(&self.faults)
            .entry((op, gpu))
            .or_default()
            .extend(std::iter::repeat_n(kind, count));
    }

    pub(super) fn take_fault(&self, op: Op, gpu: u32) -> Option<FaultKind> {
        lock(&self.faults)
            .get_mut(&(op, gpu))
            .and_then(VecDeque::pop_front)
    }

    pub(super) fn is_lost(&self, gpu_index: u32) -> bool {
        lock(&self.lost).contains(&gpu_index)
    }

    pub(super) fn sleep(&self, op: Op) {
        let latency = *lock(&self.latency);
        let d = match op {
            Op::Create => latency.create,
            Op::Destroy => latency.destroy,
            Op::SetMigMode => latency.mig_mode_switch,
            Op::SetTimeSlice => Duration::ZERO,
        };
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

/// Whether a modification time is within the last two seconds: the file system's timestamp
/// granularity may hide an edit made in the same tick, so a recent file is re-read.
fn recent(t: SystemTime) -> bool {
    SystemTime::now()
        .duration_since(t)
        .map_or(true, |age| age < Duration::from_secs(2))
}
