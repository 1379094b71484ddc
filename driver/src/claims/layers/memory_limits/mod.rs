//! Kernel-enforced memory limits as a layer (docs/design.md §7, "Memory slices of a whole GPU"
//! and "Memory limits the kernel enforces"): a share of a whole GPU whose GPU is `enforced`
//! (its memory a cgroup v2 `dmem` region the driver sets limits on) gets, in its CDI device, the
//! `createRuntime` hook that caps each of its containers at the share's `memory`
//! ([`crate::claims::memory_limits`]). Nothing runs between prepare and release: the runtime
//! runs the hook once per container, and a hard limit goes with the container's cgroup, so
//! there is nothing to put on, take off or bring back.

use std::collections::BTreeMap;

use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{CheckpointStore, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::{NodeDevices, Planned};
use crate::claims::layers::Layer;
use crate::claims::memory_limits::MemoryLimits;
use crate::gpu::GpuInfo;

/// The memory-limit layer: how limits are set, and this node's GPUs by UUID (what a hook
/// names of its GPU).
pub(crate) struct MemoryLimitLayer {
    limits: Option<MemoryLimits>,
    gpus: BTreeMap<String, GpuInfo>,
}

impl MemoryLimitLayer {
    /// The layer over `limits` (`None`: no GPU of this node gets a hook) for the GPUs of
    /// `inventory`.
    pub(crate) fn new(limits: Option<MemoryLimits>, inventory: &[GpuInfo]) -> Self {
        Self {
            limits,
            gpus: inventory
                .iter()
                .map(|g| (g.uuid.clone(), g.clone()))
                .collect(),
        }
    }

    /// The hook capping a container of share `d` at its memory, where its GPU is enforced.
    fn hook_of(&self, d: &RecordedDevice) -> Option<crate::claims::cdi::Hook> {
        let (limits, share) = (self.limits.as_ref()?, d.share.as_ref()?);
        let gpu = self.gpus.get(&d.gpu_uuid)?;
        match limits.hook(gpu, share.memory_bytes) {
            Ok(hook) => hook,
            Err(e) => {
                tracing::error!(device = %d.device, error = %e,
                    "no GPU memory-limit hook for the share: its memory is held by MPS only");
                None
            }
        }
    }
}

#[tonic::async_trait]
impl Layer for MemoryLimitLayer {
    /// A share of a whole GPU (its memory is the share's; a MIG instance's memory is the
    /// hardware's).
    fn worn_by(&self, d: &RecordedDevice) -> bool {
        self.limits.is_some() && d.share.is_some() && d.is_whole_gpu()
    }

    fn check(&self, _planned: &[Planned], _node: &NodeDevices) -> Result<(), PrepareError> {
        Ok(())
    }

    async fn put_on(
        &self,
        _claim: &ClaimRef,
        _devices: &[RecordedDevice],
    ) -> Result<(), PrepareError> {
        Ok(())
    }

    async fn take_off(
        &self,
        _claim: &ClaimRef,
        _leaving: &[RecordedDevice],
        _kept: &[RecordedDevice],
    ) {
    }

    /// The hook in the CDI device of each share whose GPU is enforced.
    fn cdi_edits(&self, _claim_uid: &str, devices: &[RecordedDevice], specs: &mut [SpecDevice]) {
        for d in devices.iter().filter(|d| self.worn_by(d)) {
            let Some(hook) = self.hook_of(d) else {
                continue;
            };
            if let Some(s) = specs.iter_mut().find(|s| s.key == d.device) {
                s.hooks.push(hook);
            }
        }
    }

    async fn restore(&self, _kept: &[(ClaimRef, Vec<RecordedDevice>)]) {}

    async fn remove_unrecorded(&self, _records: &CheckpointStore) {}
}
