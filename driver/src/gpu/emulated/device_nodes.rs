//! Stand-in device nodes for emulated GPUs (`--emulated-device-dir`).
//!
//! A CDI-enabled runtime injects a CDI device node by looking at the host node (its type and
//! numbers, container-device-interface `DeviceNode.fillMissingInfo`) and then creating or
//! bind-mounting it in the container. On a machine without the NVIDIA driver there is no
//! `/dev/nvidia0`, so emulated GPUs either leave device nodes out of their specs
//! (`--cdi-device-nodes=false`) or, with this module, get character devices of their own: the
//! same names and numbers the driver uses, made with mknod(2) in a directory of the plugin's
//! choosing, which the CDI specs then name as `hostPath` (the path in the container stays
//! `/dev/...`). The nodes are never opened: no driver answers behind them (open gives ENXIO), but
//! a runtime injects them exactly as it injects real ones.
//!
//! Numbers (docs/reference/mig.md, "Device nodes and capabilities"): `nvidia<N>` is 195:N and
//! `nvidiactl` 195:255 (the fixed major of the NVIDIA character driver); the UVM driver's major
//! is allocated at module load, so [`UVM_MAJOR`] is a stand-in; `nvidia-caps/nvidia-cap<M>` use
//! the caps major the plugin puts in its specs and the minors of the `mig-minors` listing, for
//! every GI and CI a GPU can have.

use std::io;
use std::path::{Path, PathBuf};

use crate::gpu::{ci_cap_minor, gi_cap_minor};

/// Major of the NVIDIA character devices (`/dev/nvidia<N>`, `/dev/nvidiactl`), fixed by the
/// driver.
pub(crate) const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub(crate) const NVIDIACTL_MINOR: u32 = 255;
/// Stand-in major of `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` (minors 0 and 1); the real one
/// is dynamic (`nvidia-uvm` in `/proc/devices`).
pub(crate) const UVM_MAJOR: u32 = 510;
/// GI IDs per GPU in the `mig-minors` listing (`gi0..gi14`).
const GI_IDS: u32 = 15;
/// CI IDs per GI in the `mig-minors` listing (`ci0..ci7`).
const CI_IDS: u32 = 8;

/// One stand-in node: its path below the device directory, and its numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandInNode {
    /// Path relative to the device directory, e.g. `nvidia0`, `nvidia-caps/nvidia-cap12`.
    pub relative: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// The nodes GPUs with the given minors need: control and UVM nodes, each GPU's node, and the
/// capability node of every GI and CI the GPU can have (`caps_major`).
pub fn stand_in_nodes(gpu_minors: &[u32], caps_major: u32) -> Vec<StandInNode> {
    let node = |relative: String, major, minor| StandInNode {
        relative,
        major,
        minor,
    };
    let mut nodes = vec![
        node("nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR),
        node("nvidia-uvm".into(), UVM_MAJOR, 0),
        node("nvidia-uvm-tools".into(), UVM_MAJOR, 1),
    ];
    for &gpu in gpu_minors {
        nodes.push(node(format!("nvidia{gpu}"), NVIDIA_MAJOR, gpu));
        for gi in 0..GI_IDS {
            let caps = std::iter::once(gi_cap_minor(gpu, gi))
                .chain((0..CI_IDS).map(|ci| ci_cap_minor(gpu, gi, ci)));
            for minor in caps {
                nodes.push(node(
                    format!("nvidia-caps/nvidia-cap{minor}"),
                    caps_major,
                    minor,
                ));
            }
        }
    }
    nodes
}

/// Creates `nodes` under `dir` (mode 0666, as the driver's nodes), replacing a node of other
/// numbers and keeping one that is right. Needs CAP_MKNOD (root).
///
/// # Errors
/// The directory cannot be created, or mknod fails (EPERM without CAP_MKNOD); the error names
/// the path and says what to do.
pub fn create_stand_in_nodes(dir: &Path, nodes: &[StandInNode]) -> io::Result<()> {
    for n in nodes {
        let path = dir.join(&n.relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if has_numbers(&path, n.major, n.minor) {
            continue;
        }
        let _ = std::fs::remove_file(&path);
        mknod_char(&path, n.major, n.minor).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "create stand-in device node {} ({}:{}): {e}; this needs root (CAP_MKNOD): run as root or drop --emulated-device-dir",
                    path.display(),
                    n.major,
                    n.minor
                ),
            )
        })?;
    }
    Ok(())
}

/// Whether `path` is a character device with these numbers.
fn has_numbers(path: &Path, major: u32, minor: u32) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) => {
            let rdev = m.rdev();
            m.file_type().is_char_device()
                && libc::major(rdev) == major
                && libc::minor(rdev) == minor
        }
        Err(_) => false,
    }
}

fn mknod_char(path: &PathBuf, major: u32, minor: u32) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))?;
    // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mknod(
            c_path.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // mknod applies the umask; the driver's nodes are 0666.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
}

#[cfg(test)]
mod tests;
