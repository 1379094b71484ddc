//! Start-up reconciliation of the three records of what is prepared: the checkpoint, the GPUs
//! (instances that exist) and the API server (claims that still hold devices). In order:
//! 0. a MIG mode switch the checkpoint records as under way (the plugin stopped in its middle)
//!    is finished: kept where it took effect, set back where it was left pending a reset (DAS
//!    then no longer switches that GPU), forgotten where it never started (docs/design.md §7,
//!    "MIG mode follows demand");
//! 1. GPUs that do not answer are skipped, with a log line and a Warning event on the Node; the
//!    records of claims with instances on them are kept for when they answer again;
//! 2. prepares that started but never completed are rolled back (the kubelet retries them), and
//!    releases left over are tried again;
//! 3. completed claims are kept, whatever the API server says of them: the kubelet holds them
//!    until it unprepares them, and a container of a force-deleted pod may still run on their
//!    MIG instances. Each gets its CDI spec written again where it is missing or not what it should be,
//!    its MPS devices' control daemons supervised again after steps 3 and 4 (all claims' at once;
//!    a live one adopted, any other started; docs/design.md §7, "MPS on a slice"), and becomes a
//!    suspect of the orphan rule ([`super::orphans`]), which checks after its delay whether the API server still allocates it and, if not, asks the container runtime;
//!    (prepares that never completed were never answered, so no container has their MIG instances;
//!    releases were asked for by the kubelet's unprepare or are roll-backs);
//! 4. when the checkpoint was lost (corrupt, or first start), the records of live instances are
//!    rebuilt from the claims the API server has allocated on this node (with their MPS
//!    daemons);
//! 5. MPS control daemons no record holds are stopped and their directories removed (first: an
//!    unrecorded daemon's MPS server would keep its MIG instance in use), then instances nobody records
//!    are destroyed — only those DAS created, unless `reclaim_foreign`;
//! 6. CDI specs of claims we no longer hold, and leftover temp files, are removed.
//!
//! The decisions are [`super::plan`]'s, the steps [`super::Preparer::reconcile_at_startup`]'s
//! ([`super::preparer::startup`]); nothing there runs concurrently with calls (the plugin
//! reconciles before it serves). This module holds what it answers: its [`Report`], or the
//! [`StartupError`] that stopped it.

use super::ApiError;
use super::cdi::CdiError;
use super::checkpoint::CheckpointError;

/// What start-up reconciliation did; logged, and asserted on by tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// GPUs that did not answer (skipped).
    pub unavailable_gpus: Vec<u32>,
    /// Claims whose half-done prepare was rolled back.
    pub rolled_back: Vec<String>,
    /// Claims whose release left over (an unprepare or roll-back whose destroys failed)
    /// finished.
    pub released: Vec<String>,
    /// Completed claims kept for the kubelet (each a suspect of the orphan rule).
    pub kept: Vec<String>,
    /// Claims whose instances could not all be destroyed: recorded for the reaper.
    pub pending_destroy: Vec<String>,
    /// Claims whose record was rebuilt from live instances and the API server.
    pub rebuilt: Vec<String>,
    /// Kept claims with a recorded instance that no longer exists.
    pub missing_instances: Vec<String>,
    /// CDI specs written again.
    pub cdi_specs_rewritten: usize,
    /// MIG instances destroyed because no claim owns them (`MIG UUID`s).
    pub orphans_destroyed: Vec<String>,
    /// MIG instances left alone because DAS did not create them.
    pub foreign_kept: Vec<String>,
    /// Orphans that could not be destroyed (retried at the next start).
    pub orphans_left: Vec<String>,
    /// CDI spec files removed.
    pub stale_cdi_specs: usize,
}

/// Why start-up reconciliation stopped. A GPU that does not answer, a MIG instance that cannot be
/// destroyed or a claim's spec that cannot be written again is not one: each is logged and
/// reported ([`Report`]), and reconciliation goes on.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The API server's ResourceClaims could not be listed (step 4, the rebuild of a lost
    /// checkpoint).
    #[error("list ResourceClaims: {0}")]
    ListClaims(#[source] ApiError),
    /// A rebuilt claim's CDI spec could not be built or written (step 4), or the CDI directory
    /// could not be cleaned (step 6).
    #[error(transparent)]
    Cdi(#[from] CdiError),
    /// A rebuilt claim's record, or the end of an interrupted MIG mode switch (step 0), could
    /// not be saved.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}
