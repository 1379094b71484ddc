//! Start-up reconciliation of checkpoint, GPUs and API server: the steps of
//! [`crate::claims::startup`], in that order, before the plugin serves; and the reads of every
//! GPU's instances it and the plugin's start make.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tracing::Instrument;

use super::Preparer;
use crate::claims::EventTarget;
use crate::claims::cdi;
use crate::claims::checkpoint::{ClaimRecord, PrepareState, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::layers::Restored;
use crate::claims::plan::{self, Holding};
use crate::claims::spans::claim_span;
use crate::claims::startup::{Report, StartupError};
use crate::gpu::{BackendError, MigInstance};

/// Every managed GPU's instances, or why that GPU could not be read.
type LivePerGpu = BTreeMap<u32, Result<Vec<MigInstance>, BackendError>>;

impl Preparer {
    /// Reconciles checkpoint, GPUs and API server; see [`crate::claims::startup`]. `rebuild`
    /// asks for step 4 (the checkpoint was missing or corrupt); `reclaim_foreign` has step 5
    /// destroy unrecorded instances DAS did not create too.
    ///
    /// # Errors
    /// [`StartupError::ListClaims`]: the API server could not be listed (rebuild only);
    /// [`StartupError::Cdi`] or [`StartupError::Checkpoint`]: a rebuilt claim's spec or record
    /// could not be written, or the CDI directory could not be cleaned.
    pub async fn reconcile_at_startup(
        &self,
        rebuild: bool,
        reclaim_foreign: bool,
    ) -> Result<Report, StartupError> {
        let mut report = Report::default();
        self.recover_mig_mode_switches().await?;
        let live = self.live_per_gpu().await;
        for (gpu, r) in &live {
            if let Err(e) = r {
                tracing::error!(gpu, error = %e, "GPU does not answer: skipping it; claims with slices on it are kept until it does");
                self.warn(EventTarget::Node, "GpuUnavailable", format!("GPU {gpu}: {e}. DAS keeps the claims with slices on it and destroys them once it answers again."))
                    .await;
                report.unavailable_gpus.push(*gpu);
            }
        }
        // The kept and rebuilt claims whose layers (MPS daemons) come back all together once the
        // records are settled (each may wait for its daemon's socket and limits).
        let mut layers_back = Vec::new();
        for (claim, record) in self.recorded_claims() {
            let span = claim_span!("startup", &claim);
            self.settle(&claim, record, &live, &mut report, &mut layers_back)
                .instrument(span)
                .await;
        }
        if rebuild {
            self.rebuild_from_api(&live, &mut report, &mut layers_back)
                .await?;
        }
        self.learn_pods_of_kept().await;
        // Before the orphans are destroyed (`destroy_orphans` requires the proof): an
        // unrecorded daemon's MPS server keeps its MIG instance in use, and the MIG instance's destroy would
        // fail.
        let restored = self
            .layers
            .restore_at_startup(&layers_back, &self.records.checkpoint)
            .await;
        self.destroy_orphans(&restored, reclaim_foreign, &mut report)
            .await;
        self.remove_stale_cdi_specs(&mut report)?;
        self.update_gauges();
        Ok(report)
    }

    /// Every record, with the claim it is of.
    fn recorded_claims(&self) -> Vec<(ClaimRef, ClaimRecord)> {
        self.records.checkpoint.read(|cp| {
            cp.claims
                .iter()
                .map(|(uid, r)| {
                    let claim = ClaimRef {
                        namespace: r.namespace.clone(),
                        name: r.name.clone(),
                        uid: uid.clone(),
                    };
                    (claim, r.clone())
                })
                .collect()
        })
    }

    /// Steps 2 and 3 for one record; a kept claim whose instances exist goes to `layers_back`
    /// (its layers, MPS daemons, come back with the others').
    async fn settle(
        &self,
        claim: &ClaimRef,
        record: ClaimRecord,
        live: &LivePerGpu,
        report: &mut Report,
        layers_back: &mut Vec<(ClaimRef, Vec<RecordedDevice>)>,
    ) {
        let what = match record.state {
            PrepareState::PrepareCompleted => {
                self.suspect_holders(std::iter::once(&claim.uid));
                report.kept.push(claim.to_string());
                match self.check_kept(claim, &record, live, report) {
                    Kept::Live => layers_back.push((claim.clone(), record.devices)),
                    // Its daemons come back once the GPU answers (the reaper's passes).
                    Kept::GpuUnavailable if self.layers.worn(&record.devices) => {
                        self.lifecycle.layers_pending.add(&claim.uid);
                    }
                    Kept::GpuUnavailable | Kept::Missing => {}
                }
                return;
            }
            PrepareState::Repairing => {
                // A guard without instances: the kubelet holds the claim and its next prepare
                // creates them again; nothing to check on the GPUs.
                tracing::info!(
                    "keeping the guard of a claim whose repair did not finish: the kubelet holds it"
                );
                self.suspect_holders(std::iter::once(&claim.uid));
                report.kept.push(claim.to_string());
                return;
            }
            PrepareState::Carved if self.carved_still_allocated(claim, &record).await => {
                tracing::info!("keeping a claim carved before bind for the kubelet's prepare");
                report.kept.push(claim.to_string());
                return;
            }
            PrepareState::Carved => {
                "destroying a slice carved for a claim no longer allocated here"
            }
            PrepareState::PrepareStarted => "rolling back a prepare that did not complete",
            PrepareState::Releasing => "destroying the slices a release left",
        };
        tracing::info!("{what}");
        match self.release(claim, record.devices).await {
            Ok(()) if record.state == PrepareState::PrepareStarted => {
                report.rolled_back.push(claim.to_string())
            }
            Ok(()) => report.released.push(claim.to_string()),
            Err(e) => {
                tracing::warn!(error = %e, "slices left for the reaper");
                report.pending_destroy.push(claim.to_string());
            }
        }
    }

    /// A kept claim: its instances should exist (a whole GPU, that this node still publishes
    /// it); its CDI spec is written again if needed. Says whether its instances exist (its
    /// MPS daemons can then run).
    pub(super) fn check_kept(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
        live: &LivePerGpu,
        report: &mut Report,
    ) -> Kept {
        let on_gpus: Option<Vec<MigInstance>> = record
            .devices
            .iter()
            .map(|d| d.gpu_index)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|g| live.get(&g).and_then(|r| r.as_ref().ok()).cloned())
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect());
        let Some(on_gpus) = on_gpus else {
            return Kept::GpuUnavailable; // nothing to check now
        };
        let matched = plan::match_devices(&record.devices, &on_gpus, |_| false);
        let held = self.holdings(&record.devices, &matched);
        if held.iter().any(Option::is_none) {
            tracing::warn!(
                "a slice recorded for a prepared claim no longer exists (or its whole GPU is no longer published here); the claim's next prepare creates it again"
            );
            report.missing_instances.push(claim.to_string());
            return Kept::Missing;
        }
        let held: Vec<Holding> = held.into_iter().flatten().collect();
        match self.ensure_cdi_spec(claim, record, &held) {
            Ok(true) => report.cdi_specs_rewritten += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::error!(error = %e, "writing the claim's CDI spec failed")
            }
        }
        Kept::Live
    }

    /// The records the kubelet holds learn the pods their claims are reserved for now (a pod
    /// that reserved a prepared claim never reached a prepare): one read per claim, all at
    /// once; a claim that cannot be read is left to the next read (the orphan rule's).
    async fn learn_pods_of_kept(&self) {
        let kept: Vec<(ClaimRef, ClaimRecord)> = self
            .recorded_claims()
            .into_iter()
            .filter(|(_, r)| {
                matches!(
                    r.state,
                    PrepareState::PrepareCompleted | PrepareState::Repairing
                )
            })
            .collect();
        let reads = kept.iter().map(|(claim, record)| {
            async move {
                if let Err(e) = self.allocated_as_recorded(claim, record).await {
                    tracing::debug!(error = %e, "cannot read a kept claim to learn its pods; the orphan rule reads it later");
                }
            }
            .instrument(claim_span!("learn_pods", claim))
        });
        futures::future::join_all(reads).await;
    }

    /// Step 4: records for live instances that claims on this node are allocated to. A whole GPU
    /// leaves nothing on its GPU: the claim's CDI spec, still on disk, is the evidence that the
    /// kubelet prepared it (its unprepare deletes the spec).
    async fn rebuild_from_api(
        &self,
        live: &LivePerGpu,
        report: &mut Report,
        layers_back: &mut Vec<(ClaimRef, Vec<RecordedDevice>)>,
    ) -> Result<(), StartupError> {
        let live: Vec<MigInstance> = live
            .values()
            .filter_map(|r| r.as_ref().ok())
            .flatten()
            .cloned()
            .collect();
        let claims = self
            .api
            .client
            .list_claims()
            .await
            .map_err(StartupError::ListClaims)?;
        for rc in claims {
            let claim = crate::claims::carve::claim_ref(&rc);
            if rc.metadata.uid.is_none() || self.record_of(&claim.uid).is_some() {
                continue;
            }
            let span = claim_span!("rebuild", &claim);
            self.rebuild_claim(&claim, &rc, &live, report, layers_back)
                .instrument(span)
                .await?;
        }
        Ok(())
    }

    /// Step 4 for claim `claim` (`rc`), which has no record: its record, when every device of
    /// its allocation here is held on the GPUs (`live`).
    async fn rebuild_claim(
        &self,
        claim: &ClaimRef,
        rc: &ResourceClaim,
        live: &[MigInstance],
        report: &mut Report,
        layers_back: &mut Vec<(ClaimRef, Vec<RecordedDevice>)>,
    ) -> Result<(), StartupError> {
        let Some((devices, held)) = self.held_for(claim, rc, live) else {
            return Ok(()); // not (fully) prepared here: the kubelet will prepare it
        };
        // Carved before bind and not prepared yet: the kubelet's prepare writes its CDI spec
        // (no container was given it), so no spec on disk and SliceReady answered. Rebuilt
        // as carved, the watch and start-up release it if its claim goes; as prepared with
        // no pod, the orphan rule would keep it forever.
        let node = &self.node.name;
        if crate::claims::carve::waits_for_carve(rc, node)
            && crate::claims::carve::carve_answered(rc, node)
            && !self.spec_on_disk(claim)
        {
            self.records
                .checkpoint
                .commit(|cp| cp.set_carved(&claim.uid, &claim.namespace, &claim.name, devices))
                .await?;
            tracing::info!("rebuilt the record of a claim carved before bind from live slices");
        } else {
            self.rebuild_prepared(claim, rc, devices.clone(), &held)
                .await?;
            layers_back.push((claim.clone(), devices));
            tracing::info!("rebuilt the record of a prepared claim from live slices");
        }
        report.rebuilt.push(claim.to_string());
        Ok(())
    }

    /// Whether claim `claim`'s CDI spec is on disk (the kubelet prepared it: its unprepare
    /// deletes it).
    fn spec_on_disk(&self, claim: &ClaimRef) -> bool {
        cdi::spec_path(self.cdi.dir(), &claim.uid).exists()
    }

    /// The devices of `rc`'s allocation here with what holds each on the GPUs (`live`), when
    /// every one is held (each MIG device's instance live, each whole GPU's CDI spec still on
    /// disk: nothing on the GPU shows that the kubelet prepared a whole GPU); `None` otherwise.
    fn held_for(
        &self,
        claim: &ClaimRef,
        rc: &ResourceClaim,
        live: &[MigInstance],
    ) -> Option<(Vec<RecordedDevice>, Vec<Holding>)> {
        let planned = self.resolve(claim, Some(rc)).ok()?;
        let started: Vec<RecordedDevice> = planned.iter().map(plan::record).collect();
        // A share's MIG instance may already be recorded by another share of it: that is no other
        // claim's instance.
        let matched = plan::match_devices(&started, live, |s| {
            self.records
                .checkpoint
                .read(|cp| plan::recorded_unshared_elsewhere(cp, &claim.uid, s))
        });
        let held = self.holdings(&started, &matched);
        // A kind that makes no instance leaves nothing on the GPU: its CDI spec is the evidence.
        let traceless = |d: &RecordedDevice| !self.kinds.of_record(d).creates_instance();
        if held.iter().any(Option::is_none)
            || (started.iter().any(traceless) && !self.spec_on_disk(claim))
        {
            return None;
        }
        let held: Vec<Holding> = held.into_iter().flatten().collect();
        let devices = started
            .iter()
            .zip(&held)
            .map(|(d, h)| match h.instance() {
                Some(s) => plan::with_instance(d, s),
                None => d.clone(),
            })
            .collect();
        Some((devices, held))
    }

    /// Writes the CDI spec of a prepared claim found live and records it completed, with the
    /// pods it is reserved for (the orphan rule's evidence).
    async fn rebuild_prepared(
        &self,
        claim: &ClaimRef,
        rc: &ResourceClaim,
        devices: Vec<RecordedDevice>,
        held: &[Holding],
    ) -> Result<(), StartupError> {
        let built = self.build_spec(claim, &devices, held, &[])?;
        self.cdi.write(&claim.uid, &built.spec)?;
        let ids: BTreeMap<String, Vec<String>> = built
            .device_ids
            .into_iter()
            .map(|(k, id)| (k, vec![id]))
            .collect();
        self.records
            .checkpoint
            .commit(|cp| {
                cp.set_completed(&claim.uid, &claim.namespace, &claim.name, devices, ids);
                cp.set_pods(&claim.uid, plan::reserving_pods(rc));
            })
            .await?;
        Ok(())
    }

    /// Step 5, on the GPUs that answer (listed again: steps 2–4 changed them), once the layers
    /// are settled (`_layers`: nothing a layer runs keeps an orphan in use).
    async fn destroy_orphans(
        &self,
        _layers: &Restored,
        reclaim_foreign: bool,
        report: &mut Report,
    ) {
        for gpu in self.gpus.gpu_indices() {
            let Ok(live) = self.gpus.instances_on(gpu).await else {
                continue;
            };
            let found = self
                .records
                .checkpoint
                .read(|cp| plan::orphans(&live, cp, reclaim_foreign));
            for s in found.foreign {
                tracing::warn!(gpu = s.gpu_index, profile = %s.profile, start = s.placement.start, mig = %s.mig_uuid,
                    "leaving a MIG instance DAS did not create; its placement stays unavailable (--reclaim-foreign-slices destroys it)");
                report.foreign_kept.push(s.mig_uuid);
            }
            for s in found.destroy {
                let _held = self.gpus.lock(gpu).await;
                match self.destroy_one(&s).await {
                    Ok(()) => {
                        tracing::info!(gpu = s.gpu_index, profile = %s.profile, start = s.placement.start, mig = %s.mig_uuid, "destroyed an orphaned slice");
                        report.orphans_destroyed.push(s.mig_uuid);
                    }
                    Err(e) => {
                        tracing::error!(mig = %s.mig_uuid, error = %e, "destroying an orphaned slice failed; retried at the next start");
                        self.metrics.destroy_failed(e.kind());
                        report.orphans_left.push(s.mig_uuid);
                    }
                }
            }
        }
    }

    /// Step 6.
    fn remove_stale_cdi_specs(&self, report: &mut Report) -> Result<(), StartupError> {
        let held: HashSet<String> = self
            .records
            .checkpoint
            .read(|cp| cp.claims.keys().cloned().collect());
        self.cdi.remove_temp_files()?;
        for f in self.cdi.list()? {
            if !held.contains(&f.claim_uid) {
                self.cdi.delete(&f.claim_uid)?;
                report.stale_cdi_specs += 1;
            }
        }
        Ok(())
    }

    /// Every managed GPU's instances, or why that GPU could not be read.
    pub(crate) async fn live_per_gpu(&self) -> LivePerGpu {
        let mut out = BTreeMap::new();
        for gpu in self.gpus.gpu_indices() {
            out.insert(gpu, self.gpus.instances_on(gpu).await);
        }
        out
    }

    /// The MIG instances on the GPUs that answer that no claim holds ([`plan::unclaimed`]),
    /// read from the GPUs now: at the plugin's start, before it serves.
    pub async fn unclaimed_instances(&self) -> Vec<MigInstance> {
        self.unclaimed_in(false).await
    }

    /// The instances no claim holds on the GPUs that answer, from each GPU's instance list read
    /// now, or, with `cached`, as the backend last knew it
    /// ([`crate::gpu::GpuBackend::cached_instances_on`]).
    pub(crate) async fn unclaimed_in(&self, cached: bool) -> Vec<MigInstance> {
        let mut out = Vec::new();
        for gpu in self.gpus.gpu_indices() {
            let live = if cached {
                self.gpus
                    .call(gpu, move |b| b.cached_instances_on(gpu))
                    .await
            } else {
                self.gpus.instances_on(gpu).await
            };
            let Ok(live) = live else {
                continue;
            };
            out.extend(
                self.records
                    .checkpoint
                    .read(|cp| plan::unclaimed(&live, cp)),
            );
        }
        out
    }
}

/// What start-up found of a kept claim's instances ([`Preparer::check_kept`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// They exist (its MPS daemons can run).
    Live,
    /// A GPU of the claim does not answer: nothing can be checked (or started) now.
    GpuUnavailable,
    /// One is gone: the claim's next prepare repairs it.
    Missing,
}
