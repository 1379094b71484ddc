//! The request path as the health monitor's source of unclaimed MIG instances
//! ([`crate::health::unclaimed::UnclaimedInstances`]): only the request path knows what is
//! claimed (the checkpoint), so the monitor asks it, and health never depends on claims.

use crate::gpu::MigInstance;
use crate::health::unclaimed::UnclaimedInstances;

use super::Preparer;

/// The preparer's unclaimed instances, from each GPU's instance list as the backend last knew it
/// ([`crate::gpu::GpuBackend::cached_instances_on`]): on real GPUs NVML is read again only every
/// `INSTANCE_REFRESH` (60 s) or after a health event or a failed create or destroy, not at every
/// 5 s check; DAS's own creates and destroys show at once. So an instance made with `nvidia-smi`
/// is withdrawn within about 65 s instead of 10 s (docs/design.md §7, "Start-up").
#[tonic::async_trait]
impl UnclaimedInstances for Preparer {
    async fn unclaimed_instances(&self) -> Vec<MigInstance> {
        self.unclaimed_in(true).await
    }
}

#[cfg(test)]
mod tests;
