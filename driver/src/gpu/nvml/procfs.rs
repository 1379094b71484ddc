//! Capability device numbers of MIG instances from procfs (docs/reference/mig.md, "Device nodes and capabilities").
//!
//! - Major: the `nvidia-caps` line of `/proc/devices` (dynamic; 238, 508, … seen).
//! - Minors: `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access` and
//!   `…/gi<G>/ci<C>/access`, content `DeviceFileMinor: N` (note the `mig/` component).
//!
//! The functions take the procfs root (normally `/proc`) so tests can point them at a fake tree.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The default procfs root.
pub const PROC_ROOT: &str = "/proc";

/// The `nvidia-caps` character-device major from `<proc_root>/devices`.
pub(crate) fn read_caps_major(proc_root: &Path) -> io::Result<u32> {
    let path = proc_root.join("devices");
    let text = fs::read_to_string(&path)?;
    parse_caps_major(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{}: no `nvidia-caps` character device (is the NVIDIA driver loaded with MIG support?)",
                path.display()
            ),
        )
    })
}

/// The `nvidia-caps` major ([`read_caps_major`]) of a node where `mig` is whether any GPU DAS
/// serves has MIG. A node whose GPUs all lack MIG (T4, L4, …) never names a capability node,
/// so a missing `nvidia-caps` device there is `Ok(None)` (the plugin serves its GPUs whole),
/// not a start-up failure.
///
/// # Errors
/// `/proc/devices` unreadable, or no `nvidia-caps` where a GPU has MIG.
pub fn caps_major_if_needed(proc_root: &Path, mig: bool) -> io::Result<Option<u32>> {
    match read_caps_major(proc_root) {
        Ok(major) => Ok(Some(major)),
        Err(_) if !mig => Ok(None),
        Err(e) => Err(e),
    }
}

/// The major of the exact name `nvidia-caps` in the "Character devices:" section of
/// `/proc/devices` (not `nvidia-caps-imex-channels`, which newer drivers also list).
pub(crate) fn parse_caps_major(devices: &str) -> Option<u32> {
    devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices"))
        .take_while(|l| !l.starts_with("Block devices"))
        .filter_map(|l| l.trim().split_once(char::is_whitespace))
        .find(|(_, name)| name.trim() == "nvidia-caps")
        .and_then(|(major, _)| major.parse().ok())
}

/// `<proc_root>/driver/nvidia/capabilities/gpu<gpu_minor>/mig/gi<gi>/access`.
pub(crate) fn gi_access_path(proc_root: &Path, gpu_minor: u32, gi: u32) -> PathBuf {
    proc_root
        .join("driver/nvidia/capabilities")
        .join(format!("gpu{gpu_minor}"))
        .join("mig")
        .join(format!("gi{gi}"))
        .join("access")
}

/// `<proc_root>/driver/nvidia/capabilities/gpu<gpu_minor>/mig/gi<gi>/ci<ci>/access`.
pub(crate) fn ci_access_path(proc_root: &Path, gpu_minor: u32, gi: u32, ci: u32) -> PathBuf {
    gi_access_path(proc_root, gpu_minor, gi).with_file_name(format!("ci{ci}/access"))
}

/// The `DeviceFileMinor: N` value of a capability `access` file.
pub(crate) fn read_cap_minor(access: &Path) -> io::Result<u32> {
    let text = fs::read_to_string(access)?;
    parse_cap_minor(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: no `DeviceFileMinor: N` line", access.display()),
        )
    })
}

/// Parses `DeviceFileMinor: N` out of an `access` file's text.
pub(crate) fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "DeviceFileMinor")
        .and_then(|(_, v)| v.trim().parse().ok())
}
