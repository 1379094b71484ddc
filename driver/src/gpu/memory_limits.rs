//! Whether the kernel can cap a GPU's memory per container (docs/design.md §7, "Memory limits
//! the kernel enforces"): NVIDIA driver r615+ registers each non-MIG GPU with the cgroup v2
//! `dmem` controller, and `<cgroup root>/dmem.capacity` then lists it as
//! `nvidia/<PCI bus ID>/vidmem <bytes>` (docs/reference/mps.md, "Memory limits the kernel
//! enforces (dmem)"). [`enforcement`] is the pure decision, [`read_dmem_capacity`] the file,
//! [`gpu_memory_enforcement`] both for one GPU of the inventory under the plugin's flags.
//!
//! The limit itself is set by the container's `createRuntime` CDI hook
//! (`crate::claims::memory_limits`).

use std::io;
use std::path::{Path, PathBuf};

use super::GpuInfo;
use super::pci::standard_bus_id;

/// The first NVIDIA driver major version with dmem memory limits (r615, CUDA 13.4;
/// docs/reference/mps.md, "Memory limits the kernel enforces (dmem)").
pub(crate) const DMEM_MIN_DRIVER_MAJOR: u32 = 615;

/// Where cgroup v2 is mounted unless `--cgroup-root` says otherwise.
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The root cgroup's file listing every device the dmem controller manages, one
/// `<region> <bytes>` line each.
pub const DMEM_CAPACITY_FILE: &str = "dmem.capacity";

/// How far a GPU's memory share is held to its size: the level published for the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryEnforcement {
    /// The kernel caps each container's GPU memory (dmem `dmem.max` on the container's own
    /// cgroup, set by DAS's `createRuntime` hook): an allocation beyond fails.
    Enforced,
    /// Only MPS client limits hold it (cooperative where the client's environment can change
    /// them; docs/design.md §7, "MPS on a slice").
    Mps,
}

impl MemoryEnforcement {
    /// The published spelling: `enforced` or `mps`.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryEnforcement::Enforced => "enforced",
            MemoryEnforcement::Mps => "mps",
        }
    }
}

/// What `--memory-enforcement` asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EnforcementChoice {
    /// Detect per GPU ([`enforcement`]).
    #[default]
    Auto,
    /// Never claim [`MemoryEnforcement::Enforced`]: no GPU gets a kernel limit.
    Mps,
}

/// A `--memory-enforcement` value that is neither `auto` nor `mps`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a memory enforcement: valid are auto (detect per GPU) and mps (never set kernel limits)"
)]
pub struct ChoiceError(pub String);

impl EnforcementChoice {
    /// Parses `auto` or `mps`.
    ///
    /// # Errors
    /// [`ChoiceError`] naming the value and the valid ones.
    pub fn parse(value: &str) -> Result<Self, ChoiceError> {
        match value.trim() {
            "auto" => Ok(EnforcementChoice::Auto),
            "mps" => Ok(EnforcementChoice::Mps),
            other => Err(ChoiceError(other.to_string())),
        }
    }
}

/// Whether NVIDIA driver `driver_version` (`615.12.03`) has dmem memory limits: its major
/// version is at least [`DMEM_MIN_DRIVER_MAJOR`]. An unparsable version has not.
pub(crate) fn driver_has_dmem(driver_version: &str) -> bool {
    driver_version
        .trim()
        .split('.')
        .next()
        .and_then(|major| major.parse::<u32>().ok())
        .is_some_and(|major| major >= DMEM_MIN_DRIVER_MAJOR)
}

/// Whether `dmem_capacity` (the text of `dmem.capacity`) lists the GPU at PCI bus ID
/// `pci_bus_id` as `nvidia/<bus ID>/vidmem`. Bus IDs compare in the standard form
/// ([`standard_bus_id`]: NVML's 8-digit domain `00000000:01:00.0` and the kernel's
/// `0000:01:00.0` are one GPU, case-insensitively); a bus ID of no standard form matches nothing.
pub(crate) fn capacity_lists(dmem_capacity: &str, pci_bus_id: &str) -> bool {
    let Some(wanted) = standard_bus_id(pci_bus_id) else {
        return false;
    };
    dmem_capacity.lines().any(|line| {
        let region = line.split_whitespace().next().unwrap_or("");
        let mut parts = region.split('/');
        matches!(
            (parts.next(), parts.next(), parts.next(), parts.next()),
            (Some("nvidia"), Some(bus), Some("vidmem"), None)
                if standard_bus_id(bus).as_deref() == Some(wanted.as_str())
        )
    })
}

/// The level a GPU gives a memory share (pure): [`MemoryEnforcement::Enforced`] iff its driver
/// has dmem limits ([`driver_has_dmem`]) and `dmem_capacity` (the text of `dmem.capacity`;
/// `None`: no such file, no cgroup v2 dmem controller) lists its bus ID
/// ([`capacity_lists`]); a GPU without a known bus ID is [`MemoryEnforcement::Mps`].
pub(crate) fn enforcement(
    dmem_capacity: Option<&str>,
    driver_version: &str,
    pci_bus_id: Option<&str>,
) -> MemoryEnforcement {
    match (dmem_capacity, pci_bus_id) {
        (Some(text), Some(bus)) if driver_has_dmem(driver_version) && capacity_lists(text, bus) => {
            MemoryEnforcement::Enforced
        }
        _ => MemoryEnforcement::Mps,
    }
}

/// The text of `<cgroup_root>/dmem.capacity`; `None` when there is no such file (no cgroup v2,
/// or a kernel without the dmem controller).
///
/// # Errors
/// Any other read error, naming the file.
pub(crate) fn read_dmem_capacity(cgroup_root: &Path) -> io::Result<Option<String>> {
    let path = cgroup_root.join(DMEM_CAPACITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("read {}: {e}", path.display()),
        )),
    }
}

/// The plugin's memory-enforcement flags, as [`gpu_memory_enforcement`] needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnforcementSettings {
    /// `--memory-enforcement`.
    pub choice: EnforcementChoice,
    /// `--cgroup-root`: where cgroup v2 is (its `dmem.capacity`), as this process sees it.
    pub cgroup_root: PathBuf,
    /// Emulated GPUs: their driver version (580) is not asked, the `dmem.capacity` under
    /// `cgroup_root` alone decides (tests point `--cgroup-root` at a fake tree), since their
    /// limits are written to that tree, not set through NVIDIA's driver.
    pub emulated: bool,
}

/// The level GPU `gpu` gives a memory share on this node (reads `dmem.capacity` once):
/// [`MemoryEnforcement::Mps`] with `--memory-enforcement=mps`; else [`enforcement`] of the
/// file, the GPU's driver version (any, for emulated GPUs) and its PCI bus ID (emulated GPUs
/// have synthetic ones, `0000:10:00.0` for GPU 0: `pci::emulated_bus_id`). A file that
/// exists but cannot be read is logged and counts as absent. Applies to the GPU's whole-GPU
/// device: dmem takes no MIG device.
pub fn gpu_memory_enforcement(settings: &EnforcementSettings, gpu: &GpuInfo) -> MemoryEnforcement {
    if settings.choice == EnforcementChoice::Mps {
        return MemoryEnforcement::Mps;
    }
    let capacity = read_dmem_capacity(&settings.cgroup_root).unwrap_or_else(|e| {
        tracing::warn!(error = %e, gpu = gpu.index, "dmem capacity unreadable: GPU memory shares are held by MPS only");
        None
    });
    let bus = gpu.pci_bus_id.as_deref();
    if settings.emulated {
        // The fake tree's file alone decides: no NVIDIA driver sets these limits.
        let listed = capacity
            .as_deref()
            .zip(bus)
            .is_some_and(|(c, b)| capacity_lists(c, b));
        return if listed {
            MemoryEnforcement::Enforced
        } else {
            MemoryEnforcement::Mps
        };
    }
    enforcement(capacity.as_deref(), &gpu.driver_version, bus)
}

#[cfg(test)]
mod tests;
