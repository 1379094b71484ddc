//! A shared slice serves one namespace (docs/design.md §7, "Shares are a tenant's own"): a
//! share of a MIG instance that claims of another namespace hold is refused before anything is
//! recorded for it ([`check_namespace`]; the same rule is decided again under the GPU's lock,
//! [`super::plan::on_share`]), and the publisher learns, after every change of the records,
//! which namespace each shareable device serves ([`namespaces_facts`]), so that das-webhook's
//! selector steers the scheduler away from MIG instances of other namespaces. With
//! `--shares-across-namespaces` neither happens.

use super::plan;
use crate::claims::PrepareError;
use crate::claims::kinds::{NodeDevices, Planned, Precheck, RecordFacts};

/// Before a prepare or carve of claim `cx.claim` records anything: its shares (`planned`) may
/// not join a MIG instance that claims of another namespace hold ([`plan::check_namespace`]).
///
/// # Errors
/// [`PrepareError::Share`] naming the namespace the MIG instance serves, its holders and what to do;
/// nothing was recorded, created or joined.
pub(super) fn check_namespace(planned: &[&Planned], cx: &Precheck<'_>) -> Result<(), PrepareError> {
    let only = cx.node.share_scope(&cx.claim.namespace);
    let planned: Vec<Planned> = planned.iter().map(|p| (*p).clone()).collect();
    cx.checkpoint
        .read(|cp| plan::check_namespace(cp, &cx.claim.uid, only, &planned))
}

/// The namespace each shareable device serves, as the publisher shows it
/// (`HealthFacts::share_namespaces`), derived from the records after every change of them (a
/// share recorded by a prepare or carve, the last share's record dropped by an unprepare, a
/// roll-back, the reaper or the orphan rule); none where shares may cross namespaces.
pub(super) fn namespaces_facts(node: &NodeDevices) -> Option<RecordFacts> {
    if node.shares_across_namespaces {
        return None;
    }
    Some(Box::new(|cp, f| {
        let now = plan::share_namespaces(cp);
        if f.share_namespaces == now {
            return false;
        }
        tracing::debug!(namespaces = ?now, "the namespaces of the shared slices changed");
        f.share_namespaces = now;
        true
    }))
}
