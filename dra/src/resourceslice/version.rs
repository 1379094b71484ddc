//! The API server's version ([`ServerVersion`]) and what a server of that version can be given
//! (pure). The facts, with their sources, are in docs/reference/dra.md.

use k8s_openapi::apimachinery::pkg::version::Info;

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

/// Why a server cannot be given a gated field (for the log: what the server lacks, and the
/// version that has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// 1.34 and 1.35: `DRADeviceBindingConditions` is alpha and off.
    #[error(
        "Kubernetes 1.{minor} has binding conditions (DRADeviceBindingConditions) alpha and off: its scheduler would treat devices with binding conditions as unselectable; binding conditions need 1.36 or newer"
    )]
    BindingConditionsAlpha {
        /// The server's minor version.
        minor: u32,
    },
    /// 1.34 and 1.35: `DRAConsumableCapacity` is alpha and off, and the scheduler miscounts
    /// shares.
    #[error(
        "Kubernetes 1.{minor} has consumable capacity (DRAConsumableCapacity) alpha and off, and its scheduler can give a placement that overlaps a shared one (kubernetes/kubernetes#139034); shareable devices need 1.36.2 or newer"
    )]
    ConsumableCapacityAlpha {
        /// The server's minor version.
        minor: u32,
    },
    /// 1.36.0 and 1.36.1: shares already committed are ignored when counters are recounted.
    #[error(
        "Kubernetes 1.36.{patch} can give a placement that overlaps a shared one (kubernetes/kubernetes#139034, fixed in 1.36.2); upgrade to 1.36.2 or newer"
    )]
    SharesRecount {
        /// The server's patch version.
        patch: u32,
    },
    /// A version this crate knows nothing of (before 1.34, or another major).
    #[error("Kubernetes {major}.{minor} is not supported for {what}; they need {needs} or newer")]
    Unknown {
        /// The server's major version.
        major: u32,
        /// The server's minor version.
        minor: u32,
        /// What was asked for (`binding conditions`, `shareable devices`).
        what: &'static str,
        /// The oldest version that has it.
        needs: &'static str,
    },
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

    /// Whether the server may be given devices with binding conditions (KEP-5007): 1.36 and
    /// newer (`DRADeviceBindingConditions` beta and on). On 1.34–1.35 the gate is alpha and
    /// off: the API server drops the fields, and a scheduler with the gate off treats such
    /// devices as unselectable.
    ///
    /// # Errors
    /// Why not.
    pub fn binding_conditions(self) -> Result<(), Unsupported> {
        match (self.major, self.minor) {
            (1, m) if m >= 36 => Ok(()),
            (1, minor @ (34 | 35)) => Err(Unsupported::BindingConditionsAlpha { minor }),
            (major, minor) => Err(Unsupported::Unknown {
                major,
                minor,
                what: "binding conditions",
                needs: "1.36",
            }),
        }
    }

    /// Whether the server may be given shareable devices (`allowMultipleAllocations`, KEP-5075)
    /// that consume shared counters: 1.37 and newer, and 1.36 from 1.36.2.
    ///
    /// # Errors
    /// Why not (KEP-5075 `DRAConsumableCapacity` is alpha and off in 1.34–1.35, beta and on
    /// from 1.36; kubernetes/kubernetes#134100: on 1.34 the second share of a device that
    /// consumes counters fails once the counters run out; #139034: before 1.36.2 and 1.37
    /// shares already committed are ignored when the scheduler recounts counters, so it can
    /// hand out a device that overlaps a shared one).
    pub fn shareable_devices(self) -> Result<(), Unsupported> {
        match (self.major, self.minor) {
            (1, m) if m >= 37 => Ok(()),
            (1, 36) if self.patch >= 2 => Ok(()),
            (1, 36) => Err(Unsupported::SharesRecount { patch: self.patch }),
            (1, minor @ (34 | 35)) => Err(Unsupported::ConsumableCapacityAlpha { minor }),
            (major, minor) => Err(Unsupported::Unknown {
                major,
                minor,
                what: "shareable devices",
                needs: "1.36.2",
            }),
        }
    }
}

#[cfg(test)]
mod tests;
