//! Who sets a whole GPU's compute time slice (docs/design.md §7, "Time-slicing"): on real GPUs
//! NVIDIA's `nvidia-smi compute-policy -i <GPU UUID> --set-timeslice <level>`, as NVIDIA's DRA
//! driver does (`SetTimeSlice`; no NVML call sets it), found among the driver's files and run
//! with the driver's library directory; on emulated GPUs their backend, which records the level.
//!
//! NVIDIA's driver also sets the compute mode to `DEFAULT` first, because its MPS sets
//! `EXCLUSIVE_PROCESS`; DAS never changes the compute mode (it serves MPS on MIG instances only),
//! so a GPU an administrator set to `EXCLUSIVE_PROCESS` keeps one context at a time whatever
//! its time slice.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use das_api::device_config::TimeSliceInterval;

use super::{BackendError, GpuBackend, Target};

/// Why time-slicing cannot be served here: neither NVIDIA's `nvidia-smi` nor emulated GPUs.
pub const NO_NVIDIA_SMI: &str = "time-slicing needs NVIDIA's nvidia-smi, which was not found among the driver's files: run the plugin with --driver-root (the chart does), or use sharing.strategy Exclusive";

/// `nvidia-smi`'s exit status for an operation the GPU does not support (`nvidia-smi(1)`,
/// "RETURN VALUE").
const NVIDIA_SMI_NOT_SUPPORTED: i32 = 3;

/// Sets a GPU's compute time slice.
#[derive(Clone)]
pub enum TimeSlicer {
    /// NVIDIA's `nvidia-smi` at `program`, with `library_dir` (the driver's libraries) as its
    /// `LD_LIBRARY_PATH` when the driver is not the plugin's own root.
    NvidiaSmi {
        /// The `nvidia-smi` binary as this process sees it.
        program: PathBuf,
        /// The driver's library directory, if `program` is below a driver root.
        library_dir: Option<PathBuf>,
    },
    /// The GPU backend sets it (the emulated GPUs, [`GpuBackend::set_time_slice`]).
    Backend(Arc<dyn GpuBackend>),
    /// None: a time-sliced device is refused with [`NO_NVIDIA_SMI`].
    Unavailable,
}

impl std::fmt::Debug for TimeSlicer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimeSlicer::NvidiaSmi { program, .. } => write!(f, "NvidiaSmi({})", program.display()),
            TimeSlicer::Backend(_) => f.write_str("Backend"),
            TimeSlicer::Unavailable => f.write_str("Unavailable"),
        }
    }
}

impl TimeSlicer {
    /// Whether it can set a time slice at all.
    pub fn available(&self) -> bool {
        !matches!(self, TimeSlicer::Unavailable)
    }

    /// Sets GPU `gpu_index` (UUID `gpu_uuid`) to `interval`. Blocks (a process, or a state
    /// file write): run it on the blocking pool.
    ///
    /// # Errors
    /// [`BackendError::NotSupported`]: the GPU refuses (`nvidia-smi` exit status 3) or there is
    /// no way to set it here; [`BackendError::Other`]: `nvidia-smi` could not run or failed, with
    /// its output.
    pub fn set(
        &self,
        gpu_index: u32,
        gpu_uuid: &str,
        interval: TimeSliceInterval,
    ) -> Result<(), BackendError> {
        let target = Target::gpu(gpu_index);
        match self {
            TimeSlicer::Backend(b) => b.set_time_slice(gpu_index, interval),
            TimeSlicer::Unavailable => Err(BackendError::NotSupported {
                target,
                reason: NO_NVIDIA_SMI.into(),
            }),
            TimeSlicer::NvidiaSmi {
                program,
                library_dir,
            } => {
                let mut cmd = Command::new(program);
                cmd.args(nvidia_smi_args(gpu_uuid, interval));
                if let Some(dir) = library_dir {
                    cmd.env("LD_LIBRARY_PATH", dir);
                }
                let out = cmd.output().map_err(|e| BackendError::Other {
                    target: target.clone(),
                    reason: format!("run {}: {e}", program.display()),
                })?;
                nvidia_smi_result(target, out.status.code(), &out.stdout, &out.stderr)
            }
        }
    }
}

/// `nvidia-smi`'s arguments that set GPU `gpu_uuid`'s time slice to `interval` (its level,
/// [`TimeSliceInterval::level`]).
pub(crate) fn nvidia_smi_args(gpu_uuid: &str, interval: TimeSliceInterval) -> Vec<String> {
    vec![
        "compute-policy".into(),
        "-i".into(),
        gpu_uuid.into(),
        "--set-timeslice".into(),
        interval.level().to_string(),
    ]
}

/// What `nvidia-smi`'s exit status `code` and its output mean (pure).
fn nvidia_smi_result(
    target: Target,
    code: Option<i32>,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<(), BackendError> {
    let output = || {
        let text = format!(
            "{} {}",
            String::from_utf8_lossy(stdout).trim(),
            String::from_utf8_lossy(stderr).trim()
        );
        text.trim().chars().take(500).collect::<String>()
    };
    match code {
        Some(0) => Ok(()),
        Some(NVIDIA_SMI_NOT_SUPPORTED) => Err(BackendError::NotSupported {
            target,
            reason: format!("nvidia-smi compute-policy: {}", output()),
        }),
        other => Err(BackendError::Other {
            target,
            reason: format!(
                "nvidia-smi compute-policy exited with {}: {}",
                other.map_or_else(|| "a signal".to_string(), |c| format!("status {c}")),
                output()
            ),
        }),
    }
}

#[cfg(test)]
mod tests;
