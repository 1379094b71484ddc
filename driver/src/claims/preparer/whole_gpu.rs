//! What the preparer does for whole GPUs (docs/design.md §7, "Whole GPUs"): before a prepare
//! records one, it checks that the GPU is in the backend's inventory with MIG mode off, or one
//! DAS may switch off (the switch itself comes later, under the GPU's lock); after,
//! a whole GPU's CDI spec needs only its GPU's device node, taken from what this node publishes.
//! Nothing is created, looked for or destroyed on the GPU.

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::plan::{self, DeviceKind, Holding, Planned};
use crate::gpu::MigInstance;

impl Preparer {
    /// Checks every planned whole GPU against the backend's inventory, read now: the GPU
    /// answers, has the UUID it was published with, and MIG mode off or switchable. No-op (no
    /// backend call)
    /// for a claim without whole GPUs.
    ///
    /// # Errors
    /// [`PrepareError::WholeGpuUnavailable`] for the first whole GPU that cannot be prepared.
    pub(crate) async fn check_whole_gpus(&self, planned: &[Planned]) -> Result<(), PrepareError> {
        let whole: Vec<&Planned> = planned
            .iter()
            .filter(|p| p.at.kind == DeviceKind::WholeGpu)
            .collect();
        let Some(first) = whole.first() else {
            return Ok(());
        };
        let gpu = first.at.gpu_index;
        let mut inventory = self.gpus.call(gpu, |b| b.inventory()).await.map_err(|e| {
            PrepareError::WholeGpuUnavailable {
                device: first.device.clone(),
                reason: format!("the node's GPUs cannot be read ({e}); the kubelet retries"),
            }
        })?;
        // Whether a GPU may be switched is the request path's to say since start-up.
        for g in &mut inventory {
            g.mig_switch = self.modes.switch_of(g.index);
        }
        for p in whole {
            if let Some(reason) = plan::whole_gpu_unavailable(p, &inventory) {
                return Err(PrepareError::WholeGpuUnavailable {
                    device: p.device.clone(),
                    reason,
                });
            }
        }
        Ok(())
    }

    /// The minor of whole GPU `d`'s device node, from the devices this node publishes; `None`
    /// when it no longer publishes that GPU whole (the plugin restarted without `--whole-gpus`,
    /// or the GPU changed).
    pub(crate) fn whole_gpu_minor(&self, d: &RecordedDevice) -> Option<u32> {
        self.node
            .devices
            .get(&d.device)
            .filter(|r| r.kind == DeviceKind::WholeGpu && r.gpu_uuid == d.gpu_uuid)
            .map(|r| r.gpu_minor)
    }

    /// What each of `devices` holds ([`plan::holdings`]), the whole GPUs' device nodes from
    /// what this node publishes.
    pub(crate) fn holdings(
        &self,
        devices: &[RecordedDevice],
        matched: &[Option<MigInstance>],
    ) -> Vec<Option<Holding>> {
        plan::holdings(devices, matched, |d| self.whole_gpu_minor(d))
    }
}
