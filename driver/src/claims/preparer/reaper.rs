//! The reaper's passes over the claims its schedule ([`crate::claims::reaper`]) says are due.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Preparer;
use super::startup::Kept;
use crate::claims::checkpoint::{ClaimRecord, PrepareState, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::reaper::{MAX_DELAY, MPS_RETRY, ReapReport};
use crate::claims::spans::claim_span;
use crate::claims::startup::Report;
use crate::claims::{EventTarget, PrepareError};

impl Preparer {
    /// One pass: for every `Releasing` record that is due (a record found after a restart is
    /// due at once) and not busy with a call, try its destroys again.
    pub(crate) async fn reap_due(&self) -> ReapReport {
        let now = Instant::now();
        let releasing: Vec<(ClaimRef, Vec<_>)> = self.records.checkpoint.read(|cp| {
            cp.claims
                .iter()
                .filter(|(_, r)| r.state == PrepareState::Releasing)
                .map(|(uid, r)| {
                    let claim = ClaimRef {
                        namespace: r.namespace.clone(),
                        name: r.name.clone(),
                        uid: uid.clone(),
                    };
                    (claim, r.devices.clone())
                })
                .collect()
        });
        let mut report = ReapReport::default();
        for (claim, _) in releasing {
            if !self.lifecycle.reaper.is_due(&claim.uid, now) {
                continue;
            }
            let Some(_held) = self.records.locks.try_lock(&claim.uid) else {
                report.busy.push(claim.uid);
                continue;
            };
            // Read again under the lock: a call may have finished it meanwhile.
            let Some(record) = self
                .record_of(&claim.uid)
                .filter(|r| r.state == PrepareState::Releasing)
            else {
                continue;
            };
            let span = claim_span!("reap", &claim);
            if self.reap(&claim, record.devices).instrument(span).await {
                report.finished.push(claim.uid);
            } else {
                report.failed.push(claim.uid);
            }
        }
        report
    }

    /// The reaper's attempt at claim `claim`'s `Releasing` record, whose lock the caller holds:
    /// releases `devices` again; `true` when they are all gone.
    async fn reap(&self, claim: &ClaimRef, devices: Vec<RecordedDevice>) -> bool {
        match self.release(claim, devices).await {
            Ok(()) => {
                self.metrics.reaper_attempt(true);
                tracing::info!("reaper: the claim's remaining slices are destroyed");
                true
            }
            Err(e) => {
                self.metrics.reaper_attempt(false);
                let retry = self.lifecycle.reaper.failed(&claim.uid);
                tracing::warn!(error = %e, retry_in = ?retry, "reaper: destroying the claim's slices failed again");
                self.warn(
                    EventTarget::from(claim),
                    "SliceDestroyFailed",
                    note(&e, retry),
                )
                .await;
                false
            }
        }
    }

    /// Brings back the MPS daemons of the kept claims start-up skipped because a GPU did not
    /// answer ([`crate::claims::reaper::PendingDaemons`]), once their GPUs answer. Returns the
    /// claims whose daemons were brought back.
    pub async fn retry_pending_mps(&self) -> Vec<String> {
        let mut back = Vec::new();
        for uid in self.lifecycle.layers_pending.all() {
            let Some(_held) = self.records.locks.try_lock(&uid) else {
                continue;
            };
            let Some(record) = self
                .record_of(&uid)
                .filter(|r| r.state == PrepareState::PrepareCompleted)
            else {
                self.lifecycle.layers_pending.done(&uid);
                continue;
            };
            let claim = ClaimRef {
                namespace: record.namespace.clone(),
                name: record.name.clone(),
                uid: uid.clone(),
            };
            // Its layers open their own spans (start-up brings back many claims' at once).
            let live = self.pending_live(&claim, &record);
            match live.instrument(claim_span!("restore_layers", &claim)).await {
                Kept::Live => {
                    self.layers.restore(&[(claim, record.devices)]).await;
                    self.lifecycle.layers_pending.done(&uid);
                    back.push(uid);
                }
                Kept::Missing => self.lifecycle.layers_pending.done(&uid),
                Kept::GpuUnavailable => {}
            }
        }
        back
    }

    /// Whether kept claim `claim`, recorded as `record`, whose layers start-up could not bring
    /// back, has its instances live now that its GPUs are read again.
    async fn pending_live(&self, claim: &ClaimRef, record: &ClaimRecord) -> Kept {
        let live = self.live_per_gpu().await;
        let kept = self.check_kept(claim, record, &live, &mut Report::default());
        if kept == Kept::Live {
            tracing::info!("its GPU answers again: bringing back its MPS daemons");
        }
        kept
    }

    /// Runs [`Self::reap_due`] whenever an attempt is due, the orphan rule's checks
    /// ([`Self::check_orphans`]) whenever a suspect is due, and [`Self::retry_pending_mps`]
    /// every [`MPS_RETRY`] while a claim waits for its daemons, until `stop`.
    pub async fn run_reaper(self: Arc<Self>, stop: CancellationToken) {
        loop {
            self.reap_due().await;
            self.check_orphans().await;
            self.retry_pending_mps().await;
            let pending = (!self.lifecycle.layers_pending.all().is_empty())
                .then(|| Instant::now() + MPS_RETRY);
            let next = [
                self.lifecycle.reaper.next_due(),
                self.lifecycle.orphans.next_due(),
                pending,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Instant::now() + MAX_DELAY);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.lifecycle.reaper.wake.notified() => {}
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }
}

/// The note of a `SliceDestroyFailed` event: what failed, and when the next attempt is.
fn note(e: &PrepareError, retry: Duration) -> String {
    format!("{e}; next attempt in {}s", retry.as_secs())
}
