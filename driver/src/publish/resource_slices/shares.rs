//! Which profiles get shareable devices and which Kubernetes servers may be given them (pure;
//! docs/design.md §7, "Shared slices").

use std::collections::BTreeSet;

use dra_plugin::resourceslice::ServerVersion;

use super::SharePolicy;
use crate::gpu::GiProfile;

/// Which profiles also get shareable devices (docs/design.md §7, "Shared slices"), and how they
/// are cut. The default shares nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedProfiles {
    /// Profile names (`1g.10gb`) or compute sizes (`1g`: every profile of one compute slice).
    pub selectors: Vec<String>,
    /// Shares and memory step of every shareable device.
    pub policy: SharePolicy,
    /// The UUIDs of the GPUs whose memory shares the kernel enforces (a cgroup v2 `dmem`
    /// region and a driver that sets its limits; docs/design.md §7, "Memory slices of a whole
    /// GPU"): their shareable whole-GPU device says `memoryEnforcement: enforced`, every other
    /// says `mps`.
    pub memory_enforced: BTreeSet<String>,
}

impl SharedProfiles {
    /// Whether `profile` gets shareable devices: named, or of a listed compute size.
    pub fn matches(&self, profile: &GiProfile) -> bool {
        let size = format!("{}g", profile.compute_slices);
        self.selectors
            .iter()
            .any(|s| *s == profile.name || *s == size)
    }

    /// Whether whole GPUs get shareable devices (memory slices of a whole GPU): the selector
    /// [`das_api::WHOLE_GPU_PROFILE`] (`gpu`) is listed.
    pub fn whole_gpus(&self) -> bool {
        self.selectors
            .iter()
            .any(|s| s == das_api::WHOLE_GPU_PROFILE)
    }
}

/// Whether a Kubernetes server of version `major.minor.patch` may be given shareable devices
/// (docs/design.md §7, "Shared slices"): 1.37 and newer, and 1.36 from 1.36.2.
///
/// # Errors
/// Why not, for the log and the docs ([`ServerVersion::shareable_devices`] gives the sources).
pub fn shares_supported(major: u32, minor: u32, patch: u32) -> Result<(), String> {
    let version = ServerVersion {
        major,
        minor,
        patch,
    };
    version.shareable_devices().map_err(|e| e.to_string())
}
