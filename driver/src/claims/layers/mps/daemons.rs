//! The MPS control daemons of a claim's MPS devices (docs/design.md §7, "MPS on a slice"): the
//! start of each daemon once its MIG instance exists (before the CDI spec is written: a container
//! never gets a pipe directory without a daemon behind it), the stop before its MIG instance is
//! destroyed (a live MPS server keeps the MIG instance in use), a share's leave of a MIG instance others
//! keep, and their return at start-up. [`crate::mps::MpsDaemons`] runs and supervises them.

use std::collections::{BTreeMap, BTreeSet};

use tracing::Instrument;

use super::{MpsLayer, daemon_owner};
use crate::claims::PrepareError;
use crate::claims::checkpoint::{CheckpointStore, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::Kinds;
use crate::claims::spans::claim_span;
use crate::mps::commands::{namespace_limits, namespace_name};
use crate::mps::{DaemonSpec, Namespace, layout};

impl MpsLayer {
    /// The daemon of `d` of `claim`, if `d` is an MPS device whose instance exists (a share of a
    /// whole GPU: always). A shared device's daemon is the device's, not one share's: the same
    /// spec whichever share asks.
    fn spec(&self, claim: &ClaimRef, d: &RecordedDevice) -> Option<DaemonSpec> {
        let limits = d.mps.as_ref()?;
        let kind = Kinds::standard().of_record(d);
        let uuid = kind.mps_uuid(d)?;
        let label = if kind.shared_by_claims() {
            format!("shares on GPU {}", d.gpu_uuid)
        } else {
            claim.to_string()
        };
        Some(
            self.daemons
                .spec(&label, daemon_owner(&claim.uid, d), &d.device, uuid, limits),
        )
    }

    /// The MPS namespace of `d` of claim `claim_uid` (protocol 3): named after the claim and
    /// device, with the claim's limits, or for a share the tighter of its MIG instance's and its own.
    fn namespace(claim_uid: &str, d: &RecordedDevice) -> Option<Namespace> {
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
    pub(super) async fn start(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), PrepareError> {
        for d in devices {
            let Some(spec) = self.spec(claim, d) else {
                continue;
            };
            // The shares of one MIG instance start its daemon concurrently: one at a time.
            let _one = self.locks.lock(&spec.id).await;
            self.daemons
                .start(spec, Self::namespace(&claim.uid, d))
                .await
                .map_err(|e| PrepareError::MpsDaemon {
                    device: d.device.clone(),
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Stops the daemons of `devices`' MPS devices and removes their directories (nothing to do
    /// for a device without one; the caller leaves out the shares whose MIG instance other shares
    /// keep). A directory that cannot be removed is only logged: the daemon is gone, and
    /// start-up removes what no record holds.
    pub(super) async fn stop(&self, claim: &ClaimRef, devices: &[RecordedDevice]) {
        for d in devices.iter().filter(|d| d.mps.is_some()) {
            let dirs = self.daemons.dirs(daemon_owner(&claim.uid, d), &d.device);
            let id = layout::daemon_id(daemon_owner(&claim.uid, d), &d.device);
            let _one = self.locks.lock(&id).await;
            if let Err(e) = self.daemons.stop(&dirs).await {
                tracing::warn!(device = %d.device, error = %e, "stopping the slice's MPS control daemon left its directory");
            }
        }
    }

    /// A share whose MIG instance other shares keep leaves it: its namespace is deleted from the
    /// MIG instance's daemon (protocol 3; nothing to do with protocol 2, whose shares have none).
    pub(super) async fn leave(&self, claim: &ClaimRef, kept: &[RecordedDevice]) {
        for d in kept.iter().filter(|d| d.mps.is_some()) {
            let owner = daemon_owner(&claim.uid, d);
            let id = layout::daemon_id(owner, &d.device);
            let _one = self.locks.lock(&id).await;
            let dirs = self.daemons.dirs(owner, &d.device);
            self.daemons
                .leave(&dirs, &namespace_name(&claim.uid, &d.device))
                .await;
        }
    }

    /// At start-up, for the prepared claims whose instances exist: supervises their MPS devices'
    /// daemons again (adopting those still running) with the namespaces of every claim and
    /// share they serve, all at once: each may wait for its daemon's control socket and
    /// configuration, and the plugin serves only after start-up. One that cannot be started
    /// now is logged and retried by its supervisor.
    pub(super) async fn bring_back(&self, claims: &[(ClaimRef, Vec<RecordedDevice>)]) {
        // A shared slice's daemon once, however many shares hold it, with all their namespaces.
        let mut daemons: BTreeMap<String, (&ClaimRef, &RecordedDevice, DaemonSpec)> =
            BTreeMap::new();
        let mut namespaces: BTreeMap<String, Vec<Namespace>> = BTreeMap::new();
        for (claim, devices) in claims {
            for d in devices {
                let Some(spec) = self.spec(claim, d) else {
                    continue;
                };
                if let Some(ns) = Self::namespace(&claim.uid, d) {
                    namespaces.entry(spec.id.clone()).or_default().push(ns);
                }
                daemons.entry(spec.id.clone()).or_insert((claim, d, spec));
            }
        }
        // Each in the span of the claim it is brought back for (start-up settles many at once).
        let back = daemons.into_iter().map(|(id, (claim, d, spec))| {
            let ns = namespaces.remove(&id).unwrap_or_default();
            async move {
                match self.daemons.bring_back(spec, ns).await {
                    Ok(adopted) => {
                        tracing::info!(device = %d.device, adopted, "the slice's MPS control daemon runs")
                    }
                    Err(e) => {
                        tracing::error!(device = %d.device, error = %e, "the slice's MPS control daemon could not be started; retried with backoff")
                    }
                }
            }
            .instrument(claim_span!("restore_mps", claim))
        });
        futures::future::join_all(back).await;
    }

    /// At start-up, after the records were settled: stops the daemons no record holds.
    pub(super) async fn stop_unrecorded(&self, records: &CheckpointStore) {
        let keep: BTreeSet<String> = records.read(|cp| {
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
        for id in self.daemons.stop_unrecorded(&keep).await {
            tracing::info!(daemon = %id, "stopped an MPS control daemon no record holds");
        }
    }
}
