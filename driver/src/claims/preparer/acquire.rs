//! The acquires of a prepare and of a carve before bind: each GPU put in the MIG mode its
//! devices' kinds need, each device acquired by its kind ([`crate::claims::kinds::Kind::acquire`]:
//! a MIG instance created at exactly its placement, a share's MIG instance created or joined, a whole
//! GPU's device node; GPUs in parallel, one GPU's calls in turn), and each instance noted in the
//! claim's record as soon as it exists; a failure rolled back. Nothing here names a kind.

use std::collections::BTreeMap;

use futures::future::join_all;
use tracing::Instrument;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::error::ModeRefusal;
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::{Failed, GpuMode, GpuTxn};
use crate::claims::plan::{self, Holding, Planned};

/// What one GPU's acquires came to: what each acquired device holds, by position in the plan,
/// and the first failure with its position, if any.
type Acquired = (Vec<(usize, Holding)>, Option<(usize, Failed)>);

impl Preparer {
    /// Creates the instances of `planned` for the claim whose record was just checkpointed
    /// `PrepareStarted` (prepare, and carve before bind); returns the record's devices with
    /// their instances and what each holds. A failure is rolled back.
    pub(super) async fn acquire_planned(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(Vec<RecordedDevice>, Vec<Holding>), PrepareError> {
        let (made, failed) = self.acquire_all(claim, planned).await;
        let devices = self.record_of(&claim.uid).map(|r| r.devices);
        let Some(devices) = devices else {
            return Err(PrepareError::Internal(
                "the claim's record vanished while its lock was held".into(),
            ));
        };
        if let Some((attempted, err)) = failed_creates(&devices, &made, failed) {
            self.roll_back(claim, attempted).await;
            return Err(err);
        }
        // Every device holds what its kind acquired.
        let held: Vec<Holding> = made.into_iter().flatten().collect();
        Ok((devices, held))
    }

    /// Puts each GPU in the MIG mode its planned devices need and acquires every planned
    /// device, GPUs in parallel. Returns what each planned device holds (in order; `None` where
    /// nothing was acquired) and the first failure of each GPU that failed (a GPU stops at its
    /// first failure).
    async fn acquire_all(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> (Vec<Option<Holding>>, Vec<(usize, Failed)>) {
        let mut by_gpu: BTreeMap<u32, Vec<(usize, &Planned)>> = BTreeMap::new();
        for (i, p) in planned.iter().enumerate() {
            by_gpu.entry(p.at.gpu_index).or_default().push((i, p));
        }
        let per_gpu = join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, items)| self.acquire_on_gpu(claim, gpu, items)),
        )
        .await;
        let mut made = vec![None; planned.len()];
        let mut failed = Vec::new();
        for (held, err) in per_gpu {
            for (i, h) in held {
                made[i] = Some(h);
            }
            failed.extend(err);
        }
        (made, failed)
    }

    /// Under GPU `gpu`'s lock: puts the GPU in the MIG mode `items`' kinds need
    /// ([`Self::ensure_mig_mode`]), then acquires each device in turn, noting each instance in
    /// the claim's record while still holding the lock, so a concurrent release on this GPU
    /// sees it as recorded. In a span `acquire` with the `gpu`, each device's acquire in a span
    /// `acquire_device` with the `device`.
    #[tracing::instrument(name = "acquire", level = "error", skip_all, fields(gpu = gpu))]
    async fn acquire_on_gpu(
        &self,
        claim: &ClaimRef,
        gpu: u32,
        items: Vec<(usize, &Planned)>,
    ) -> Acquired {
        let uid = claim.uid.as_str();
        let _held = self.gpus.lock(gpu).await;
        let Some(&(first, p)) = items.first() else {
            return (Vec::new(), None);
        };
        let mode = self.kinds.of(&p.at).gpu_mode();
        let want_mig = mode == GpuMode::MigOn;
        if let Some(&(i, other)) = items
            .iter()
            .find(|(_, q)| self.kinds.of(&q.at).gpu_mode() != mode)
        {
            let err = PrepareError::MigModeSwitch {
                device: other.device.clone(),
                gpu,
                mig_enabled: !want_mig,
                reason: ModeRefusal::MixedModes {
                    other: p.device.clone(),
                }
                .to_string(),
            };
            return (Vec::new(), Some((i, err.into())));
        }
        if let Err(e) = self.ensure_mig_mode(uid, gpu, want_mig, &p.device).await {
            return (Vec::new(), Some((first, e.into())));
        }
        let tx = GpuTxn::new(
            gpu,
            claim,
            &self.records.checkpoint,
            &self.node,
            &self.gpus,
            &self.metrics,
        );
        let mut made = Vec::new();
        for (i, p) in items {
            let span = tracing::error_span!("acquire_device", device = %p.device);
            let held = match self
                .kinds
                .of(&p.at)
                .acquire(i, p, &tx)
                .instrument(span)
                .await
            {
                Ok(h) => h,
                Err(e) => return (made, Some((i, e))),
            };
            if let Holding::Instance(instance) = &held {
                self.records.checkpoint.change(|cp| {
                    if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                        *d = plan::with_instance(d, instance);
                    }
                });
            }
            made.push((i, held));
        }
        (made, None)
    }
}

/// After acquires of which some GPUs' `failed`: what the roll-back must release (the
/// instances made, and every GPU instance a failed acquire left behind, [`Failed::left`]) and
/// the prepare's error (the first GPU's failure). `None` when nothing failed.
fn failed_creates(
    devices: &[RecordedDevice],
    made: &[Option<Holding>],
    failed: Vec<(usize, Failed)>,
) -> Option<(Vec<RecordedDevice>, PrepareError)> {
    let mut attempted: Vec<RecordedDevice> = devices
        .iter()
        .zip(made)
        .filter(|(_, m)| m.as_ref().and_then(Holding::instance).is_some())
        .map(|(d, _)| d.clone())
        .collect();
    let mut first = None;
    for (i, failure) in failed {
        if let Some(left) = failure.left {
            attempted.push(RecordedDevice {
                instance: Some(left),
                ..devices[i].clone()
            });
        }
        first.get_or_insert(failure.error);
    }
    first.map(|err| (attempted, err))
}
