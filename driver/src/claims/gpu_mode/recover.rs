//! Start-up finishes what the checkpoint says a stopped plugin was switching (docs/design.md
//! §7, "MIG mode follows demand"): a switch that took effect is kept, one left pending a reset
//! is set back and the GPU no longer switched, one that never started is forgotten.

use super::{GpuModes, ModeCalls};
use crate::claims::checkpoint::CheckpointError;
use crate::gpu::on_off;

impl GpuModes {
    /// Start-up: finishes what the checkpoint says a stopped plugin was switching. A switch that
    /// took effect is kept; one left pending a reset is set back and the GPU no longer switched;
    /// one that never started is forgotten. Every record is removed. Called with no request in
    /// flight.
    ///
    /// # Errors
    /// The checkpoint could not be saved.
    pub(crate) async fn recover(&self, cx: &ModeCalls<'_>) -> Result<(), CheckpointError> {
        let switches = cx.checkpoint.read(|cp| cp.mig_mode_switches.clone());
        for (gpu, s) in switches {
            let _held = cx.gpus.lock(gpu).await;
            let to = on_off(s.mig_enabled);
            tracing::info!(gpu, to, claim = %s.claim, started_at = s.started_at,
                "finishing a MIG mode switch the checkpoint records as under way");
            let now = self.uuids.get(&gpu);
            if now != Some(&s.gpu_uuid) {
                // The GPUs changed since (another board at this index): the switch was not of
                // this GPU, whose mode is as found.
                tracing::warn!(gpu, recorded = %s.gpu_uuid, now = ?now,
                    "the GPU at this index is not the one the switch was of; forgetting it");
            } else {
                self.recover_switch(cx, gpu, s.mig_enabled).await;
            }
            cx.checkpoint
                .commit(|cp| cp.clear_mig_mode_switch(gpu))
                .await?;
        }
        Ok(())
    }

    /// Finishes one interrupted switch of GPU `gpu` to `mig_enabled` (see
    /// [`Self::recover`]). The caller holds the GPU's lock.
    async fn recover_switch(&self, cx: &ModeCalls<'_>, gpu: u32, mig_enabled: bool) {
        let to = on_off(mig_enabled);
        match cx.gpus.call(gpu, move |b| b.mig_mode(gpu)).await {
            Ok(m) if m.current == mig_enabled => {
                tracing::info!(
                    gpu,
                    to,
                    "a MIG mode switch interrupted by a restart took effect"
                );
            }
            Ok(m) if m.pending == mig_enabled => {
                let (_, reverted) = self.settle_mode(cx, gpu, m.current).await;
                let why = format!(
                    "a switch to MIG mode {to} interrupted by a restart was left pending a reset"
                );
                tracing::warn!(gpu, to, %reverted, "{why}");
                self.refuse(gpu, m.current, why, cx.metrics);
            }
            Ok(_) => {
                tracing::info!(
                    gpu,
                    to,
                    "a MIG mode switch interrupted by a restart never started"
                );
            }
            Err(e) => {
                let why = format!(
                    "its MIG mode cannot be read after a switch to {to} was interrupted ({e})"
                );
                tracing::warn!(gpu, "{why}");
                let on = self.started_on.get(&gpu).copied().unwrap_or(true);
                self.refuse(gpu, on, why, cx.metrics);
            }
        }
    }
}
