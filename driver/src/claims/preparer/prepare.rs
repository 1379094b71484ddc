//! NodePrepareResources of one claim (see [`super`] for the steps), and the claim's CDI spec,
//! which start-up writes again too.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::cdi::ClaimSpec;
use crate::claims::checkpoint::{Checkpoint, ClaimRecord, InstanceId, RecordedDevice};
use crate::claims::handler::{ClaimRef, PreparedDevice};
use crate::claims::plan::share::OnShare;
use crate::claims::plan::{self, DeviceKind, Holding, OnPrepare, Planned};
use crate::gpu::{BackendError, MigInstance};

/// Longest a prepare waits for another claim's instances at its placements to go: after a force
/// delete the scheduler gives the placement to a new pod before the kubelet has unprepared the
/// old pod's claim, which it does once the old pod's containers have stopped (its kill grace is
/// at least 2 s). Waiting here starts the new pod as soon as that happens; the kubelet retries
/// a failed prepare only after several seconds. Below the kubelet's own call timeout (45 s).
pub const PLACEMENT_WAIT: Duration = Duration::from_secs(20);
/// How often a waiting prepare looks again (it is also woken when a record is dropped).
const PLACEMENT_POLL: Duration = Duration::from_millis(100);

/// What the instances of one GPU's creates came to: the instances made, by position in the
/// plan, and the first failure with its position, if any.
type Created = (Vec<(usize, MigInstance)>, Option<(usize, Failed)>);

/// Why the work of a prepare on one GPU stopped.
enum Failed {
    /// The GPU could not be put in the MIG mode its devices need, or a share could neither
    /// create nor join its slice; nothing was created for the device.
    Refused(PrepareError),
    /// A create failed.
    Create(BackendError),
}

impl Preparer {
    /// Prepares one claim; see the module docs of [`super`].
    ///
    /// # Errors
    /// Why the claim cannot be prepared; what was created is rolled back (or, where a destroy
    /// fails, recorded for the reaper).
    pub async fn prepare_claim(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _held = self.records.locks.lock(&claim.uid).await;
        let rc = self
            .api
            .client
            .get_claim(&claim.namespace, &claim.name)
            .await
            .map_err(PrepareError::ApiRead)?;
        let planned = plan::resolve_allocation(
            claim,
            rc.as_ref(),
            &self.node.name,
            &self.node.devices,
            self.node.shares_per_slice,
        )?;
        self.check_mps(&planned)?;
        let pods = rc.as_ref().map(plan::reserving_pods).unwrap_or_default();
        let record = self.record_of(&claim.uid);
        match (plan::on_prepare(record.as_ref(), &planned), record) {
            (OnPrepare::Verify, Some(r)) => {
                if let Some(done) = self.serve_completed(claim, &r).await? {
                    self.note_pods(claim, &r.pods, &pods).await?;
                    return Ok(done);
                }
            }
            (OnPrepare::ReleaseFirst, Some(r)) => {
                tracing::warn!(claim = %claim, state = ?r.state,
                    "releasing what an earlier prepare of this claim left before preparing it");
                self.release(claim, r.devices).await?;
            }
            _ => {}
        }
        // A whole GPU whose GPU cannot serve it fails at once, not after a wait for its holders.
        self.check_whole_gpus(&planned).await?;
        self.wait_for_placements(claim, &planned).await?;
        let known = self
            .record_of(&claim.uid)
            .map(|r| r.pods)
            .unwrap_or_default();
        self.create_and_record(claim, &planned, plan::with_pods(&known, &pods))
            .await
    }

    /// Adds the pods a retried prepare of a completed claim was called for (a shared claim gains
    /// pods) to its record; saves only when that changes it.
    async fn note_pods(
        &self,
        claim: &ClaimRef,
        known: &[String],
        pods: &[String],
    ) -> Result<(), PrepareError> {
        let all = plan::with_pods(known, pods);
        if all.len() == known.len() {
            return Ok(());
        }
        self.records
            .checkpoint
            .commit(|cp| {
                cp.set_pods(&claim.uid, all);
            })
            .await?;
        Ok(())
    }

    /// Waits (at most [`PLACEMENT_WAIT`]) until no other claim's record holds an instance at the
    /// planned placements: the force-delete race, where the kubelet's unprepare of the old pod's
    /// claim comes after this prepare, once the old pod's containers have stopped. The holders
    /// are never released here, whatever the API server says of them: they become suspects of
    /// the orphan rule ([`crate::claims::orphans`]).
    ///
    /// # Errors
    /// [`PrepareError::PlacementHeld`] naming the holders, when they are still there at the limit
    /// (the kubelet retries the prepare).
    async fn wait_for_placements(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), PrepareError> {
        let t0 = tokio::time::Instant::now();
        let mut waited = false;
        loop {
            let holders = self
                .records
                .checkpoint
                .read(|cp| plan::placement_holders(cp, &claim.uid, planned));
            if holders.is_empty() {
                if waited {
                    self.metrics.placement_wait("released", t0.elapsed());
                    tracing::info!(claim = %claim, waited_ms = t0.elapsed().as_millis() as u64, "the placements are free");
                }
                return Ok(());
            }
            if !waited {
                waited = true;
                self.suspect_holders(holders.keys());
                tracing::info!(claim = %claim, holders = ?holders,
                    "waiting for the kubelet to unprepare another claim's slices at these placements (a force-deleted pod whose containers are stopping)");
            }
            if t0.elapsed() >= PLACEMENT_WAIT {
                self.metrics.placement_wait("timeout", t0.elapsed());
                return Err(self.placement_held(&holders));
            }
            tokio::select! {
                _ = self.records.released.notified() => {}
                _ = tokio::time::sleep(PLACEMENT_POLL) => {}
            }
        }
    }

    /// The error of a prepare whose placements stay held, naming the holding claims.
    fn placement_held(&self, holders: &BTreeMap<String, String>) -> PrepareError {
        let device = holders.values().next().cloned().unwrap_or_default();
        let holders = holders
            .keys()
            .map(|uid| match self.record_of(uid) {
                Some(r) => format!("claim {}/{} ({uid})", r.namespace, r.name),
                None => format!("claim {uid}"),
            })
            .collect();
        PrepareError::PlacementHeld { device, holders }
    }

    /// A retried prepare of a completed claim: answers with the record if its instances still
    /// exist (writing its CDI spec again where it is missing or differs); `None` after
    /// releasing a record whose instances are gone. A whole GPU has nothing to look for on its
    /// GPU: it is answered from the record as long as this node publishes it.
    async fn serve_completed(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> Result<Option<Vec<PreparedDevice>>, PrepareError> {
        let mut live = Vec::new();
        for gpu in gpus_of(&record.devices) {
            live.extend(
                self.gpus
                    .instances_on(gpu)
                    .await
                    .map_err(PrepareError::GpuUnavailable)?,
            );
        }
        let matched = plan::match_devices(&record.devices, &live, |s| {
            self.records
                .checkpoint
                .read(|cp| plan::recorded_elsewhere(cp, &claim.uid, s))
        });
        // A GPU instance whose compute instance is gone (an administrator's `nvidia-smi mig
        // -dci`) is listed without a MIG UUID: no container can use it, so it is repaired like
        // a missing one (released and created again), never answered with.
        let usable = |h: &Option<Holding>| match h {
            Some(Holding::Instance(s)) => !s.mig_uuid.is_empty(),
            Some(Holding::WholeGpu { .. }) => true,
            None => false,
        };
        let held = self.holdings(&record.devices, &matched);
        if !held.iter().all(usable) {
            tracing::warn!(claim = %claim, "slices recorded for this claim are gone or have lost their compute instance (or its whole GPU is no longer published); preparing it again");
            self.release(claim, record.devices.clone()).await?;
            return Ok(None);
        }
        let held: Vec<Holding> = held.into_iter().flatten().collect();
        // Its MPS daemons run (supervised since the prepare or start-up); a missing one starts.
        self.start_mps(claim, &record.devices).await?;
        self.ensure_cdi_spec(claim, record, &held)?;
        self.start_status(claim, record);
        Ok(Some(plan::kubelet_devices(record)))
    }

    /// Writes the record's CDI spec when the file is missing, unreadable or not what it should
    /// be; returns whether it wrote.
    ///
    /// # Errors
    /// [`PrepareError::Cdi`]: the spec could not be built or written.
    pub(crate) fn ensure_cdi_spec(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
        held: &[Holding],
    ) -> Result<bool, PrepareError> {
        let legacy = plan::legacy_cdi_keys(record);
        let built = self.build_spec(claim, &record.devices, held, &legacy)?;
        let on_disk = self.cdi.read(&claim.uid).ok();
        if on_disk.as_ref() == Some(&built.spec) {
            return Ok(false);
        }
        tracing::info!(claim = %claim, "writing the claim's CDI spec again");
        self.cdi.write(&claim.uid, &built.spec)?;
        Ok(true)
    }

    /// The claim's CDI spec on this node for `devices` and what they hold (`held`, in order);
    /// `legacy_keys` are the requests a first-release record named its CDI devices after.
    ///
    /// # Errors
    /// [`crate::claims::cdi::CdiError`]: the spec is not valid (a bad claim UID, MIG or GPU
    /// UUID).
    pub(crate) fn build_spec(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        held: &[Holding],
        legacy_keys: &[String],
    ) -> Result<ClaimSpec, crate::claims::cdi::CdiError> {
        let mut spec_devices =
            plan::spec_devices(devices, held, self.cdi.caps_major(), legacy_keys);
        plan::add_mps_mounts(&mut spec_devices, devices, |d| {
            self.mps_mounts(&claim.uid, d)
        });
        self.cdi.claim_spec(&claim.uid, &spec_devices)
    }

    /// Checkpoint `PrepareStarted`, create the instances, write the CDI spec, checkpoint
    /// `PrepareCompleted`, start the status write; rolls back on any failure.
    async fn create_and_record(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        pods: Vec<String>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let t0 = Instant::now();
        let started: Vec<RecordedDevice> = planned.iter().map(plan::record).collect();
        self.records
            .checkpoint
            .commit(|cp| {
                cp.set_started(&claim.uid, &claim.namespace, &claim.name, started);
                cp.set_pods(&claim.uid, pods);
            })
            .await?;
        let t_started = t0.elapsed();
        let (made, failed) = self.create_all(&claim.uid, planned).await;
        let devices = self.record_of(&claim.uid).map(|r| r.devices);
        let Some(devices) = devices else {
            return Err(PrepareError::Internal(
                "the claim's record vanished while its lock was held".into(),
            ));
        };
        if let Some((attempted, err)) = failed_creates(planned, &devices, &made, failed) {
            self.roll_back(claim, attempted).await;
            return Err(err);
        }
        // Every MIG device has its instance now; a whole GPU needs only its device node.
        let held: Vec<Holding> = planned
            .iter()
            .zip(made)
            .filter_map(|(p, m)| match p.at.kind {
                DeviceKind::WholeGpu => Some(Holding::WholeGpu {
                    minor: p.at.gpu_minor,
                }),
                DeviceKind::Mig => m.map(Holding::Instance),
            })
            .collect();
        // The daemons before the spec: no container gets a pipe directory without one behind it.
        if let Err(e) = self.start_mps(claim, &devices).await {
            self.roll_back(claim, devices).await;
            return Err(e);
        }
        let t_created = t0.elapsed();
        let written = self.build_spec(claim, &devices, &held, &[]).and_then(|b| {
            self.cdi.write(&claim.uid, &b.spec)?;
            Ok(b)
        });
        let built = match written {
            Ok(b) => b,
            Err(e) => {
                self.roll_back(claim, devices).await;
                return Err(e.into());
            }
        };
        let cdi_ids: BTreeMap<String, Vec<String>> = built
            .device_ids
            .into_iter()
            .map(|(k, id)| (k, vec![id]))
            .collect();
        let completed = self
            .records
            .checkpoint
            .commit(|cp| {
                cp.set_completed(
                    &claim.uid,
                    &claim.namespace,
                    &claim.name,
                    devices.clone(),
                    cdi_ids,
                );
                cp.get(&claim.uid).cloned()
            })
            .await;
        let record = match completed {
            Ok(Some(r)) => r,
            Ok(None) => unreachable_record(),
            Err(e) => {
                self.roll_back(claim, devices).await;
                return Err(e.into());
            }
        };
        self.update_prepared_gauge();
        tracing::debug!(claim = %claim, started_ms = ms(t_started), create_ms = ms(t_created - t_started),
            finish_ms = ms(t0.elapsed() - t_created), "prepare phases");
        // The kubelet only needs the CDI devices: the status is written after answering.
        self.start_status(claim, &record);
        Ok(plan::kubelet_devices(&record))
    }

    /// Releases the instances of a failed prepare; a failure to destroy is already recorded for
    /// the reaper by [`Self::release`], so only logged here.
    async fn roll_back(&self, claim: &ClaimRef, devices: Vec<RecordedDevice>) {
        if let Err(e) = self.release(claim, devices).await {
            tracing::error!(claim = %claim, error = %e, "rolling back a failed prepare left slices behind; the reaper retries");
        }
    }

    /// Puts each GPU in the MIG mode its planned devices need and creates every planned
    /// instance, GPUs in parallel. Returns the instance made for each planned device (in order;
    /// `None` for a whole GPU, for which nothing is created) and the first failure, if any (a
    /// GPU stops at its first failure).
    async fn create_all(
        &self,
        uid: &str,
        planned: &[Planned],
    ) -> (Vec<Option<MigInstance>>, Vec<(usize, Failed)>) {
        let mut by_gpu: BTreeMap<u32, Vec<(usize, &Planned)>> = BTreeMap::new();
        for (i, p) in planned.iter().enumerate() {
            by_gpu.entry(p.at.gpu_index).or_default().push((i, p));
        }
        let per_gpu = join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, items)| self.create_on_gpu(uid, gpu, items)),
        )
        .await;
        let mut made = vec![None; planned.len()];
        let mut failed = Vec::new();
        for (instances, err) in per_gpu {
            for (i, s) in instances {
                made[i] = Some(s);
            }
            failed.extend(err);
        }
        (made, failed)
    }

    /// Under GPU `gpu`'s lock: puts the GPU in the MIG mode `items` need (on for MIG devices, off
    /// for a whole GPU; [`Self::ensure_mig_mode`]), then creates the MIG devices' instances in
    /// turn, noting each in the claim's record while still holding the lock, so a concurrent
    /// release on this GPU sees it as recorded.
    async fn create_on_gpu(&self, uid: &str, gpu: u32, items: Vec<(usize, &Planned)>) -> Created {
        let _held = self.gpus.lock(gpu).await;
        let Some(&(first, p)) = items.first() else {
            return (Vec::new(), None);
        };
        let want_mig = p.at.kind == DeviceKind::Mig;
        if let Some(&(i, other)) = items.iter().find(|(_, q)| q.at.kind != p.at.kind) {
            let err = PrepareError::MigModeSwitch {
                device: other.device.clone(),
                gpu,
                mig_enabled: !want_mig,
                reason: format!(
                    "the claim was also allocated {} on this GPU, which needs the other mode; a whole GPU and a slice of one GPU are never allocated together while the counters are published (check `kubectl get resourceslices` for this node's counter sets), so delete the pod to have its claim allocated again",
                    p.device
                ),
            };
            return (Vec::new(), Some((i, Failed::Refused(err))));
        }
        if let Err(e) = self.ensure_mig_mode(uid, gpu, want_mig, &p.device).await {
            return (Vec::new(), Some((first, Failed::Refused(e))));
        }
        let mut made = Vec::new();
        for (i, p) in items
            .into_iter()
            .filter(|(_, p)| p.at.kind == DeviceKind::Mig)
        {
            let r = match self.create_or_join(uid, gpu, i, p).await {
                Ok(r) => r,
                Err(e) => return (made, Some((i, Failed::Refused(e)))),
            };
            match r {
                Ok(instance) => {
                    self.records.checkpoint.change(|cp| {
                        if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                            *d = plan::with_instance(d, &instance);
                        }
                    });
                    made.push((i, instance));
                }
                Err(e) => return (made, Some((i, Failed::Create(e)))),
            }
        }
        (made, None)
    }
}

impl Preparer {
    /// The instance of planned device `p` (the claim's `i`th) on GPU `gpu`, whose lock the
    /// caller holds: created, or, for a share of a slice other shares hold, theirs
    /// ([`plan::share::on_share`]). A share that joins records the slice's instance in the same
    /// change of the checkpoint that decides it: a release of another share that decides
    /// between the two (after its record is marked `Releasing`) sees this share as a holder, so
    /// it never stops the daemon or destroys the slice this share just joined.
    ///
    /// # Errors
    /// Outer: [`PrepareError::Share`], the share can neither create nor join its slice (nothing
    /// was created). Inner: what the backend's create answered.
    async fn create_or_join(
        &self,
        uid: &str,
        gpu: u32,
        i: usize,
        p: &Planned,
    ) -> Result<Result<MigInstance, BackendError>, PrepareError> {
        if p.share.is_some() {
            let (on, _) = self.records.checkpoint.change(|cp| {
                let on = plan::share::on_share(cp, uid, p);
                if let OnShare::Join(id) = &on {
                    set_instance(cp, uid, i, Some(id.clone()));
                }
                on
            });
            tracing::debug!(claim = uid, device = %p.device, decision = ?on, "a share of a shared slice");
            match on {
                OnShare::Create => {}
                OnShare::Refuse(e) => return Err(e),
                OnShare::Join(id) => {
                    let joined = self.join_slice(gpu, p, id).await;
                    if joined.is_err() {
                        self.records
                            .checkpoint
                            .change(|cp| set_instance(cp, uid, i, None));
                    }
                    return joined.map(Ok);
                }
            }
        }
        let (profile, start) = (p.at.profile.clone(), p.at.start);
        let t0 = Instant::now();
        let r = self
            .gpus
            .call(gpu, move |b| b.create_instance(gpu, &profile, start))
            .await;
        self.metrics.observe_backend("create", t0.elapsed());
        Ok(r)
    }

    /// The live instance `id` other shares of `p`'s slice hold, on GPU `gpu` (its lock held).
    ///
    /// # Errors
    /// [`PrepareError::Share`]: the GPU does not answer, or the instance is gone.
    async fn join_slice(
        &self,
        gpu: u32,
        p: &Planned,
        id: InstanceId,
    ) -> Result<MigInstance, PrepareError> {
        let fail = |reason: String| PrepareError::Share {
            device: p.device.clone(),
            reason,
        };
        let live = self
            .gpus
            .instances_on(gpu)
            .await
            .map_err(|e| fail(format!("its slice's GPU does not answer: {e}")))?;
        let held = RecordedDevice {
            instance: Some(id),
            ..plan::record(p)
        };
        live.into_iter()
            .find(|s| plan::is_instance(&held, s) && !s.mig_uuid.is_empty())
            .ok_or_else(|| fail("the slice its other shares hold is gone from the GPU (destroyed outside DAS, or its compute instance lost); it is created again once they are unprepared".into()))
    }
}

/// Sets (or clears) the instance of claim `uid`'s `i`th recorded device.
fn set_instance(cp: &mut Checkpoint, uid: &str, i: usize, id: Option<InstanceId>) {
    if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
        d.instance = id;
    }
}

/// After creates of which some GPUs' `failed`: what the roll-back must release (the
/// instances made, and every GPU instance a failed create names: NVML's create leaves one
/// behind when the compute instance fails and so does its clean-up) and the prepare's error
/// (the first GPU's failure). `None` when nothing failed.
fn failed_creates(
    planned: &[Planned],
    devices: &[RecordedDevice],
    made: &[Option<MigInstance>],
    failed: Vec<(usize, Failed)>,
) -> Option<(Vec<RecordedDevice>, PrepareError)> {
    let mut attempted: Vec<RecordedDevice> = devices
        .iter()
        .zip(made)
        .filter(|(_, m)| m.is_some())
        .map(|(d, _)| d.clone())
        .collect();
    let mut first = None;
    for (i, failure) in failed {
        let err = match failure {
            Failed::Refused(err) => err,
            Failed::Create(e) => {
                if let Some(gi_id) = e.target().gi_id {
                    attempted.push(RecordedDevice {
                        instance: Some(InstanceId {
                            gi_id,
                            ci_id: 0,
                            mig_uuid: String::new(),
                        }),
                        ..devices[i].clone()
                    });
                }
                PrepareError::create(&planned[i].device, e)
            }
        };
        first.get_or_insert(err);
    }
    first.map(|err| (attempted, err))
}

fn unreachable_record() -> ClaimRecord {
    // `set_completed` just inserted it under the claim's lock.
    panic!("the completed record is missing right after it was written")
}

/// The GPU indices the MIG devices of `devices` live on, each once (a whole GPU has no
/// instance to look for).
fn gpus_of(devices: &[RecordedDevice]) -> Vec<u32> {
    let mut gpus: Vec<u32> = devices
        .iter()
        .filter(|d| !d.is_whole_gpu())
        .map(|d| d.gpu_index)
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

/// Milliseconds with a fraction, for logs.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
