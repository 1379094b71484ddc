//! The MPS control daemons of a claim's MPS devices (docs/design.md §7, "MPS on a slice"): the
//! checks a prepare makes before it creates anything, the start of each daemon once its slice
//! exists (before the CDI spec is written: a container never gets a pipe directory without a
//! daemon behind it), the stop before its slice is destroyed (a live MPS server keeps the slice
//! in use), and their return at start-up. [`crate::mps::MpsDaemons`] runs and supervises them.

use std::collections::BTreeSet;

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::cdi::{MpsMounts, ShareLimits};
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::handler::ClaimRef;
use crate::claims::plan::{self, Planned};
use crate::mps::{DaemonSpec, layout, supervisor::NO_BINARY};

impl Preparer {
    /// Before anything is created: each MPS device's limits fit its slice, and MPS is available
    /// on this node if a device needs it.
    ///
    /// # Errors
    /// [`PrepareError::MpsDaemon`] (no control binary), [`PrepareError::InvalidConfig`] (a
    /// pinned memory limit above the slice's memory).
    pub(crate) fn check_mps(&self, planned: &[Planned]) -> Result<(), PrepareError> {
        // The claim's own mistake first: it is one whatever the node.
        plan::mps::check_limits(planned, |p| {
            let model = self.node.models.get(&p.at.gpu_index)?;
            model.profile(&p.at.profile).map(|(_, g)| g.memory_mib)
        })?;
        match planned.iter().find(|p| p.mps.is_some()) {
            Some(p) if !self.mps.available() => Err(PrepareError::MpsDaemon {
                device: p.device.clone(),
                reason: NO_BINARY.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The daemon of `d` of `claim`, if `d` is an MPS device whose instance exists. A shared
    /// slice's daemon is the slice's, not one share's: the same spec whichever share asks.
    fn mps_spec(&self, claim: &ClaimRef, d: &RecordedDevice) -> Option<DaemonSpec> {
        let limits = d.mps.as_ref()?;
        let mig_uuid = d.mig_uuid().filter(|u| !u.is_empty())?;
        let label = match &d.share {
            Some(_) => format!("shared slice on GPU {}", d.gpu_uuid),
            None => claim.to_string(),
        };
        Some(self.mps.spec(
            &label,
            daemon_owner(&claim.uid, d),
            &d.device,
            mig_uuid,
            limits,
        ))
    }

    /// Starts the daemons of `devices`' MPS devices (a daemon already running for one is kept).
    ///
    /// # Errors
    /// [`PrepareError::MpsDaemon`] for the first that could not be started; the caller rolls
    /// the prepare back (which stops those that were).
    pub(crate) async fn start_mps(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), PrepareError> {
        for d in devices {
            let Some(spec) = self.mps_spec(claim, d) else {
                continue;
            };
            // The shares of one slice start its daemon concurrently: one at a time.
            let _one = self.mps_locks.lock(&spec.id).await;
            self.mps
                .start(spec)
                .await
                .map_err(|e| PrepareError::MpsDaemon {
                    device: d.device.clone(),
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Stops the daemons of `devices`' MPS devices and removes their directories (nothing to do
    /// for a device without one; the caller leaves out the shares whose slice other shares
    /// keep). A directory that cannot be removed is only logged: the daemon is gone, and
    /// start-up removes what no record holds.
    pub(crate) async fn stop_mps(&self, claim: &ClaimRef, devices: &[RecordedDevice]) {
        for d in devices.iter().filter(|d| d.mps.is_some()) {
            let dirs = self.mps.dirs(daemon_owner(&claim.uid, d), &d.device);
            let id = layout::daemon_id(daemon_owner(&claim.uid, d), &d.device);
            let _one = self.mps_locks.lock(&id).await;
            if let Err(e) = self.mps.stop(&dirs).await {
                tracing::warn!(claim = %claim, device = %d.device, error = %e, "stopping the slice's MPS control daemon left its directory");
            }
        }
    }

    /// At start-up, for the prepared claims whose instances exist: supervises their MPS devices'
    /// daemons again (adopting those still running), all at once: each may wait for its
    /// daemon's control socket and limits, and the plugin serves only after start-up. One that
    /// cannot be started now is logged and retried by its supervisor.
    pub(crate) async fn bring_back_mps(&self, claims: Vec<(ClaimRef, Vec<RecordedDevice>)>) {
        // A shared slice's daemon once, however many shares hold it.
        let mut seen = BTreeSet::new();
        let mut specs = Vec::new();
        for (claim, devices) in &claims {
            for d in devices {
                if let Some(spec) = self.mps_spec(claim, d)
                    && seen.insert(spec.id.clone())
                {
                    specs.push((claim, d, spec));
                }
            }
        }
        let back = specs.into_iter().map(|(claim, d, spec)| async move {
            match self.mps.bring_back(spec).await {
                Ok(adopted) => {
                    tracing::info!(claim = %claim, device = %d.device, adopted, "the slice's MPS control daemon runs")
                }
                Err(e) => {
                    tracing::error!(claim = %claim, device = %d.device, error = %e, "the slice's MPS control daemon could not be started; retried with backoff")
                }
            }
        });
        futures::future::join_all(back).await;
    }

    /// At start-up, after the records were settled: stops the daemons no record holds.
    pub(crate) async fn stop_unrecorded_mps(&self) {
        let keep: BTreeSet<String> = self.records.checkpoint.read(|cp| {
            cp.claims
                .iter()
                .flat_map(|(uid, r)| {
                    r.devices
                        .iter()
                        .filter(|d| d.mps.is_some())
                        .map(move |d| layout::daemon_id(daemon_owner(uid, d), &d.device))
                })
                .collect()
        });
        for id in self.mps.stop_unrecorded(&keep).await {
            tracing::info!(daemon = %id, "stopped an MPS control daemon no record holds");
        }
    }

    /// What a container of MPS device `d` of claim `claim_uid` mounts of its daemon.
    pub(crate) fn mps_mounts(&self, claim_uid: &str, d: &RecordedDevice) -> MpsMounts {
        let dirs = self.mps.dirs(daemon_owner(claim_uid, d), &d.device);
        MpsMounts {
            pipe_dir: dirs.pipe.display().to_string(),
            shm_dir: dirs.shm.display().to_string(),
            share: d.share.as_ref().map(|s| ShareLimits {
                thread_percentage: s.thread_percentage(),
                pinned_memory_mib: s.memory_mib(),
            }),
        }
    }
}

/// Whose daemon serves `d` of claim `claim_uid` (the key of its ID and directories): the
/// claim's, or for a share of a shared slice the slice's, named by its GPU's UUID (the device
/// name gives the placement).
fn daemon_owner<'a>(claim_uid: &'a str, d: &'a RecordedDevice) -> &'a str {
    match &d.share {
        Some(_) => &d.gpu_uuid,
        None => claim_uid,
    }
}
