//! The MPS control daemons of a claim's MPS devices (docs/design.md §7, "MPS on a slice"): the
//! checks a prepare makes before it creates anything, the start of each daemon once its slice
//! exists (before the CDI spec is written: a container never gets a pipe directory without a
//! daemon behind it), the stop before its slice is destroyed (a live MPS server keeps the slice
//! in use), and their return at start-up. [`crate::mps::MpsDaemons`] runs and supervises them.

use std::collections::{BTreeMap, BTreeSet};

use super::Preparer;
use crate::claims::PrepareError;
use crate::claims::cdi::{MpsMounts, ShareLimits};
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::handler::ClaimRef;
use crate::claims::plan::{self, Planned};
use crate::mps::commands::{namespace_limits, namespace_name};
use crate::mps::supervisor::{NO_BINARY, PipeMount};
use crate::mps::{DaemonSpec, Namespace, Protocol, layout};

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

    /// The MPS namespace of `d` of claim `claim_uid` (protocol 3): named after the claim and
    /// device, with the claim's limits, or for a share the tighter of its slice's and its own.
    fn mps_namespace(claim_uid: &str, d: &RecordedDevice) -> Option<Namespace> {
        let config = d.mps.as_ref()?;
        let share = d.share.as_ref().map(|s| {
            let percent = u8::try_from(s.thread_percentage()).unwrap_or(100);
            (percent, s.memory_mib())
        });
        Some(Namespace {
            name: namespace_name(claim_uid, &d.device),
            limits: namespace_limits(config, share),
        })
    }

    /// Starts the daemons of `devices`' MPS devices (a daemon already running for one is kept),
    /// each with the device's namespace (protocol 3).
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
                .start(spec, Self::mps_namespace(&claim.uid, d))
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

    /// A share whose slice other shares keep leaves it: its namespace is deleted from the
    /// slice's daemon (protocol 3; nothing to do with protocol 2, whose shares have none).
    pub(crate) async fn leave_mps(&self, claim: &ClaimRef, kept: &[RecordedDevice]) {
        for d in kept.iter().filter(|d| d.mps.is_some()) {
            let owner = daemon_owner(&claim.uid, d);
            let id = layout::daemon_id(owner, &d.device);
            let _one = self.mps_locks.lock(&id).await;
            let dirs = self.mps.dirs(owner, &d.device);
            self.mps
                .leave(&dirs, &namespace_name(&claim.uid, &d.device))
                .await;
        }
    }

    /// At start-up, for the prepared claims whose instances exist: supervises their MPS devices'
    /// daemons again (adopting those still running) with the namespaces of every claim and
    /// share they serve, all at once: each may wait for its daemon's control socket and
    /// configuration, and the plugin serves only after start-up. One that cannot be started
    /// now is logged and retried by its supervisor.
    pub(crate) async fn bring_back_mps(&self, claims: Vec<(ClaimRef, Vec<RecordedDevice>)>) {
        // A shared slice's daemon once, however many shares hold it, with all their namespaces.
        let mut daemons: BTreeMap<String, (&ClaimRef, &RecordedDevice, DaemonSpec)> =
            BTreeMap::new();
        let mut namespaces: BTreeMap<String, Vec<Namespace>> = BTreeMap::new();
        for (claim, devices) in &claims {
            for d in devices {
                let Some(spec) = self.mps_spec(claim, d) else {
                    continue;
                };
                if let Some(ns) = Self::mps_namespace(&claim.uid, d) {
                    namespaces.entry(spec.id.clone()).or_default().push(ns);
                }
                daemons.entry(spec.id.clone()).or_insert((claim, d, spec));
            }
        }
        let back = daemons.into_iter().map(|(id, (claim, d, spec))| {
            let ns = namespaces.remove(&id).unwrap_or_default();
            async move {
            match self.mps.bring_back(spec, ns).await {
                Ok(adopted) => {
                    tracing::info!(claim = %claim, device = %d.device, adopted, "the slice's MPS control daemon runs")
                }
                Err(e) => {
                    tracing::error!(claim = %claim, device = %d.device, error = %e, "the slice's MPS control daemon could not be started; retried with backoff")
                }
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

    /// What a container of MPS device `d` of claim `claim_uid` mounts of its daemon: protocol
    /// 2, the daemon's pipe directory, and a share's limits in its environment (cooperative: a
    /// client may change them); protocol 3, only its namespace's directory (the server applies
    /// the namespace's limits, so none are set in the environment: a
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` naming a device the client cannot see would drop every
    /// pinned limit, the namespace's included).
    pub(crate) fn mps_mounts(&self, claim_uid: &str, d: &RecordedDevice) -> MpsMounts {
        let dirs = self.mps.dirs(daemon_owner(claim_uid, d), &d.device);
        let settings = self.mps.settings();
        let namespace = namespace_name(claim_uid, &d.device);
        MpsMounts {
            pipe_dir: dirs
                .client_pipe_dir(settings.protocol, &namespace)
                .display()
                .to_string(),
            pipe_read_only: settings.pipe_mount == PipeMount::ReadOnly,
            shm_dir: dirs.shm.display().to_string(),
            share: d
                .share
                .as_ref()
                .filter(|_| settings.protocol == Protocol::V2)
                .map(|s| ShareLimits {
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
