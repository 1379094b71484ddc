//! Start-up reconciliation of the three records of what is prepared: the checkpoint, the GPUs
//! (instances that exist) and the API server (claims that still hold devices). In order:
//! 1. GPUs that do not answer are skipped, with a log line and a Warning event on the Node; the
//!    records of claims with instances on them are kept for when they answer again;
//! 2. prepares that started but never completed are rolled back (the kubelet retries them), and
//!    releases left over are tried again;
//! 3. completed claims are kept, whatever the API server says of them: the kubelet holds them
//!    until it unprepares them, and a container of a force-deleted pod may still run on their
//!    slices. Each gets its CDI spec written again where it is missing or not what it should be,
//!    and becomes a suspect of the orphan rule ([`super::orphans`]), which checks after its
//!    delay whether the API server still allocates it and, if not, asks the container runtime;
//!    (prepares that never completed were never answered, so no container has their slices;
//!    releases were asked for by the kubelet's unprepare or are roll-backs);
//! 4. when the checkpoint was lost (corrupt, or first start), the records of live instances are
//!    rebuilt from the claims the API server has allocated on this node;
//! 5. instances nobody records are destroyed — only those DAS created, unless `reclaim_foreign`;
//! 6. CDI specs of claims we no longer hold, and leftover temp files, are removed.
//!
//! The decisions are [`super::plan`]'s; nothing here runs concurrently with calls (the plugin
//! reconciles before it serves).

use std::collections::{BTreeMap, HashSet};

use anyhow::{Context, Result};

use super::handler::ClaimRef;
use super::plan;
use super::{EventTarget, Preparer};
use crate::claims::cdi;
use crate::claims::checkpoint::{ClaimRecord, PrepareState, RecordedDevice};
use crate::gpu::{BackendError, MigInstance};

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
    /// Slices destroyed because no claim owns them (`MIG UUID`s).
    pub orphans_destroyed: Vec<String>,
    /// Slices left alone because DAS did not create them.
    pub foreign_kept: Vec<String>,
    /// Orphans that could not be destroyed (retried at the next start).
    pub orphans_left: Vec<String>,
    /// CDI spec files removed.
    pub stale_cdi_specs: usize,
}

impl Preparer {
    /// Reconciles checkpoint, GPUs and API server; see the module docs. `rebuild` asks for
    /// step 4 (the checkpoint was missing or corrupt).
    ///
    /// # Errors
    /// The API server could not be listed (rebuild only), or the CDI directory could not be
    /// cleaned.
    pub async fn reconcile_at_startup(
        &self,
        rebuild: bool,
        reclaim_foreign: bool,
    ) -> Result<Report> {
        let mut report = Report::default();
        let live = self.live_per_gpu().await;
        for (gpu, r) in &live {
            if let Err(e) = r {
                tracing::error!(gpu, error = %e, "GPU does not answer: skipping it; claims with slices on it are kept until it does");
                self.warn(EventTarget::Node, "GpuUnavailable", format!("GPU {gpu}: {e}. DAS keeps the claims with slices on it and destroys them once it answers again."))
                    .await;
                report.unavailable_gpus.push(*gpu);
            }
        }
        for (claim, record) in self.records() {
            self.settle(&claim, record, &live, &mut report).await;
        }
        if rebuild {
            self.rebuild_from_api(&live, &mut report).await?;
        }
        self.destroy_orphans(reclaim_foreign, &mut report).await;
        self.remove_stale_cdi_specs(&mut report)?;
        self.update_gauges();
        Ok(report)
    }

    fn records(&self) -> Vec<(ClaimRef, ClaimRecord)> {
        self.checkpoint.read(|cp| {
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

    /// Steps 2 and 3 for one record.
    async fn settle(
        &self,
        claim: &ClaimRef,
        record: ClaimRecord,
        live: &BTreeMap<u32, Result<Vec<MigInstance>, BackendError>>,
        report: &mut Report,
    ) {
        let what = match record.state {
            PrepareState::PrepareCompleted => {
                self.suspect_holders(std::iter::once(&claim.uid));
                report.kept.push(claim.to_string());
                self.check_kept(claim, &record, live, report);
                return;
            }
            PrepareState::PrepareStarted => "rolling back a prepare that did not complete",
            PrepareState::Releasing => "destroying the slices a release left",
        };
        tracing::info!(claim = %claim, "{what}");
        match self.release(claim, record.devices).await {
            Ok(()) if record.state == PrepareState::PrepareStarted => {
                report.rolled_back.push(claim.to_string())
            }
            Ok(()) => report.released.push(claim.to_string()),
            Err(e) => {
                tracing::warn!(claim = %claim, error = %e, "slices left for the reaper");
                report.pending_destroy.push(claim.to_string());
            }
        }
    }

    /// A kept claim: its instances should exist; its CDI spec is written again if needed.
    fn check_kept(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
        live: &BTreeMap<u32, Result<Vec<MigInstance>, BackendError>>,
        report: &mut Report,
    ) {
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
            return; // a GPU of the claim does not answer: nothing to check now
        };
        let matched = plan::match_devices(&record.devices, &on_gpus, |_| false);
        if matched.iter().any(Option::is_none) {
            tracing::warn!(claim = %claim, "a slice recorded for a prepared claim no longer exists; the claim's next prepare creates it again");
            report.missing_instances.push(claim.to_string());
            return;
        }
        let instances: Vec<MigInstance> = matched.into_iter().flatten().collect();
        match self.ensure_cdi_spec(claim, record, &instances) {
            Ok(true) => report.cdi_specs_rewritten += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::error!(claim = %claim, error = %e, "writing the claim's CDI spec failed")
            }
        }
    }

    /// Step 4: records for live instances that claims on this node are allocated to.
    async fn rebuild_from_api(
        &self,
        live: &BTreeMap<u32, Result<Vec<MigInstance>, BackendError>>,
        report: &mut Report,
    ) -> Result<()> {
        let live: Vec<MigInstance> = live
            .values()
            .filter_map(|r| r.as_ref().ok())
            .flatten()
            .cloned()
            .collect();
        for rc in self
            .api
            .list_claims()
            .await
            .context("list ResourceClaims")?
        {
            let (Some(namespace), Some(name), Some(uid)) = (
                rc.metadata.namespace.clone(),
                rc.metadata.name.clone(),
                rc.metadata.uid.clone(),
            ) else {
                continue;
            };
            let claim = ClaimRef {
                namespace,
                name,
                uid,
            };
            if self.record_of(&claim.uid).is_some() {
                continue;
            }
            let Ok(planned) =
                plan::resolve_allocation(&claim, Some(&rc), &self.node, &self.devices)
            else {
                continue;
            };
            let started: Vec<RecordedDevice> = planned.iter().map(plan::record).collect();
            let matched = plan::match_devices(&started, &live, |s| {
                self.checkpoint
                    .read(|cp| plan::recorded_elsewhere(cp, &claim.uid, s))
            });
            if matched.iter().any(Option::is_none) {
                continue; // not (fully) prepared here: the kubelet will prepare it
            }
            let instances: Vec<MigInstance> = matched.into_iter().flatten().collect();
            let devices: Vec<RecordedDevice> = started
                .iter()
                .zip(&instances)
                .map(|(d, s)| plan::with_instance(d, s))
                .collect();
            let built = self
                .build_spec(&claim, &devices, &instances, &[])
                .map_err(anyhow::Error::msg)?;
            cdi::write_spec(&self.cdi_dir, &claim.uid, &built.spec)?;
            let ids: BTreeMap<String, Vec<String>> = built
                .device_ids
                .into_iter()
                .map(|(k, id)| (k, vec![id]))
                .collect();
            self.checkpoint
                .commit(|cp| {
                    cp.set_completed(&claim.uid, &claim.namespace, &claim.name, devices, ids)
                })
                .await
                .map_err(anyhow::Error::msg)?;
            tracing::info!(claim = %claim, "rebuilt the record of a prepared claim from live slices");
            report.rebuilt.push(claim.to_string());
        }
        Ok(())
    }

    /// Step 5, on the GPUs that answer (listed again: steps 2–4 changed them).
    async fn destroy_orphans(&self, reclaim_foreign: bool, report: &mut Report) {
        for gpu in self.backend.gpu_indices() {
            let Ok(live) = self.instances_on(gpu).await else {
                continue;
            };
            let found = self
                .checkpoint
                .read(|cp| plan::orphans(&live, cp, reclaim_foreign));
            for s in found.foreign {
                tracing::warn!(gpu = s.gpu_index, profile = %s.profile, start = s.placement.start, mig = %s.mig_uuid,
                    "leaving a MIG instance DAS did not create; its placement stays unavailable (--reclaim-foreign-slices destroys it)");
                report.foreign_kept.push(s.mig_uuid);
            }
            for s in found.destroy {
                let lock = self.gpu_lock_for(gpu);
                let _held = lock.lock().await;
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
    fn remove_stale_cdi_specs(&self, report: &mut Report) -> Result<()> {
        let held: HashSet<String> = self
            .checkpoint
            .read(|cp| cp.claims.keys().cloned().collect());
        cdi::remove_temp_files(&self.cdi_dir)?;
        for f in cdi::list_specs(&self.cdi_dir)? {
            if !held.contains(&f.claim_uid) {
                cdi::delete_spec(&self.cdi_dir, &f.claim_uid)?;
                report.stale_cdi_specs += 1;
            }
        }
        Ok(())
    }
}
