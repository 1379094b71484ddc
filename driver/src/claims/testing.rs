//! Test doubles for the request path's unit tests: an in-memory [`ClaimApi`] (the API server's
//! ResourceClaims as a map, with injectable failures) and a [`Preparer`] over the emulated
//! backend in a temp dir. The request path's behaviour against a real API server is covered by
//! the e2e tests; these drive its decisions through interleavings no cluster can reproduce.

use std::collections::BTreeMap;
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
use crate::claims::checkpoint::{Checkpoint, CheckpointStore, RecordedDevice};
use crate::gpu::GpuBackend;
use crate::metrics::Metrics;

/// Node name the test preparers serve.
pub const NODE: &str = "n0";

/// The API server's ResourceClaims, in memory.
#[derive(Default)]
pub struct MemoryApi {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    /// Status writes that landed: claim UID → MIG UUIDs written.
    pub statuses: Mutex<BTreeMap<String, Vec<String>>>,
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
    pub fn reserve_for(&self, claim: &ClaimRef, more: &[&str]) {
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
}

#[tonic::async_trait]
impl EventSink for MemoryApi {
    async fn event(&self, _about: &EventTarget, _kind: EventKind, reason: &str, note: String) {
        self.events.lock().unwrap().push((reason.into(), note));
    }
}

/// The UID of the pod a [`MemoryApi`] claim with UID `claim_uid` is reserved for.
pub fn pod_of(claim_uid: &str) -> String {
    format!("pod-{claim_uid}")
}

/// The container runtime, in memory: the pods that still have a sandbox or container.
#[derive(Default)]
pub struct MemoryRuntime {
    /// UIDs of pods with a sandbox or container.
    pub pods: Mutex<std::collections::BTreeSet<String>>,
    /// The next this many calls fail.
    pub failing: AtomicUsize,
}

#[tonic::async_trait]
impl PodContainers for MemoryRuntime {
    async fn pod_has_containers(&self, pod_uid: &str) -> Result<bool, RuntimeError> {
        if MemoryApi::take(&self.failing) {
            return Err(RuntimeError::Injected("the runtime does not answer".into()));
        }
        Ok(self.pods.lock().unwrap().contains(pod_uid))
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
        backend,
        cdi_dir: dir.join("cdi"),
        caps_major: 509,
        device_nodes: crate::claims::cdi::DeviceNodes::Host,
        driver_mounts: Vec::new(),
        checkpoint: store,
        metrics: Arc::new(Metrics::new()),
        blocking,
        orphans,
    })
}
