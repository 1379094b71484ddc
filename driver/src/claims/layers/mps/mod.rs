//! MPS as a layer (docs/design.md §7, "MPS on a slice"): a device whose config says
//! `sharing: {strategy: MPS}` is prepared as its kind prepares it, and its claim's containers
//! then share what it holds through NVIDIA's CUDA Multi-Process Service, one control daemon per
//! MIG instance. The claim's configs give each device its limits ([`plan`]); a prepare checks them and
//! that MPS is available before anything is created ([`MpsLayer::check`]); the daemon starts
//! once the MIG instance exists and before the CDI spec is written, and stops before the MIG instance is
//! destroyed ([`daemons`]); the CDI device mounts its pipe and shm directories ([`cdi`]). Its
//! record carries the limits (checkpoint version 6), so start-up brings the daemon back.
//! [`crate::mps::MpsDaemons`] runs and supervises the daemons.

use std::sync::Arc;

use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{CheckpointStore, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::{Kinds, NodeDevices, Planned};
use crate::claims::layers::Layer;
use crate::claims::{ClaimLocks, PrepareError};
use crate::mps::MpsDaemons;
use crate::mps::supervisor::NO_BINARY;
use crate::publish::devices::DeviceKind;

pub(crate) mod cdi;
mod daemons;
pub(crate) mod plan;

/// The MPS layer: the daemons of the MPS devices, and one lock per daemon.
pub(crate) struct MpsLayer {
    /// The MPS control daemons of MPS devices.
    daemons: Arc<MpsDaemons>,
    /// One lock per MPS daemon ID, held while a daemon of a shared slice is started or stopped:
    /// its shares' prepares start it concurrently (each under its own claim's lock).
    locks: ClaimLocks,
}

impl MpsLayer {
    /// The layer over `daemons`.
    pub fn new(daemons: Arc<MpsDaemons>) -> Self {
        Self {
            daemons,
            locks: ClaimLocks::default(),
        }
    }
}

#[tonic::async_trait]
impl Layer for MpsLayer {
    fn worn_by(&self, d: &RecordedDevice) -> bool {
        d.mps.is_some()
    }

    /// Each MPS device's limits fit its MIG instance, and MPS is available on this node if a device
    /// needs it.
    ///
    /// # Errors
    /// [`PrepareError::MpsDaemon`] (no control binary), [`PrepareError::InvalidConfig`] (a
    /// pinned memory limit above the MIG instance's memory).
    fn check(&self, planned: &[Planned], node: &NodeDevices) -> Result<(), PrepareError> {
        // The claim's own mistake first: it is one whatever the node.
        plan::check_limits(planned, |p| {
            if p.at.kind == DeviceKind::WholeGpu {
                return node.whole_gpu_memory_mib.get(&p.at.gpu_index).copied();
            }
            let model = node.models.get(&p.at.gpu_index)?;
            model.profile(&p.at.profile).map(|(_, g)| g.memory_mib)
        })?;
        match planned.iter().find(|p| p.mps.is_some()) {
            Some(p) if !self.daemons.available() => Err(PrepareError::MpsDaemon {
                device: p.device.clone(),
                reason: NO_BINARY.to_string(),
            }),
            _ => Ok(()),
        }
    }

    async fn put_on(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), PrepareError> {
        self.start(claim, devices).await
    }

    /// A share whose MIG instance other shares keep leaves it (its namespace goes), then the daemons
    /// of the devices released stop.
    async fn take_off(
        &self,
        claim: &ClaimRef,
        leaving: &[RecordedDevice],
        kept: &[RecordedDevice],
    ) {
        self.leave(claim, kept).await;
        // An MPS server keeps its MIG instance in use: its daemon goes first.
        self.stop(claim, leaving).await;
    }

    fn cdi_edits(&self, claim_uid: &str, devices: &[RecordedDevice], specs: &mut [SpecDevice]) {
        cdi::add_mps_mounts(specs, devices, |d| self.mounts(claim_uid, d));
    }

    async fn restore(&self, kept: &[(ClaimRef, Vec<RecordedDevice>)]) {
        self.bring_back(kept).await;
    }

    async fn remove_unrecorded(&self, records: &CheckpointStore) {
        self.stop_unrecorded(records).await;
    }
}

/// Whose daemon serves `d` of claim `claim_uid` (the key of its ID and directories): whose
/// instance it is, as its kind says ([`crate::claims::kinds::Kind::owner`]): the claim's, or for
/// a share the shared MIG instance's or whole GPU's, named by its GPU's UUID (the device name
/// gives the placement).
fn daemon_owner<'a>(claim_uid: &'a str, d: &'a RecordedDevice) -> &'a str {
    Kinds::standard().of_record(d).owner(claim_uid, d)
}
