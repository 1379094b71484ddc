//! The creates of a prepare and of a carve before bind: each GPU put in the MIG mode its
//! devices need, each instance created at exactly its placement (GPUs in parallel, one GPU's
//! calls in turn) or, for a share, joined, and noted in the claim's record as soon as it
//! exists; a failure rolled back.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::future::join_all;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::checkpoint::{Checkpoint, InstanceId, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::plan::share::OnShare;
use crate::claims::plan::{self, DeviceKind, Holding, Planned};
use crate::gpu::{BackendError, MigInstance};

/// What the instances of one GPU's creates came to: the instances made, by position in the
/// plan, and the first failure with its position, if any.
type Created = (Vec<(usize, MigInstance)>, Option<(usize, Failed)>);

/// Why the work of a prepare on one GPU stopped.
enum Failed {
    /// The GPU could not be put in the MIG mode its devices need, or a share could neither
    /// create nor join its slice; nothing was created for the device.
    Refused(PrepareError),
    /// A create failed.
    Create(BackendError),
}

impl Preparer {
    /// Creates the instances of `planned` for the claim whose record was just checkpointed
    /// `PrepareStarted` (prepare, and carve before bind); returns the record's devices with
    /// their instances and what each holds. A failure is rolled back.
    pub(super) async fn create_planned(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(Vec<RecordedDevice>, Vec<Holding>), PrepareError> {
        let (made, failed) = self.create_all(claim, planned).await;
        let devices = self.record_of(&claim.uid).map(|r| r.devices);
        let Some(devices) = devices else {
            return Err(PrepareError::Internal(
                "the claim's record vanished while its lock was held".into(),
            ));
        };
        if let Some((attempted, err)) = failed_creates(planned, &devices, &made, failed) {
            self.roll_back(claim, attempted).await;
            return Err(err);
        }
        // Every MIG device has its instance now; a whole GPU needs only its device node.
        let held: Vec<Holding> = planned
            .iter()
            .zip(made)
            .filter_map(|(p, m)| match p.at.kind {
                DeviceKind::WholeGpu => Some(Holding::WholeGpu {
                    minor: p.at.gpu_minor,
                }),
                DeviceKind::Mig => m.map(Holding::Instance),
            })
            .collect();
        Ok((devices, held))
    }

    /// Puts each GPU in the MIG mode its planned devices need and creates every planned
    /// instance, GPUs in parallel. Returns the instance made for each planned device (in order;
    /// `None` for a whole GPU, for which nothing is created) and the first failure, if any (a
    /// GPU stops at its first failure).
    async fn create_all(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> (Vec<Option<MigInstance>>, Vec<(usize, Failed)>) {
        let mut by_gpu: BTreeMap<u32, Vec<(usize, &Planned)>> = BTreeMap::new();
        for (i, p) in planned.iter().enumerate() {
            by_gpu.entry(p.at.gpu_index).or_default().push((i, p));
        }
        let per_gpu = join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, items)| self.create_on_gpu(claim, gpu, items)),
        )
        .await;
        let mut made = vec![None; planned.len()];
        let mut failed = Vec::new();
        for (instances, err) in per_gpu {
            for (i, s) in instances {
                made[i] = Some(s);
            }
            failed.extend(err);
        }
        (made, failed)
    }

    /// Under GPU `gpu`'s lock: puts the GPU in the MIG mode `items` need (on for MIG devices, off
    /// for a whole GPU; [`Self::ensure_mig_mode`]), then creates the MIG devices' instances in
    /// turn, noting each in the claim's record while still holding the lock, so a concurrent
    /// release on this GPU sees it as recorded.
    async fn create_on_gpu(
        &self,
        claim: &ClaimRef,
        gpu: u32,
        items: Vec<(usize, &Planned)>,
    ) -> Created {
        let uid = claim.uid.as_str();
        let _held = self.gpus.lock(gpu).await;
        let Some(&(first, p)) = items.first() else {
            return (Vec::new(), None);
        };
        let want_mig = p.at.kind == DeviceKind::Mig;
        if let Some(&(i, other)) = items.iter().find(|(_, q)| q.at.kind != p.at.kind) {
            let err = PrepareError::MigModeSwitch {
                device: other.device.clone(),
                gpu,
                mig_enabled: !want_mig,
                reason: format!(
                    "the claim was also allocated {} on this GPU, which needs the other mode; a whole GPU and a slice of one GPU are never allocated together while the counters are published (check `kubectl get resourceslices` for this node's counter sets), so delete the pod to have its claim allocated again",
                    p.device
                ),
            };
            return (Vec::new(), Some((i, Failed::Refused(err))));
        }
        if let Err(e) = self.ensure_mig_mode(uid, gpu, want_mig, &p.device).await {
            return (Vec::new(), Some((first, Failed::Refused(e))));
        }
        let mut made = Vec::new();
        for (i, p) in items
            .into_iter()
            .filter(|(_, p)| p.at.kind == DeviceKind::Mig)
        {
            let r = match self.create_or_join(claim, gpu, i, p).await {
                Ok(r) => r,
                Err(e) => return (made, Some((i, Failed::Refused(e)))),
            };
            match r {
                Ok(instance) => {
                    self.records.checkpoint.change(|cp| {
                        if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                            *d = plan::with_instance(d, &instance);
                        }
                    });
                    made.push((i, instance));
                }
                Err(e) => return (made, Some((i, Failed::Create(e)))),
            }
        }
        (made, None)
    }
}

impl Preparer {
    /// The instance of planned device `p` (claim `claim`'s `i`th) on GPU `gpu`, whose lock the
    /// caller holds: created, or, for a share of a slice other shares hold, theirs
    /// ([`plan::share::on_share`]; refused where those serve another namespace). A share that joins records the slice's instance in the same
    /// change of the checkpoint that decides it: a release of another share that decides
    /// between the two (after its record is marked `Releasing`) sees this share as a holder, so
    /// it never stops the daemon or destroys the slice this share just joined.
    ///
    /// # Errors
    /// Outer: [`PrepareError::Share`], the share can neither create nor join its slice (nothing
    /// was created). Inner: what the backend's create answered.
    async fn create_or_join(
        &self,
        claim: &ClaimRef,
        gpu: u32,
        i: usize,
        p: &Planned,
    ) -> Result<Result<MigInstance, BackendError>, PrepareError> {
        let uid = claim.uid.as_str();
        if p.share.is_some() {
            let only = self.node.share_scope(&claim.namespace);
            let (on, _) = self.records.checkpoint.change(|cp| {
                let on = plan::share::on_share(cp, uid, only, p);
                if let OnShare::Join(id) = &on {
                    set_instance(cp, uid, i, Some(id.clone()));
                }
                on
            });
            tracing::debug!(claim = uid, device = %p.device, decision = ?on, "a share of a shared slice");
            match on {
                OnShare::Create => {}
                OnShare::Refuse(e) => return Err(e),
                OnShare::Join(id) => {
                    let joined = self.join_slice(gpu, p, id).await;
                    if joined.is_err() {
                        self.records
                            .checkpoint
                            .change(|cp| set_instance(cp, uid, i, None));
                    }
                    return joined.map(Ok);
                }
            }
        }
        let (profile, start) = (p.at.profile.clone(), p.at.start);
        let t0 = Instant::now();
        let r = self
            .gpus
            .call(gpu, move |b| b.create_instance(gpu, &profile, start))
            .await;
        self.metrics.observe_backend("create", t0.elapsed());
        Ok(r)
    }

    /// The live instance `id` other shares of `p`'s slice hold, on GPU `gpu` (its lock held).
    ///
    /// # Errors
    /// [`PrepareError::Share`]: the GPU does not answer, or the instance is gone.
    async fn join_slice(
        &self,
        gpu: u32,
        p: &Planned,
        id: InstanceId,
    ) -> Result<MigInstance, PrepareError> {
        let fail = |reason: String| PrepareError::Share {
            device: p.device.clone(),
            reason,
        };
        let live = self
            .gpus
            .instances_on(gpu)
            .await
            .map_err(|e| fail(format!("its slice's GPU does not answer: {e}")))?;
        let held = RecordedDevice {
            instance: Some(id),
            ..plan::record(p)
        };
        live.into_iter()
            .find(|s| plan::is_instance(&held, s) && !s.mig_uuid.is_empty())
            .ok_or_else(|| fail("the slice its other shares hold is gone from the GPU (destroyed outside DAS, or its compute instance lost); it is created again once they are unprepared".into()))
    }
}

/// Sets (or clears) the instance of claim `uid`'s `i`th recorded device.
fn set_instance(cp: &mut Checkpoint, uid: &str, i: usize, id: Option<InstanceId>) {
    if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
        d.instance = id;
    }
}

/// After creates of which some GPUs' `failed`: what the roll-back must release (the
/// instances made, and every GPU instance a failed create names: NVML's create leaves one
/// behind when the compute instance fails and so does its clean-up) and the prepare's error
/// (the first GPU's failure). `None` when nothing failed.
fn failed_creates(
    planned: &[Planned],
    devices: &[RecordedDevice],
    made: &[Option<MigInstance>],
    failed: Vec<(usize, Failed)>,
) -> Option<(Vec<RecordedDevice>, PrepareError)> {
    let mut attempted: Vec<RecordedDevice> = devices
        .iter()
        .zip(made)
        .filter(|(_, m)| m.is_some())
        .map(|(d, _)| d.clone())
        .collect();
    let mut first = None;
    for (i, failure) in failed {
        let err = match failure {
            Failed::Refused(err) => err,
            Failed::Create(e) => {
                if let Some(gi_id) = e.target().gi_id {
                    attempted.push(RecordedDevice {
                        instance: Some(InstanceId {
                            gi_id,
                            ci_id: 0,
                            mig_uuid: String::new(),
                        }),
                        ..devices[i].clone()
                    });
                }
                PrepareError::create(&planned[i].device, e)
            }
        };
        first.get_or_insert(err);
    }
    first.map(|err| (attempted, err))
}
