//! NodePrepareResources of one claim (see [`super`] for the steps), and the claim's CDI spec,
//! which start-up writes again too.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::cdi::ClaimSpec;
use crate::claims::checkpoint::{ClaimRecord, RecordedDevice};
use crate::claims::handler::{ClaimRef, PreparedDevice};
use crate::claims::plan::{self, Holding, OnPrepare, Planned};

/// Longest a prepare waits for another claim's instances at its placements to go: after a force
/// delete the scheduler gives the placement to a new pod before the kubelet has unprepared the
/// old pod's claim, which it does once the old pod's containers have stopped (its kill grace is
/// at least 2 s). Waiting here starts the new pod as soon as that happens; the kubelet retries
/// a failed prepare only after several seconds. Below the kubelet's own call timeout (45 s).
pub(crate) const PLACEMENT_WAIT: Duration = Duration::from_secs(20);
/// How often a waiting prepare looks again (it is also woken when a record is dropped).
const PLACEMENT_POLL: Duration = Duration::from_millis(100);

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
            .read_claim(claim)
            .await
            .map_err(PrepareError::ApiRead)?;
        let planned = self.resolve(claim, rc.as_ref())?;
        self.layers.check(&planned, &self.node)?;
        let pods = rc.as_ref().map(plan::reserving_pods).unwrap_or_default();
        let record = self.record_of(&claim.uid);
        match (plan::on_prepare(record.as_ref(), &planned), record) {
            (OnPrepare::Verify, Some(r)) => {
                if let Some(done) = self.serve_completed(claim, &r).await? {
                    self.note_pods(claim, &r.pods, &pods).await?;
                    return Ok(done);
                }
            }
            (OnPrepare::FinishCarved, Some(r)) => {
                if let Some(done) = self.prepare_carved(claim, &r, &pods).await? {
                    return Ok(done);
                }
            }
            (OnPrepare::ReleaseFirst, Some(r)) => {
                tracing::warn!(state = ?r.state,
                    "releasing what an earlier prepare of this claim left before preparing it");
                self.release(claim, r.devices).await?;
            }
            _ => {}
        }
        // A device its kind refuses fails at once, before anything is recorded and not after a
        // wait for its holders: a share of a MIG instance another namespace's claims hold (a completed
        // claim, answered above, is never refused here), a whole GPU whose GPU cannot serve it.
        self.check_kinds(claim, &planned).await?;
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
    pub(super) async fn wait_for_placements(
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
                    tracing::info!(
                        waited_ms = t0.elapsed().as_millis() as u64,
                        "the placements are free"
                    );
                }
                return Ok(());
            }
            if !waited {
                waited = true;
                self.suspect_holders(holders.keys());
                tracing::info!(holders = ?holders,
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
        let Some(held) = self.live_holdings(claim, record).await? else {
            return Ok(None);
        };
        // Its layers are on (its MPS daemons run, supervised since the prepare or start-up); a
        // missing one is put on.
        self.layers.put_on(claim, &record.devices).await?;
        self.ensure_cdi_spec(claim, record, &held)?;
        self.start_status(claim, record);
        Ok(Some(plan::kubelet_devices(record)))
    }

    /// What the record's devices hold on the GPUs, when every instance still exists (and each
    /// whole GPU is still published); `None` after releasing a record whose instances are gone.
    pub(super) async fn live_holdings(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> Result<Option<Vec<Holding>>, PrepareError> {
        let mut live = Vec::new();
        for gpu in self.gpus_of(&record.devices) {
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
        let held = self.holdings(&record.devices, &matched);
        if !held.iter().all(|h| h.as_ref().is_some_and(Holding::usable)) {
            tracing::warn!(
                "slices recorded for this claim are gone or have lost their compute instance (or its whole GPU is no longer published); preparing it again"
            );
            self.release(claim, record.devices.clone()).await?;
            return Ok(None);
        }
        Ok(Some(held.into_iter().flatten().collect()))
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
        tracing::info!("writing the claim's CDI spec again");
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
        self.layers
            .cdi_edits(&claim.uid, devices, &mut spec_devices);
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
        let (devices, held) = self.acquire_planned(claim, planned).await?;
        self.finish_prepare(claim, devices, held, (t0, t_started))
            .await
    }

    /// The rest of a prepare once the claim's instances exist (created now, or carved before
    /// bind): start the MPS daemons, write the CDI spec, checkpoint `PrepareCompleted`, start
    /// the status write; rolls back on any failure. `t0` and when the record was started are
    /// for the log of the phases.
    pub(super) async fn finish_prepare(
        &self,
        claim: &ClaimRef,
        devices: Vec<RecordedDevice>,
        held: Vec<Holding>,
        (t0, t_started): (Instant, Duration),
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        // The layers before the spec: no container gets an MPS pipe directory without a daemon
        // behind it.
        if let Err(e) = self.layers.put_on(claim, &devices).await {
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
        tracing::debug!(
            started_ms = ms(t_started),
            create_ms = ms(t_created - t_started),
            finish_ms = ms(t0.elapsed() - t_created),
            "prepare phases"
        );
        // The kubelet only needs the CDI devices: the status is written after answering.
        self.start_status(claim, &record);
        Ok(plan::kubelet_devices(&record))
    }

    /// The GPU indices the instances of `devices` live on, each once (a device of a kind that
    /// makes no instance, a whole GPU, has none to look for).
    fn gpus_of(&self, devices: &[RecordedDevice]) -> Vec<u32> {
        let mut gpus: Vec<u32> = devices
            .iter()
            .filter(|d| self.kinds.of_record(d).creates_instance())
            .map(|d| d.gpu_index)
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// Releases the instances of a failed prepare; a failure to destroy is already recorded for
    /// the reaper by [`Self::release`], so only logged here.
    pub(super) async fn roll_back(&self, claim: &ClaimRef, devices: Vec<RecordedDevice>) {
        if let Err(e) = self.release(claim, devices).await {
            tracing::error!(error = %e, "rolling back a failed prepare left slices behind; the reaper retries");
        }
    }
}

fn unreachable_record() -> ClaimRecord {
    // `set_completed` just inserted it under the claim's lock.
    panic!("the completed record is missing right after it was written")
}

/// Milliseconds with a fraction, for logs.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
