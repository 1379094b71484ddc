//! What an MPS daemon is told (pure): its environment, the control commands that set a slice's
//! limits, and the check of the limits against the slice. The commands are NVIDIA's
//! (`nvidia-cuda-mps-control` manual, "Control daemon commands"), written one per line to the
//! control binary's standard input in client mode, as NVIDIA's DRA driver does.

use super::MpsLimits;
use super::layout::{LOG_DIR_ENV, MpsDirs, PIPE_DIR_ENV, VISIBLE_DEVICES_ENV};

/// The command that stops the daemon (and its server, once its clients are gone).
pub const QUIT: &str = "quit";

/// The device the pinned memory limit is set for: ordinal 0, the one device the daemon sees
/// (its `CUDA_VISIBLE_DEVICES` is the slice's MIG UUID alone, see [`daemon_env`]). Not the
/// UUID: NVIDIA's daemon answers nothing and sets nothing effective for a UUID it does not serve,
/// so a wrong UUID would pass silently, while ordinal 0 can only be the slice.
pub const LIMIT_DEVICE: &str = "0";

/// The commands that set `limits` on a slice's daemon, in order: the active thread percentage,
/// then the pinned memory limit of the slice (device [`LIMIT_DEVICE`], `<N>M` in MiB). None
/// for no limits.
pub fn limit_commands(limits: &MpsLimits) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = limits.active_thread_percentage {
        out.push(format!("set_default_active_thread_percentage {p}"));
    }
    if let Some(mib) = limits.pinned_device_memory_limit_mib {
        out.push(format!(
            "set_default_device_pinned_mem_limit {LIMIT_DEVICE} {mib}M"
        ));
    }
    out
}

/// The environment of the daemon of slice `mig_uuid`: the slice alone visible, its pipe and
/// log directories.
pub fn daemon_env(dirs: &MpsDirs, mig_uuid: &str) -> Vec<(String, String)> {
    vec![
        (VISIBLE_DEVICES_ENV.to_string(), mig_uuid.to_string()),
        (PIPE_DIR_ENV.to_string(), dirs.pipe.display().to_string()),
        (LOG_DIR_ENV.to_string(), dirs.log.display().to_string()),
    ]
}

/// The environment of the control binary in client mode: the daemon's pipe and log directories.
pub fn client_env(dirs: &MpsDirs) -> Vec<(String, String)> {
    vec![
        (PIPE_DIR_ENV.to_string(), dirs.pipe.display().to_string()),
        (LOG_DIR_ENV.to_string(), dirs.log.display().to_string()),
    ]
}

/// A pinned memory limit above the memory of the slice it is for: a client cannot pin more than
/// the slice has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "sharing.mps.pinnedDeviceMemoryLimit is {limit_mib}Mi, more than the {slice_mib}Mi of a {profile} slice; valid: 1Mi to {slice_mib}Mi"
)]
pub struct LimitAboveSlice {
    /// The limit asked for, in MiB.
    pub limit_mib: u64,
    /// The slice's profile.
    pub profile: String,
    /// The slice's memory, in MiB.
    pub slice_mib: u64,
}

/// Checks `limits` against the slice they are for, whose memory is `slice_memory_mib` (the
/// profile's).
///
/// # Errors
/// The pinned memory limit is above the slice's memory.
pub fn check_against_slice(
    limits: &MpsLimits,
    profile: &str,
    slice_memory_mib: u64,
) -> Result<(), LimitAboveSlice> {
    match limits.pinned_device_memory_limit_mib {
        Some(mib) if mib > slice_memory_mib => Err(LimitAboveSlice {
            limit_mib: mib,
            profile: profile.to_string(),
            slice_mib: slice_memory_mib,
        }),
        _ => Ok(()),
    }
}
