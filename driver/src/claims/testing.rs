//! Test doubles for the request path's unit tests: an in-memory [`ClaimApi`] (the API server's
//! ResourceClaims as a map, with injectable failures), a [`Preparer`] over the emulated
//! backend in a temp dir, and GPUs with MIG mode off serving whole GPUs ([`MigOff`],
//! [`serve_whole`]). The request path's behaviour against a real API server is covered by
//! the e2e tests; these drive its decisions through interleavings no cluster can reproduce.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use das_api::DRIVER_NAME;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use super::handler::ClaimRef;
use super::{
    ApiError, ClaimApi, EventKind, EventSink, EventTarget, OrphanPolicy, PodContainers, Preparer,
    PreparerConfig, RuntimeError,
};
use crate::blocking::BlockingCalls;
use crate::claims::carve::{self, CarveOutcome};
use crate::claims::checkpoint::{Checkpoint, CheckpointStore, RecordedDevice};
use crate::claims::plan::{DeviceKind, DeviceRef};
use crate::gpu::{BackendError, GpuBackend, GpuInfo, MigInstance, MigModeState, Placement, Target};
use crate::metrics::Metrics;

/// Node name the test preparers serve.
pub const NODE: &str = "n0";

/// The API server's ResourceClaims, in memory.
#[derive(Default)]
pub(crate) struct MemoryApi {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    /// Status writes that landed: claim UID → MIG UUIDs written.
    pub statuses: Mutex<BTreeMap<String, Vec<String>>>,
    /// Carve status writes that landed: claim UID → what they said (carve before bind).
    pub carves: Mutex<BTreeMap<String, CarveOutcome>>,
    /// Warning events: (reason, note).
    pub events: Mutex<Vec<(String, String)>>,
    /// The next this many status writes fail (transiently).
    pub failing_status_writes: AtomicUsize,
    /// The next this many claim reads fail (transiently).
    pub failing_reads: AtomicUsize,
}

impl MemoryApi {
    /// Creates (or replaces) claim `ns/name` with `uid`, allocated to `devices` (request,
    /// device) on [`NODE`].
    pub fn allocate(&self, ns: &str, name: &str, uid: &str, devices: &[(&str, &str)]) -> ClaimRef {
        let results: Vec<_> = devices
            .iter()
            .map(|(request, device)| {
                json!({"request": request, "driver": DRIVER_NAME, "pool": NODE, "device": device})
            })
            .collect();
        let rc: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "spec": {},
            "status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": pod_of(uid)}]
            }
        }))
        .expect("claim");
        self.claims
            .lock()
            .unwrap()
            .insert((ns.into(), name.into()), rc);
        ClaimRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// Sets the claim's `status.reservedFor` to its own pod ([`pod_of`]) and `more` pod UIDs.
    pub(crate) fn reserve_for(&self, claim: &ClaimRef, more: &[&str]) {
        let mut claims = self.claims.lock().unwrap();
        let rc = claims
            .get_mut(&(claim.namespace.clone(), claim.name.clone()))
            .expect("claim");
        let mut pods = vec![json!({"resource": "pods", "name": "own", "uid": pod_of(&claim.uid)})];
        pods.extend(
            more.iter()
                .map(|uid| json!({"resource": "pods", "name": uid, "uid": uid})),
        );
        let status = rc.status.as_mut().expect("status");
        status.reserved_for = serde_json::from_value(json!(pods)).expect("reservedFor");
    }

    /// Sets the claim's allocated configs (`status.allocation.devices.config`): one opaque
    /// config for `mig.das.com` from the claim, for every request, with `parameters`.
    pub(crate) fn configure(&self, claim: &ClaimRef, parameters: serde_json::Value) {
        let mut claims = self.claims.lock().unwrap();
        let rc = claims
            .get_mut(&(claim.namespace.clone(), claim.name.clone()))
            .expect("claim");
        let config = serde_json::from_value(json!([{"source": "FromClaim",
            "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}]))
        .expect("config");
        let allocation = rc.status.as_mut().and_then(|s| s.allocation.as_mut());
        let devices = allocation
            .and_then(|a| a.devices.as_mut())
            .expect("devices");
        devices.config = Some(config);
    }

    /// Has the claim's results wait for the carve (binding conditions of carve before bind), as
    /// the scheduler copies them from devices published with `--carve-before-bind`.
    pub(crate) fn wait_for_carve(&self, claim: &ClaimRef) {
        self.change(claim, |rc| {
            let allocation = rc.status.as_mut().and_then(|s| s.allocation.as_mut());
            let results = allocation
                .and_then(|a| a.devices.as_mut())
                .and_then(|d| d.results.as_mut());
            for r in results.into_iter().flatten() {
                r.binding_conditions = Some(vec![carve::SLICE_READY.into()]);
                r.binding_failure_conditions = Some(vec![carve::SLICE_FAILED.into()]);
            }
        });
    }

    /// The claim as the API server has it now.
    pub fn claim(&self, claim: &ClaimRef) -> Option<ResourceClaim> {
        self.claims
            .lock()
            .unwrap()
            .get(&(claim.namespace.clone(), claim.name.clone()))
            .cloned()
    }

    /// Changes the stored claim `ns/name`.
    pub fn change(&self, claim: &ClaimRef, f: impl FnOnce(&mut ResourceClaim)) {
        let mut claims = self.claims.lock().unwrap();
        f(claims
            .get_mut(&(claim.namespace.clone(), claim.name.clone()))
            .expect("claim"));
    }

    /// Deletes the claim, if the API server still has it (with its UID).
    pub fn delete(&self, claim: &ClaimRef) {
        if self.has(claim) {
            self.claims
                .lock()
                .unwrap()
                .remove(&(claim.namespace.clone(), claim.name.clone()));
        }
    }

    /// Whether the claim `ns/name` exists with `uid`.
    pub fn has(&self, claim: &ClaimRef) -> bool {
        self.claims
            .lock()
            .unwrap()
            .get(&(claim.namespace.clone(), claim.name.clone()))
            .is_some_and(|rc| rc.metadata.uid.as_deref() == Some(claim.uid.as_str()))
    }

    fn take(counter: &AtomicUsize) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[tonic::async_trait]
impl ClaimApi for MemoryApi {
    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, ApiError> {
        if Self::take(&self.failing_reads) {
            return Err(ApiError::transient("injected: the API server is slow"));
        }
        Ok(self
            .claims
            .lock()
            .unwrap()
            .get(&(namespace.into(), name.into()))
            .cloned())
    }

    async fn list_claims(&self) -> Result<Vec<ResourceClaim>, ApiError> {
        Ok(self.claims.lock().unwrap().values().cloned().collect())
    }

    async fn write_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), ApiError> {
        if Self::take(&self.failing_status_writes) {
            return Err(ApiError::transient("injected: 503"));
        }
        if !self.has(claim) {
            return Err(ApiError::permanent("not found or replaced"));
        }
        let migs = devices
            .iter()
            .map(|d| d.mig_uuid().unwrap_or_default().to_string())
            .collect();
        self.statuses
            .lock()
            .unwrap()
            .insert(claim.uid.clone(), migs);
        Ok(())
    }

    async fn write_carve_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        outcome: &CarveOutcome,
    ) -> Result<(), ApiError> {
        self.carve_status(claim, devices, outcome)
    }
}

impl MemoryApi {
    /// [`ClaimApi::write_carve_status`]: records the outcome, and puts its condition into the
    /// stored claim's `status.devices` as the API server would.
    pub(crate) fn carve_status(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
        outcome: &CarveOutcome,
    ) -> Result<(), ApiError> {
        if Self::take(&self.failing_status_writes) {
            return Err(ApiError::transient("injected: 503"));
        }
        if !self.has(claim) {
            return Err(ApiError::permanent("not found or replaced"));
        }
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let body = carve::carve_status_body(claim, devices, outcome, now);
        let entries = serde_json::from_value(body["status"]["devices"].clone()).expect("entries");
        self.change(claim, |rc| {
            rc.status.get_or_insert_with(Default::default).devices = Some(entries);
        });
        let mut carves = self.carves.lock().unwrap();
        carves.insert(claim.uid.clone(), outcome.clone());
        Ok(())
    }
}

#[tonic::async_trait]
impl EventSink for MemoryApi {
    async fn event(&self, _about: &EventTarget, _kind: EventKind, reason: &str, note: String) {
        self.events.lock().unwrap().push((reason.into(), note));
    }
}

/// The UID of the pod a [`MemoryApi`] claim with UID `claim_uid` is reserved for.
pub(crate) fn pod_of(claim_uid: &str) -> String {
    format!("pod-{claim_uid}")
}

/// The container runtime, in memory: the pods that still have a sandbox or container, and the
/// live containers with their OCI runtime specs.
#[derive(Default)]
pub(crate) struct MemoryRuntime {
    /// UIDs of pods with a sandbox or container.
    pub pods: Mutex<std::collections::BTreeSet<String>>,
    /// Live containers: name → OCI runtime spec (JSON, as a runtime reports it).
    pub containers: Mutex<std::collections::BTreeMap<String, serde_json::Value>>,
    /// The next this many calls fail.
    pub failing: AtomicUsize,
}

impl MemoryRuntime {
    /// Adds (or replaces) live container `name`, whose runtime spec has the environment `env`
    /// (`KEY=VALUE`) and the device nodes `devices` (container paths).
    pub(crate) fn run_container(&self, name: &str, env: &[String], devices: &[String]) {
        let devices: Vec<serde_json::Value> = devices
            .iter()
            .map(|p| serde_json::json!({"path": p, "type": "c"}))
            .collect();
        let spec = serde_json::json!({"process": {"env": env}, "linux": {"devices": devices}});
        self.containers
            .lock()
            .unwrap()
            .insert(name.to_string(), spec);
    }

    /// Removes container `name` (it exited).
    pub(crate) fn stop_container(&self, name: &str) {
        self.containers.lock().unwrap().remove(name);
    }
}

#[tonic::async_trait]
impl PodContainers for MemoryRuntime {
    async fn pod_has_containers(&self, pod_uid: &str) -> Result<bool, RuntimeError> {
        if MemoryApi::take(&self.failing) {
            return Err(RuntimeError::Injected("the runtime does not answer".into()));
        }
        Ok(self.pods.lock().unwrap().contains(pod_uid))
    }

    async fn containers_holding(
        &self,
        marks: &crate::claims::container_marks::ClaimMarks,
    ) -> Result<Vec<String>, RuntimeError> {
        if MemoryApi::take(&self.failing) {
            return Err(RuntimeError::Injected("the runtime does not answer".into()));
        }
        Ok(self
            .containers
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(name, spec)| {
                crate::claims::container_marks::spec_mark(spec, marks)
                    .map(|m| format!("container {name} ({m})"))
            })
            .collect())
    }
}

/// A preparer for [`NODE`] over `backend`, with its checkpoint and CDI dir under `dir`, loading
/// the checkpoint there if one exists (a restart); no container runtime (orphans are kept).
pub fn preparer(
    dir: &Path,
    backend: Arc<dyn GpuBackend>,
    api: Arc<dyn ClaimApi>,
    blocking: BlockingCalls,
) -> Preparer {
    preparer_with(dir, backend, api, blocking, OrphanPolicy::default())
}

/// [`preparer`] with the orphan rule's policy `orphans`.
pub fn preparer_with(
    dir: &Path,
    backend: Arc<dyn GpuBackend>,
    api: Arc<dyn ClaimApi>,
    blocking: BlockingCalls,
    orphans: OrphanPolicy,
) -> Preparer {
    let path = dir.join("checkpoint.json");
    let checkpoint = match Checkpoint::load(&path, "boot").expect("checkpoint") {
        crate::claims::checkpoint::LoadOutcome::Loaded(cp) => cp,
        _ => Checkpoint::new("boot"),
    };
    let store = CheckpointStore::new(checkpoint, path).for_tests(blocking.clone());
    Preparer::new(PreparerConfig {
        api,
        node: NODE.into(),
        inventory: backend.inventory().expect("inventory"),
        time_slicer: crate::gpu::TimeSlicer::Backend(backend.clone()),
        backend,
        cdi_dir: dir.join("cdi"),
        caps_major: 509,
        device_nodes: crate::claims::cdi::DeviceNodes::Host,
        driver_mounts: Vec::new(),
        checkpoint: store,
        metrics: Arc::new(Metrics::new()),
        blocking,
        orphans,
        // No control binary: the request path's tests have no MPS device (the daemons' life is
        // driver/tests/mps_daemon.rs and mps_supervision.rs, the preparer with MPS devices
        // driver/tests/mps_preparer.rs: the stand-in is the plugin's binary, which only
        // integration tests can run).
        mps: Arc::new(crate::mps::MpsDaemons::new(
            None,
            dir,
            Arc::new(Metrics::new()),
        )),
        share_policy: Default::default(),
        memory_limits: None,
    })
}

/// A backend whose GPUs in `off` have MIG mode off, as whole GPUs need (the emulated GPUs all
/// have it on): its inventory says so, and a create on such a GPU fails as on a GPU without
/// MIG mode; everything else is `inner`'s.
pub(crate) struct MigOff {
    /// The GPUs.
    pub inner: Arc<dyn GpuBackend>,
    /// Indices of the GPUs with MIG mode off now.
    pub off: Mutex<BTreeSet<u32>>,
    /// Creates asked for on a GPU with MIG mode off.
    pub creates_refused: AtomicUsize,
}

impl MigOff {
    /// `inner` with MIG mode off on `off`.
    pub fn new(inner: Arc<dyn GpuBackend>, off: &[u32]) -> Self {
        Self {
            inner,
            off: Mutex::new(off.iter().copied().collect()),
            creates_refused: AtomicUsize::new(0),
        }
    }

    /// Switches GPU `gpu`'s MIG mode on (`true`) or off.
    pub(crate) fn set_mig(&self, gpu: u32, on: bool) {
        let mut off = self.off.lock().unwrap();
        if on {
            off.remove(&gpu);
        } else {
            off.insert(gpu);
        }
    }
}

impl GpuBackend for MigOff {
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let off = self.off.lock().unwrap().clone();
        let mut gpus = self.inner.inventory()?;
        for g in &mut gpus {
            g.mig_enabled = !off.contains(&g.index);
        }
        Ok(gpus)
    }
    fn gpu_indices(&self) -> Vec<u32> {
        self.inner.gpu_indices()
    }
    fn create_instance(
        &self,
        gpu: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        if self.off.lock().unwrap().contains(&gpu) {
            self.creates_refused.fetch_add(1, Ordering::SeqCst);
            return Err(BackendError::Other {
                target: Target::at(gpu, profile, Placement { start, size: 0 }),
                reason: "MIG mode is off on this GPU".into(),
            });
        }
        self.inner.create_instance(gpu, profile, start)
    }
    fn destroy_instance(&self, gpu: u32, gi_id: u32) -> Result<(), BackendError> {
        self.inner.destroy_instance(gpu, gi_id)
    }
    fn instances_on(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.inner.instances_on(gpu)
    }
    fn mig_mode(&self, gpu: u32) -> Result<MigModeState, BackendError> {
        let on = !self.off.lock().unwrap().contains(&gpu);
        Ok(MigModeState {
            current: on,
            pending: on,
        })
    }
    /// Switches at once (Hopper's rule); `InUse` while the GPU has instances.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError> {
        let n = self.inner.instances_on(gpu)?.len();
        if n > 0 && !enabled {
            return Err(BackendError::InUse {
                target: Target::gpu(gpu),
                reason: format!("{n} MIG instances exist"),
            });
        }
        self.set_mig(gpu, enabled);
        Ok(())
    }
    fn set_time_slice(
        &self,
        gpu: u32,
        interval: das_api::device_config::TimeSliceInterval,
    ) -> Result<(), BackendError> {
        self.inner.set_time_slice(gpu, interval)
    }
}

/// The published device of `gpu` whole (as `device_index` makes it for a GPU with MIG mode
/// off under `--whole-gpus`): `gpu-<index>`, profile `gpu`, every memory slice.
pub(crate) fn whole_gpu_ref(gpu: &GpuInfo) -> (String, DeviceRef) {
    let at = DeviceRef {
        kind: DeviceKind::WholeGpu,
        gpu_index: gpu.index,
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: gpu.minor,
        profile: das_api::WHOLE_GPU_PROFILE.into(),
        start: 0,
        size: gpu.model.memory_slices,
        shared: false,
    };
    (das_api::whole_gpu_device_name(gpu.index), at)
}

/// Has `p` publish `gpu` whole; `keep_slices`: its MIG devices stay published too (a device map
/// no node publishes, for the isolation rule's tests), else they go.
pub(crate) fn serve_whole(p: &mut Preparer, gpu: &GpuInfo, keep_slices: bool) {
    let devices = &mut p.node.devices;
    devices.retain(|_, d| d.gpu_index != gpu.index);
    if keep_slices {
        let on = GpuInfo {
            mig_enabled: true,
            ..gpu.clone()
        };
        devices.extend(crate::claims::plan::device_index(&[on]));
    } else {
        p.node.models.remove(&gpu.index);
    }
    let (name, at) = whole_gpu_ref(gpu);
    devices.insert(name, at);
}

/// Claim UIDs the request-path tests use.
pub(crate) const UID_A: &str = "aaaaaaaa-0000-0000-0000-000000000001";
/// A second claim's UID.
pub(crate) const UID_B: &str = "bbbbbbbb-0000-0000-0000-000000000002";

/// Backend calls inline with a few yields around each: the same interleaving every run.
pub(crate) fn inline() -> BlockingCalls {
    let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
    BlockingCalls::Inline(Arc::new(move || {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3
    }))
}

/// A planned device `device` of request `request` for the config planners' tests: of `kind`
/// (and the shareable twin when `shared`) on GPU 0 (`GPU-0`), profile `1g.10gb` at memory
/// slice 6, with no MPS limits, share or time slice yet.
pub(crate) fn planned(
    device: &str,
    request: &str,
    kind: DeviceKind,
    shared: bool,
) -> crate::claims::kinds::Planned {
    crate::claims::kinds::Planned {
        request: request.into(),
        pool: "n0".into(),
        device: device.into(),
        at: DeviceRef {
            kind,
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            gpu_minor: 0,
            profile: "1g.10gb".into(),
            start: 6,
            size: 1,
            shared,
        },
        mps: None,
        share: None,
        time_slice: None,
    }
}

/// A device published on GPU `gpu` (UUID `GPU-<gpu>`, minor `gpu`): `1g.5gb` at `start`, or the
/// whole GPU (8 memory slices) for `None`.
pub(crate) fn planned_on(
    gpu: u32,
    start: Option<u32>,
    request: &str,
) -> crate::claims::kinds::Planned {
    let (kind, device, profile, start, size) = match start {
        Some(s) => (
            DeviceKind::Mig,
            das_api::device_name(gpu, "1g.5gb", s),
            "1g.5gb",
            s,
            1,
        ),
        None => (
            DeviceKind::WholeGpu,
            das_api::whole_gpu_device_name(gpu),
            das_api::WHOLE_GPU_PROFILE,
            0,
            8,
        ),
    };
    crate::claims::kinds::Planned {
        time_slice: None,
        request: request.into(),
        pool: "n0".into(),
        device,
        at: DeviceRef {
            kind,
            gpu_index: gpu,
            gpu_uuid: format!("GPU-{gpu}"),
            gpu_minor: gpu,
            profile: profile.into(),
            start,
            size,
            shared: false,
        },
        mps: None,
        share: None,
    }
}
