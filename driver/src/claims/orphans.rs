//! Orphaned claims: prepared claims the API server no longer allocates to this node and the
//! kubelet has not unprepared.
//!
//! The rule (docs/design.md, "A slice leaves its claim"): a prepared claim's slices are
//! destroyed by the kubelet's NodeUnprepareResources, which the kubelet sends only after every
//! container of the pod has stopped. A claim that is gone or deallocated in the API server may
//! still be held by the kubelet (a force-deleted pod whose containers are still being killed),
//! so neither a prepare that finds its placement taken nor start-up releases it. Only when the
//! kubelet never unprepares it (it lost its own checkpoint) does the plugin release it itself,
//! and only with positive evidence: the claim has been no longer allocated for at least
//! [`OrphanPolicy::delay`], and the node's container runtime answers over CRI that no sandbox and
//! no container of any pod the claim was prepared for exists ([`plan::orphan_verdict`]).
//!
//! Suspects come from start-up (every completed record) and from prepares that find their
//! placement held ([`OrphanWatch::suspect`]); [`Preparer::check_orphans`] runs beside the
//! reaper and checks each suspect once it is due: one claim read, then the runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::handler::ClaimRef;
use super::plan::{self, OrphanVerdict};
use super::{EventTarget, Preparer};
use crate::claims::checkpoint::{ClaimRecord, PrepareState};

/// Default of [`OrphanPolicy::delay`]: minutes, far beyond the kubelet's kill of a pod's
/// containers (its grace period plus a few seconds) and its unprepare retries.
pub const DEFAULT_ORPHAN_DELAY: Duration = Duration::from_secs(600);
/// How long a suspect that is kept waits for its next check.
pub const RECHECK: Duration = Duration::from_secs(60);

/// What the container runtime says about a pod: the evidence the orphan rule needs.
#[tonic::async_trait]
pub trait PodContainers: Send + Sync {
    /// Whether the runtime still has a sandbox or a container, in any state, of the pod with
    /// UID `pod_uid`.
    ///
    /// # Errors
    /// Why the runtime could not answer (unreachable, timed out, refused); the caller keeps the
    /// slices.
    async fn pod_has_containers(&self, pod_uid: &str) -> Result<bool, String>;
}

/// How the plugin treats orphaned claims.
#[derive(Clone)]
pub struct OrphanPolicy {
    /// How long a claim must have been no longer allocated (as first seen by the plugin) before
    /// the container runtime is asked about its pods.
    pub delay: Duration,
    /// The container runtime; `None`: orphans are never released by the plugin (kept, with a
    /// Warning event, until the kubelet unprepares them or an administrator acts).
    pub runtime: Option<Arc<dyn PodContainers>>,
}

impl Default for OrphanPolicy {
    fn default() -> Self {
        OrphanPolicy {
            delay: DEFAULT_ORPHAN_DELAY,
            runtime: None,
        }
    }
}

/// The suspects, each with when it is due for a check, and the claims already reported as kept
/// (one Warning event per claim and reason, not one per check).
#[derive(Debug, Default)]
pub struct OrphanWatch {
    due: Mutex<BTreeMap<String, Instant>>,
    reported: Mutex<BTreeSet<(String, String)>>,
}

impl OrphanWatch {
    /// Notes claim `uid` as a suspect due at `at`; an earlier due time already noted stands, so
    /// the delay counts from the first time it was seen.
    pub fn suspect(&self, uid: &str, at: Instant) {
        self.due
            .lock()
            .expect("orphans")
            .entry(uid.to_string())
            .or_insert(at);
    }

    /// Forgets claim `uid` (unprepared, released, or allocated after all).
    pub fn clear(&self, uid: &str) {
        self.due.lock().expect("orphans").remove(uid);
        self.reported
            .lock()
            .expect("orphans")
            .retain(|(u, _)| u != uid);
    }

    /// Whether claim `uid` is a suspect.
    pub fn is_suspect(&self, uid: &str) -> bool {
        self.due.lock().expect("orphans").contains_key(uid)
    }

    /// The earliest due time.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.lock().expect("orphans").values().min().copied()
    }

    fn take_due(&self, now: Instant) -> Vec<String> {
        let due = self.due.lock().expect("orphans");
        due.iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    fn later(&self, uid: &str, at: Instant) {
        self.due
            .lock()
            .expect("orphans")
            .insert(uid.to_string(), at);
    }

    /// Whether `(uid, why)` is new (and notes it).
    fn first_report(&self, uid: &str, why: &str) -> bool {
        self.reported
            .lock()
            .expect("orphans")
            .insert((uid.to_string(), why.to_string()))
    }
}

/// What one orphan check did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OrphanReport {
    /// Claims released under the orphan rule.
    pub released: Vec<String>,
    /// Claims kept, with why.
    pub kept: Vec<(String, String)>,
    /// Claims found allocated after all (no longer suspects).
    pub allocated: Vec<String>,
}

impl Preparer {
    /// Notes every holder of a placement a prepare waits for as a suspect (see the module docs).
    pub(crate) fn suspect_holders<'a>(&self, holders: impl Iterator<Item = &'a String>) {
        let at = Instant::now() + self.orphan_policy.delay;
        for uid in holders {
            self.orphans.suspect(uid, at);
        }
    }

    /// Checks every suspect that is due and not busy with a call: releases it under the orphan
    /// rule, or keeps it and checks again after [`RECHECK`].
    pub async fn check_orphans(&self) -> OrphanReport {
        let now = Instant::now();
        let mut report = OrphanReport::default();
        for uid in self.orphans.take_due(now) {
            let Some(_held) = self.claim_locks.try_lock(&uid) else {
                self.orphans.later(&uid, now + RECHECK);
                continue;
            };
            // Read under the lock: the kubelet may have unprepared it meanwhile.
            let Some(record) = self
                .record_of(&uid)
                .filter(|r| r.state == PrepareState::PrepareCompleted)
            else {
                self.orphans.clear(&uid);
                continue;
            };
            let claim = ClaimRef {
                namespace: record.namespace.clone(),
                name: record.name.clone(),
                uid: uid.clone(),
            };
            match self.orphan_verdict(&claim, &record).await {
                OrphanVerdict::Allocated => {
                    self.orphans.clear(&uid);
                    report.allocated.push(uid);
                }
                OrphanVerdict::Keep(why) => {
                    self.keep_orphan(&claim, &why).await;
                    self.orphans.later(&uid, now + RECHECK);
                    report.kept.push((uid, why));
                }
                OrphanVerdict::Release => {
                    if self.release_orphan(&claim, record).await {
                        report.released.push(uid);
                    } else {
                        self.orphans.later(&uid, now + RECHECK);
                    }
                }
            }
        }
        report
    }

    /// The API server's answer, then the runtime's, for one suspect.
    async fn orphan_verdict(&self, claim: &ClaimRef, record: &ClaimRecord) -> OrphanVerdict {
        let allocated = match self.api.get_claim(&claim.namespace, &claim.name).await {
            Ok(rc) => plan::still_allocated(claim, record, rc.as_ref(), &self.node),
            Err(e) => {
                return OrphanVerdict::Keep(format!("the claim could not be read: {}", e.message));
            }
        };
        let evidence = match (&self.orphan_policy.runtime, allocated) {
            (Some(runtime), false) => {
                let mut answers = Vec::new();
                for pod in &record.pods {
                    answers.push((pod.clone(), runtime.pod_has_containers(pod).await));
                }
                Some(answers)
            }
            _ => None,
        };
        plan::orphan_verdict(allocated, &record.pods, evidence.as_deref())
    }

    async fn keep_orphan(&self, claim: &ClaimRef, why: &str) {
        tracing::warn!(claim = %claim, reason = %why,
            "a prepared claim the API server no longer allocates keeps its slices: the kubelet has not unprepared it");
        if self.orphans.first_report(&claim.uid, why) {
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
        tracing::warn!(claim = %claim, pods = ?record.pods,
            "releasing an orphaned claim: no longer allocated, never unprepared, and the container runtime has no sandbox or container of its pods");
        self.status.stop(&claim.uid).await;
        let pods = record.pods.join(", ");
        let r = self.release(claim, record.devices).await;
        self.metrics.orphan_released(r.is_ok());
        self.update_prepared_gauge();
        self.warn(
            EventTarget::Node,
            "OrphanedSliceReleased",
            format!(
                "released the MIG slices of claim {claim}: it has not been allocated to this node for at least {}s, the kubelet never unprepared it, and the container runtime has no sandbox or container of its pods ({pods}){}",
                self.orphan_policy.delay.as_secs(),
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
