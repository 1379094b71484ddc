//! Which profiles get shareable devices and which Kubernetes servers may be given them (pure;
//! docs/design.md §7, "Shared slices").

use k8s_openapi::apimachinery::pkg::version::Info;

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

/// A Kubernetes server's version, as `/version` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version (0 when the server does not say).
    pub patch: u32,
}

impl ServerVersion {
    /// From `/version`: the numbers of `gitVersion` (`v1.37.2`, `v1.36.2-rc.0+k3s1`), else the
    /// `major` and `minor` fields (a trailing `+` dropped) with patch 0.
    pub fn from_info(info: &Info) -> Self {
        let git = info
            .git_version
            .trim_start_matches('v')
            .split(['-', '+'])
            .next()
            .unwrap_or_default();
        let parts: Vec<Option<u32>> = git.split('.').map(|p| p.parse().ok()).collect();
        if let [Some(major), Some(minor), Some(patch)] = parts[..] {
            return Self {
                major,
                minor,
                patch,
            };
        }
        let num = |s: &str| s.trim_end_matches('+').parse::<u32>().unwrap_or(0);
        Self {
            major: num(&info.major),
            minor: num(&info.minor),
            patch: 0,
        }
    }
}

/// Whether a Kubernetes server of version `major.minor.patch` may be given shareable devices
/// (docs/design.md §7, "Shared slices"): 1.37 and newer, and 1.36 from 1.36.2.
///
/// # Errors
/// Why not, for the log and the docs (sources: KEP-5075 `DRAConsumableCapacity` is alpha and off
/// in 1.34–1.35, beta and on from 1.36; kubernetes/kubernetes#134100: on 1.34 the second share
/// of a device that consumes counters fails once the counters run out; #139034: before 1.36.2
/// and 1.37 shares already committed are ignored when the scheduler recounts counters, so it can
/// hand out a placement that overlaps a shared one).
pub fn shares_supported(major: u32, minor: u32, patch: u32) -> Result<(), String> {
    match (major, minor) {
        (1, m) if m >= 37 => Ok(()),
        (1, 36) if patch >= 2 => Ok(()),
        (1, 36) => Err(format!(
            "Kubernetes 1.36.{patch} can give a placement that overlaps a shared one (kubernetes/kubernetes#139034, fixed in 1.36.2); upgrade to 1.36.2 or newer"
        )),
        (1, m @ (34 | 35)) => Err(format!(
            "Kubernetes 1.{m} has consumable capacity (DRAConsumableCapacity) alpha and off, and its scheduler can give a placement that overlaps a shared one (kubernetes/kubernetes#139034); shared slices need 1.36.2 or newer"
        )),
        _ => Err(format!(
            "Kubernetes {major}.{minor} is not supported for shared slices; they need 1.36.2 or newer"
        )),
    }
}
