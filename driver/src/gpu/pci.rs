//! Where a GPU sits on the PCI bus (docs/design.md §3): its bus ID in the standard form of
//! `resource.kubernetes.io/pciBusID`, and its PCIe root complex (`resource.kubernetes.io/pcieRoot`)
//! read from sysfs, both as Kubernetes' `k8s.io/dynamic-resource-allocation/deviceattribute`
//! package (KEP-5491, `pci_linux.go`) defines them:
//!
//! - a bus ID is `<domain>:<bus>:<device>.<function>`, lower-case hex, 4 + 2 + 2 + 1 digits
//!   (`0000:3b:00.0`); NVML writes an 8-digit upper-case domain (`00000000:3B:00.0`), which
//!   [`standard_bus_id`] shortens as NVIDIA's go-nvlib `GetPCIBusID` does;
//! - the PCIe root is the first directory under `/sys/devices` of the device's sysfs path:
//!   `/sys/bus/pci/devices/<bus id>` is a symlink to
//!   `/sys/devices/pci0000:00/<bridges…>/<bus id>`, whose root is `pci0000:00`
//!   ([`pcie_root`]);
//! - the NUMA node is the kernel's `/sys/bus/pci/devices/<bus id>/numa_node`, a scalar int, and a
//!   device with none (`-1`) publishes no `resource.kubernetes.io/numaNode` (Kubernetes'
//!   `deviceattribute.GetNUMANodeAttributeByPCIBusID`, `numa_linux.go`; [`numa_node`]).
//!
//! Emulated GPUs get synthetic, well-formed values ([`emulated_bus_id`], [`emulated_pcie_root`],
//! [`emulated_numa_node`]).

use std::ffi::OsStr;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The sysfs root a node's PCI devices are read from unless told otherwise (`--sys-root`).
pub const SYS_ROOT: &str = "/sys";

/// `id` in the standard form `0000:3b:00.0`: lower case, and NVML's 8-digit domain cut to 4 digits
/// where its first 4 are zeros. `None` when it is not a bus ID of that form (a domain beyond
/// `ffff` has no standard form).
pub(crate) fn standard_bus_id(id: &str) -> Option<String> {
    let id = id.trim().to_ascii_lowercase();
    let (domain, rest) = id.split_once(':')?;
    let domain = match domain.len() {
        4 => domain,
        8 => domain.strip_prefix("0000")?,
        _ => return None,
    };
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(domain, 4) && hex(bus, 2) && hex(device, 2) && hex(function, 1))
        .then(|| format!("{domain}:{bus}:{device}.{function}"))
}

/// The PCIe root complex (`pci0000:00`) of the device with standard bus ID `bus_id`, from
/// `<sys_root>/bus/pci/devices/<bus_id>`: the symlink's target, resolved against its folder,
/// must lie under `<sys_root>/devices/pci…` and end in `bus_id`; the root is its first
/// component there. Only the one link is read (as Kubernetes' helper does), so a test tree needs
/// no real device folders.
///
/// # Errors
/// What is wrong, for a log line: not a standard bus ID, no such link, or a link elsewhere.
pub(crate) fn pcie_root(sys_root: &Path, bus_id: &str) -> Result<String, String> {
    if standard_bus_id(bus_id).as_deref() != Some(bus_id) {
        return Err(format!(
            "{bus_id:?} is not a PCI bus ID of the form 0000:3b:00.0"
        ));
    }
    let link = sys_root.join("bus/pci/devices").join(bus_id);
    let target = fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    let target = normalize(&link.parent().unwrap_or(sys_root).join(target));
    let devices = normalize(&sys_root.join("devices"));
    let elsewhere = || {
        format!(
            "{} points to {}, not to a device under {}/pci…/{bus_id}",
            link.display(),
            target.display(),
            devices.display()
        )
    };
    let below = target.strip_prefix(&devices).map_err(|_| elsewhere())?;
    let root = below
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .filter(|r| r.starts_with("pci"))
        .ok_or_else(elsewhere)?;
    if below.components().count() < 2 || target.file_name() != Some(OsStr::new(bus_id)) {
        return Err(elsewhere());
    }
    Ok(root.to_string())
}

/// Highest NUMA node Kubernetes' helper accepts (`maxNUMANodes` − 1 in `numa_linux.go`).
pub(crate) const MAX_NUMA_NODE: u32 = 1023;

/// The NUMA node of the device with standard bus ID `bus_id`: the integer in
/// `<sys_root>/bus/pci/devices/<bus_id>/numa_node`. `Ok(None)` when the kernel reports `-1` (no
/// NUMA affinity: such a device must not publish `numaNode`, or it would match every other
/// device without one under `matchAttribute`).
///
/// # Errors
/// What is wrong, for a log line: not a standard bus ID, an unreadable file, or a value that is
/// not an integer in `-1..=1023`.
pub fn numa_node(sys_root: &Path, bus_id: &str) -> Result<Option<u32>, String> {
    if standard_bus_id(bus_id).as_deref() != Some(bus_id) {
        return Err(format!(
            "{bus_id:?} is not a PCI bus ID of the form 0000:3b:00.0"
        ));
    }
    let path = sys_root
        .join("bus/pci/devices")
        .join(bus_id)
        .join("numa_node");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    match text.trim().parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(n) if (0..=i64::from(MAX_NUMA_NODE)).contains(&n) => Ok(Some(n as u32)),
        _ => Err(format!(
            "{}: {:?} is not a NUMA node (-1 or 0..={MAX_NUMA_NODE})",
            path.display(),
            text.trim()
        )),
    }
}

/// `path` with `.` and `..` resolved without touching the file system (`..` at the top stays at
/// the top, as in a path lookup).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// The synthetic bus ID of emulated GPU `index`: `0000:<0x10 + index>:00.0`, e.g. `0000:12:00.0`
/// for GPU 2 (at most 32 GPUs: buses `10`–`2f`).
pub(crate) fn emulated_bus_id(index: u32) -> String {
    format!("0000:{:02x}:00.0", 0x10 + index)
}

/// The synthetic PCIe root of emulated GPU `index`: one root complex per pair of GPUs, named after
/// the pair's first bus (`pci0000:10` for GPUs 0 and 1, `pci0000:12` for GPUs 2 and 3), as on
/// servers whose GPUs share a PCIe switch two by two. A claim for two devices with
/// `matchAttribute: resource.kubernetes.io/pcieRoot` thus gets two GPUs of one pair.
pub(crate) fn emulated_pcie_root(index: u32) -> String {
    format!("pci0000:{:02x}", 0x10 + (index & !1))
}

/// The synthetic NUMA node of emulated GPU `index`: four GPUs (two PCIe roots of
/// [`emulated_pcie_root`]) per node, as on a two-socket server with eight GPUs (`0` for GPUs
/// 0–3, `1` for 4–7, …).
pub(crate) fn emulated_numa_node(index: u32) -> u32 {
    index / 4
}

#[cfg(test)]
mod tests;
