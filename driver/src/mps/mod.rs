//! MPS on a MIG instance (docs/design.md §7, "MPS on a slice"): one NVIDIA MPS control daemon per MIG
//! MIG instance whose claim asks for `sharing: {strategy: MPS}` (`das_api::device_config`), pinned to
//! the MIG instance's MIG UUID, with its pipe, log and shm directories under the plugin's state
//! directory; the claim's containers reach it through the pipe directory their CDI edits mount.
//!
//! - [`layout`]: where a daemon's directories are and what a container sees of them. Pure.
//! - [`commands`]: the daemon's environment, the control commands that set its limits, and the
//!   check of the limits against the MIG instance. Pure.
//! - [`shm`]: the daemon's shm directory, a tmpfs of `--mps-shm-size` (mountinfo parsing pure;
//!   the mount, unmount and statvfs calls).
//! - [`daemon`]: one daemon process: the control binary (NVIDIA's `nvidia-cuda-mps-control`
//!   from the driver files, or the emulated GPUs' stand-in), its directories, starting it in
//!   the foreground, its pid file (to adopt a live daemon after a plugin restart), killing it.
//! - [`launch`]: what starts a daemon, as data, and the one function that starts it (the
//!   plugin's own start and the MPS host's).
//! - [`host`]: the MPS host (`das-kubelet-plugin mps-host`), a per-node process that starts
//!   and reaps the daemons on the plugin's request, so they outlive an upgrade or a crash of
//!   the plugin; and the plugin's client of it.
//! - [`control`]: its control commands through the binary's client mode: limits, and with
//!   protocol 3 the MIG instance's server and its namespaces.
//! - [`settings`]: the node-wide settings of the flags: protocol, shm, pipe mount. Pure.
//! - [`supervisor`]: [`MpsDaemons`], the daemons the plugin runs: started by a prepare,
//!   restarted with bounded backoff when one exits (its limits applied again), brought back at
//!   start-up, stopped by the release of their claim; and their metrics.
//! - [`stand_in`]: the stand-in daemon of emulated GPUs (`das-kubelet-plugin
//!   mps-control-stand-in`), which behaves as `nvidia-cuda-mps-control` does for DAS and records
//!   every command it gets, so tests can read the limits.

use serde::{Deserialize, Serialize};

pub mod commands;
pub mod control;
pub mod daemon;
pub mod host;
pub mod launch;
pub mod layout;
pub mod settings;
pub mod shm;
pub mod stand_in;
pub mod supervisor;

pub use commands::{Namespace, Protocol, ProtocolChoice};
pub use daemon::{ControlBinary, DaemonSpec, MpsError};
pub use layout::MpsDirs;
pub use shm::Shm;
pub use supervisor::{Backoff, MpsDaemons};

/// The limits an MPS device's daemon sets as its defaults for every client (from the claim's
/// `sharing.mps`, `das_api::device_config::MpsConfig`), as the checkpoint records them
/// (`RecordedDevice::mps`): the presence of the record is what makes a device an MPS device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsLimits {
    /// The share of the MIG instance's multiprocessors a client may use, in percent (1 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u8>,
    /// The device memory a client may pin, in MiB.
    #[serde(
        default,
        rename = "pinnedDeviceMemoryLimitMiB",
        skip_serializing_if = "Option::is_none"
    )]
    pub pinned_device_memory_limit_mib: Option<u64>,
}

impl MpsLimits {
    /// The limits of a decoded config.
    ///
    /// # Errors
    /// The pinned memory limit is no valid quantity
    /// ([`das_api::device_config::MpsConfig::pinned_device_memory_limit_mib`]).
    pub(crate) fn from_config(
        c: &das_api::device_config::MpsConfig,
    ) -> Result<Self, das_api::device_config::PinnedLimitError> {
        Ok(Self {
            active_thread_percentage: c.active_thread_percentage,
            pinned_device_memory_limit_mib: c.pinned_device_memory_limit_mib()?,
        })
    }
}

#[cfg(test)]
mod tests;
