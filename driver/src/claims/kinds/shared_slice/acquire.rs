//! A share's prepare under its GPU's lock (docs/design.md §7, "Shared slices"): it creates the
//! MIG instance, or joins the one other shares hold; a share of a whole GPU holds the GPU; each
//! decided from the records ([`plan::on_share`]).

use super::plan::{self, OnShare};
use crate::claims::checkpoint::{Checkpoint, InstanceId, RecordedDevice};
use crate::claims::kinds::{Failed, GpuTxn, Planned, is_instance, record};
use crate::claims::{PrepareError, ShareRefusal};
use crate::gpu::MigInstance;

/// The instance of planned share `p` (its claim's `i`th device) on GPU `tx.gpu`, whose lock
/// the caller holds: created, or, for a share of a MIG instance other shares hold, theirs (refused
/// where those serve another namespace). A share that joins records that MIG instance in
/// the same change of the checkpoint that decides it: a release of another share that decides
/// between the two (after its record is marked `Releasing`) sees this share as a holder, so it
/// never stops the daemon or destroys the MIG instance this share just joined.
///
/// # Errors
/// [`PrepareError::Share`]: the share can neither create nor join its MIG instance (nothing was
/// created); or what the create answered.
pub(super) async fn create_or_join(
    i: usize,
    p: &Planned,
    tx: &GpuTxn<'_>,
) -> Result<MigInstance, Failed> {
    let uid = tx.claim.uid.as_str();
    let only = tx.node.share_scope(&tx.claim.namespace);
    let (on, _) = tx.checkpoint.change(|cp| {
        let on = plan::on_share(cp, uid, only, p);
        if let OnShare::Join(id) = &on {
            set_instance(cp, uid, i, Some(id.clone()));
        }
        on
    });
    tracing::debug!(decision = ?on, "a share of a shared slice");
    match on {
        OnShare::Create => tx.create_instance(p).await,
        OnShare::Refuse(e) => Err(e.into()),
        OnShare::JoinGpu => Err(PrepareError::Internal(format!(
            "{}: a share of a MIG instance met a share of a whole GPU of the same name",
            p.device
        ))
        .into()),
        OnShare::Join(id) => {
            let joined = join_instance(tx, p, id).await;
            if joined.is_err() {
                tx.checkpoint.change(|cp| set_instance(cp, uid, i, None));
            }
            joined.map_err(Failed::from)
        }
    }
}

/// The live instance `id` other shares of `p`'s MIG instance hold, on GPU `tx.gpu` (its lock held).
///
/// # Errors
/// [`PrepareError::Share`]: the GPU does not answer, or the instance is gone.
async fn join_instance(
    tx: &GpuTxn<'_>,
    p: &Planned,
    id: InstanceId,
) -> Result<MigInstance, PrepareError> {
    let fail = |reason: ShareRefusal| PrepareError::Share {
        device: p.device.clone(),
        reason,
    };
    let live = tx
        .instances()
        .await
        .map_err(|e| fail(ShareRefusal::GpuUnavailable(e)))?;
    let held = RecordedDevice {
        instance: Some(id),
        ..record(p)
    };
    live.into_iter()
        .find(|s| is_instance(&held, s) && !s.mig_uuid.is_empty())
        .ok_or_else(|| fail(ShareRefusal::Gone))
}

/// Share `p` (its claim's `i`th device) of a whole GPU on GPU `tx.gpu`, whose lock the caller
/// holds: held, unless the GPU's shares serve another namespace or another config, or are being
/// released. A share that holds it is marked acquired in the same change of the checkpoint that
/// decides it, so the next share's decision (and a release's) sees it as a holder.
///
/// # Errors
/// [`PrepareError::Share`]: the share cannot hold the GPU; nothing was marked.
pub(super) fn hold_gpu(i: usize, p: &Planned, tx: &GpuTxn<'_>) -> Result<(), PrepareError> {
    let uid = tx.claim.uid.as_str();
    let only = tx.node.share_scope(&tx.claim.namespace);
    let (on, _) = tx.checkpoint.change(|cp| {
        let on = plan::on_share(cp, uid, only, p);
        if !matches!(on, OnShare::Refuse(_))
            && let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i))
        {
            d.acquired = true;
        }
        on
    });
    tracing::debug!(decision = ?on, "a share of a whole GPU");
    match on {
        OnShare::Refuse(e) => Err(e),
        OnShare::Create | OnShare::Join(_) | OnShare::JoinGpu => Ok(()),
    }
}

/// Sets (or clears) the instance of claim `uid`'s `i`th recorded device.
fn set_instance(cp: &mut Checkpoint, uid: &str, i: usize, id: Option<InstanceId>) {
    if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
        d.instance = id;
    }
}
