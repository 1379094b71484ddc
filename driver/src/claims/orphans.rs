//! Orphaned claims: prepared claims the API server no longer allocates to this node and the
//! kubelet has not unprepared.
//!
//! The rule (docs/design.md, "A slice leaves its claim"): a prepared claim's MIG instances are
//! destroyed by the kubelet's NodeUnprepareResources, which the kubelet sends only after every
//! container of the pod has stopped. A claim that is gone or deallocated in the API server may
//! still be held by the kubelet (a force-deleted pod whose containers are still being killed),
//! so neither a prepare that finds its placement taken nor start-up releases it. Only when the
//! kubelet never unprepares it (it lost its own checkpoint) does the plugin release it itself,
//! and only with positive evidence: the claim has been no longer allocated for at least
//! [`OrphanPolicy::delay`], and the node's container runtime answers over CRI that no sandbox and
//! no container of any pod the claim was prepared for exists ([`super::plan::orphan_verdict`]).
//!
//! Suspects come from start-up (every completed record) and from prepares that find their
//! placement held ([`OrphanWatch::suspect`]); [`super::Preparer::check_orphans`] runs beside the
//! reaper and checks each suspect once it is due: one claim read, then the runtime.
//!
//! This module states the rule's policy ([`OrphanPolicy`], [`PodContainers`]) and keeps its
//! suspects ([`OrphanWatch`]); the checks are the preparer's, in [`super::preparer::orphans`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::container_marks::ClaimMarks;

/// Default of [`OrphanPolicy::delay`]: minutes, far beyond the kubelet's kill of a pod's
/// containers (its grace period plus a few seconds) and its unprepare retries.
pub(crate) const DEFAULT_ORPHAN_DELAY: Duration = Duration::from_secs(600);
/// How long a suspect that is kept waits for its next check.
pub(crate) const RECHECK: Duration = Duration::from_secs(60);

/// What the container runtime says about pods and containers: the evidence the orphan rule
/// needs.
#[tonic::async_trait]
pub trait PodContainers: Send + Sync {
    /// Whether the runtime still has a sandbox or a container, in any state, of the pod with
    /// UID `pod_uid`.
    ///
    /// # Errors
    /// [`RuntimeError`]: why the runtime could not answer (unreachable, timed out, refused);
    /// the caller keeps the MIG instances.
    async fn pod_has_containers(&self, pod_uid: &str) -> Result<bool, RuntimeError>;

    /// The live containers (any state but exited) of the node, of any pod, whose OCI runtime
    /// spec carries one of `marks` ([`super::container_marks`]), each described as
    /// `container <name> of pod <namespace>/<name> (<its mark>)`.
    ///
    /// # Errors
    /// [`RuntimeError`]: the runtime could not answer, or could not say what a live container
    /// holds (no runtime spec in its verbose status); the caller keeps the MIG instances.
    async fn containers_holding(&self, marks: &ClaimMarks) -> Result<Vec<String>, RuntimeError>;
}

/// Why the container runtime gave no evidence. Defined beside [`PodContainers`] rather than in
/// its CRI client (`super::cri`) so the client depends on this module and not the other way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// `--container-runtime-endpoint` is not a unix socket.
    #[error(
        "container runtime endpoint {endpoint:?} is not a unix socket: give unix:///<path> or an absolute path, e.g. unix:///run/containerd/containerd.sock"
    )]
    NotUnixSocket {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The socket could not be reached (missing, refused, timed out).
    #[error("connect to {socket}: {reason}")]
    Connect {
        /// The socket's path.
        socket: String,
        /// The transport's error.
        reason: String,
    },
    /// A CRI call failed.
    #[error("{call}: {message}")]
    Call {
        /// The CRI method (`ListPodSandbox`, `ListContainers`).
        call: &'static str,
        /// The runtime's status message.
        message: String,
    },
    /// A live container's verbose status has no OCI runtime spec (a runtime that does not
    /// report one): nothing tells which devices it holds.
    #[error(
        "container {container}: its verbose ContainerStatus has no runtime spec (info[\"info\"].runtimeSpec, as containerd and CRI-O report it), so nothing tells which devices it holds"
    )]
    NoRuntimeSpec {
        /// The container, as the evidence names it.
        container: String,
    },
    /// A test double's injected failure.
    #[error("injected: {0}")]
    Injected(String),
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
pub(crate) struct OrphanWatch {
    due: Mutex<BTreeMap<String, Instant>>,
    reported: Mutex<BTreeSet<(String, String)>>,
}

impl OrphanWatch {
    /// Notes claim `uid` as a suspect due at `at`; an earlier due time already noted stands, so
    /// the delay counts from the first time it was seen.
    pub(crate) fn suspect(&self, uid: &str, at: Instant) {
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

    /// Whether claim `uid` is a suspect (for tests).
    #[cfg(test)]
    pub(crate) fn is_suspect(&self, uid: &str) -> bool {
        self.due.lock().expect("orphans").contains_key(uid)
    }

    /// The earliest due time.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.due.lock().expect("orphans").values().min().copied()
    }

    /// The suspects due at `now` (they stay suspects until cleared or rescheduled).
    pub(crate) fn take_due(&self, now: Instant) -> Vec<String> {
        let due = self.due.lock().expect("orphans");
        due.iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// Reschedules suspect `uid`'s next check to `at`.
    pub(crate) fn later(&self, uid: &str, at: Instant) {
        self.due
            .lock()
            .expect("orphans")
            .insert(uid.to_string(), at);
    }

    /// Whether `(uid, why)` is new (and notes it).
    pub(crate) fn first_report(&self, uid: &str, why: &str) -> bool {
        self.reported
            .lock()
            .expect("orphans")
            .insert((uid.to_string(), why.to_string()))
    }
}

/// What one orphan check did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct OrphanReport {
    /// Claims released under the orphan rule.
    pub released: Vec<String>,
    /// Claims kept, with why.
    pub kept: Vec<(String, String)>,
    /// Claims found allocated after all (no longer suspects).
    pub allocated: Vec<String>,
}
