//! [`Preparer`]: the transaction. It carries out the request path's rules ([`super::plan`])
//! against the GPU backend, the checkpoint, the CDI directory and the API server, and asks each
//! device's kind ([`super::kinds`]) and the layers ([`super::layers`]) what differs between
//! them; it names no kind. Its methods, by what they serve:
//!
//! - [`prepare`]: NodePrepareResources of one claim, and the claim's CDI spec.
//! - [`acquire`]: the acquires of a prepare and of a carve (MIG mode, each device's kind's
//!   acquire, the roll-back of a failure).
//! - [`release`]: NodeUnprepareResources, and the release of a claim's instances that it, the
//!   roll-back of a failed prepare, the reaper and the orphan rule share; the guard of a record
//!   the kubelet holds (issue 41) is kept here, never in a kind.
//! - [`startup`]: the start-up reconciliation of checkpoint, GPUs and API server.
//! - [`reaper`]: the passes of the reaper ([`super::reaper`] keeps its schedule).
//! - [`orphans`]: the checks of the orphan rule ([`super::orphans`] states it).
//! - [`carve`]: carve before bind (issue 34): the carve of a claim allocated here, the prepare
//!   of a carved claim, the release of a carved claim that never reached a prepare.
//! - [`devices`]: what the transaction asks of the kinds (their checks before anything is
//!   recorded, what a recorded device holds, what they tell the publisher) and of the GPUs'
//!   MIG modes ([`super::gpu_mode`]).
//! - [`gauges`]: the gauges of prepared MIG instances, free placements and pending destroys.
//!
//! A device whose kind makes no instance (a whole GPU) goes through the same steps with nothing
//! created: its record holds no instance, its CDI spec gives its GPU's device node, and its
//! release destroys nothing.
//!
//! Prepare of one claim, under the claim's lock: read the claim → resolve its allocation →
//! settle what the checkpoint has for it (reuse a completed record after checking that its
//! instances and CDI spec still exist, or release a half-done or stale one) → each kind's
//! checks → checkpoint `PrepareStarted` → acquire each device (GPUs in parallel, one GPU's
//! calls in turn; a MIG instance created at exactly the allocated placement), noting each
//! instance in the record as soon as it exists → put on the layers (the MPS control daemon of
//! an MPS device) → write the CDI spec → checkpoint `PrepareCompleted` → answer → write
//! `status.devices` (retried).
//!
//! A placement that overlaps a MIG instance another claim's record still holds is never taken from it:
//! the prepare waits a little for the kubelet's unprepare of that claim (the force-delete race)
//! and otherwise fails with [`PrepareError::PlacementHeld`], which the kubelet retries. Only the
//! kubelet's unprepare, or the orphan rule with the container runtime's evidence
//! ([`super::orphans`]), ever releases a prepared claim.
//!
//! Unprepare, and the roll-back of a failed prepare, release the claim: take off its layers,
//! destroy exactly the recorded instances, delete the CDI spec, and drop the record only when
//! every instance is confirmed gone; what could not be destroyed stays recorded as `Releasing`
//! for the reaper.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::Notify;
use tracing::Instrument;

use super::gpu_mode::GpuModes;
use super::handler::{ClaimHandler, ClaimRef, PreparedDevice};
use super::kinds::{Kinds, NodeDevices};
use super::layers::Layers;
use super::orphans::{OrphanPolicy, OrphanWatch};
use super::plan;
use super::reaper::{PendingDaemons, ReaperState};
use super::spans::claim_span;
use super::status::StatusWriters;
use super::{ClaimApi, ClaimLocks, EventTarget, PrepareError};
pub use crate::blocking::BlockingCalls;
use crate::claims::cdi::{self, CdiWriter};
use crate::claims::checkpoint::{CheckpointStore, ClaimRecord};
use crate::claims::memory_limits::MemoryLimits;
use crate::gpu::{GpuBackend, GpuCalls, GpuInfo, TimeSlicer};
use crate::metrics::Metrics;
use crate::mps::MpsDaemons;
use crate::publish::resource_slices::SharePolicy;
pub use carve::Carved;

pub(crate) mod acquire;
pub(crate) mod carve;
pub(crate) mod devices;
pub(crate) mod gauges;
pub(crate) mod orphans;
pub(crate) mod prepare;
pub(crate) mod reaper;
pub(crate) mod release;
pub(crate) mod startup;

#[cfg(test)]
pub(crate) use prepare::PLACEMENT_WAIT;

/// What a [`Preparer`] is built from.
pub struct PreparerConfig {
    /// The API-server calls.
    pub api: Arc<dyn ClaimApi>,
    /// This node's name (the pool).
    pub node: String,
    /// The GPUs.
    pub backend: Arc<dyn GpuBackend>,
    /// The GPUs at start-up: what the plugin publishes.
    pub inventory: Vec<GpuInfo>,
    /// Where CDI specs go.
    pub cdi_dir: PathBuf,
    /// Major of the `nvidia-caps` char device (from `/proc/devices`; a fixed value when
    /// emulated).
    pub caps_major: u32,
    /// Where the CDI specs' device nodes are on the host: the driver's `/dev` nodes, none
    /// (emulated GPUs on a node without NVIDIA devices), or the emulated GPUs' stand-ins.
    pub device_nodes: cdi::DeviceNodes,
    /// The driver's files every claim's spec mounts ([`super::driver_files`]); empty when the
    /// plugin has no driver root (emulated GPUs without stand-in devices).
    pub driver_mounts: Vec<cdi::Mount>,
    /// The checkpoint.
    pub checkpoint: CheckpointStore,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Where backend calls run.
    pub blocking: BlockingCalls,
    /// When the plugin may release a prepared claim the kubelet never unprepares.
    pub orphans: OrphanPolicy,
    /// The MPS control daemons of MPS devices.
    pub mps: Arc<MpsDaemons>,
    /// Who sets a time-sliced whole GPU's time slice (docs/design.md §7, "Time-slicing").
    pub time_slicer: TimeSlicer,
    /// How this node's shareable devices are cut (their `shares` capacity is a share's
    /// denominator; docs/design.md §7, "Shared slices").
    pub share_policy: SharePolicy,
    /// How a container gets a GPU memory limit the kernel enforces (the installed
    /// `createRuntime` hook, the cgroup root, the setter; docs/design.md §7, "Memory limits the
    /// kernel enforces"); `None` where no GPU of the node can get one.
    pub memory_limits: Option<MemoryLimits>,
}

/// Prepares and unprepares claims for this node; see the module docs.
pub struct Preparer {
    /// This node and the devices it publishes.
    pub(crate) node: NodeDevices,
    /// The kinds of device it serves ([`crate::claims::kinds`]): the transaction asks each
    /// device's kind what differs between kinds.
    pub(crate) kinds: Kinds,
    /// The GPU backend, where its calls run, and one lock per GPU.
    pub(crate) gpus: GpuCalls,
    /// What is prepared (the checkpoint) and the per-claim locks.
    pub(crate) records: Records,
    /// The claims' CDI specs.
    pub(crate) cdi: CdiWriter,
    /// The API server: claim reads, events and the claims' status writes.
    pub(crate) api: ApiSide,
    /// What outlives a call: the reaper's schedule and the orphan rule's suspects.
    pub(crate) lifecycle: Lifecycle,
    /// Whether each GPU's MIG mode may be switched.
    pub(crate) modes: GpuModes,
    /// The layers devices wear ([`crate::claims::layers`]: MPS).
    pub(crate) layers: Layers,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// How a container gets a GPU memory limit ([`PreparerConfig::memory_limits`]).
    pub(crate) memory_limits: Option<MemoryLimits>,
}

/// The records of what is prepared, and who may change a claim's record now.
pub(crate) struct Records {
    /// The checkpoint: a record per claim with the exact instances it holds.
    pub(crate) checkpoint: CheckpointStore,
    /// One lock per claim UID: calls for one claim run one after another.
    pub(crate) locks: ClaimLocks,
    /// Woken whenever a record is dropped (placement waits).
    pub(crate) released: Notify,
}

impl Records {
    /// A copy of claim `uid`'s record, if it has one.
    pub(crate) fn get(&self, uid: &str) -> Option<ClaimRecord> {
        self.checkpoint.read(|cp| cp.get(uid).cloned())
    }
}

/// The API server as the request path uses it.
pub(crate) struct ApiSide {
    /// Claim reads and lists, status writes and events.
    pub(crate) client: Arc<dyn ClaimApi>,
    /// The running writers of prepared claims' `status.devices`.
    pub(crate) status: StatusWriters,
}

/// The state of what runs beside the calls: the reaper and the orphan rule.
pub(crate) struct Lifecycle {
    /// When each releasing claim is due for the reaper's next attempt.
    pub(crate) reaper: ReaperState,
    /// The orphan rule's suspects ([`super::orphans`]).
    pub(crate) orphans: OrphanWatch,
    /// When the plugin may release a prepared claim the kubelet never unprepares.
    pub(crate) orphan_policy: OrphanPolicy,
    /// Kept claims whose layers (MPS daemons) start-up could not bring back (a GPU did not
    /// answer).
    pub(crate) layers_pending: PendingDaemons,
}

impl Preparer {
    /// A preparer over `config`.
    pub fn new(config: PreparerConfig) -> Self {
        Self {
            node: NodeDevices {
                name: config.node,
                devices: plan::device_index(&config.inventory),
                models: config
                    .inventory
                    .iter()
                    .filter(|g| g.offers_mig())
                    .map(|g| (g.index, g.model.clone()))
                    .collect(),
                whole_gpu_memory_mib: config
                    .inventory
                    .iter()
                    .filter(|g| g.offers_whole_gpu())
                    .map(|g| (g.index, g.whole_gpu_memory_bytes() >> 20))
                    .collect(),
                shares_per_slice: u64::from(config.share_policy.shares.max(1)),
                shares_across_namespaces: config.share_policy.across_namespaces,
            },
            kinds: Kinds::standard(),
            gpus: GpuCalls::new(config.backend, config.blocking.clone()),
            records: Records {
                checkpoint: config.checkpoint,
                locks: ClaimLocks::default(),
                released: Notify::new(),
            },
            cdi: CdiWriter::new(
                config.cdi_dir,
                config.caps_major,
                config.device_nodes,
                config.driver_mounts,
            ),
            api: ApiSide {
                client: config.api,
                status: StatusWriters::default(),
            },
            lifecycle: Lifecycle {
                reaper: ReaperState::default(),
                orphans: OrphanWatch::default(),
                orphan_policy: config.orphans,
                layers_pending: PendingDaemons::default(),
            },
            modes: GpuModes::new(&config.inventory, &config.metrics),
            layers: Layers::standard(
                config.mps,
                config.time_slicer,
                config.blocking,
                config.memory_limits.clone(),
                &config.inventory,
            ),
            metrics: config.metrics,
            memory_limits: config.memory_limits,
        }
    }

    /// How a container gets a GPU memory limit the kernel enforces, if any GPU of the node can
    /// get one ([`PreparerConfig::memory_limits`]).
    pub fn memory_limits(&self) -> Option<&MemoryLimits> {
        self.memory_limits.as_ref()
    }

    /// The checkpoint (read-only use: tests and start-up reports).
    pub fn checkpoint(&self) -> &CheckpointStore {
        &self.records.checkpoint
    }

    /// The GPU calls, shared with whatever else calls the backend (one lock per GPU for all).
    pub fn gpu_calls(&self) -> &GpuCalls {
        &self.gpus
    }

    /// Reads claim `claim` from the API server (`None`: it is gone).
    pub(crate) async fn read_claim(
        &self,
        claim: &ClaimRef,
    ) -> Result<Option<ResourceClaim>, super::ApiError> {
        self.api
            .client
            .get_claim(&claim.namespace, &claim.name)
            .await
    }

    /// Whether the API server allocates `claim`, recorded as `record`, to this node as recorded
    /// now ([`plan::still_allocated`] of a fresh read); callers decide what a failed read means.
    /// While it is, the record learns the pods the claim is reserved for ([`Self::learn_pods`]).
    pub(crate) async fn allocated_as_recorded(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> Result<bool, super::ApiError> {
        let rc = self.read_claim(claim).await?;
        let allocated = plan::still_allocated(claim, record, rc.as_ref(), &self.node.name);
        if allocated && let Some(rc) = &rc {
            self.learn_pods(claim, &plan::reserving_pods(rc)).await;
        }
        Ok(allocated)
    }

    /// Adds to claim `claim`'s record the pods of `pods` it does not know (docs/design.md §7, "A
    /// slice leaves its claim": a record learns every pod that reserves its claim whenever the
    /// claim is read while allocated; the kubelet prepares a claim once, so a pod that reserves
    /// it later never reaches a prepare). A pod already known is kept, even when it no longer
    /// reserves the claim (its containers may outlive it). Saves only when the record changed; a
    /// failed save is logged, and the next save of the checkpoint writes it.
    pub(crate) async fn learn_pods(&self, claim: &ClaimRef, pods: &[String]) {
        let checkpoint = &self.records.checkpoint;
        let (learned, version) = checkpoint.change(|cp| {
            let known = cp.get(&claim.uid).map(|r| r.pods.clone())?;
            let all = plan::with_pods(&known, pods);
            let new: Vec<String> = all[known.len()..].to_vec();
            cp.set_pods(&claim.uid, all).then_some(new)
        });
        let Some(new) = learned else { return };
        tracing::info!(pods = ?new, "the record learned pods that reserve its claim");
        if let Err(e) = checkpoint.persist(version).await {
            tracing::error!(error = %e, "saving the checkpoint failed");
        }
    }

    /// A copy of claim `uid`'s record, if it has one.
    pub(crate) fn record_of(&self, uid: &str) -> Option<ClaimRecord> {
        self.records.get(uid)
    }

    /// Posts a Warning event about `about` (best effort).
    pub(crate) async fn warn(&self, about: EventTarget, reason: &str, note: String) {
        self.api.client.warn(&about, reason, note).await;
    }

    /// Starts writing `claim`'s `status.devices` for `record` (retried until it lands).
    fn start_status(&self, claim: &ClaimRef, record: &ClaimRecord) {
        self.api.status.start(
            self.api.client.clone(),
            claim.clone(),
            record.devices.clone(),
            self.metrics.clone(),
        );
    }
}

#[tonic::async_trait]
impl ClaimHandler for Preparer {
    type Error = PrepareError;

    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
        let done = join_all(claims.iter().map(|c| {
            async move {
                let t0 = Instant::now();
                let r = self.prepare_claim(c).await;
                self.metrics.observe_call(
                    "prepare",
                    r.as_ref().err().map(PrepareError::metric_label),
                    t0.elapsed(),
                );
                match &r {
                    Ok(d) => tracing::info!(
                        devices = d.len(),
                        ms = t0.elapsed().as_millis() as u64,
                        "prepared"
                    ),
                    Err(e) => {
                        tracing::error!(cause = e.metric_label(), error = %e, "prepare failed")
                    }
                }
                (c.uid.clone(), r)
            }
            .instrument(claim_span!("prepare", c))
        }))
        .await;
        done.into_iter().collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), PrepareError>> {
        let done = join_all(claims.iter().map(|c| {
            async move {
                let t0 = Instant::now();
                let r = self.unprepare_claim(c).await;
                self.metrics.observe_call(
                    "unprepare",
                    r.as_ref().err().map(PrepareError::metric_label),
                    t0.elapsed(),
                );
                match &r {
                    Ok(()) => tracing::info!("unprepared"),
                    Err(e) => {
                        tracing::error!(cause = e.metric_label(), error = %e, "unprepare failed")
                    }
                }
                (c.uid.clone(), r)
            }
            .instrument(claim_span!("unprepare", c))
        }))
        .await;
        done.into_iter().collect()
    }
}
