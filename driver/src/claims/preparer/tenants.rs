//! A shared slice serves one namespace (docs/design.md §7, "Shares are a tenant's own"): a
//! share of a slice that claims of another namespace hold is refused before anything is
//! recorded for it ([`Preparer::check_share_namespace`]; the same rule is decided again under
//! the GPU's lock, [`crate::claims::plan::share::on_share`]), and the publisher learns, after
//! every change of the records, which namespace each shareable device serves
//! ([`Preparer::report_share_namespaces_to`]), so that das-webhook's selector steers the
//! scheduler away from slices of other namespaces. With `--shares-across-namespaces` neither
//! happens.

use tokio::sync::watch;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::handler::ClaimRef;
use crate::claims::plan::{self, Planned};
use crate::publish::desired::HealthFacts;

impl Preparer {
    /// Before claim `claim`'s prepare or carve records anything: its shares may not join a
    /// slice that claims of another namespace hold ([`plan::share::check_namespace`]).
    ///
    /// # Errors
    /// [`PrepareError::Share`] naming the namespace the slice serves, its holders and what to
    /// do; nothing was recorded, created or joined.
    pub(crate) fn check_share_namespace(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), PrepareError> {
        let only = self.node.share_scope(&claim.namespace);
        self.records
            .checkpoint
            .read(|cp| plan::share::check_namespace(cp, &claim.uid, only, planned))
    }

    /// Has the publisher learn, through `facts` ([`HealthFacts::share_namespaces`]), the
    /// namespace each shareable device serves, now and after every change of the records that
    /// changes it (a share recorded by a prepare or carve, the last share's record dropped by
    /// an unprepare, a roll-back, the reaper or the orphan rule). Nothing is reported where
    /// shares may cross namespaces. Call once, before publishing.
    pub fn report_share_namespaces_to(&self, facts: watch::Sender<HealthFacts>) {
        if self.node.shares_across_namespaces {
            return;
        }
        self.records.checkpoint.observe(move |cp| {
            let now = plan::share::share_namespaces(cp);
            facts.send_if_modified(|f| {
                if f.share_namespaces == now {
                    return false;
                }
                tracing::debug!(namespaces = ?now, "the namespaces of the shared slices changed");
                f.share_namespaces = now;
                true
            });
        });
    }
}
