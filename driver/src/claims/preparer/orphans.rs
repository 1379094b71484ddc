//! The orphan rule's checks ([`crate::claims::orphans`] states the rule and keeps the
//! suspects): each due suspect is released on the container runtime's evidence, or kept.

use tokio::time::Instant;
use tracing::Instrument;

use super::Preparer;
use crate::claims::EventTarget;
use crate::claims::checkpoint::{ClaimRecord, PrepareState};
use crate::claims::container_marks::claim_marks;
use crate::claims::handler::ClaimRef;
use crate::claims::orphans::{OrphanReport, RECHECK};
use crate::claims::plan::{self, OrphanVerdict, RuntimeEvidence};
use crate::claims::spans::claim_span;

impl Preparer {
    /// Notes every holder of a placement a prepare waits for as a suspect (see
    /// [`crate::claims::orphans`]).
    pub(crate) fn suspect_holders<'a>(&self, holders: impl Iterator<Item = &'a String>) {
        let at = Instant::now() + self.lifecycle.orphan_policy.delay;
        for uid in holders {
            self.lifecycle.orphans.suspect(uid, at);
        }
    }

    /// Checks every suspect that is due and not busy with a call: releases it under the orphan
    /// rule, or keeps it and checks again after [`RECHECK`].
    pub(crate) async fn check_orphans(&self) -> OrphanReport {
        let now = Instant::now();
        let mut report = OrphanReport::default();
        for uid in self.lifecycle.orphans.take_due(now) {
            let Some(_held) = self.records.locks.try_lock(&uid) else {
                self.lifecycle.orphans.later(&uid, now + RECHECK);
                continue;
            };
            // Read under the lock: the kubelet may have unprepared it meanwhile.
            // A record the kubelet holds, at rest: completed, or a guard without instances.
            let Some(record) = self.record_of(&uid).filter(|r| {
                matches!(
                    r.state,
                    PrepareState::PrepareCompleted | PrepareState::Repairing
                )
            }) else {
                self.lifecycle.orphans.clear(&uid);
                continue;
            };
            let claim = ClaimRef {
                namespace: record.namespace.clone(),
                name: record.name.clone(),
                uid: uid.clone(),
            };
            let span = claim_span!("orphan_check", &claim);
            self.check_suspect(&claim, record, now, &mut report)
                .instrument(span)
                .await;
        }
        report
    }

    /// The orphan rule's check of suspect `claim`, recorded as `record`, whose lock the caller
    /// holds: clears it (allocated), keeps it and checks again after [`RECHECK`], or releases
    /// it; notes the outcome in `report`.
    async fn check_suspect(
        &self,
        claim: &ClaimRef,
        record: ClaimRecord,
        now: Instant,
        report: &mut OrphanReport,
    ) {
        let uid = claim.uid.clone();
        match self.orphan_verdict(claim, &record).await {
            OrphanVerdict::Allocated => {
                self.lifecycle.orphans.clear(&uid);
                report.allocated.push(uid);
            }
            OrphanVerdict::Keep(why) => {
                self.keep_orphan(claim, &why).await;
                self.lifecycle.orphans.later(&uid, now + RECHECK);
                report.kept.push((uid, why));
            }
            OrphanVerdict::Release => {
                if self.release_orphan(claim, record).await {
                    report.released.push(uid);
                } else {
                    self.lifecycle.orphans.later(&uid, now + RECHECK);
                }
            }
        }
    }

    /// The API server's answer, then the runtime's, for one suspect.
    async fn orphan_verdict(&self, claim: &ClaimRef, record: &ClaimRecord) -> OrphanVerdict {
        let allocated = match self.allocated_as_recorded(claim, record).await {
            Ok(allocated) => allocated,
            Err(e) => {
                return OrphanVerdict::Keep(format!("the claim could not be read: {}", e.message));
            }
        };
        let evidence = match (&self.lifecycle.orphan_policy.runtime, allocated) {
            (Some(runtime), false) => {
                let mut pods = Vec::new();
                for pod in &record.pods {
                    pods.push((pod.clone(), runtime.pod_has_containers(pod).await));
                }
                // The claim's CDI spec names its instances' device nodes while it exists (a
                // guard whose instances are gone has none: its variables mark its containers).
                let spec = self.cdi.read(&claim.uid).ok();
                let marks = claim_marks(&claim.uid, record, spec.as_ref());
                let holding = runtime.containers_holding(&marks).await;
                Some(RuntimeEvidence { pods, holding })
            }
            _ => None,
        };
        plan::orphan_verdict(allocated, &record.pods, evidence.as_ref())
    }

    async fn keep_orphan(&self, claim: &ClaimRef, why: &str) {
        tracing::warn!(reason = %why,
            "a prepared claim the API server no longer allocates keeps its slices: the kubelet has not unprepared it");
        if self.lifecycle.orphans.first_report(&claim.uid, why) {
            self.warn(
                EventTarget::Node,
                "OrphanedSliceKept",
                format!(
                    "claim {claim} is no longer allocated to this node but the kubelet has not unprepared it; DAS keeps its MIG slices because {why}. They are destroyed when the kubelet unprepares the claim, or once the container runtime confirms that no container of its pods is left."
                ),
            )
            .await;
        }
    }

    /// Releases an orphan; `false` when something is left (the reaper takes it over).
    async fn release_orphan(&self, claim: &ClaimRef, record: ClaimRecord) -> bool {
        tracing::warn!(pods = ?record.pods,
            "releasing an orphaned claim: no longer allocated, never unprepared, the container runtime has no sandbox or container of its pods and no container holds its devices");
        self.api.status.stop(&claim.uid).await;
        let pods = record.pods.join(", ");
        let r = self.release_for_good(claim, record.devices).await;
        self.metrics.orphan_released(r.is_ok());
        self.update_prepared_gauge();
        self.warn(
            EventTarget::Node,
            "OrphanedSliceReleased",
            format!(
                "released the MIG slices of claim {claim}: it has not been allocated to this node for at least {}s, the kubelet never unprepared it, the container runtime has no sandbox or container of its pods ({pods}), and no live container holds its devices{}",
                self.lifecycle.orphan_policy.delay.as_secs(),
                match &r {
                    Ok(()) => String::new(),
                    Err(e) => format!("; some slices are left for the reaper: {e}"),
                }
            ),
        )
        .await;
        r.is_ok()
    }
}
