//! The request path's gauges, set from the checkpoint after every change of what is prepared:
//! prepared MIG instances and memory slices per GPU, free placements per GPU and profile, and MIG instances
//! waiting for the reaper.

use super::Preparer;
use crate::claims::checkpoint::PrepareState;
use crate::claims::plan;

impl Preparer {
    /// Sets the prepared-slices and free-placements gauges of every GPU (0 for an idle one).
    pub(crate) fn update_prepared_gauge(&self) {
        let checkpoint = &self.records.checkpoint;
        let mut per_gpu = checkpoint.read(|cp| {
            plan::per_gpu(
                cp.claims
                    .values()
                    .filter(|r| r.state == PrepareState::PrepareCompleted)
                    .flat_map(|r| &r.devices),
            )
        });
        // Every GPU gets a sample, 0 when idle, so dashboards see idle GPUs too.
        for gpu in self.gpus.gpu_indices() {
            per_gpu.entry(gpu).or_default();
        }
        for (gpu, model) in &self.node.models {
            let free = checkpoint.read(|cp| {
                plan::free_placements(
                    model,
                    cp.claims
                        .values()
                        .flat_map(|r| &r.devices)
                        .filter(|d| d.gpu_index == *gpu),
                )
            });
            self.metrics.set_free_placements(*gpu, &free);
        }
        let carved = checkpoint.read(|cp| {
            cp.claims
                .values()
                .filter(|r| r.state == PrepareState::Carved)
                .map(|r| r.devices.len() as i64)
                .sum()
        });
        self.metrics.set_carved(carved);
        self.metrics.set_prepared(
            per_gpu
                .into_iter()
                .map(|(gpu, u)| (gpu, u.instances, u.memory_slices)),
        );
    }

    /// Sets the gauges of MIG instances waiting for the reaper (devices of `Releasing` records) and of
    /// guards without instances (`Repairing` records).
    pub(crate) fn update_pending_gauge(&self) {
        let pending = self.records.checkpoint.read(|cp| {
            cp.claims
                .values()
                .filter(|r| r.state == PrepareState::Releasing)
                .map(|r| r.devices.len() as i64)
                .sum()
        });
        self.metrics.set_pending_destroy(pending);
        let repairing = self.records.checkpoint.read(|cp| {
            cp.claims
                .values()
                .filter(|r| r.state == PrepareState::Repairing)
                .count() as i64
        });
        self.metrics.set_repairing(repairing);
    }

    /// Refreshes the gauges from the checkpoint (after start-up).
    pub(crate) fn update_gauges(&self) {
        self.update_prepared_gauge();
        self.update_pending_gauge();
    }
}
