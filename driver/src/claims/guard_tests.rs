//! Issue 41's findings on the request path, one test each, each failing before its fix: a
//! failed repair's record keeps guarding its placement (through a restart) until the kubelet
//! unprepares the claim; a pod the record never heard of keeps its claim's MIG instance under the
//! orphan rule; a record learns the pods that reserve its claim whenever the claim is read while
//! allocated (start-up, the orphan check, the carve watch); a lost checkpoint rebuilds a claim
//! carved before bind as carved, and a prepared one with its pods.

use std::sync::Arc;
use std::time::Duration;

use super::carve_watch::CarveWatch;
use super::handler::ClaimRef;
use super::orphans::{DEFAULT_ORPHAN_DELAY, OrphanPolicy, RECHECK};
use super::testing::{MemoryApi, MemoryRuntime, NODE, UID_A, UID_B, inline, pod_of, preparer_with};
use super::{PrepareError, Preparer};
use crate::claims::cdi;
use crate::claims::checkpoint::{CHECKPOINT_FILE_NAME, PrepareState};
use crate::gpu::{EmulatedBackend, FaultKind, GpuBackend};

const DEVICE: &str = "gpu-0-mig-1g-10gb-6";

struct Setup {
    dir: tempfile::TempDir,
    emu: Arc<EmulatedBackend>,
    api: Arc<MemoryApi>,
    runtime: Arc<MemoryRuntime>,
    p: Arc<Preparer>,
}

impl Setup {
    /// One H100; the orphan rule asks an in-memory runtime after the default delay.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let emu =
            Arc::new(EmulatedBackend::open("H100-80GB:1", NODE, &dir.path().join("emu")).unwrap());
        let api = Arc::new(MemoryApi::default());
        let runtime = Arc::new(MemoryRuntime::default());
        let p = Self::preparer(&dir, &emu, &api, &runtime);
        Setup {
            dir,
            emu,
            api,
            runtime,
            p,
        }
    }

    fn preparer(
        dir: &tempfile::TempDir,
        emu: &Arc<EmulatedBackend>,
        api: &Arc<MemoryApi>,
        runtime: &Arc<MemoryRuntime>,
    ) -> Arc<Preparer> {
        Arc::new(preparer_with(
            dir.path(),
            emu.clone(),
            api.clone(),
            inline(),
            OrphanPolicy {
                delay: DEFAULT_ORPHAN_DELAY,
                runtime: Some(runtime.clone()),
            },
        ))
    }

    /// A new plugin process on the same state (its checkpoint, the GPUs, the API server).
    fn restart(&mut self) {
        self.p = Self::preparer(&self.dir, &self.emu, &self.api, &self.runtime);
    }

    fn claim(&self, name: &str, uid: &str) -> ClaimRef {
        self.api.allocate("ns", name, uid, &[("gpu", DEVICE)])
    }

    fn state(&self, uid: &str) -> Option<PrepareState> {
        self.p.record_of(uid).map(|r| r.state)
    }

    /// A container of pod `pod` given `claim`'s CDI devices: the environment and device nodes
    /// its CDI spec gives it, as the runtime applied them.
    fn run_container_of(&self, name: &str, claim: &ClaimRef) {
        let spec =
            cdi::read_spec(&cdi::spec_path(&self.dir.path().join("cdi"), &claim.uid)).unwrap();
        let edits = || spec.devices.iter().map(|d| &d.container_edits);
        let env: Vec<String> = edits().flat_map(|e| e.env.clone()).collect();
        let nodes: Vec<String> = edits()
            .flat_map(|e| e.device_nodes.iter().map(|n| n.path.clone()))
            .collect();
        self.runtime.run_container(name, &env, &nodes);
    }
}

/// Item 4: the claim's instance is lost while its pod runs; the kubelet prepares it again and
/// the repair's create fails. Its record stays a guard without instances (also across a
/// restart), so after a force delete the placement's next claim waits for the kubelet's
/// unprepare instead of creating an instance the old container can reach.
#[tokio::test(start_paused = true)]
async fn a_failed_repair_keeps_guarding_its_placement_until_the_kubelet_unprepares() {
    let mut s = Setup::new();
    let old = s.claim("old", UID_A);
    s.p.prepare_claim(&old).await.unwrap();
    let lost = s.emu.all_instances().unwrap().remove(0);
    s.emu.destroy_instance(0, lost.gi_id).unwrap();
    s.emu.inject_create_faults(0, 1, FaultKind::Other);
    let e = s.p.prepare_claim(&old).await.unwrap_err();
    assert_eq!(e.metric_label(), "create", "{e}");
    let r = s.p.record_of(UID_A).expect("the guard stays");
    assert_eq!(r.state, PrepareState::Repairing);
    assert!(r.is_handed() && r.devices.iter().all(|d| d.instance.is_none()));
    assert!(s.emu.all_instances().unwrap().is_empty());
    assert!(
        s.p.metrics
            .probe
            .encode()
            .contains("das_kubelet_plugin_repairing_claims 1"),
    );
    // Force-deleted: the scheduler gives the placement to a new claim.
    s.api.delete(&old);
    let next = s.claim("next", UID_B);
    let held = |e: PrepareError| assert_eq!(e.metric_label(), "placement_held", "{e}");
    held(s.p.prepare_claim(&next).await.unwrap_err());
    // A restart keeps the guard.
    s.restart();
    let report = s.p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.kept, [old.to_string()]);
    assert_eq!(s.state(UID_A), Some(PrepareState::Repairing));
    held(s.p.prepare_claim(&next).await.unwrap_err());
    assert!(
        s.emu.all_instances().unwrap().is_empty(),
        "nothing created under the guard"
    );
    // The kubelet unprepares it once the old pod's containers are gone: the guard ends.
    s.p.unprepare_claim(&old).await.unwrap();
    assert_eq!(s.state(UID_A), None);
    s.p.prepare_claim(&next).await.unwrap();
    assert_eq!(s.emu.all_instances().unwrap().len(), 1);
}

/// Item 4, the retry: the kubelet's next prepare of a guard creates the instances again and
/// the record is completed (and no longer needs version 9).
#[tokio::test(start_paused = true)]
async fn a_guards_next_prepare_repairs_it() {
    let s = Setup::new();
    let a = s.claim("a", UID_A);
    s.p.prepare_claim(&a).await.unwrap();
    let lost = s.emu.all_instances().unwrap().remove(0);
    s.emu.destroy_instance(0, lost.gi_id).unwrap();
    s.emu.inject_create_faults(0, 1, FaultKind::Other);
    assert!(s.p.prepare_claim(&a).await.is_err());
    assert_eq!(s.state(UID_A), Some(PrepareState::Repairing));
    s.p.prepare_claim(&a).await.unwrap();
    let r = s.p.record_of(UID_A).unwrap();
    assert_eq!(r.state, PrepareState::PrepareCompleted);
    assert!(!r.handed_to_kubelet, "implied by the state");
    assert_eq!(s.p.checkpoint().read(|cp| cp.format_version()), 3);
}

/// Item 3: a second pod reserves the prepared claim (no prepare reaches the plugin); both pods
/// are force-deleted and only the first one's containers are gone. The orphan rule keeps the
/// MIG instance while the second pod's container carries the claim's CDI devices, and releases it once
/// that container is gone.
#[tokio::test(start_paused = true)]
async fn a_pod_the_record_never_heard_of_keeps_the_slice() {
    let s = Setup::new();
    let a = s.claim("a", UID_A);
    s.p.prepare_claim(&a).await.unwrap();
    s.api.reserve_for(&a, &["late"]);
    s.run_container_of("late-main", &a);
    s.api.delete(&a);
    s.p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(
        s.p.record_of(UID_A).unwrap().pods,
        [pod_of(UID_A)],
        "never heard of late"
    );
    tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
    let r = s.p.check_orphans().await;
    assert!(
        r.kept[0]
            .1
            .contains("container late-main (its CDI variable DAS_MIG_UUID_aaaaaaaa_"),
        "{r:?}"
    );
    assert_eq!(s.emu.all_instances().unwrap().len(), 1);
    s.runtime.stop_container("late-main");
    tokio::time::advance(RECHECK).await;
    assert_eq!(s.p.check_orphans().await.released, [UID_A]);
    assert!(s.emu.all_instances().unwrap().is_empty());
}

/// Item 3: a record learns the pods that reserve its claim when the claim is read while
/// allocated: at start-up, by the orphan check of an allocated suspect, and from the carve
/// watch's events.
#[tokio::test(start_paused = true)]
async fn a_record_learns_the_pods_that_reserve_its_claim() {
    let mut s = Setup::new();
    let a = s.claim("a", UID_A);
    s.p.prepare_claim(&a).await.unwrap();
    s.api.reserve_for(&a, &["second"]);
    s.restart();
    s.p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(
        s.p.record_of(UID_A).unwrap().pods,
        [pod_of(UID_A), "second".into()]
    );
    // The orphan check of a suspect the API server still allocates.
    s.api.reserve_for(&a, &["second", "third"]);
    s.p.suspect_holders(std::iter::once(&a.uid));
    tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
    assert_eq!(s.p.check_orphans().await.allocated, [UID_A]);
    assert_eq!(s.p.record_of(UID_A).unwrap().pods.len(), 3);
    // The carve watch sees the claim change.
    s.api.reserve_for(&a, &["fourth"]);
    let mut watch = CarveWatch::new(s.p.clone(), NODE);
    watch.handle(kube::runtime::watcher::Event::Apply(
        s.api.claim(&a).unwrap(),
    ));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let pods = s.p.record_of(UID_A).unwrap().pods;
    assert_eq!(pods.last().map(String::as_str), Some("fourth"), "{pods:?}");
    assert_eq!(pods.len(), 4, "a pod that left stays known: {pods:?}");
}

/// Item 7: a lost checkpoint rebuilds a claim carved before bind and never prepared as carved
/// (no CDI spec; its claim's SliceReady), and a prepared claim as completed with the pods its
/// claim is reserved for.
#[tokio::test(start_paused = true)]
async fn a_lost_checkpoint_rebuilds_carved_claims_as_carved_and_records_pods() {
    let mut s = Setup::new();
    let carved = s.claim("carved", UID_A);
    s.api.wait_for_carve(&carved);
    s.p.carve_claim(&carved).await.unwrap();
    assert_eq!(s.state(UID_A), Some(PrepareState::Carved));
    let prepared = s
        .api
        .allocate("ns", "prepared", UID_B, &[("gpu", "gpu-0-mig-1g-10gb-5")]);
    s.p.prepare_claim(&prepared).await.unwrap();
    s.api.reserve_for(&prepared, &["second"]);
    std::fs::remove_file(s.dir.path().join(CHECKPOINT_FILE_NAME)).unwrap();
    s.restart();
    let report = s.p.reconcile_at_startup(true, false).await.unwrap();
    assert_eq!(report.rebuilt.len(), 2, "{report:?}");
    assert_eq!(s.state(UID_A), Some(PrepareState::Carved));
    assert!(!cdi::spec_path(&s.dir.path().join("cdi"), UID_A).exists());
    let r = s.p.record_of(UID_B).unwrap();
    assert_eq!(r.state, PrepareState::PrepareCompleted);
    assert_eq!(r.pods, [pod_of(UID_B), "second".into()]);
    // The carved claim's prepare finishes it without creating anything.
    s.p.prepare_claim(&carved).await.unwrap();
    assert_eq!(s.state(UID_A), Some(PrepareState::PrepareCompleted));
    assert_eq!(s.emu.all_instances().unwrap().len(), 2);
}
