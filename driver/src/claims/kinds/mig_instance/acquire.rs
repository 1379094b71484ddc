//! The create of a MIG slice: one MIG instance at exactly the allocated placement, on its GPU
//! (lock held, MIG mode on).

use crate::claims::PrepareError;
use crate::claims::checkpoint::InstanceId;
use crate::claims::kinds::{Failed, GpuTxn, Planned};
use crate::gpu::MigInstance;

/// Creates the instance of `p`.
///
/// # Errors
/// [`PrepareError::Create`] with what the backend answered; a GPU instance the failed create
/// left behind (its target names a GI ID) is [`Failed::left`], for the roll-back.
pub(super) async fn create(p: &Planned, tx: &GpuTxn<'_>) -> Result<MigInstance, Failed> {
    tx.create_instance(&p.at.profile, p.at.start)
        .await
        .map_err(|e| Failed {
            left: e.target().gi_id.map(|gi_id| InstanceId {
                gi_id,
                ci_id: 0,
                mig_uuid: String::new(),
            }),
            error: PrepareError::create(&p.device, e),
        })
}
