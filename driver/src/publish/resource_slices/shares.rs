//! Which profiles get shareable devices and which Kubernetes servers may be given them (pure;
//! docs/design.md §7, "Shared slices").

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
}

impl SharedProfiles {
    /// Whether `profile` gets shareable devices: named, or of a listed compute size.
    pub fn matches(&self, profile: &GiProfile) -> bool {
        let size = format!("{}g", profile.compute_slices);
        self.selectors
            .iter()
            .any(|s| *s == profile.name || *s == size)
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
