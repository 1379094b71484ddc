//! The check a prepare makes of its whole GPUs before anything is recorded (docs/design.md §7,
//! "Whole GPUs"): against the backend's inventory, read now, with whether DAS may switch each
//! GPU as the request path says since start-up. The switch itself comes later, under the GPU's
//! lock.

use super::plan;
use crate::claims::PrepareError;
use crate::claims::error::WholeGpuRefusal;
use crate::claims::kinds::{Planned, Precheck};

/// Checks the whole GPUs `whole` (one inventory read for all of them).
///
/// # Errors
/// [`PrepareError::WholeGpuUnavailable`] for the first whole GPU that cannot be prepared.
pub(super) async fn against_inventory(
    whole: &[&Planned],
    cx: &Precheck<'_>,
) -> Result<(), PrepareError> {
    let Some(first) = whole.first() else {
        return Ok(());
    };
    let gpu = first.at.gpu_index;
    let mut inventory = cx.gpus.call(gpu, |b| b.inventory()).await.map_err(|e| {
        PrepareError::WholeGpuUnavailable {
            device: first.device.clone(),
            reason: WholeGpuRefusal::InventoryUnreadable(e).to_string(),
        }
    })?;
    // Whether a GPU may be switched is the request path's to say since start-up.
    for g in &mut inventory {
        g.mig_switch = (cx.switch_of)(g.index);
    }
    for p in whole {
        if let Some(reason) = plan::whole_gpu_unavailable(p, &inventory) {
            return Err(PrepareError::WholeGpuUnavailable {
                device: p.device.clone(),
                reason,
            });
        }
    }
    Ok(())
}
