//! The instance cache of [`NvmlBackend`]: each GPU's MIG instance list as DAS's own creates and
//! destroys left it, served by [`GpuBackend::cached_instances_on`] for [`INSTANCE_REFRESH`].
//!
//! Every full read of a GPU's instances (either method) is kept with its time. A successful
//! [`GpuBackend::create_instance`] adds the instance it made (the same [`MigInstance`] a listing
//! gives: same profile, placement, GI, CI, MIG UUID and capability minors), a successful
//! [`GpuBackend::destroy_instance`] removes the GI it destroyed. Marked stale, so that the next
//! cached read goes to NVML:
//! - a GPU a health event names ([`GpuBackend::wait_health_events`]: XID, uncorrectable ECC),
//!   and a GPU that does not answer [`GpuBackend::inventory`] (lost: the next read fails, as
//!   without the cache);
//! - a failed destroy, `NOT_FOUND` included (the GI was already gone, or only its compute
//!   instances went), and a failed create that reached NVML (`INSUFFICIENT_RESOURCES`: someone
//!   holds the placement; or a roll-back that left a GI behind).
//!
//! Why the cached list equals NVML's whenever only DAS changes instances: DAS changes a GPU's
//! instances only through this backend (one active plugin per node, docs/design.md §7); each
//! successful change is applied to the list after NVML made it, replacing whatever the list had
//! for that GI; a change that failed leaves no list. A read runs outside the request path's
//! per-GPU lock (the health monitor's), so a change may land while NVML is being walked: the
//! read is then not kept (a generation count, bumped by every change and invalidation), and the
//! list as the change left it stays, with its older read time, so the next cached read after
//! the period reads again. A read kept is one no change overlapped, and every later change was
//! applied to it. Changes made behind DAS's back (`nvidia-smi mig -cgi` / `-dgi`) show in the
//! cached list only at the next re-read: within [`INSTANCE_REFRESH`] instead of at once. The
//! request path and start-up reconciliation call [`GpuBackend::instances_on`], which always
//! reads NVML (and refreshes the kept list for free).

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use super::NvmlBackend;
#[cfg(doc)]
use crate::gpu::GpuBackend;
use crate::gpu::nvml::NvmlApi;
use crate::gpu::{BackendError, GpuInfo, MigInstance};

/// How long [`GpuBackend::cached_instances_on`] serves a GPU's MIG instance list of the NVML
/// backend without reading NVML again, when nothing marked it stale (this module's docs). It bounds how late the health monitor's unclaimed-instance check (docs/design.md §7)
/// sees an instance made or destroyed behind DAS's back (an administrator's `nvidia-smi`): that
/// check runs every 5 s and withdraws an instance's devices once it sees it twice, so such an
/// instance is acted on within about this period plus 5 s. Twelve of the monitor's checks share
/// one NVML read (107 calls for an H100 with four instances, docs/benchmarks.md).
pub const INSTANCE_REFRESH: Duration = Duration::from_secs(60);

/// Where the backend reads the time (the instance cache's ages); a simulated clock in tests and
/// benchmarks.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// One GPU's instance list as the backend knows it.
#[derive(Debug, Default)]
pub(super) struct KnownInstances {
    /// By placement start; `None` when never read or marked stale.
    list: Option<Vec<MigInstance>>,
    /// When NVML was last read in full for the list.
    read_at: Option<Instant>,
    /// Bumped by every change and invalidation: a read that started before one is not kept.
    generation: u64,
}

impl<A: NvmlApi> NvmlBackend<A> {
    fn known(&self) -> MutexGuard<'_, BTreeMap<u32, KnownInstances>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads GPU `gpu`'s instances from NVML and keeps them, unless a change or an invalidation
    /// landed while reading (then the list as that left it stays).
    pub(super) fn read_instances(&self, gpu: &GpuInfo) -> Result<Vec<MigInstance>, BackendError> {
        let generation = self.known().entry(gpu.index).or_default().generation;
        let mut out = self.instances_of(gpu)?;
        out.sort_by_key(|s| s.placement.start);
        let mut known = self.known();
        let k = known.entry(gpu.index).or_default();
        if k.generation == generation {
            k.list = Some(out.clone());
            k.read_at = Some((self.clock)());
        }
        Ok(out)
    }

    /// The kept list of GPU `gpu` when it is younger than the refresh period.
    pub(super) fn fresh_known(&self, gpu: u32) -> Option<Vec<MigInstance>> {
        let now = (self.clock)();
        let known = self.known();
        let k = known.get(&gpu)?;
        let age = now.saturating_duration_since(k.read_at?);
        (age < self.refresh).then(|| k.list.clone()).flatten()
    }

    /// Applies DAS's own change to GPU `gpu`'s kept list: `gi_id` removed, then `added` (if any)
    /// put in by placement. Any entry with that GI (a read that overlapped the change) is
    /// replaced.
    pub(super) fn note_change(&self, gpu: u32, gi_id: u32, added: Option<&MigInstance>) {
        let mut known = self.known();
        let k = known.entry(gpu).or_default();
        k.generation += 1;
        if let Some(list) = &mut k.list {
            list.retain(|s| s.gi_id != gi_id);
            if let Some(s) = added {
                let at = list.partition_point(|x| x.placement.start <= s.placement.start);
                list.insert(at, s.clone());
            }
        }
    }

    /// Marks GPU `gpu`'s kept list stale: the next cached read goes to NVML.
    pub(super) fn invalidate(&self, gpu: u32, why: &dyn std::fmt::Display) {
        tracing::debug!(gpu, reason = %why, "MIG instance list marked stale");
        let mut known = self.known();
        let k = known.entry(gpu).or_default();
        k.generation += 1;
        k.list = None;
    }
}
