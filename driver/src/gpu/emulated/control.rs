//! Faults, latency and lost GPUs injected into the emulated backend: from code (unit tests) and
//! through the control file [`super::CONTROL_FILE`] (tests that drive a running plugin;
//! docs/emulated-mode.md, "Injecting faults into a running plugin").

use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::CONTROL_FILE;
use crate::gpu::{BackendError, Target};

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
pub(super) enum Op {
    Create,
    Destroy,
}

/// The fault-injection control file, `<state dir>/control.json`, for tests that drive a running
/// plugin (the e2e tests and the chaos soak). The backend reads it again whenever its content
/// changes (checked on every call, a `stat` and, on a change, a read). `latencyMs` and
/// `lostGpus` replace the current settings; each fault list and each health event is queued once
/// per new content (write new content, e.g. another event, to raise the same event again).
/// Write it atomically (temp file and rename). A file that does not parse is logged and ignored.
///
/// ```json
/// {"latencyMs": {"create": 2000, "destroy": 0}, "lostGpus": [1],
///  "createFaults": [{"gpu": 0, "count": 1, "kind": "Other"}],
///  "destroyFaults": [{"gpu": 1, "count": 3, "kind": "InUse"}],
///  "xidEvents": [{"gpu": 0, "xid": 79}, {"gpu": 1, "xid": 94, "gpuInstance": 2}],
///  "uncorrectableEccGpus": [1]}
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
