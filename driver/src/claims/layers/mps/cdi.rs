//! What a container of an MPS device gets of its MIG instance's MPS control daemon (docs/design.md
//! §7, "MPS on a slice", *CDI*): the pipe directory (the daemon's, or with protocol 3 only its
//! namespace's), the shm tmpfs as `/dev/shm`, and with protocol 2 a share's limits in its
//! environment.

use super::{MpsLayer, daemon_owner};
use crate::claims::cdi::{MpsMounts, ShareLimits, SpecDevice};
use crate::claims::checkpoint::RecordedDevice;
use crate::mps::Protocol;
use crate::mps::commands::namespace_name;
use crate::mps::supervisor::PipeMount;

/// Gives each CDI device of a device served with MPS (`RecordedDevice::mps`) its daemon's
/// mounts (`mounts`, from the device). Records of the first release, whose CDI devices are
/// per request, have no MPS device.
pub(crate) fn add_mps_mounts(
    specs: &mut [SpecDevice],
    devices: &[RecordedDevice],
    mounts: impl Fn(&RecordedDevice) -> MpsMounts,
) {
    for d in devices.iter().filter(|d| d.mps.is_some()) {
        if let Some(s) = specs.iter_mut().find(|s| s.key == d.device) {
            s.mps = Some(mounts(d));
        }
    }
}

impl MpsLayer {
    /// What a container of MPS device `d` of claim `claim_uid` mounts of its daemon: protocol
    /// 2, the daemon's pipe directory, and a share's limits in its environment (cooperative: a
    /// client may change them); protocol 3, only its namespace's directory (the server applies
    /// the namespace's limits, so none are set in the environment: a
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` naming a device the client cannot see would drop every
    /// pinned limit, the namespace's included).
    pub(super) fn mounts(&self, claim_uid: &str, d: &RecordedDevice) -> MpsMounts {
        let dirs = self.daemons.dirs(daemon_owner(claim_uid, d), &d.device);
        let settings = self.daemons.settings();
        let namespace = namespace_name(claim_uid, &d.device);
        MpsMounts {
            pipe_dir: dirs
                .client_pipe_dir(settings.protocol, &namespace)
                .display()
                .to_string(),
            pipe_read_only: settings.pipe_mount == PipeMount::ReadOnly,
            shm_dir: dirs.shm.display().to_string(),
            share: d
                .share
                .as_ref()
                .filter(|_| settings.protocol == Protocol::V2)
                .map(|s| ShareLimits {
                    thread_percentage: s.thread_percentage(),
                    pinned_memory_mib: s.memory_mib(),
                }),
        }
    }
}
