//! [`Preparer`]: carries out the request path's decisions ([`super::plan`]) against the GPU
//! backend, the checkpoint, the CDI directory and the API server.
//!
//! Prepare of one claim, under the claim's lock: read the claim → resolve its allocation →
//! settle what the checkpoint has for it (reuse a completed record after checking that its
//! instances and CDI spec still exist, or release a half-done or stale one) → checkpoint
//! `PrepareStarted` → create each instance at exactly the allocated placement (GPUs in parallel,
//! one GPU's calls in turn), noting each instance in the record as soon as it exists → write the
//! CDI spec → checkpoint `PrepareCompleted` → answer → write `status.devices` (retried).
//!
//! A placement that overlaps a slice another claim's record still holds is never taken from it:
//! the prepare waits a little for the kubelet's unprepare of that claim (the force-delete race)
//! and otherwise fails with [`PrepareError::PlacementHeld`], which the kubelet retries. Only the
//! kubelet's unprepare, or the orphan rule with the container runtime's evidence
//! ([`super::orphans`]), ever releases a prepared claim.
//!
//! Unprepare, and the roll-back of a failed prepare, release the claim: destroy exactly the
//! recorded instances, delete the CDI spec, and drop the record only when every instance is
//! confirmed gone; what could not be destroyed stays recorded as `Releasing` for the reaper.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::sync::Mutex;

use super::handler::{ClaimHandler, ClaimRef, PreparedDevice};
use super::orphans::{OrphanPolicy, OrphanWatch};
use super::plan::{self, DeviceRef, OnPrepare, Planned};
use super::reaper::ReaperState;
use super::status::StatusWriters;
use super::{ClaimApi, ClaimLocks, EventTarget, PrepareError};
pub use crate::blocking::BlockingCalls;
use crate::claims::cdi;
use crate::claims::checkpoint::{
    CheckpointStore, ClaimRecord, InstanceId, PrepareState, RecordedDevice,
};
use crate::gpu::{BackendError, GpuBackend, GpuInfo, MigInstance};
use crate::metrics::Metrics;

/// Longest a prepare waits for another claim's instances at its placements to go: after a force
/// delete the scheduler gives the placement to a new pod before the kubelet has unprepared the
/// old pod's claim, which it does once the old pod's containers have stopped (its kill grace is
/// at least 2 s). Waiting here starts the new pod as soon as that happens; the kubelet retries
/// a failed prepare only after several seconds. Below the kubelet's own call timeout (45 s).
pub const PLACEMENT_WAIT: Duration = Duration::from_secs(20);
/// How often a waiting prepare looks again (it is also woken when a record is dropped).
const PLACEMENT_POLL: Duration = Duration::from_millis(100);

/// Retries of a destroy that NVML answers with `IN_USE` (processes still exiting). A release
/// pauses without the GPU's lock, so other claims' calls on that GPU go on meanwhile.
const DESTROY_RETRIES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

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
}

/// Prepares and unprepares claims for this node; see the module docs.
pub struct Preparer {
    pub(crate) api: Arc<dyn ClaimApi>,
    pub(crate) node: String,
    pub(crate) backend: Arc<dyn GpuBackend>,
    pub(crate) devices: HashMap<String, DeviceRef>,
    /// The model of each GPU that offers MIG, by index (for the free-placement gauge).
    models: BTreeMap<u32, Arc<crate::gpu::GpuModel>>,
    pub(crate) cdi_dir: PathBuf,
    caps_major: u32,
    device_nodes: cdi::DeviceNodes,
    driver_mounts: Vec<cdi::Mount>,
    pub(crate) checkpoint: CheckpointStore,
    gpu_locks: HashMap<u32, Arc<Mutex<()>>>,
    pub(crate) claim_locks: ClaimLocks,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: StatusWriters,
    pub(crate) blocking: BlockingCalls,
    pub(crate) reaper: ReaperState,
    /// Woken whenever a record is dropped (placement waits).
    released: tokio::sync::Notify,
    /// Suspected orphans ([`super::orphans`]).
    pub(crate) orphans: OrphanWatch,
    pub(crate) orphan_policy: OrphanPolicy,
}

/// A device whose instance is still there after a release, and why.
#[derive(Debug, Clone)]
pub(crate) struct Remaining {
    pub(crate) device: RecordedDevice,
    pub(crate) failure: String,
    pub(crate) gpu_lost: bool,
    pub(crate) cause: &'static str,
}

impl Preparer {
    /// A preparer over `config`.
    pub fn new(config: PreparerConfig) -> Self {
        let gpu_locks = config
            .backend
            .gpu_indices()
            .into_iter()
            .map(|i| (i, Arc::default()))
            .collect();
        Self {
            devices: plan::device_index(&config.inventory),
            models: config
                .inventory
                .iter()
                .filter(|g| g.offers_mig())
                .map(|g| (g.index, g.model.clone()))
                .collect(),
            api: config.api,
            node: config.node,
            backend: config.backend,
            cdi_dir: config.cdi_dir,
            caps_major: config.caps_major,
            device_nodes: config.device_nodes,
            driver_mounts: config.driver_mounts,
            checkpoint: config.checkpoint,
            gpu_locks,
            claim_locks: ClaimLocks::default(),
            metrics: config.metrics,
            status: StatusWriters::default(),
            blocking: config.blocking,
            reaper: ReaperState::default(),
            released: tokio::sync::Notify::new(),
            orphans: OrphanWatch::default(),
            orphan_policy: config.orphans,
        }
    }

    /// The checkpoint (read-only use: tests and start-up reports).
    pub fn checkpoint(&self) -> &CheckpointStore {
        &self.checkpoint
    }

    /// The lock of GPU `index`.
    fn gpu_lock(&self, index: u32) -> Arc<Mutex<()>> {
        self.gpu_locks.get(&index).cloned().unwrap_or_default()
    }

    /// The lock of GPU `index`, for start-up.
    pub(crate) fn gpu_lock_for(&self, index: u32) -> Arc<Mutex<()>> {
        self.gpu_lock(index)
    }

    pub(crate) fn record_of(&self, uid: &str) -> Option<ClaimRecord> {
        self.checkpoint.read(|cp| cp.get(uid).cloned())
    }

    /// Prepares one claim; see the module docs.
    ///
    /// # Errors
    /// Why the claim cannot be prepared; what was created is rolled back (or, where a destroy
    /// fails, recorded for the reaper).
    pub async fn prepare_claim(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _held = self.claim_locks.lock(&claim.uid).await;
        let rc = self
            .api
            .get_claim(&claim.namespace, &claim.name)
            .await
            .map_err(|e| PrepareError::ApiRead(e.message))?;
        let planned = plan::resolve_allocation(claim, rc.as_ref(), &self.node, &self.devices)?;
        let pods = rc.as_ref().map(plan::reserving_pods).unwrap_or_default();
        let record = self.record_of(&claim.uid);
        match (plan::on_prepare(record.as_ref(), &planned), record) {
            (OnPrepare::Verify, Some(r)) => {
                if let Some(done) = self.serve_completed(claim, &r).await? {
                    self.note_pods(claim, &r.pods, &pods).await?;
                    return Ok(done);
                }
            }
            (OnPrepare::ReleaseFirst, Some(r)) => {
                tracing::warn!(claim = %claim, state = ?r.state,
                    "releasing what an earlier prepare of this claim left before preparing it");
                self.release(claim, r.devices).await?;
            }
            _ => {}
        }
        self.wait_for_placements(claim, &planned).await?;
        let known = self
            .record_of(&claim.uid)
            .map(|r| r.pods)
            .unwrap_or_default();
        self.create_and_record(claim, &planned, plan::with_pods(&known, &pods))
            .await
    }

    /// Adds the pods a retried prepare of a completed claim was called for (a shared claim gains
    /// pods) to its record; saves only when that changes it.
    async fn note_pods(
        &self,
        claim: &ClaimRef,
        known: &[String],
        pods: &[String],
    ) -> Result<(), PrepareError> {
        let all = plan::with_pods(known, pods);
        if all.len() == known.len() {
            return Ok(());
        }
        self.checkpoint
            .commit(|cp| {
                cp.set_pods(&claim.uid, all);
            })
            .await
            .map_err(PrepareError::Checkpoint)
    }

    /// Waits (at most [`PLACEMENT_WAIT`]) until no other claim's record holds an instance at the
    /// planned placements: the force-delete race, where the kubelet's unprepare of the old pod's
    /// claim comes after this prepare, once the old pod's containers have stopped. The holders
    /// are never released here, whatever the API server says of them: they become suspects of
    /// the orphan rule ([`super::orphans`]).
    ///
    /// # Errors
    /// [`PrepareError::PlacementHeld`] naming the holders, when they are still there at the limit
    /// (the kubelet retries the prepare).
    async fn wait_for_placements(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
    ) -> Result<(), PrepareError> {
        let t0 = tokio::time::Instant::now();
        let mut waited = false;
        loop {
            let holders = self
                .checkpoint
                .read(|cp| plan::placement_holders(cp, &claim.uid, planned));
            if holders.is_empty() {
                if waited {
                    self.metrics.placement_wait("released", t0.elapsed());
                    tracing::info!(claim = %claim, waited_ms = t0.elapsed().as_millis() as u64, "the placements are free");
                }
                return Ok(());
            }
            if !waited {
                waited = true;
                self.suspect_holders(holders.keys());
                tracing::info!(claim = %claim, holders = ?holders,
                    "waiting for the kubelet to unprepare another claim's slices at these placements (a force-deleted pod whose containers are stopping)");
            }
            if t0.elapsed() >= PLACEMENT_WAIT {
                self.metrics.placement_wait("timeout", t0.elapsed());
                return Err(self.placement_held(&holders));
            }
            tokio::select! {
                _ = self.released.notified() => {}
                _ = tokio::time::sleep(PLACEMENT_POLL) => {}
            }
        }
    }

    /// The error of a prepare whose placements stay held, naming the holding claims.
    fn placement_held(&self, holders: &BTreeMap<String, String>) -> PrepareError {
        let device = holders.values().next().cloned().unwrap_or_default();
        let holders = holders
            .keys()
            .map(|uid| match self.record_of(uid) {
                Some(r) => format!("claim {}/{} ({uid})", r.namespace, r.name),
                None => format!("claim {uid}"),
            })
            .collect();
        PrepareError::PlacementHeld { device, holders }
    }

    /// A retried prepare of a completed claim: answers with the record if its instances still
    /// exist (writing its CDI spec again where it is missing or differs); `None` after
    /// releasing a record whose instances are gone.
    async fn serve_completed(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> Result<Option<Vec<PreparedDevice>>, PrepareError> {
        let mut live = Vec::new();
        for gpu in gpus_of(&record.devices) {
            live.extend(
                self.instances_on(gpu)
                    .await
                    .map_err(PrepareError::GpuUnavailable)?,
            );
        }
        let matched = plan::match_devices(&record.devices, &live, |s| {
            self.checkpoint
                .read(|cp| plan::recorded_elsewhere(cp, &claim.uid, s))
        });
        // A GPU instance whose compute instance is gone (an administrator's `nvidia-smi mig
        // -dci`) is listed without a MIG UUID: no container can use it, so it is repaired like
        // a missing one (released and created again), never answered with.
        let usable = |m: &Option<MigInstance>| m.as_ref().is_some_and(|s| !s.mig_uuid.is_empty());
        if !matched.iter().all(usable) {
            tracing::warn!(claim = %claim, "slices recorded for this claim are gone or have lost their compute instance; preparing it again");
            self.release(claim, record.devices.clone()).await?;
            return Ok(None);
        }
        let instances: Vec<MigInstance> = matched.into_iter().flatten().collect();
        self.ensure_cdi_spec(claim, record, &instances)?;
        self.status.start(
            self.api.clone(),
            claim.clone(),
            record.devices.clone(),
            self.metrics.clone(),
        );
        Ok(Some(plan::kubelet_devices(record)))
    }

    /// Writes the record's CDI spec when the file is missing, unreadable or not what it should
    /// be; returns whether it wrote.
    pub(crate) fn ensure_cdi_spec(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
        instances: &[MigInstance],
    ) -> Result<bool, PrepareError> {
        let legacy = plan::legacy_cdi_keys(record);
        let built = self.build_spec(claim, &record.devices, instances, &legacy)?;
        let on_disk = cdi::read_spec(&cdi::spec_path(&self.cdi_dir, &claim.uid)).ok();
        if on_disk.as_ref() == Some(&built.spec) {
            return Ok(false);
        }
        tracing::info!(claim = %claim, "writing the claim's CDI spec again");
        cdi::write_spec(&self.cdi_dir, &claim.uid, &built.spec)?;
        Ok(true)
    }

    pub(crate) fn build_spec(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        instances: &[MigInstance],
        legacy_keys: &[String],
    ) -> Result<cdi::ClaimSpec, PrepareError> {
        let spec_devices = plan::spec_devices(devices, instances, self.caps_major, legacy_keys);
        let mut built = cdi::build_claim_spec(&claim.uid, &spec_devices)?;
        cdi::place_device_nodes(&mut built.spec, &self.device_nodes);
        cdi::add_spec_mounts(&mut built.spec, &self.driver_mounts);
        Ok(built)
    }

    /// Checkpoint `PrepareStarted`, create the instances, write the CDI spec, checkpoint
    /// `PrepareCompleted`, start the status write; rolls back on any failure.
    async fn create_and_record(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        pods: Vec<String>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let t0 = Instant::now();
        let started: Vec<RecordedDevice> = planned.iter().map(plan::record).collect();
        self.checkpoint
            .commit(|cp| {
                cp.set_started(&claim.uid, &claim.namespace, &claim.name, started);
                cp.set_pods(&claim.uid, pods);
            })
            .await
            .map_err(PrepareError::Checkpoint)?;
        let t_started = t0.elapsed();
        let (made, failed) = self.create_all(&claim.uid, planned).await;
        let devices = self.record_of(&claim.uid).map(|r| r.devices);
        let Some(devices) = devices else {
            return Err(PrepareError::Internal(
                "the claim's record vanished while its lock was held".into(),
            ));
        };
        if let Some((i, e)) = failed {
            // The instances made, and the GPU instance a failed create names: NVML's create leaves
            // one behind when the compute instance fails and so does the clean-up.
            let mut attempted: Vec<RecordedDevice> = devices
                .iter()
                .zip(&made)
                .filter(|(_, m)| m.is_some())
                .map(|(d, _)| d.clone())
                .collect();
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
            let err = PrepareError::create(&planned[i].device, e);
            self.roll_back(claim, attempted).await;
            return Err(err);
        }
        let instances: Vec<MigInstance> = made.into_iter().flatten().collect();
        let t_created = t0.elapsed();
        let built = match self
            .build_spec(claim, &devices, &instances, &[])
            .and_then(|b| {
                cdi::write_spec(&self.cdi_dir, &claim.uid, &b.spec)?;
                Ok(b)
            }) {
            Ok(b) => b,
            Err(e) => {
                self.roll_back(claim, devices).await;
                return Err(e);
            }
        };
        let cdi_ids: BTreeMap<String, Vec<String>> = built
            .device_ids
            .into_iter()
            .map(|(k, id)| (k, vec![id]))
            .collect();
        let completed = self
            .checkpoint
            .commit(|cp| {
                cp.set_completed(
                    &claim.uid,
                    &claim.namespace,
                    &claim.name,
                    devices.clone(),
                    cdi_ids,
                );
                cp.get(&claim.uid).cloned()
            })
            .await;
        let record = match completed {
            Ok(Some(r)) => r,
            Ok(None) => unreachable_record(),
            Err(e) => {
                self.roll_back(claim, devices).await;
                return Err(PrepareError::Checkpoint(e));
            }
        };
        self.update_prepared_gauge();
        tracing::debug!(claim = %claim, started_ms = ms(t_started), create_ms = ms(t_created - t_started),
            finish_ms = ms(t0.elapsed() - t_created), "prepare phases");
        // The kubelet only needs the CDI devices: the status is written after answering.
        self.status.start(
            self.api.clone(),
            claim.clone(),
            record.devices.clone(),
            self.metrics.clone(),
        );
        Ok(plan::kubelet_devices(&record))
    }

    /// Releases the instances of a failed prepare; a failure to destroy is already recorded for
    /// the reaper by [`Self::release`], so only logged here.
    async fn roll_back(&self, claim: &ClaimRef, devices: Vec<RecordedDevice>) {
        if let Err(e) = self.release(claim, devices).await {
            tracing::error!(claim = %claim, error = %e, "rolling back a failed prepare left slices behind; the reaper retries");
        }
    }

    /// Creates every planned instance, GPUs in parallel. Returns the instance made for each planned
    /// device (in order) and the first failure, if any (a GPU stops at its first failure).
    async fn create_all(
        &self,
        uid: &str,
        planned: &[Planned],
    ) -> (Vec<Option<MigInstance>>, Option<(usize, BackendError)>) {
        let mut by_gpu: BTreeMap<u32, Vec<(usize, &Planned)>> = BTreeMap::new();
        for (i, p) in planned.iter().enumerate() {
            by_gpu.entry(p.at.gpu_index).or_default().push((i, p));
        }
        let per_gpu = join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, items)| self.create_on_gpu(uid, gpu, items)),
        )
        .await;
        let mut made = vec![None; planned.len()];
        let mut failed = None;
        for (instances, err) in per_gpu {
            for (i, s) in instances {
                made[i] = Some(s);
            }
            if failed.is_none() {
                failed = err;
            }
        }
        (made, failed)
    }

    /// Creates `items` on one GPU in turn, under its lock; notes each instance in the claim's
    /// record while still holding the lock, so a concurrent release on this GPU sees it as
    /// recorded.
    async fn create_on_gpu(
        &self,
        uid: &str,
        gpu: u32,
        items: Vec<(usize, &Planned)>,
    ) -> (Vec<(usize, MigInstance)>, Option<(usize, BackendError)>) {
        let lock = self.gpu_lock(gpu);
        let _held = lock.lock().await;
        let mut made = Vec::new();
        for (i, p) in items {
            let backend = self.backend.clone();
            let (profile, start) = (p.at.profile.clone(), p.at.start);
            let t0 = Instant::now();
            let r = self
                .blocking
                .run(move || backend.create_instance(gpu, &profile, start))
                .await;
            self.metrics.observe_backend("create", t0.elapsed());
            match r {
                Ok(Ok(instance)) => {
                    self.checkpoint.change(|cp| {
                        if let Some(d) = cp.claims.get_mut(uid).and_then(|r| r.devices.get_mut(i)) {
                            *d = plan::with_instance(d, &instance);
                        }
                    });
                    made.push((i, instance));
                }
                Ok(Err(e)) => return (made, Some((i, e))),
                Err(e) => {
                    let e = BackendError::Other {
                        target: crate::gpu::Target::gpu(gpu),
                        reason: e,
                    };
                    return (made, Some((i, e)));
                }
            }
        }
        (made, None)
    }

    /// Unprepares one claim: stops its status write, releases its instances. Idempotent; a claim
    /// without a record only has its CDI spec removed (if any).
    ///
    /// Slices left on a lost GPU do not fail the call: the claim stays recorded and the reaper
    /// destroys them when the GPU answers again, while the kubelet can finish the pod.
    ///
    /// # Errors
    /// Slices that could not be destroyed (the kubelet retries; the reaper does too).
    pub async fn unprepare_claim(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        let _held = self.claim_locks.lock(&claim.uid).await;
        self.status.stop(&claim.uid).await;
        let Some(record) = self.record_of(&claim.uid) else {
            cdi::delete_spec(&self.cdi_dir, &claim.uid)?;
            return Ok(());
        };
        let r = self.release(claim, record.devices).await;
        self.update_prepared_gauge();
        match r {
            Err(PrepareError::Destroy {
                only_lost_gpus: true,
                failures,
            }) => {
                tracing::warn!(claim = %claim, failures = ?failures,
                    "unprepared; slices on a lost GPU stay recorded until it answers again");
                Ok(())
            }
            other => other,
        }
    }

    /// Destroys exactly the recorded instances of `devices` (and, for devices recorded without
    /// an instance, the instance at their placement that nobody else records), deletes the CDI
    /// spec, and drops the record once every instance is confirmed gone. Otherwise the record
    /// becomes `Releasing` with what is left, and the reaper takes it over. The caller holds
    /// the claim's lock.
    ///
    /// # Errors
    /// [`PrepareError::Destroy`] naming every instance left; [`PrepareError::Cdi`] when only the
    /// spec could not be deleted.
    pub(crate) async fn release(
        &self,
        claim: &ClaimRef,
        devices: Vec<RecordedDevice>,
    ) -> Result<(), PrepareError> {
        // A completed record always holds live instances: mark it releasing before the first
        // destroy, so a crash half-way leaves a record start-up finishes, not a completed one
        // with instances missing.
        let completed = self.checkpoint.read(|cp| {
            cp.get(&claim.uid)
                .is_some_and(|r| r.state == PrepareState::PrepareCompleted)
        });
        if completed {
            let marked = devices.clone();
            self.checkpoint
                .commit(|cp| cp.set_releasing(&claim.uid, &claim.namespace, &claim.name, marked))
                .await
                .map_err(PrepareError::Checkpoint)?;
        }
        let remaining = self.destroy_devices(&claim.uid, devices).await;
        let spec = cdi::delete_spec(&self.cdi_dir, &claim.uid);
        if remaining.is_empty() && spec.is_ok() {
            self.forget(claim).await;
            return Ok(());
        }
        let left: Vec<RecordedDevice> = remaining.iter().map(|r| r.device.clone()).collect();
        if let Err(e) = self
            .checkpoint
            .commit(|cp| cp.set_releasing(&claim.uid, &claim.namespace, &claim.name, left))
            .await
        {
            tracing::error!(claim = %claim, error = %e, "saving the checkpoint failed");
        }
        self.reaper.schedule(&claim.uid);
        self.update_pending_gauge();
        for r in &remaining {
            self.metrics.destroy_failed(r.cause);
        }
        if let Err(e) = spec
            && remaining.is_empty()
        {
            return Err(e.into());
        }
        Err(PrepareError::Destroy {
            only_lost_gpus: remaining.iter().all(|r| r.gpu_lost),
            failures: remaining.into_iter().map(|r| r.failure).collect(),
        })
    }

    /// Destroys the instances of `devices`, GPUs in parallel, each under its GPU's lock; returns
    /// the devices whose instance is still there.
    async fn destroy_devices(&self, uid: &str, devices: Vec<RecordedDevice>) -> Vec<Remaining> {
        let mut by_gpu: BTreeMap<u32, Vec<RecordedDevice>> = BTreeMap::new();
        for d in devices {
            by_gpu.entry(d.gpu_index).or_default().push(d);
        }
        join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, devs)| self.destroy_on_gpu(uid, gpu, devs)),
        )
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// Destroys `devices` on GPU `gpu`: one pass under the GPU's lock, then, for instances NVML
    /// answers `IN_USE` (processes still exiting), more passes after the pauses of
    /// [`DESTROY_RETRIES`], each paused without the lock so the GPU's other calls go on.
    async fn destroy_on_gpu(
        &self,
        uid: &str,
        gpu: u32,
        devices: Vec<RecordedDevice>,
    ) -> Vec<Remaining> {
        let mut pauses = DESTROY_RETRIES.iter();
        let mut pending = devices;
        let mut failed = Vec::new();
        loop {
            let (in_use, other) = self.destroy_pass(uid, gpu, pending).await;
            failed.extend(other);
            match pauses.next() {
                Some(pause) if !in_use.is_empty() => {
                    tokio::time::sleep(*pause).await;
                    pending = in_use.into_iter().map(|r| r.device).collect();
                }
                _ => {
                    failed.extend(in_use);
                    return failed;
                }
            }
        }
    }

    /// One attempt at each of `devices`, under GPU `gpu`'s lock: list its instances, match the
    /// recorded ones (exact identity, re-read on every pass), destroy each once. Returns the
    /// devices whose instance answered `IN_USE`, then those that failed otherwise.
    async fn destroy_pass(
        &self,
        uid: &str,
        gpu: u32,
        devices: Vec<RecordedDevice>,
    ) -> (Vec<Remaining>, Vec<Remaining>) {
        let lock = self.gpu_lock(gpu);
        let _held = lock.lock().await;
        let live = match self.instances_on(gpu).await {
            Ok(live) => live,
            Err(e) => {
                let failed = devices
                    .into_iter()
                    .map(|d| Remaining {
                        failure: format!("device {} ({} on GPU {gpu}): {e}", d.device, d.profile),
                        gpu_lost: matches!(e, BackendError::GpuLost { .. }),
                        cause: e.kind(),
                        device: d,
                    })
                    .collect();
                return (Vec::new(), failed);
            }
        };
        let matched = plan::match_devices(&devices, &live, |s| {
            self.checkpoint
                .read(|cp| plan::recorded_elsewhere(cp, uid, s))
        });
        let (mut in_use, mut failed) = (Vec::new(), Vec::new());
        for (d, found) in devices.iter().zip(matched) {
            let Some(s) = found else {
                continue; // confirmed gone: the GPU answered and it is not there
            };
            let Err(e) = self.destroy_once(&s).await else {
                continue;
            };
            let left = Remaining {
                failure: format!(
                    "slice {} ({} at memory slice {} on GPU {gpu}): {e}",
                    s.mig_uuid, s.profile, s.placement.start
                ),
                gpu_lost: matches!(e, BackendError::GpuLost { .. }),
                cause: e.kind(),
                device: plan::with_instance(d, &s),
            };
            if matches!(e, BackendError::InUse { .. }) {
                in_use.push(left);
            } else {
                failed.push(left);
            }
        }
        (in_use, failed)
    }

    /// Destroys one instance, retrying `IN_USE` after the pauses of [`DESTROY_RETRIES`]. The
    /// caller holds the GPU's lock throughout: for start-up only, before the plugin serves.
    pub(crate) async fn destroy_one(&self, s: &MigInstance) -> Result<(), BackendError> {
        let mut pauses = DESTROY_RETRIES.iter();
        loop {
            match self.destroy_once(s).await {
                Err(e @ BackendError::InUse { .. }) => match pauses.next() {
                    Some(pause) => tokio::time::sleep(*pause).await,
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }

    /// One destroy of one instance; `NOT_FOUND` counts as destroyed. The caller holds the GPU's
    /// lock.
    async fn destroy_once(&self, s: &MigInstance) -> Result<(), BackendError> {
        let backend = self.backend.clone();
        let (gpu, gi) = (s.gpu_index, s.gi_id);
        let t0 = Instant::now();
        let r = self
            .blocking
            .run(move || backend.destroy_instance(gpu, gi))
            .await;
        self.metrics.observe_backend("destroy", t0.elapsed());
        match r {
            Ok(Ok(())) | Ok(Err(BackendError::NotFound { .. })) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(reason) => Err(BackendError::Other {
                target: crate::gpu::Target::gpu(gpu),
                reason,
            }),
        }
    }

    async fn forget(&self, claim: &ClaimRef) {
        let (removed, version) = self.checkpoint.change(|cp| cp.remove(&claim.uid).is_some());
        if removed && let Err(e) = self.checkpoint.persist(version).await {
            tracing::error!(claim = %claim, error = %e, "saving the checkpoint failed");
        }
        self.reaper.done(&claim.uid);
        self.orphans.clear(&claim.uid);
        self.update_pending_gauge();
        self.released.notify_waiters();
    }

    /// The instances of GPU `gpu`, from the backend.
    pub(crate) async fn instances_on(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        let backend = self.backend.clone();
        match self.blocking.run(move || backend.instances_on(gpu)).await {
            Ok(r) => r,
            Err(reason) => Err(BackendError::Other {
                target: crate::gpu::Target::gpu(gpu),
                reason,
            }),
        }
    }

    /// The MIG instances on the GPUs that answer that no claim holds ([`plan::unclaimed`]).
    pub async fn unclaimed_instances(&self) -> Vec<MigInstance> {
        let mut out = Vec::new();
        for gpu in self.backend.gpu_indices() {
            let Ok(live) = self.instances_on(gpu).await else {
                continue;
            };
            out.extend(self.checkpoint.read(|cp| plan::unclaimed(&live, cp)));
        }
        out
    }

    /// Every managed GPU's instances, or why that GPU could not be read.
    pub(crate) async fn live_per_gpu(
        &self,
    ) -> BTreeMap<u32, Result<Vec<MigInstance>, BackendError>> {
        let mut out = BTreeMap::new();
        for gpu in self.backend.gpu_indices() {
            out.insert(gpu, self.instances_on(gpu).await);
        }
        out
    }

    pub(crate) fn update_prepared_gauge(&self) {
        let mut per_gpu = self.checkpoint.read(|cp| {
            plan::per_gpu(
                cp.claims
                    .values()
                    .filter(|r| r.state == PrepareState::PrepareCompleted)
                    .flat_map(|r| &r.devices),
            )
        });
        // Every GPU gets a sample, 0 when idle, so dashboards see idle GPUs too.
        for gpu in self.gpu_locks.keys() {
            per_gpu.entry(*gpu).or_default();
        }
        for (gpu, model) in &self.models {
            let free = self.checkpoint.read(|cp| {
                plan::free_placements(
                    model,
                    cp.claims
                        .values()
                        .flat_map(|r| &r.devices)
                        .filter(|d| d.gpu_index == *gpu),
                )
            });
            self.metrics.set_free_placements(*gpu, &free);
        }
        self.metrics.set_prepared(
            per_gpu
                .into_iter()
                .map(|(gpu, u)| (gpu, u.instances, u.memory_slices)),
        );
    }

    pub(crate) fn update_pending_gauge(&self) {
        let pending = self.checkpoint.read(|cp| {
            cp.claims
                .values()
                .filter(|r| r.state == PrepareState::Releasing)
                .map(|r| r.devices.len() as i64)
                .sum()
        });
        self.metrics.set_pending_destroy(pending);
    }

    /// Refreshes the gauges from the checkpoint (after start-up).
    pub fn update_gauges(&self) {
        self.update_prepared_gauge();
        self.update_pending_gauge();
    }

    /// Posts a Warning event about `about` (best effort).
    pub(crate) async fn warn(&self, about: EventTarget, reason: &str, note: String) {
        self.api.warn(&about, reason, note).await;
    }
}

fn unreachable_record() -> ClaimRecord {
    // `set_completed` just inserted it under the claim's lock.
    panic!("the completed record is missing right after it was written")
}

/// The GPU indices `devices` live on, each once.
fn gpus_of(devices: &[RecordedDevice]) -> Vec<u32> {
    let mut gpus: Vec<u32> = devices.iter().map(|d| d.gpu_index).collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

/// Milliseconds with a fraction, for logs.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tonic::async_trait]
impl ClaimHandler for Preparer {
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
        let done = join_all(claims.iter().map(|c| async move {
            let t0 = Instant::now();
            let r = self.prepare_claim(c).await;
            self.metrics.observe_call(
                "prepare",
                r.as_ref().err().map(PrepareError::metric_label),
                t0.elapsed(),
            );
            match &r {
                Ok(d) => tracing::info!(claim = %c, devices = d.len(), ms = t0.elapsed().as_millis() as u64, "prepared"),
                Err(e) => tracing::error!(claim = %c, cause = e.metric_label(), error = %e, "prepare failed"),
            }
            (c.uid.clone(), r)
        }))
        .await;
        done.into_iter().collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), PrepareError>> {
        let done = join_all(claims.iter().map(|c| async move {
            let t0 = Instant::now();
            let r = self.unprepare_claim(c).await;
            self.metrics.observe_call(
                "unprepare",
                r.as_ref().err().map(PrepareError::metric_label),
                t0.elapsed(),
            );
            match &r {
                Ok(()) => tracing::info!(claim = %c, "unprepared"),
                Err(e) => tracing::error!(claim = %c, cause = e.metric_label(), error = %e, "unprepare failed"),
            }
            (c.uid.clone(), r)
        }))
        .await;
        done.into_iter().collect()
    }
}
