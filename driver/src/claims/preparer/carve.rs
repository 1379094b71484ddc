//! Carve before bind (issue 34; [`crate::claims::carve`]): the carve of a claim the scheduler
//! allocated to this node and waits for, the prepare of a carved claim, and the release of a
//! carved claim that never reached a prepare.

use std::time::{Duration, Instant};

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::carve::{self, CarveOutcome};
use crate::claims::checkpoint::{ClaimRecord, PrepareState, RecordedDevice};
use crate::claims::handler::{ClaimRef, PreparedDevice};
use crate::claims::plan;

/// Attempts of a carve's status write (the scheduler waits for it), the first pause between two
/// (doubled after each).
const STATUS_ATTEMPTS: u32 = 6;
const STATUS_FIRST_RETRY: Duration = Duration::from_millis(250);

/// What a call of [`Preparer::carve_claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carved {
    /// The instances exist, the record is `Carved`, `SliceReady` is written.
    Ready,
    /// The carve failed, was rolled back, and `SliceFailed` is written with the message.
    Failed(String),
    /// Nothing to do: the claim has a record already, is no longer allocated here, or its
    /// carve was answered.
    Skipped,
}

impl Preparer {
    /// Carves claim `claim` before its pod is bound: under the claim's lock, resolves its
    /// allocation as a prepare does, checkpoints `PrepareStarted`, creates the instances exactly
    /// as a prepare does (rolled back on failure) and checkpoints `Carved`; then writes
    /// `mig.das.com/SliceReady` True into the claim's `status.devices`, or, when the carve
    /// failed, `mig.das.com/SliceFailed` True with the error as message. No CDI spec and no MPS
    /// daemon: the prepare starts them.
    ///
    /// # Errors
    /// Only what leaves the claim as it was and asks for another try (the claim could not be
    /// read); everything else is answered in the claim's status.
    pub async fn carve_claim(&self, claim: &ClaimRef) -> Result<Carved, PrepareError> {
        let _held = self.records.locks.lock(&claim.uid).await;
        if self.record_of(&claim.uid).is_some() {
            return Ok(Carved::Skipped);
        }
        let rc = self
            .read_claim(claim)
            .await
            .map_err(PrepareError::ApiRead)?;
        let waits = rc.as_ref().is_some_and(|rc| {
            carve::on_claim_seen(rc, &self.node.name, None) == carve::OnClaimSeen::Carve
        });
        if !waits {
            return Ok(Carved::Skipped);
        }
        let t0 = Instant::now();
        let planned = self.resolve(claim, rc.as_ref());
        let result = match planned {
            Ok(planned) => {
                let devices: Vec<RecordedDevice> = planned.iter().map(plan::record).collect();
                (self.carve_planned(claim, &planned).await, devices)
            }
            Err(e) => (Err(e), Vec::new()),
        };
        let (devices, outcome) = match result {
            (Ok(devices), _) => (devices, CarveOutcome::Ready),
            (Err(e), _) if !carve::fails_the_carve(&e) => {
                tracing::info!(error = %e, "not carving a claim that changed");
                return Ok(Carved::Skipped);
            }
            (Err(e), planned) => {
                let devices = if planned.is_empty() {
                    carve::allocated_devices(rc.as_ref(), &self.node.name)
                } else {
                    planned
                };
                (devices, CarveOutcome::Failed(e.to_string()))
            }
        };
        self.update_prepared_gauge();
        let ok = outcome == CarveOutcome::Ready;
        self.metrics.carve_done(ok);
        match &outcome {
            CarveOutcome::Ready => {
                tracing::info!(
                    devices = devices.len(),
                    ms = t0.elapsed().as_millis() as u64,
                    "carved before bind"
                )
            }
            CarveOutcome::Failed(e) => {
                tracing::warn!(error = %e, "carve before bind failed: the scheduler allocates the claim again")
            }
        }
        self.write_carve_status(claim, &devices, &outcome).await;
        Ok(match outcome {
            CarveOutcome::Ready => Carved::Ready,
            CarveOutcome::Failed(e) => Carved::Failed(e),
        })
    }

    /// The carve of a resolved allocation: the checks a prepare makes first, `PrepareStarted`,
    /// the creates, `Carved`. Returns the recorded devices with their instances.
    async fn carve_planned(
        &self,
        claim: &ClaimRef,
        planned: &[plan::Planned],
    ) -> Result<Vec<RecordedDevice>, PrepareError> {
        self.layers.check(planned, &self.node)?;
        self.check_kinds(claim, planned).await?;
        self.wait_for_placements(claim, planned).await?;
        let started: Vec<RecordedDevice> = planned.iter().map(plan::record).collect();
        self.records
            .checkpoint
            .commit(|cp| cp.set_started(&claim.uid, &claim.namespace, &claim.name, started))
            .await?;
        let (devices, _held) = self.acquire_planned(claim, planned).await?;
        let carved = devices.clone();
        let saved = self
            .records
            .checkpoint
            .commit(|cp| cp.set_carved(&claim.uid, &claim.namespace, &claim.name, carved))
            .await;
        if let Err(e) = saved {
            self.roll_back(claim, devices).await;
            return Err(e.into());
        }
        Ok(devices)
    }

    /// Writes the carve's conditions into the claim's `status.devices`, retrying a few times
    /// (the scheduler waits for them; a claim that changed is not written).
    async fn write_carve_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        outcome: &CarveOutcome,
    ) {
        let mut delay = STATUS_FIRST_RETRY;
        for attempt in 1..=STATUS_ATTEMPTS {
            match self
                .api
                .client
                .write_carve_status(claim, devices, outcome)
                .await
            {
                Ok(()) => return,
                Err(e) if e.permanent || attempt == STATUS_ATTEMPTS => {
                    tracing::warn!(error = %e, "the carve's device status was not written");
                    self.metrics.status_write_failed();
                    return;
                }
                Err(e) => {
                    self.metrics.status_write_failed();
                    tracing::warn!(error = %e, retry_in = ?delay, "writing the carve's device status failed; retrying");
                }
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }

    /// The kubelet's prepare of a claim carved for this very allocation (its lock held): the
    /// instances are checked, the MPS daemons started, the CDI spec written and the record
    /// completed; nothing is created. `None` after releasing a carved record whose instances
    /// are gone (the prepare then creates them as usual).
    pub(super) async fn prepare_carved(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
        pods: &[String],
    ) -> Result<Option<Vec<PreparedDevice>>, PrepareError> {
        let t0 = Instant::now();
        let Some(held) = self.live_holdings(claim, record).await? else {
            return Ok(None);
        };
        let all = plan::with_pods(&record.pods, pods);
        self.records
            .checkpoint
            .commit(|cp| {
                cp.set_pods(&claim.uid, all);
            })
            .await?;
        tracing::info!("preparing a claim carved before bind: nothing to create");
        let done = self
            .finish_prepare(claim, record.devices.clone(), held, (t0, t0.elapsed()))
            .await?;
        Ok(Some(done))
    }

    /// Releases claim `claim`'s carved record when the claim is no longer allocated to this
    /// node as recorded (deleted, deallocated, allocated otherwise): no container was ever given
    /// its instances. A record that is not `Carved` (prepared since) is left alone, and so is a
    /// claim the API server still allocates here as recorded (the watch saw an old version).
    pub(crate) async fn release_carved(&self, claim: &ClaimRef) -> Result<bool, PrepareError> {
        let _held = self.records.locks.lock(&claim.uid).await;
        let Some(record) = self.record_of(&claim.uid) else {
            return Ok(false);
        };
        if record.state != PrepareState::Carved {
            return Ok(false);
        }
        // A claim that cannot be read now is asked again by the caller (the watch retries): a
        // deleted claim sends no second event.
        let allocated = self
            .allocated_as_recorded(claim, &record)
            .await
            .map_err(PrepareError::ApiRead)?;
        if allocated {
            return Ok(false);
        }
        tracing::info!(
            "destroying a slice carved before bind whose claim is no longer allocated here"
        );
        let r = self.release(claim, record.devices).await;
        self.update_gauges();
        r.map(|()| true)
    }

    /// Writes `SliceReady` again for claim `claim`'s `Carved` record, whose claim is still
    /// allocated here as recorded but does not say so (the plugin stopped between its carve and
    /// the status write, or every attempt of that write failed): the scheduler would otherwise
    /// wait for it until its binding timeout.
    pub(crate) async fn announce_carved(&self, claim: &ClaimRef) {
        let _held = self.records.locks.lock(&claim.uid).await;
        let Some(record) = self
            .record_of(&claim.uid)
            .filter(|r| r.state == PrepareState::Carved)
        else {
            return;
        };
        tracing::info!("writing SliceReady again for a carved claim that lacks it");
        self.write_carve_status(claim, &record.devices, &CarveOutcome::Ready)
            .await;
    }

    /// Whether the API server still allocates the carved claim to this node as recorded; `true`
    /// when it cannot be asked (the record is kept until it can).
    pub(super) async fn carved_still_allocated(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> bool {
        match self.allocated_as_recorded(claim, record).await {
            Ok(allocated) => allocated,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a carved claim: keeping its slices for now");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests;
