//! A whole GPU (docs/design.md §7, "Whole GPUs"): a GPU with MIG mode off, held by one claim.
//! Nothing is created, looked for or destroyed on the GPU: its record holds no instance, its
//! CDI device gives the GPU's device node `/dev/nvidia<minor>` and its UUID, and its placement
//! is every memory slice of its GPU, so it overlaps every MIG instance of that GPU. Before anything is
//! recorded its GPU must answer with the UUID it was published with and MIG mode off, or one
//! DAS may switch off ([`crate::claims::kinds::whole_gpus_against_inventory`]).

use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::error::WholeGpuRefusal;
use crate::claims::kinds::{
    CdiPlace, Failed, GpuMode, GpuTxn, Holding, Kind, KindId, Planned, Precheck, gpu_edits,
    gpu_status, whole_gpus_against_inventory,
};
use crate::gpu::MigInstance;
use crate::publish::devices::{DeviceKind, DeviceRef};
use das_api::claim_status::DeviceStatusData;

pub(crate) mod plan;

#[cfg(test)]
mod tests;

/// The whole-GPU kind.
pub(crate) struct WholeGpuKind;

#[tonic::async_trait]
impl Kind for WholeGpuKind {
    fn id(&self) -> KindId {
        KindId::WholeGpu
    }

    fn serves(&self, at: &DeviceRef) -> bool {
        at.kind == DeviceKind::WholeGpu && !at.shared
    }

    fn recorded(&self, d: &RecordedDevice) -> bool {
        d.kind == DeviceKind::WholeGpu && d.share.is_none()
    }

    /// A device named like a whole GPU (`gpu-<index>`) this node does not publish.
    fn unpublished(&self, device: &str) -> Option<PrepareError> {
        plan::is_whole_gpu_name(device).then(|| PrepareError::WholeGpuUnavailable {
            reason: WholeGpuRefusal::Unpublished.to_string(),
            device: device.to_string(),
        })
    }

    fn gpu_mode(&self) -> GpuMode {
        GpuMode::MigOff
    }

    /// Its GPU against the backend's inventory, read now: the GPU answers, has the UUID it was
    /// published with, and MIG mode off or switchable.
    async fn precheck(&self, planned: &[&Planned], cx: &Precheck<'_>) -> Result<(), PrepareError> {
        whole_gpus_against_inventory(planned, cx).await
    }

    fn creates_instance(&self) -> bool {
        false
    }

    /// Nothing to create: the GPU's device node, as published.
    async fn acquire(&self, _i: usize, p: &Planned, _tx: &GpuTxn<'_>) -> Result<Holding, Failed> {
        Ok(Holding::WholeGpu {
            minor: p.at.gpu_minor,
        })
    }

    /// Its GPU's device node while this node publishes it whole; a live MIG instance on its
    /// GPU is never its.
    fn holding(
        &self,
        _d: &RecordedDevice,
        _live: Option<&MigInstance>,
        minor: Option<u32>,
    ) -> Option<Holding> {
        minor.map(|minor| Holding::WholeGpu { minor })
    }

    fn cdi_edits(&self, d: &RecordedDevice, h: &Holding, at: CdiPlace<'_>, dev: &mut SpecDevice) {
        gpu_edits(d, h, at, dev);
    }

    /// Its GPU's device node: the GPU is its alone.
    fn own_node(&self, _path: &str) -> bool {
        true
    }

    /// Reason `GpuPrepared`, profile `gpu`, every memory slice of its GPU, no instance.
    fn status(&self, d: &RecordedDevice, ready_time: Option<String>) -> (DeviceStatusData, String) {
        gpu_status(d, ready_time, "whole GPU")
    }

    /// A whole GPU is never carved: it is published without binding conditions.
    fn carved_before_bind(&self) -> bool {
        false
    }
}
