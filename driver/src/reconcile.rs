//! Start-up reconciliation of the three records of what is prepared: the checkpoint, the GPU
//! backend (slices that exist) and the API server (claims that still hold devices).
//!
//! In order (DESIGN §7):
//! 1. prepares that started but never completed are rolled back (the kubelet retries them);
//! 2. completed claims whose ResourceClaim is gone, replaced or deallocated are released;
//! 3. when the checkpoint was lost (corrupt, or first start) the records of live slices are
//!    rebuilt from the claims the API server has allocated on this node;
//! 4. slices nobody owns are destroyed — only those DAS created, unless `reclaim_foreign`;
//! 5. CDI specs of claims we no longer hold, and leftover temp files, are removed.

use std::collections::{BTreeMap, HashSet};

use anyhow::{Context, Result};
use das_api::DRIVER_NAME;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::ListParams;

use crate::cdi;
use crate::checkpoint::{PrepareState, PreparedDevice as Recorded};
use crate::gpu::MigSlice;
use crate::kubelet::ClaimRef;
use crate::prepare::Preparer;

/// What start-up reconciliation did; logged, and asserted on by tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Claims whose half-done prepare was rolled back.
    pub rolled_back: Vec<String>,
    /// Claims released because the API server no longer allocates them.
    pub released: Vec<String>,
    /// Claims whose record was rebuilt from live slices and the API server.
    pub rebuilt: Vec<String>,
    /// Slices destroyed because no claim owns them (`MIG UUID`s).
    pub orphans_destroyed: Vec<String>,
    /// Slices left alone because DAS did not create them.
    pub foreign_kept: Vec<String>,
    /// CDI spec files removed.
    pub stale_cdi_specs: usize,
}

impl Preparer {
    /// Reconciles checkpoint, backend and API server; see the module docs. `rebuild` asks for
    /// step 3 (the checkpoint was missing or corrupt).
    pub async fn reconcile_at_startup(
        &self,
        rebuild: bool,
        reclaim_foreign: bool,
    ) -> Result<Report> {
        let mut report = Report::default();
        self.roll_back_started(&mut report).await?;
        self.release_gone_claims(&mut report).await?;
        if rebuild {
            self.rebuild_from_api(&mut report).await?;
        }
        self.destroy_orphans(reclaim_foreign, &mut report).await?;
        self.remove_stale_cdi_specs(&mut report).await?;
        self.metrics.set_prepared(self.prepared_per_gpu().await);
        Ok(report)
    }

    async fn records(&self, state: PrepareState) -> Vec<(ClaimRef, Vec<Recorded>)> {
        self.checkpoint.read(|cp| {
            cp.claims
                .iter()
                .filter(|(_, r)| r.state == state)
                .map(|(uid, r)| {
                    let claim = ClaimRef {
                        namespace: r.namespace.clone(),
                        name: r.name.clone(),
                        uid: uid.clone(),
                    };
                    (claim, r.devices.clone())
                })
                .collect()
        })
    }

    async fn roll_back_started(&self, report: &mut Report) -> Result<()> {
        for (claim, _) in self.records(PrepareState::PrepareStarted).await {
            self.roll_back_half_done(&claim)
                .await
                .map_err(anyhow::Error::msg)?;
            report.rolled_back.push(claim.to_string());
        }
        Ok(())
    }

    async fn release_gone_claims(&self, report: &mut Report) -> Result<()> {
        for (claim, _) in self.records(PrepareState::PrepareCompleted).await {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
            let live = api
                .get_opt(&claim.name)
                .await
                .with_context(|| format!("read claim {claim}"))?;
            let still_ours = live.is_some_and(|rc| {
                rc.metadata.uid.as_deref() == Some(claim.uid.as_str())
                    && rc.status.and_then(|s| s.allocation).is_some()
            });
            if !still_ours {
                tracing::info!(claim = %claim, "releasing a claim the API server no longer allocates");
                self.unprepare_claim(&claim)
                    .await
                    .map_err(anyhow::Error::msg)?;
                report.released.push(claim.to_string());
            }
        }
        Ok(())
    }

    /// Re-creates records for live slices that claims on this node are allocated to.
    async fn rebuild_from_api(&self, report: &mut Report) -> Result<()> {
        let live = self.list_slices().await?;
        let claims: Api<ResourceClaim> = Api::all(self.client.clone());
        for rc in claims
            .list(&ListParams::default())
            .await
            .context("list ResourceClaims")?
            .items
        {
            let (Some(ns), Some(name), Some(uid)) = (
                rc.metadata.namespace.clone(),
                rc.metadata.name.clone(),
                rc.metadata.uid.clone(),
            ) else {
                continue;
            };
            let results: Vec<_> = rc
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default()
                .into_iter()
                .filter(|r| r.driver == DRIVER_NAME && r.pool == self.node)
                .collect();
            if results.is_empty() {
                continue;
            }
            let mut matched = Vec::new();
            for r in &results {
                let Some(at) = self.devices.get(&r.device) else {
                    break;
                };
                let Some(s) = live.iter().find(|s| {
                    s.gpu_index == at.gpu_index
                        && s.profile == at.profile
                        && s.placement.start == at.start
                }) else {
                    break;
                };
                matched.push((r, at, s));
            }
            if matched.len() != results.len() {
                continue; // not (fully) prepared here: the kubelet will prepare it
            }
            let claim = ClaimRef {
                namespace: ns,
                name,
                uid,
            };
            let slices: Vec<MigSlice> = matched.iter().map(|(_, _, s)| (*s).clone()).collect();
            let recorded: Vec<Recorded> = matched
                .iter()
                .map(|(r, at, s)| Recorded {
                    request: r.request.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    gpu_index: at.gpu_index,
                    gpu_uuid: at.gpu_uuid.clone(),
                    profile: at.profile.clone(),
                    placement_start: at.start,
                    placement_size: at.size,
                    gi_id: Some(s.gi_id),
                    ci_id: Some(s.ci_id),
                    mig_uuid: Some(s.mig_uuid.clone()),
                })
                .collect();
            self.record_completed(&claim, &recorded, &slices)
                .await
                .map_err(anyhow::Error::msg)?;
            tracing::info!(claim = %claim, "rebuilt the record of a prepared claim from live slices");
            report.rebuilt.push(claim.to_string());
        }
        Ok(())
    }

    async fn destroy_orphans(&self, reclaim_foreign: bool, report: &mut Report) -> Result<()> {
        let owned: Vec<Recorded> = self
            .checkpoint
            .read(|cp| cp.claims.values().flat_map(|r| r.devices.clone()).collect());
        let live = self.list_slices().await?;
        let mut orphans = Vec::new();
        for s in live {
            if owned.iter().any(|d| {
                s.gpu_index == d.gpu_index
                    && s.profile == d.profile
                    && s.placement.start == d.placement_start
            }) {
                continue;
            }
            if s.created_by_das == Some(true) || reclaim_foreign {
                orphans.push(s);
            } else {
                tracing::warn!(gpu = s.gpu_index, profile = %s.profile, start = s.placement.start, mig = %s.mig_uuid,
                    "leaving a MIG slice DAS did not create; its placement stays unavailable (--reclaim-foreign-slices destroys it)");
                report.foreign_kept.push(s.mig_uuid);
            }
        }
        let failures = self.destroy_all(&orphans).await;
        anyhow::ensure!(
            failures.is_empty(),
            "destroying orphaned slices: {}",
            failures.join("; ")
        );
        for s in orphans {
            tracing::info!(gpu = s.gpu_index, profile = %s.profile, start = s.placement.start, mig = %s.mig_uuid, "destroyed an orphaned slice");
            report.orphans_destroyed.push(s.mig_uuid);
        }
        Ok(())
    }

    async fn remove_stale_cdi_specs(&self, report: &mut Report) -> Result<()> {
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

/// Prepared slices per GPU index in a set of records.
pub fn per_gpu<'a>(devices: impl Iterator<Item = &'a Recorded>) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for d in devices {
        *m.entry(d.gpu_index).or_default() += 1;
    }
    m
}
