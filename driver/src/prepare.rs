//! NodePrepareResources / NodeUnprepareResources: carve the allocated MIG slices, write the CDI
//! spec, keep the checkpoint, report the claim's device status.
//!
//! Prepare of one claim is two-phase (DESIGN §7): checkpoint `PrepareStarted` → create each slice
//! at exactly the allocated placement → write the CDI spec → checkpoint `PrepareCompleted` →
//! write `status.devices`. A retried prepare of a completed claim returns the recorded result; a
//! half-done one (crash, or a failure part-way) is rolled back first, so a retry starts clean.
//! Slices on different GPUs are created concurrently; one GPU's operations are serialized by a
//! per-GPU lock (NVML serializes them anyway, and it keeps the occupancy checks honest).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use das_api::DRIVER_NAME;
use futures::future::join_all;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::Mutex;

use crate::cdi::{self, PreparedSlice, RequestSlices};
use crate::checkpoint::{Checkpoint, PrepareState, PreparedDevice as Recorded};
use crate::gpu::{BackendError, GpuBackend, GpuInfo, MigSlice};
use crate::kubelet::{ClaimHandler, ClaimRef, DeviceHealthReport, HealthSource, PreparedDevice};
use crate::metrics::Metrics;
use crate::slices::device_name;

/// Field manager of the plugin's writes to `ResourceClaim.status.devices`.
pub const FIELD_MANAGER: &str = "das-kubelet-plugin";
/// Retries of a destroy that NVML answers with `IN_USE` (processes still exiting).
const DESTROY_RETRIES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Where a published device lives: GPU, profile and placement (in memory slices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRef {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub gpu_minor: u32,
    pub profile: String,
    pub start: u32,
    pub size: u32,
}

/// Every device the plugin publishes, by device name (`gpu-0-mig-1g-10gb-6`).
pub fn device_index(inventory: &[GpuInfo]) -> HashMap<String, DeviceRef> {
    let mut map = HashMap::new();
    for gpu in inventory.iter().filter(|g| g.offers_mig()) {
        for p in &gpu.model.profiles {
            for &start in &p.placement_starts {
                map.insert(
                    device_name(gpu.index, &p.name, start),
                    DeviceRef {
                        gpu_index: gpu.index,
                        gpu_uuid: gpu.uuid.clone(),
                        gpu_minor: gpu.minor,
                        profile: p.name.clone(),
                        start,
                        size: p.placement_size,
                    },
                );
            }
        }
    }
    map
}

/// The checkpoint in memory and on disk. Changes are made under a short lock and numbered;
/// [`Self::persist`] makes sure a change is on disk by writing the newest state, so prepares that
/// run at the same time share one write and fsync (group commit) instead of queueing one each.
pub struct CheckpointStore {
    state: std::sync::Mutex<(Checkpoint, u64)>,
    /// Number of the newest change on disk; held while writing.
    written: Mutex<u64>,
    path: PathBuf,
}

impl CheckpointStore {
    /// A store for `checkpoint`, saved to `path`.
    pub fn new(checkpoint: Checkpoint, path: PathBuf) -> Self {
        Self {
            state: std::sync::Mutex::new((checkpoint, 0)),
            written: Mutex::new(0),
            path,
        }
    }

    /// Reads the checkpoint.
    pub fn read<R>(&self, f: impl FnOnce(&Checkpoint) -> R) -> R {
        f(&self.state.lock().expect("checkpoint lock").0)
    }

    /// Changes the checkpoint in memory; returns the change's number for [`Self::persist`].
    fn change<R>(&self, f: impl FnOnce(&mut Checkpoint) -> R) -> (R, u64) {
        let mut g = self.state.lock().expect("checkpoint lock");
        g.1 += 1;
        (f(&mut g.0), g.1)
    }

    /// Makes sure change `version` (and every earlier one) is on disk.
    async fn persist(&self, version: u64) -> Result<(), String> {
        let mut written = self.written.lock().await;
        if *written >= version {
            return Ok(()); // someone else's write carried it
        }
        let (snapshot, newest) = {
            let g = self.state.lock().expect("checkpoint lock");
            (g.0.clone(), g.1)
        };
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || snapshot.save(&path))
            .await
            .map_err(|e| format!("checkpoint {}: {e}", self.path.display()))?
            .map_err(|e| format!("checkpoint {}: {e}", self.path.display()))?;
        *written = newest;
        Ok(())
    }

    /// Changes the checkpoint and waits until the change is on disk.
    pub async fn commit<R>(&self, f: impl FnOnce(&mut Checkpoint) -> R) -> Result<R, String> {
        let (r, version) = self.change(f);
        self.persist(version).await?;
        Ok(r)
    }
}

/// Prepares and unprepares claims for this node.
pub struct Preparer {
    pub client: kube::Client,
    pub node: String,
    pub backend: Arc<dyn GpuBackend>,
    pub devices: HashMap<String, DeviceRef>,
    pub cdi_dir: PathBuf,
    /// Major of the `nvidia-caps` char device (from `/proc/devices`; a fixed value when emulated).
    pub caps_major: u32,
    /// Put the slices' device nodes into CDI specs (off for emulated GPUs on real nodes, see
    /// [`cdi::without_device_nodes`]).
    pub cdi_device_nodes: bool,
    pub checkpoint: CheckpointStore,
    pub gpu_locks: HashMap<u32, Arc<Mutex<()>>>,
    pub metrics: Arc<Metrics>,
    /// Status writes still running, by claim UID (see [`Preparer::finish`]).
    pub status_writes: std::sync::Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

/// A device of a claim, resolved against what we publish.
struct Planned {
    result: DeviceRequestAllocationResult,
    at: DeviceRef,
}

impl Preparer {
    /// The lock of GPU `index`.
    fn gpu_lock(&self, index: u32) -> Arc<Mutex<()>> {
        self.gpu_locks.get(&index).cloned().unwrap_or_default()
    }

    async fn prepare_claim(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        if let Some(done) = self.completed_result(claim).await {
            return Ok(done);
        }
        let t0 = Instant::now();
        let planned = self.plan(claim).await?;
        self.roll_back_half_done(claim).await?;
        let started: Vec<Recorded> = planned.iter().map(record).collect();
        self.checkpoint
            .commit(|cp| cp.set_started(&claim.uid, &claim.namespace, &claim.name, started))
            .await?;
        let t_plan = t0.elapsed();
        let slices: Vec<MigSlice> = match self.create_all(&planned).await {
            Ok(s) => s,
            Err((made, err)) => {
                self.destroy_all(&made).await;
                self.forget(claim).await;
                return Err(format!("claim {claim}: {err}"));
            }
        };
        let t_create = t0.elapsed();
        match self.finish(claim, &planned, &slices).await {
            Ok(devices) => {
                tracing::debug!(claim = %claim, plan_ms = ms(t_plan), create_ms = ms(t_create - t_plan),
                    finish_ms = ms(t0.elapsed() - t_create), "prepare phases");
                Ok(devices)
            }
            Err(err) => {
                self.destroy_all(&slices).await;
                let _ = cdi::delete_spec(&self.cdi_dir, &claim.uid);
                self.forget(claim).await;
                Err(format!("claim {claim}: {err}"))
            }
        }
    }

    /// The recorded result of an already completed prepare (kubelet retries are idempotent).
    async fn completed_result(&self, claim: &ClaimRef) -> Option<Vec<PreparedDevice>> {
        self.checkpoint.read(|cp| {
            let rec = cp.get(&claim.uid)?;
            (rec.state == PrepareState::PrepareCompleted)
                .then(|| kubelet_devices(&rec.devices, &rec.cdi_device_ids))
        })
    }

    /// Fetches the claim and resolves its allocation results for our driver on this node.
    async fn plan(&self, claim: &ClaimRef) -> Result<Vec<Planned>, String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let rc = api
            .get(&claim.name)
            .await
            .map_err(|e| format!("claim {claim}: cannot read it: {e}"))?;
        if rc.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(format!(
                "claim {claim}: the API server has UID {} for that name: the claim was replaced",
                rc.metadata.uid.as_deref().unwrap_or("<none>")
            ));
        }
        let results = rc
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .ok_or_else(|| format!("claim {claim}: not allocated"))?;
        let ours: Vec<_> = results
            .into_iter()
            .filter(|r| r.driver == DRIVER_NAME)
            .collect();
        if ours.is_empty() {
            return Err(format!(
                "claim {claim}: no device of driver {DRIVER_NAME} is allocated"
            ));
        }
        ours.into_iter()
            .map(|r| {
                if r.pool != self.node {
                    return Err(format!(
                        "claim {claim}: device {} is in pool {}, which is not this node ({})",
                        r.device, r.pool, self.node
                    ));
                }
                let at = self.devices.get(&r.device).cloned().ok_or_else(|| {
                    format!(
                        "claim {claim}: device {} is not a device this node publishes",
                        r.device
                    )
                })?;
                Ok(Planned { result: r, at })
            })
            .collect()
    }

    /// Rolls back a prepare that started but never completed (crash or failure part-way).
    pub(crate) async fn roll_back_half_done(&self, claim: &ClaimRef) -> Result<(), String> {
        let started = self.checkpoint.read(|cp| match cp.get(&claim.uid) {
            Some(rec) if rec.state == PrepareState::PrepareStarted => Some(rec.devices.clone()),
            _ => None,
        });
        let Some(started) = started else {
            return Ok(());
        };
        tracing::warn!(claim = %claim, "rolling back a prepare that did not complete");
        let live = self
            .list_slices()
            .await
            .map_err(|e| format!("claim {claim}: {e}"))?;
        let leftovers: Vec<MigSlice> = live
            .into_iter()
            .filter(|s| started.iter().any(|d| occupies(d, s)))
            .collect();
        self.destroy_all(&leftovers).await;
        let _ = cdi::delete_spec(&self.cdi_dir, &claim.uid);
        self.forget(claim).await;
        Ok(())
    }

    /// Creates every planned slice, GPUs in parallel; on failure returns what was made.
    async fn create_all(
        &self,
        planned: &[Planned],
    ) -> Result<Vec<MigSlice>, (Vec<MigSlice>, String)> {
        let mut by_gpu: BTreeMap<u32, Vec<&Planned>> = BTreeMap::new();
        for p in planned {
            by_gpu.entry(p.at.gpu_index).or_default().push(p);
        }
        let per_gpu = join_all(
            by_gpu
                .into_iter()
                .map(|(gpu, items)| self.create_on_gpu(gpu, items)),
        )
        .await;
        let mut made = Vec::new();
        let mut first_err = None;
        for (slices, err) in per_gpu {
            made.extend(slices);
            if first_err.is_none() {
                first_err = err;
            }
        }
        match first_err {
            None => {
                // Back in allocation-result order, which is the order the container numbers them.
                made.sort_by_key(|s| {
                    planned
                        .iter()
                        .position(|p| occupies_at(&p.at, s))
                        .unwrap_or(usize::MAX)
                });
                Ok(made)
            }
            Some(e) => Err((made, e)),
        }
    }

    async fn create_on_gpu(
        &self,
        gpu: u32,
        items: Vec<&Planned>,
    ) -> (Vec<MigSlice>, Option<String>) {
        let lock = self.gpu_lock(gpu);
        let _held = lock.lock().await;
        let mut made = Vec::new();
        for p in items {
            let backend = self.backend.clone();
            let (profile, start) = (p.at.profile.clone(), p.at.start);
            let t0 = Instant::now();
            let r = tokio::task::spawn_blocking(move || backend.create_slice(gpu, &profile, start))
                .await;
            self.metrics.observe_backend("create", t0.elapsed());
            match r {
                Ok(Ok(slice)) => made.push(slice),
                Ok(Err(e)) => {
                    return (
                        made,
                        Some(format!(
                            "device {}: {}",
                            p.result.device,
                            explain_create(&e)
                        )),
                    );
                }
                Err(e) => {
                    return (
                        made,
                        Some(format!(
                            "device {}: backend task failed: {e}",
                            p.result.device
                        )),
                    );
                }
            }
        }
        (made, None)
    }

    /// CDI spec, completed checkpoint, claim status; returns what the kubelet gets.
    async fn finish(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        slices: &[MigSlice],
    ) -> Result<Vec<PreparedDevice>, String> {
        let recorded: Vec<Recorded> = planned
            .iter()
            .zip(slices)
            .map(|(p, s)| Recorded {
                gi_id: Some(s.gi_id),
                ci_id: Some(s.ci_id),
                mig_uuid: Some(s.mig_uuid.clone()),
                ..record(p)
            })
            .collect();
        let cdi_ids = self.record_completed(claim, &recorded, slices).await?;
        self.metrics.set_prepared(self.prepared_per_gpu().await);
        // The kubelet only needs the CDI devices: the status (for users and the AllocationClaim
        // controller) is written after answering. Unprepare of the claim waits for it.
        let (client, metrics, claim_c) = (self.client.clone(), self.metrics.clone(), claim.clone());
        let recorded_owned = recorded.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = write_status(&client, &claim_c, &recorded_owned).await {
                // The slices are ready; a missing status only delays the AllocationClaim's `inUse`.
                tracing::warn!(claim = %claim_c, error = %e, "writing the claim's device status failed");
                metrics.status_write_failed();
            }
        });
        self.status_writes
            .lock()
            .expect("status lock")
            .insert(claim.uid.clone(), task);
        Ok(kubelet_devices(&recorded, &cdi_ids))
    }

    /// Writes the claim's CDI spec for `slices` (in the order of `recorded`) and checkpoints the
    /// claim as completed; returns the CDI device IDs per request.
    pub(crate) async fn record_completed(
        &self,
        claim: &ClaimRef,
        recorded: &[Recorded],
        slices: &[MigSlice],
    ) -> Result<BTreeMap<String, Vec<String>>, String> {
        let mut requests: BTreeMap<String, Vec<PreparedSlice>> = BTreeMap::new();
        for (d, s) in recorded.iter().zip(slices) {
            requests
                .entry(base_request(&d.request).to_string())
                .or_default()
                .push(PreparedSlice {
                    mig_uuid: s.mig_uuid.clone(),
                    parent_minor: s.gpu_minor,
                    gi_cap_minor: s.gi_cap_minor,
                    ci_cap_minor: s.ci_cap_minor,
                    caps_major: self.caps_major,
                    caps_file_mode: Some(0o444),
                });
        }
        let requests: Vec<RequestSlices> = requests
            .into_iter()
            .map(|(request, slices)| RequestSlices { request, slices })
            .collect();
        let mut spec =
            cdi::build_claim_spec(&claim.uid, &requests).map_err(|e| format!("CDI spec: {e}"))?;
        if !self.cdi_device_nodes {
            cdi::without_device_nodes(&mut spec.spec);
        }
        cdi::write_spec(&self.cdi_dir, &claim.uid, &spec.spec)
            .map_err(|e| format!("CDI spec: {e}"))?;
        let cdi_ids: BTreeMap<String, Vec<String>> = spec
            .device_ids
            .iter()
            .map(|(r, id)| (r.clone(), vec![id.clone()]))
            .collect();
        let ids = cdi_ids.clone();
        self.checkpoint
            .commit(|cp| {
                cp.set_completed(
                    &claim.uid,
                    &claim.namespace,
                    &claim.name,
                    recorded.to_vec(),
                    ids,
                )
            })
            .await?;
        Ok(cdi_ids)
    }

    pub(crate) async fn unprepare_claim(&self, claim: &ClaimRef) -> Result<(), String> {
        let pending = self
            .status_writes
            .lock()
            .expect("status lock")
            .remove(&claim.uid);
        if let Some(task) = pending {
            let _ = task.await;
        }
        let rec = self.checkpoint.read(|cp| cp.get(&claim.uid).cloned());
        if let Some(rec) = rec {
            let live = self
                .list_slices()
                .await
                .map_err(|e| format!("claim {claim}: {e}"))?;
            let ours: Vec<MigSlice> = live
                .into_iter()
                .filter(|s| rec.devices.iter().any(|d| occupies(d, s)))
                .collect();
            let failures = self.destroy_all(&ours).await;
            if !failures.is_empty() {
                return Err(format!("claim {claim}: {}", failures.join("; ")));
            }
        }
        cdi::delete_spec(&self.cdi_dir, &claim.uid).map_err(|e| format!("claim {claim}: {e}"))?;
        self.forget(claim).await;
        self.metrics.set_prepared(self.prepared_per_gpu().await);
        Ok(())
    }

    /// Destroys `slices`, retrying `IN_USE`; returns one message per slice that could not go.
    pub(crate) async fn destroy_all(&self, slices: &[MigSlice]) -> Vec<String> {
        let results = join_all(slices.iter().map(|s| self.destroy_one(s))).await;
        results.into_iter().filter_map(Result::err).collect()
    }

    async fn destroy_one(&self, s: &MigSlice) -> Result<(), String> {
        let lock = self.gpu_lock(s.gpu_index);
        let _held = lock.lock().await;
        // One try, then one more after each pause while NVML answers IN_USE.
        let mut pauses = DESTROY_RETRIES.iter();
        loop {
            let backend = self.backend.clone();
            let (gpu, gi) = (s.gpu_index, s.gi_id);
            let t0 = Instant::now();
            let r = tokio::task::spawn_blocking(move || backend.destroy_slice(gpu, gi)).await;
            self.metrics.observe_backend("destroy", t0.elapsed());
            match r {
                Ok(Ok(())) | Ok(Err(BackendError::NotFound { .. })) => return Ok(()),
                Ok(Err(e @ BackendError::InUse { .. })) => match pauses.next() {
                    Some(pause) => tokio::time::sleep(*pause).await,
                    None => return Err(format!("slice {} ({}): still {e}", s.mig_uuid, s.profile)),
                },
                Ok(Err(e)) => return Err(format!("slice {} ({}): {e}", s.mig_uuid, s.profile)),
                Err(e) => return Err(format!("slice {}: backend task failed: {e}", s.mig_uuid)),
            }
        }
    }

    async fn forget(&self, claim: &ClaimRef) {
        let (removed, version) = self.checkpoint.change(|cp| cp.remove(&claim.uid).is_some());
        if removed && let Err(e) = self.checkpoint.persist(version).await {
            tracing::error!(claim = %claim, error = %e, "saving the checkpoint failed");
        }
    }

    pub(crate) async fn list_slices(&self) -> Result<Vec<MigSlice>, BackendError> {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || backend.list_slices())
            .await
            .unwrap_or_else(|e| {
                Err(BackendError::Other {
                    target: Default::default(),
                    reason: e.to_string(),
                })
            })
    }

    /// Prepared slices per GPU index, from the checkpoint.
    pub(crate) async fn prepared_per_gpu(&self) -> BTreeMap<u32, u64> {
        self.checkpoint
            .read(|cp| crate::reconcile::per_gpu(cp.claims.values().flat_map(|r| &r.devices)))
    }
}

/// Server-side applies our entries of `status.devices`: condition `Ready` and the slice data.
async fn write_status(
    client: &kube::Client,
    claim: &ClaimRef,
    devices: &[Recorded],
) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let entries: Vec<_> = devices
        .iter()
        .map(|d| {
            serde_json::json!({
                "driver": DRIVER_NAME,
                "pool": d.pool,
                "device": d.device,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "SliceCreated",
                    "message": format!("MIG {} at memory slice {} on GPU {} ({})", d.profile, d.placement_start, d.gpu_index, d.mig_uuid.as_deref().unwrap_or("")),
                    "lastTransitionTime": now,
                }],
                "data": {
                    "migUUID": d.mig_uuid,
                    "gpuUUID": d.gpu_uuid,
                    "profile": d.profile,
                    "placement": {"start": d.placement_start, "size": d.placement_size},
                },
            })
        })
        .collect();
    let body = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace},
        "status": {"devices": entries},
    });
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    api.patch_status(
        &claim.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

#[tonic::async_trait]
impl ClaimHandler for Preparer {
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
        let done = join_all(claims.iter().map(|c| async move {
            let t0 = Instant::now();
            let r = self.prepare_claim(c).await;
            self.metrics.observe_call("prepare", r.is_ok(), t0.elapsed());
            match &r {
                Ok(d) => tracing::info!(claim = %c, devices = d.len(), ms = t0.elapsed().as_millis() as u64, "prepared"),
                Err(e) => tracing::error!(claim = %c, error = %e, "prepare failed"),
            }
            (c.uid.clone(), r)
        }))
        .await;
        done.into_iter().collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), String>> {
        let done = join_all(claims.iter().map(|c| async move {
            let t0 = Instant::now();
            let r = self.unprepare_claim(c).await;
            self.metrics
                .observe_call("unprepare", r.is_ok(), t0.elapsed());
            match &r {
                Ok(()) => tracing::info!(claim = %c, "unprepared"),
                Err(e) => tracing::error!(claim = %c, error = %e, "unprepare failed"),
            }
            (c.uid.clone(), r)
        }))
        .await;
        done.into_iter().collect()
    }
}

/// Milliseconds with a fraction, for logs.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A device is healthy while its GPU is in the backend's inventory; when the GPU is gone (fallen
/// off the bus, driver reset) or the inventory cannot be read, its devices are unhealthy.
#[tonic::async_trait]
impl HealthSource for Preparer {
    async fn device_health(&self) -> Vec<DeviceHealthReport> {
        let backend = self.backend.clone();
        let inventory = tokio::task::spawn_blocking(move || backend.inventory()).await;
        let present: Result<Vec<String>, String> = match inventory {
            Ok(Ok(gpus)) => Ok(gpus.into_iter().map(|g| g.uuid).collect()),
            Ok(Err(e)) => Err(format!("reading the GPU inventory failed: {e}")),
            Err(e) => Err(format!("reading the GPU inventory failed: {e}")),
        };
        let mut reports: Vec<DeviceHealthReport> = self
            .devices
            .iter()
            .map(|(name, at)| {
                let (healthy, message) = match &present {
                    Ok(uuids) if uuids.contains(&at.gpu_uuid) => (true, String::new()),
                    Ok(_) => (
                        false,
                        format!(
                            "GPU {} ({}) is no longer visible",
                            at.gpu_index, at.gpu_uuid
                        ),
                    ),
                    Err(e) => (false, e.clone()),
                };
                DeviceHealthReport {
                    pool: self.node.clone(),
                    device: name.clone(),
                    healthy,
                    message,
                }
            })
            .collect();
        reports.sort_by(|a, b| a.device.cmp(&b.device));
        reports
    }
}

/// The request name the kubelet expects: without `/<subrequest>`.
pub fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

fn record(p: &Planned) -> Recorded {
    Recorded {
        request: p.result.request.clone(),
        pool: p.result.pool.clone(),
        device: p.result.device.clone(),
        gpu_index: p.at.gpu_index,
        gpu_uuid: p.at.gpu_uuid.clone(),
        profile: p.at.profile.clone(),
        placement_start: p.at.start,
        placement_size: p.at.size,
        gi_id: None,
        ci_id: None,
        mig_uuid: None,
    }
}

/// Whether live slice `s` is the one recorded as `d` (same GPU, profile and placement).
fn occupies(d: &Recorded, s: &MigSlice) -> bool {
    s.gpu_index == d.gpu_index && s.profile == d.profile && s.placement.start == d.placement_start
}

fn occupies_at(at: &DeviceRef, s: &MigSlice) -> bool {
    s.gpu_index == at.gpu_index && s.profile == at.profile && s.placement.start == at.start
}

/// The kubelet's view of recorded devices: each device serves its base request and carries that
/// request's CDI device.
fn kubelet_devices(
    devices: &[Recorded],
    cdi_ids: &BTreeMap<String, Vec<String>>,
) -> Vec<PreparedDevice> {
    devices
        .iter()
        .map(|d| {
            let request = base_request(&d.request).to_string();
            PreparedDevice {
                cdi_device_ids: cdi_ids.get(&request).cloned().unwrap_or_default(),
                requests: vec![request],
                pool: d.pool.clone(),
                device: d.device.clone(),
            }
        })
        .collect()
}

/// A create failure in the words a user needs: an occupied placement means the scheduler's view
/// and the GPU disagree (a slice DAS does not know about, or a leak).
fn explain_create(e: &BackendError) -> String {
    match e {
        BackendError::InsufficientResources { .. } => {
            format!(
                "{e} (the placement is taken on the GPU: a slice DAS did not create, or one not yet destroyed)"
            )
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_request_drops_the_subrequest() {
        assert_eq!(base_request("gpu"), "gpu");
        assert_eq!(base_request("gpu/small"), "gpu");
    }

    #[test]
    fn kubelet_devices_carry_their_request_cdi_device() {
        let d = |req: &str, dev: &str| Recorded {
            request: req.into(),
            pool: "n0".into(),
            device: dev.into(),
            gpu_index: 0,
            gpu_uuid: "GPU-x".into(),
            profile: "1g.10gb".into(),
            placement_start: 6,
            placement_size: 1,
            gi_id: Some(1),
            ci_id: Some(0),
            mig_uuid: Some("MIG-a".into()),
        };
        let ids = BTreeMap::from([
            ("a".to_string(), vec!["das.com/mig=u-a".to_string()]),
            ("b".to_string(), vec!["das.com/mig=u-b".to_string()]),
        ]);
        let out = kubelet_devices(
            &[
                d("a", "gpu-0-mig-1g-10gb-6"),
                d("b/x", "gpu-0-mig-1g-10gb-5"),
            ],
            &ids,
        );
        assert_eq!(out[0].requests, ["a"]);
        assert_eq!(out[0].cdi_device_ids, ["das.com/mig=u-a"]);
        assert_eq!(out[1].requests, ["b"]);
        assert_eq!(out[1].cdi_device_ids, ["das.com/mig=u-b"]);
    }
}

#[cfg(test)]
mod concurrency_tests {
    use super::*;
    use crate::gpu::{GpuInfo, Placement};
    use std::sync::Barrier;

    /// A backend whose creates wait until `parties` creates run at the same time (or give up
    /// after 10 s): with serialized creates the barrier is never reached and the test fails.
    struct RendezvousBackend {
        barrier: Arc<Barrier>,
        met: std::sync::atomic::AtomicUsize,
    }

    impl GpuBackend for RendezvousBackend {
        fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
            Ok(vec![])
        }
        fn create_slice(
            &self,
            gpu_index: u32,
            profile: &str,
            start: u32,
        ) -> Result<MigSlice, BackendError> {
            let (tx, rx) = std::sync::mpsc::channel();
            let barrier = self.barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let _ = tx.send(());
            });
            if rx.recv_timeout(Duration::from_secs(10)).is_ok() {
                self.met.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(MigSlice {
                gpu_index,
                gpu_uuid: format!("GPU-{gpu_index}"),
                gpu_minor: gpu_index,
                profile: profile.into(),
                profile_id: 19,
                placement: Placement { start, size: 1 },
                gi_id: 1,
                ci_id: 0,
                mig_uuid: format!("MIG-{gpu_index}-{start}"),
                gi_cap_minor: 0,
                ci_cap_minor: 0,
                created_by_das: Some(true),
            })
        }
        fn destroy_slice(&self, _: u32, _: u32) -> Result<(), BackendError> {
            Ok(())
        }
        fn list_slices(&self) -> Result<Vec<MigSlice>, BackendError> {
            Ok(vec![])
        }
    }

    fn planned(gpu: u32) -> Planned {
        Planned {
            result: DeviceRequestAllocationResult {
                request: "mig".into(),
                driver: DRIVER_NAME.into(),
                pool: "n0".into(),
                device: device_name(gpu, "1g.10gb", 6),
                ..Default::default()
            },
            at: DeviceRef {
                gpu_index: gpu,
                gpu_uuid: format!("GPU-{gpu}"),
                gpu_minor: gpu,
                profile: "1g.10gb".into(),
                start: 6,
                size: 1,
            },
        }
    }

    fn preparer_with(backend: Arc<dyn GpuBackend>, dir: &std::path::Path) -> Preparer {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        Preparer {
            client,
            node: "n0".into(),
            backend,
            devices: HashMap::new(),
            cdi_dir: dir.to_path_buf(),
            caps_major: 509,
            cdi_device_nodes: true,
            checkpoint: CheckpointStore::new(Checkpoint::new("boot"), dir.join("cp.json")),
            gpu_locks: [(0, Arc::default()), (1, Arc::default())]
                .into_iter()
                .collect(),
            metrics: Arc::new(Metrics::new()),
            status_writes: Default::default(),
        }
    }

    #[tokio::test]
    async fn destroy_retries_while_the_slice_is_in_use() {
        use crate::gpu::{EmulatedBackend, FaultKind};
        let dir = tempfile::tempdir().unwrap();
        let emu =
            Arc::new(EmulatedBackend::open("H100-80GB:1", "n0", &dir.path().join("emu")).unwrap());
        let slice = emu.create_slice(0, "1g.10gb", 6).unwrap();
        let p = preparer_with(emu.clone(), dir.path());

        // Processes still exiting: NVML answers IN_USE twice, then the destroy goes through.
        emu.inject_destroy_faults(0, 2, FaultKind::InUse);
        p.destroy_one(&slice).await.unwrap();
        assert!(emu.list_slices().unwrap().is_empty());

        // Other errors are reported at once, naming the slice.
        let slice = emu.create_slice(0, "1g.10gb", 6).unwrap();
        emu.inject_destroy_faults(0, 1, FaultKind::NotSupported);
        let err = p.destroy_one(&slice).await.unwrap_err();
        assert!(
            err.contains(&slice.mig_uuid) && err.contains("not supported"),
            "{err}"
        );
        assert_eq!(emu.list_slices().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slices_on_different_gpus_are_created_concurrently() {
        let backend = Arc::new(RendezvousBackend {
            barrier: Arc::new(Barrier::new(2)),
            met: Default::default(),
        });
        let dir = tempfile::tempdir().unwrap();
        let p = preparer_with(backend.clone(), dir.path());
        let made = p
            .create_all(&[planned(0), planned(1)])
            .await
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(made.len(), 2);
        assert_eq!(
            backend.met.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the two GPUs' creates never overlapped"
        );
        // Result order follows the allocation results, whatever order the GPUs finished in.
        assert_eq!(made.iter().map(|s| s.gpu_index).collect::<Vec<_>>(), [0, 1]);
    }
}
