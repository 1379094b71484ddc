//! What an MPS daemon is told (pure): its environment, the control commands that set a slice's
//! limits, and the check of the limits against the slice. The commands are NVIDIA's
//! (`nvidia-cuda-mps-control` manual, "Control daemon commands"), written one per line to the
//! control binary's standard input in client mode, as NVIDIA's DRA driver does.

use super::MpsLimits;
use super::layout::{LOG_DIR_ENV, MpsDirs, PIPE_DIR_ENV, VISIBLE_DEVICES_ENV};

/// The command that stops the daemon (and its server, once its clients are gone).
pub const QUIT: &str = "quit";

/// The commands that set `limits` on the daemon of slice `mig_uuid`, in order: the active
/// thread percentage, then the pinned memory limit of the slice (`<N>M`, in MiB). None for no
/// limits.
pub fn limit_commands(limits: &MpsLimits, mig_uuid: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = limits.active_thread_percentage {
        out.push(format!("set_default_active_thread_percentage {p}"));
    }
    if let Some(mib) = limits.pinned_device_memory_limit_mib {
        out.push(format!(
            "set_default_device_pinned_mem_limit {mig_uuid} {mib}M"
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

/// Checks `limits` against the slice they are for, whose memory is `slice_memory_mib` (the
/// profile's): a client cannot pin more than the slice has.
///
/// # Errors
/// What is wrong and what is valid.
pub fn check_against_slice(
    limits: &MpsLimits,
    profile: &str,
    slice_memory_mib: u64,
) -> Result<(), String> {
    match limits.pinned_device_memory_limit_mib {
        Some(mib) if mib > slice_memory_mib => Err(format!(
            "sharing.mps.pinnedDeviceMemoryLimit is {mib}Mi, more than the {slice_memory_mib}Mi of a {profile} slice; valid: 1Mi to {slice_memory_mib}Mi"
        )),
        _ => Ok(()),
    }
}
