//! NodeUnprepareResources, and the release of a claim's instances it shares with the roll-back
//! of a failed prepare, the reaper and the orphan rule: stop the MPS control daemons of its MPS
//! devices, destroy exactly the recorded instances (GPUs in parallel, each under its lock; a
//! device whose kind says other claims keep its instance, a share of a MIG instance other shares
//! hold, leaves it to them),
//! delete the CDI spec, and drop the record only once every instance is confirmed gone; what is
//! left stays recorded as `Releasing`. A whole GPU has no instance: its release is its spec's
//! and its record's, and never touches the GPU.
//!
//! A record whose devices the kubelet holds
//! ([`crate::claims::checkpoint::ClaimRecord::is_handed`]) is dropped only by a
//! release *for good*: the kubelet's unprepare, or the orphan rule's. Any other release of it
//! (a repair, the roll-back of a failed repair, start-up finishing one) keeps it as a guard
//! without instances (`Repairing`): the pod's containers may still hold the destroyed
//! instances' device nodes, so its placements and its GPUs' MIG mode stay held
//! (docs/design.md §7, "A slice leaves its claim").

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::checkpoint::{PrepareState, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::plan;
use crate::gpu::{BackendError, MigInstance};

/// Retries of a destroy that NVML answers with `IN_USE` (processes still exiting). A release
/// pauses without the GPU's lock, so other claims' calls on that GPU go on meanwhile.
const DESTROY_RETRIES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// A device whose instance is still there after a release, and why.
#[derive(Debug, Clone)]
struct Remaining {
    /// The device, with its instance where one was matched.
    device: RecordedDevice,
    /// What the destroy (or the listing of its GPU) answered, naming the instance.
    failure: String,
    /// The GPU is lost: the instance goes when the GPU answers again.
    gpu_lost: bool,
    /// [`BackendError::kind`] of the failure, the metric label.
    cause: &'static str,
}

impl Preparer {
    /// Unprepares one claim: stops its status write, releases its instances. Idempotent; a claim
    /// without a record only has its CDI spec removed (if any).
    ///
    /// MIG instances left on a lost GPU do not fail the call: the claim stays recorded and the reaper
    /// destroys them when the GPU answers again, while the kubelet can finish the pod.
    ///
    /// # Errors
    /// MIG instances that could not be destroyed (the kubelet retries; the reaper does too).
    pub async fn unprepare_claim(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let _held = self.records.locks.lock(&claim.uid).await;
        self.api.status.stop(&claim.uid).await;
        let Some(record) = self.record_of(&claim.uid) else {
            self.cdi.delete(&claim.uid)?;
            return Ok(());
        };
        let r = self.release_for_good(claim, record.devices).await;
        self.update_prepared_gauge();
        match r {
            Err(PrepareError::Destroy {
                only_lost_gpus: true,
                failures,
            }) => {
                tracing::warn!(failures = ?failures,
                    "unprepared; slices on a lost GPU stay recorded until it answers again");
                Ok(())
            }
            other => other,
        }
    }

    /// Destroys exactly the recorded instances of `devices` (and, for devices recorded without
    /// an instance, the instance at their placement that nobody else records), deletes the CDI
    /// spec, and drops the record once every instance is confirmed gone. Otherwise the record
    /// becomes `Releasing` with what is left, and the reaper takes it over. The caller holds
    /// the claim's lock.
    ///
    /// # Errors
    /// [`PrepareError::Destroy`] naming every instance left; [`PrepareError::Cdi`] when only the
    /// spec could not be deleted.
    pub(crate) async fn release(
        &self,
        claim: &ClaimRef,
        devices: Vec<RecordedDevice>,
    ) -> Result<(), PrepareError> {
        self.release_as(claim, devices, false).await
    }

    /// [`Self::release`] for good: the kubelet unprepared the claim, or the orphan rule found no
    /// container left that could use its instances. The record stops guarding its placements
    /// and is dropped once they are gone.
    ///
    /// # Errors
    /// As [`Self::release`].
    pub(crate) async fn release_for_good(
        &self,
        claim: &ClaimRef,
        devices: Vec<RecordedDevice>,
    ) -> Result<(), PrepareError> {
        self.release_as(claim, devices, true).await
    }

    /// In a child span `release` of the claim's (the callers' spans carry the claim), with
    /// `for_good`.
    #[tracing::instrument(name = "release", level = "error", skip_all, fields(for_good = for_good))]
    async fn release_as(
        &self,
        claim: &ClaimRef,
        devices: Vec<RecordedDevice>,
        for_good: bool,
    ) -> Result<(), PrepareError> {
        // A completed (or carved) record always holds live instances: mark it releasing before the first
        // destroy, so a crash half-way leaves a record start-up finishes, not a completed one
        // with instances missing. A record with a share is marked too, whatever its state:
        // the mark is what tells other shares (and their releases) that this one is leaving.
        // A release for good marks every record the kubelet holds: the mark ends its guard.
        let shared = |d: &RecordedDevice| self.kinds.of_record(d).shared_by_claims();
        let mark = self.records.checkpoint.read(|cp| {
            cp.get(&claim.uid).is_some_and(|r| {
                matches!(
                    r.state,
                    PrepareState::PrepareCompleted | PrepareState::Carved
                ) || (r.state == PrepareState::PrepareStarted && r.devices.iter().any(shared))
                    || (for_good && r.is_handed())
            })
        });
        if mark {
            let marked = devices.clone();
            self.records
                .checkpoint
                .commit(|cp| {
                    if for_good {
                        cp.set_releasing_for_good(&claim.uid, &claim.namespace, &claim.name, marked)
                    } else {
                        cp.set_releasing(&claim.uid, &claim.namespace, &claim.name, marked)
                    }
                })
                .await?;
        }
        // A share whose MIG instance other shares keep leaves it, and its MPS daemon, to them
        // (docs/design.md §7, "Shared slices"; its kind decides). Decided after the mark: a
        // share joins only a MIG instance some share holds that is not being released, so none joins
        // after this.
        let (devices, kept): (Vec<RecordedDevice>, Vec<RecordedDevice>) =
            self.records.checkpoint.read(|cp| {
                devices
                    .into_iter()
                    .partition(|d| !self.kinds.of_record(d).kept_by_others(cp, &claim.uid, d))
            });
        for d in &kept {
            tracing::debug!(device = %d.device, "other shares keep the slice");
        }
        // What runs there keeps an instance in use (an MPS server): the layers go first.
        self.layers.take_off(claim, &devices, &kept).await;
        let remaining = self.destroy_devices(&claim.uid, devices).await;
        let spec = self.cdi.delete(&claim.uid);
        if remaining.is_empty() && spec.is_ok() {
            self.forget(claim).await;
            return Ok(());
        }
        let left: Vec<RecordedDevice> = remaining.iter().map(|r| r.device.clone()).collect();
        if let Err(e) = self
            .records
            .checkpoint
            .commit(|cp| cp.set_releasing(&claim.uid, &claim.namespace, &claim.name, left))
            .await
        {
            tracing::error!(error = %e, "saving the checkpoint failed");
        }
        self.lifecycle.reaper.schedule(&claim.uid);
        self.update_pending_gauge();
        for r in &remaining {
            self.metrics.destroy_failed(r.cause);
        }
        if let Err(e) = spec
            && remaining.is_empty()
        {
            return Err(e.into());
        }
        Err(PrepareError::Destroy {
            only_lost_gpus: remaining.iter().all(|r| r.gpu_lost),
            failures: remaining.into_iter().map(|r| r.failure).collect(),
        })
    }

    /// Destroys the instances of `devices`, GPUs in parallel, each under its GPU's lock; returns
    /// the devices whose instance is still there. Devices of a kind that makes no instance (a
    /// whole GPU) are skipped: nothing was created for them, so their "destroy" is done.
    async fn destroy_devices(&self, uid: &str, devices: Vec<RecordedDevice>) -> Vec<Remaining> {
        let mut by_gpu: BTreeMap<u32, Vec<RecordedDevice>> = BTreeMap::new();
        let makes = |d: &RecordedDevice| self.kinds.of_record(d).creates_instance();
        for d in devices.into_iter().filter(makes) {
            by_gpu.entry(d.gpu_index).or_default().push(d);
        }
        join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, devs)| self.destroy_on_gpu(uid, gpu, devs)),
        )
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// Destroys `devices` on GPU `gpu`: one pass under the GPU's lock, then, for instances NVML
    /// answers `IN_USE` (processes still exiting), more passes after the pauses of
    /// [`DESTROY_RETRIES`], each paused without the lock so the GPU's other calls go on. In a
    /// span `destroy` with the `gpu`.
    #[tracing::instrument(name = "destroy", level = "error", skip_all, fields(gpu = gpu))]
    async fn destroy_on_gpu(
        &self,
        uid: &str,
        gpu: u32,
        devices: Vec<RecordedDevice>,
    ) -> Vec<Remaining> {
        let mut pauses = DESTROY_RETRIES.iter();
        let mut pending = devices;
        let mut failed = Vec::new();
        loop {
            let (in_use, other) = self.destroy_pass(uid, gpu, pending).await;
            failed.extend(other);
            match pauses.next() {
                Some(pause) if !in_use.is_empty() => {
                    tokio::time::sleep(*pause).await;
                    pending = in_use.into_iter().map(|r| r.device).collect();
                }
                _ => {
                    failed.extend(in_use);
                    return failed;
                }
            }
        }
    }

    /// One attempt at each of `devices`, under GPU `gpu`'s lock: list its instances, match the
    /// recorded ones (exact identity, re-read on every pass), destroy each once. Returns the
    /// devices whose instance answered `IN_USE`, then those that failed otherwise.
    async fn destroy_pass(
        &self,
        uid: &str,
        gpu: u32,
        devices: Vec<RecordedDevice>,
    ) -> (Vec<Remaining>, Vec<Remaining>) {
        let _held = self.gpus.lock(gpu).await;
        let live = match self.gpus.instances_on(gpu).await {
            Ok(live) => live,
            Err(e) => {
                let failed = devices
                    .into_iter()
                    .map(|d| Remaining {
                        failure: format!("device {} ({} on GPU {gpu}): {e}", d.device, d.profile),
                        gpu_lost: matches!(e, BackendError::GpuLost { .. }),
                        cause: e.kind(),
                        device: d,
                    })
                    .collect();
                return (Vec::new(), failed);
            }
        };
        let matched = plan::match_devices(&devices, &live, |s| {
            self.records
                .checkpoint
                .read(|cp| plan::recorded_elsewhere(cp, uid, s))
        });
        let (mut in_use, mut failed) = (Vec::new(), Vec::new());
        for (d, found) in devices.iter().zip(matched) {
            let Some(s) = found else {
                continue; // confirmed gone: the GPU answered and it is not there
            };
            let Err(e) = self.destroy_once(&s).await else {
                continue;
            };
            let left = Remaining {
                failure: format!(
                    "slice {} ({} at memory slice {} on GPU {gpu}): {e}",
                    s.mig_uuid, s.profile, s.placement.start
                ),
                gpu_lost: matches!(e, BackendError::GpuLost { .. }),
                cause: e.kind(),
                device: plan::with_instance(d, &s),
            };
            if matches!(e, BackendError::InUse { .. }) {
                in_use.push(left);
            } else {
                failed.push(left);
            }
        }
        (in_use, failed)
    }

    /// Destroys one instance, retrying `IN_USE` after the pauses of [`DESTROY_RETRIES`]. The
    /// caller holds the GPU's lock throughout: for start-up only, before the plugin serves.
    pub(crate) async fn destroy_one(&self, s: &MigInstance) -> Result<(), BackendError> {
        let mut pauses = DESTROY_RETRIES.iter();
        loop {
            match self.destroy_once(s).await {
                Err(e @ BackendError::InUse { .. }) => match pauses.next() {
                    Some(pause) => tokio::time::sleep(*pause).await,
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }

    /// One destroy of one instance; `NOT_FOUND` counts as destroyed. The caller holds the GPU's
    /// lock.
    async fn destroy_once(&self, s: &MigInstance) -> Result<(), BackendError> {
        let (gpu, gi) = (s.gpu_index, s.gi_id);
        let t0 = Instant::now();
        let r = self
            .gpus
            .call(gpu, move |b| b.destroy_instance(gpu, gi))
            .await;
        self.metrics.observe_backend("destroy", t0.elapsed());
        match r {
            Ok(()) | Err(BackendError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Its instances are all gone: drops the claim's record and everything kept about it, and
    /// wakes the prepares waiting for its placements; or, for a record the kubelet still holds,
    /// keeps it as a guard without instances (`Repairing`), which the orphan rule watches.
    async fn forget(&self, claim: &ClaimRef) {
        let checkpoint = &self.records.checkpoint;
        let (outcome, version) = checkpoint.change(|cp| match cp.get(&claim.uid).cloned() {
            Some(r) if r.is_handed() => {
                cp.set_repairing(&claim.uid, &claim.namespace, &claim.name, r.devices);
                Forgot::Guard
            }
            Some(_) => {
                cp.remove(&claim.uid);
                Forgot::Dropped
            }
            None => Forgot::Nothing,
        });
        if outcome != Forgot::Nothing
            && let Err(e) = checkpoint.persist(version).await
        {
            tracing::error!(error = %e, "saving the checkpoint failed");
        }
        self.lifecycle.reaper.done(&claim.uid);
        self.update_pending_gauge();
        if outcome == Forgot::Guard {
            tracing::info!(
                "the claim's instances are gone, but the kubelet holds the claim: its record keeps guarding its placements until the kubelet unprepares it"
            );
            self.suspect_holders(std::iter::once(&claim.uid));
            return;
        }
        self.lifecycle.orphans.clear(&claim.uid);
        self.records.released.notify_waiters();
    }
}

/// What [`Preparer::forget`] did with a record whose instances are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forgot {
    /// Dropped it.
    Dropped,
    /// Kept it as a guard (`Repairing`): the kubelet holds the claim.
    Guard,
    /// There was none.
    Nothing,
}
