//! One test per finding of the instance-lifecycle review (issue 11), each failing on the request
//! path before it was rebuilt: per-claim serialization, exact instance identity, nothing forgotten
//! while it exists, CDI that composes, per-GPU fault isolation, fresh answers.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handler::{ClaimHandler, ClaimRef};
use super::orphans::{DEFAULT_ORPHAN_DELAY, OrphanPolicy, OrphanReport, RECHECK};
use super::testing::{
    MemoryApi, MemoryRuntime, NODE, UID_A, UID_B, inline, pod_of, preparer, preparer_with,
};
use super::{ClaimApi, PrepareError, Preparer};
use crate::blocking::BlockingCalls;
use crate::claims::cdi;
use crate::claims::checkpoint::PrepareState;
use crate::gpu::nvml::{FakeGpuSpec, FakeNvml, code};
use crate::gpu::{
    EmulatedBackend, FaultKind, GpuBackend, Latency, NvmlBackend, NvmlOptions, find_model,
};

struct Setup {
    dir: tempfile::TempDir,
    emu: Arc<EmulatedBackend>,
    api: Arc<MemoryApi>,
    p: Arc<Preparer>,
}

fn setup(gpus: &str, blocking: BlockingCalls) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let emu = Arc::new(EmulatedBackend::open(gpus, NODE, &dir.path().join("emu")).unwrap());
    let api = Arc::new(MemoryApi::default());
    let p = Arc::new(preparer(dir.path(), emu.clone(), api.clone(), blocking));
    Setup { dir, emu, api, p }
}

impl Setup {
    /// Makes every create take `ms` milliseconds.
    fn slow_creates(&self, ms: u64) {
        self.emu.set_latency(Latency {
            create: Duration::from_millis(ms),
            destroy: Duration::ZERO,
            ..Latency::default()
        });
    }

    /// Claim `ns/<name>` with `uid`, allocated `1g.10gb` at memory slice 6 on GPUs 0 and 1.
    fn two_gpus(&self, name: &str, uid: &str) -> ClaimRef {
        self.api.allocate(
            "ns",
            name,
            uid,
            &[
                ("gpu", "gpu-0-mig-1g-10gb-6"),
                ("gpu", "gpu-1-mig-1g-10gb-6"),
            ],
        )
    }

    /// Claim `ns/<name>` with `uid`, allocated one device (request `gpu`).
    fn one_device(&self, name: &str, uid: &str, device: &str) -> ClaimRef {
        self.api.allocate("ns", name, uid, &[("gpu", device)])
    }

    fn live_migs(&self) -> Vec<String> {
        self.emu
            .all_instances()
            .unwrap()
            .into_iter()
            .map(|s| s.mig_uuid)
            .collect()
    }

    fn spec_exists(&self, claim: &ClaimRef) -> bool {
        cdi::spec_path(&self.dir.path().join("cdi"), &claim.uid).exists()
    }

    /// The MIG UUIDs a CDI spec gives a container, from its `DAS_MIG_UUID_*` variables.
    fn spec_migs(&self, claim: &ClaimRef) -> Vec<String> {
        let spec =
            cdi::read_spec(&cdi::spec_path(&self.dir.path().join("cdi"), &claim.uid)).unwrap();
        spec.devices
            .iter()
            .flat_map(|d| d.container_edits.env.iter())
            .filter_map(|e| e.strip_prefix(cdi::MIG_UUID_ENV_PREFIX))
            .map(|e| e.split_once('=').unwrap().1.to_string())
            .collect()
    }
}

/// Finding 1: an unprepare that arrives while the same claim's prepare is still creating (the
/// kubelet gave up on the prepare and the pod was deleted) used to destroy nothing, forget the
/// claim, and let the prepare finish afterwards: a leaked instance and CDI spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprepare_during_the_same_claims_prepare_leaves_nothing() {
    let s = setup("H100-80GB:1", BlockingCalls::Threads);
    s.slow_creates(300);
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    let p = s.p.clone();
    let a2 = a.clone();
    let prepare = tokio::spawn(async move { p.prepare_claim(&a2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.p.unprepare_claim(&a).await.unwrap();
    // Whatever the prepare answered, nothing of the claim is left.
    let _ = prepare.await.unwrap();
    assert!(s.live_migs().is_empty(), "leaked: {:?}", s.live_migs());
    assert!(!s.spec_exists(&a), "CDI spec leaked");
    assert!(s.p.record_of(UID_A).is_none());
}

/// Finding 1: two prepares of one claim at once (a retry, or a claim shared by two pods) used
/// to roll back each other's fresh instance and answer with a dead MIG UUID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prepares_of_one_claim_answer_the_same_live_slice() {
    let s = setup("H100-80GB:1", BlockingCalls::Threads);
    s.slow_creates(100);
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    let (r1, r2) = tokio::join!(s.p.prepare_claim(&a), s.p.prepare_claim(&a));
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!(r1, r2);
    let live = s.live_migs();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(s.spec_migs(&a), live, "the CDI spec names the live slice");
}

/// Finding 2: after an unprepare that failed on its second GPU, the freed placement on the
/// first went to claim B; the kubelet's retry of the first unprepare used to find B's instance at
/// "its" placement and destroy it.
#[tokio::test(start_paused = true)]
async fn a_retried_unprepare_never_destroys_the_next_claims_slice_at_the_same_placement() {
    let s = setup("H100-80GB:2", inline());
    let a = s.two_gpus("a", UID_A);
    s.p.prepare_claim(&a).await.unwrap();
    s.emu.inject_destroy_faults(1, 5, FaultKind::InUse);
    let e = s.p.unprepare_claim(&a).await.unwrap_err();
    assert!(matches!(e, PrepareError::Destroy { .. }), "{e}");
    // The scheduler gives GPU 0's placement to claim B (A's pod is gone).
    let b = s.one_device("b", UID_B, "gpu-0-mig-1g-10gb-6");
    s.p.prepare_claim(&b).await.unwrap();
    let b_mig = s.spec_migs(&b);
    // The kubelet retries A's unprepare.
    s.p.unprepare_claim(&a).await.unwrap();
    assert_eq!(s.live_migs(), b_mig, "B's slice survives A's retry");
    assert!(s.p.record_of(UID_A).is_none());
}

/// Finding 3: a failed prepare whose roll-back could not destroy what it made used to forget
/// the record anyway: the instance was lost for good (never reclaimed on real GPUs).
#[tokio::test(start_paused = true)]
async fn a_roll_back_that_fails_is_recorded_and_the_reaper_finishes_it() {
    let s = setup("H100-80GB:2", inline());
    let a = s.two_gpus("a", UID_A);
    s.emu.inject_create_faults(1, 1, FaultKind::Other);
    s.emu.inject_destroy_faults(0, 1, FaultKind::Other);
    let e = s.p.prepare_claim(&a).await.unwrap_err();
    assert_eq!(e.metric_label(), "create", "{e}");
    let left = s.live_migs();
    assert_eq!(left.len(), 1, "GPU 0's slice could not be destroyed");
    let record = s.p.record_of(UID_A).expect("kept while the slice exists");
    assert_eq!(record.state, PrepareState::Releasing);
    assert_eq!(record.devices[0].mig_uuid(), Some(left[0].as_str()));
    // The reaper's next attempt succeeds.
    tokio::time::sleep(super::reaper::FIRST_DELAY).await;
    let report = s.p.reap_due().await;
    assert_eq!(report.finished, [UID_A]);
    assert!(s.live_migs().is_empty());
    assert!(s.p.record_of(UID_A).is_none());
}

/// Finding 3, the reaper's side: every failed attempt is counted and posted as an event, and
/// the attempts back off.
#[tokio::test(start_paused = true)]
async fn the_reaper_backs_off_and_reports_every_failed_attempt() {
    let s = setup("H100-80GB:1", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    s.p.prepare_claim(&a).await.unwrap();
    s.emu.inject_destroy_faults(0, 1, FaultKind::Other);
    assert!(s.p.unprepare_claim(&a).await.is_err());
    assert!(s.p.reap_due().await.finished.is_empty(), "not due yet");
    s.emu.inject_destroy_faults(0, 1, FaultKind::Other);
    tokio::time::sleep(super::reaper::FIRST_DELAY).await;
    assert_eq!(s.p.reap_due().await.failed, [UID_A]);
    let events = s.api.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "SliceDestroyFailed");
    assert!(events[0].1.contains("injected fault"), "{events:?}");
    // Backed off: not due one FIRST_DELAY later, due after the doubled delay.
    tokio::time::sleep(super::reaper::FIRST_DELAY).await;
    assert!(s.p.reap_due().await.finished.is_empty());
    tokio::time::sleep(super::reaper::FIRST_DELAY).await;
    assert_eq!(s.p.reap_due().await.finished, [UID_A]);
    let metrics = s.p.metrics.probe.encode();
    assert!(
        metrics.contains(r#"das_kubelet_plugin_reaper_attempts_total{result="failure"} 1"#)
            && metrics.contains(r#"das_kubelet_plugin_slices_pending_destroy 0"#),
        "{metrics}"
    );
}

/// Finding 3, NVML: a create whose compute instance fails and whose GPU-instance clean-up fails
/// too leaves a GPU instance that NVML lists as nobody's; it is recorded for the reaper.
#[tokio::test(start_paused = true)]
async fn a_gpu_instance_left_by_a_failed_create_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let model = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let fake = FakeNvml::new(vec![FakeGpuSpec::mig(model, true)]);
    let nvml = Arc::new(
        NvmlBackend::new(
            fake,
            NvmlOptions {
                proc_root: "/nonexistent".into(),
                enable_mig_mode: false,
                ..NvmlOptions::default()
            },
        )
        .unwrap(),
    );
    let api = Arc::new(MemoryApi::default());
    let p = preparer(dir.path(), nvml.clone(), api.clone(), inline());
    let a = api.allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-5gb-6")]);
    // The backend's own clean-up fails: the roll-back destroys the GPU instance it names.
    nvml.api()
        .fail_next("nvmlGpuInstanceCreateComputeInstance", code::UNKNOWN);
    nvml.api()
        .fail_next("nvmlGpuInstanceDestroy", code::UNKNOWN);
    p.prepare_claim(&a).await.unwrap_err();
    assert!(nvml.all_instances().unwrap().is_empty());
    assert!(p.record_of(UID_A).is_none());
    // Both fail: the GPU instance is left, and recorded.
    nvml.api()
        .fail_next("nvmlGpuInstanceCreateComputeInstance", code::UNKNOWN);
    nvml.api()
        .fail_next("nvmlGpuInstanceDestroy", code::UNKNOWN);
    nvml.api()
        .fail_next("nvmlGpuInstanceDestroy", code::UNKNOWN);
    p.prepare_claim(&a).await.unwrap_err();
    assert_eq!(
        nvml.all_instances().unwrap().len(),
        1,
        "a GPU instance is left"
    );
    let record = p
        .record_of(UID_A)
        .expect("the left GPU instance is recorded");
    assert_eq!(record.state, PrepareState::Releasing);
    tokio::time::sleep(super::reaper::FIRST_DELAY).await;
    assert_eq!(p.reap_due().await.finished, [UID_A]);
    assert!(nvml.all_instances().unwrap().is_empty());
}

/// Review L3 (issue 30): a prepared claim whose compute instance was destroyed behind the
/// plugin's back (`nvidia-smi mig -dci`) keeps a bare GPU instance that matches its record by GI
/// ID. A retried prepare used to answer with it and fail forever on its empty MIG UUID; it now
/// releases the GPU instance and creates the MIG instance again.
#[tokio::test(start_paused = true)]
async fn a_gpu_instance_without_its_compute_instance_is_created_again() {
    use crate::gpu::nvml::NvmlApi;
    let dir = tempfile::tempdir().unwrap();
    let model = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let fake = FakeNvml::new(vec![FakeGpuSpec::mig(model, true)]);
    let options = NvmlOptions {
        proc_root: "/nonexistent".into(),
        enable_mig_mode: false,
        ..NvmlOptions::default()
    };
    let nvml = Arc::new(NvmlBackend::new(fake, options).unwrap());
    let api = Arc::new(MemoryApi::default());
    let p = preparer(dir.path(), nvml.clone(), api.clone(), inline());
    let a = api.allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-5gb-6")]);
    let before = p.prepare_claim(&a).await.unwrap();
    let live = nvml.all_instances().unwrap();
    nvml.api()
        .destroy_ci(0, live[0].gi_id, live[0].ci_id)
        .unwrap();
    assert!(nvml.all_instances().unwrap()[0].mig_uuid.is_empty());
    let after = p.prepare_claim(&a).await.unwrap();
    let live = nvml.all_instances().unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert!(
        !live[0].mig_uuid.is_empty(),
        "created again with its compute instance"
    );
    assert_eq!(
        p.record_of(UID_A).unwrap().devices[0].mig_uuid(),
        Some(live[0].mig_uuid.as_str())
    );
    assert_eq!(before.len(), after.len());
}

/// Finding 4: a container with devices from two claims (what the webhook makes of two legacy
/// profiles) and a claim with two requests: every MIG UUID reaches the container.
#[tokio::test(start_paused = true)]
async fn cdi_specs_of_two_claims_and_two_requests_compose() {
    let s = setup("H100-80GB:2", inline());
    let a = s.api.allocate(
        "ns",
        "a",
        UID_A,
        &[
            ("small", "gpu-0-mig-1g-10gb-6"),
            ("big", "gpu-1-mig-3g-40gb-4"),
        ],
    );
    let b = s.one_device("b", UID_B, "gpu-0-mig-1g-10gb-5");
    let da = s.p.prepare_claim(&a).await.unwrap();
    let db = s.p.prepare_claim(&b).await.unwrap();
    // One CDI device per allocated device.
    assert_eq!(da.len(), 2);
    assert_ne!(da[0].cdi_device_ids, da[1].cdi_device_ids);
    let mut env = std::collections::BTreeMap::new();
    let dir = s.dir.path().join("cdi");
    for claim in [&a, &b] {
        let spec = cdi::read_spec(&cdi::spec_path(&dir, &claim.uid)).unwrap();
        for d in &spec.devices {
            for e in spec
                .container_edits
                .iter()
                .chain([&d.container_edits])
                .flat_map(|e| &e.env)
            {
                let (k, v) = e.split_once('=').unwrap();
                if let Some(old) = env.insert(k.to_string(), v.to_string()) {
                    assert_eq!(old, v, "{k} set to two values");
                }
            }
        }
    }
    let mut got: Vec<String> = env
        .iter()
        .filter(|(k, _)| k.starts_with(cdi::MIG_UUID_ENV_PREFIX))
        .map(|(_, v)| v.clone())
        .collect();
    let mut live = s.live_migs();
    got.sort();
    live.sort();
    assert_eq!(got, live);
    assert_eq!(db.len(), 1);
}

/// Finding 5: one lost GPU used to fail every unprepare on the node and crash-loop start-up;
/// health kept reporting it healthy.
#[tokio::test(start_paused = true)]
async fn a_lost_gpu_fails_only_what_touches_it() {
    let s = setup("H100-80GB:2", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    let b = s.one_device("b", UID_B, "gpu-1-mig-1g-10gb-6");
    s.p.prepare_claim(&a).await.unwrap();
    s.p.prepare_claim(&b).await.unwrap();
    s.emu.set_gpu_lost(1, true);
    // GPU 0 is served.
    s.p.unprepare_claim(&a).await.unwrap();
    let c = s.api.allocate(
        "ns",
        "c",
        "cccccccc-0000-0000-0000-000000000003",
        &[("gpu", "gpu-0-mig-2g-20gb-4")],
    );
    s.p.prepare_claim(&c).await.unwrap();
    // B's pod goes: the unprepare succeeds, the instance stays recorded for when GPU 1 answers.
    s.p.unprepare_claim(&b).await.unwrap();
    assert_eq!(
        s.p.record_of(UID_B).map(|r| r.state),
        Some(PrepareState::Releasing)
    );
    // (Device health of a lost GPU: `health::monitor` tests.)
    // A restart while GPU 1 is lost reconciles instead of failing.
    let restarted = preparer(s.dir.path(), s.emu.clone(), s.api.clone(), inline());
    let report = restarted.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.unavailable_gpus, [1]);
    assert!(
        s.api
            .events
            .lock()
            .unwrap()
            .iter()
            .any(|(r, _)| r == "GpuUnavailable")
    );
    // GPU 1 is back: the reaper destroys B's instance.
    s.emu.set_gpu_lost(1, false);
    tokio::time::sleep(super::reaper::MAX_DELAY).await;
    assert_eq!(restarted.reap_due().await.finished, [UID_B]);
    assert_eq!(s.emu.instances_on(1).unwrap().len(), 0);
}

/// Finding 6: a retried prepare of a completed claim used to answer with the record without
/// looking: a destroyed instance's dead MIG UUID, a CDI spec that no longer exists.
#[tokio::test(start_paused = true)]
async fn a_retried_prepare_checks_that_slices_and_cdi_spec_still_exist() {
    let s = setup("H100-80GB:1", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    s.p.prepare_claim(&a).await.unwrap();
    // The CDI spec disappears: the retry writes it again, same instance.
    let first = s.spec_migs(&a);
    std::fs::remove_file(cdi::spec_path(&s.dir.path().join("cdi"), &a.uid)).unwrap();
    s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(s.spec_migs(&a), first);
    // The instance is destroyed behind the plugin's back: the retry carves a new one.
    let instance = s.emu.all_instances().unwrap().remove(0);
    s.emu.destroy_instance(0, instance.gi_id).unwrap();
    s.p.prepare_claim(&a).await.unwrap();
    let live = s.live_migs();
    assert_eq!(live.len(), 1);
    assert_ne!(live, first);
    assert_eq!(s.spec_migs(&a), live, "the answer names the live slice");
    // A claim replaced under the same name is refused.
    s.api
        .allocate("ns", "a", UID_B, &[("gpu", "gpu-0-mig-1g-10gb-6")]);
    let e = s.p.prepare_claim(&a).await.unwrap_err();
    assert_eq!(e.metric_label(), "claim_replaced");
}

/// Finding 6: the status write used to be fire and forget: one API error left the
/// AllocationClaim `created` for good.
#[tokio::test(start_paused = true)]
async fn the_status_write_is_retried_until_it_lands() {
    let s = setup("H100-80GB:1", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    s.api.failing_status_writes.store(3, Ordering::SeqCst);
    s.p.prepare_claim(&a).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        s.api.statuses.lock().unwrap().get(UID_A),
        Some(&s.live_migs())
    );
    assert!(
        s.p.metrics
            .probe
            .encode()
            .contains("das_kubelet_plugin_claim_status_write_failures_total 3")
    );
    assert_eq!(s.p.api.status.running(), 0);
}

/// Finding 7: API calls without a timeout could hold a claim's lock (and the handover gate)
/// forever.
#[tokio::test]
async fn an_api_server_that_never_answers_fails_the_call_in_bounded_time() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts connections and never answers.
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let client =
        kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap()))
            .unwrap();
    let api = super::KubeClaimApi::new(client, NODE).with_call_timeout(Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    let e = api.get_claim("ns", "a").await.unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(e.message.contains("no answer"), "{e}");
    assert!(!e.permanent);
}

/// Finding 8 is covered in `handover::tests::lock_files_are_0600_in_a_0700_state_dir`.
///
/// The per-claim lock keeps different claims parallel: two claims on two GPUs create their
/// instances at the same time (no node-wide lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_claims_on_different_gpus_prepare_in_parallel() {
    let s = setup("H100-80GB:2", BlockingCalls::Threads);
    s.slow_creates(300);
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    let b = s.one_device("b", UID_B, "gpu-1-mig-1g-10gb-6");
    let t0 = std::time::Instant::now();
    let r = s.p.prepare(vec![a, b]).await;
    assert!(r.values().all(Result::is_ok), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(550),
        "the two creates did not overlap: {:?}",
        t0.elapsed()
    );
}

/// The force-delete race (issue 12): the scheduler gives a force-deleted pod's placement to a
/// new claim before the kubelet has unprepared the old claim. The new prepare waits for the
/// unprepare instead of failing (and being retried by the kubelet seconds later).
#[tokio::test(start_paused = true)]
async fn a_prepare_waits_for_the_unprepare_of_a_force_deleted_claim_at_its_placement() {
    let s = setup("H100-80GB:1", inline());
    let old = s.one_device("old", UID_A, "gpu-0-mig-7g-80gb-0");
    s.p.prepare_claim(&old).await.unwrap();
    s.api.delete(&old);
    let new = s.one_device("new", UID_B, "gpu-0-mig-7g-80gb-0");
    let p = s.p.clone();
    let n = new.clone();
    let t0 = tokio::time::Instant::now();
    let prepare = tokio::spawn(async move { p.prepare_claim(&n).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!prepare.is_finished(), "the new prepare waits");
    s.p.unprepare_claim(&old).await.unwrap();
    prepare.await.unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(s.live_migs(), s.spec_migs(&new));
    assert!(
        s.p.metrics
            .probe
            .encode()
            .contains(r#"das_kubelet_plugin_placement_wait_seconds_count{result="released"} 1"#)
    );
}

/// Issue 30: the same race when the kubelet's unprepare is slow (the old pod's containers are
/// still being killed). The API server no longer has the old claim, yet its MIG instance is never
/// destroyed for the new one: the new prepare fails, naming the holder, until the kubelet
/// unprepares the old claim; the kubelet's retry then succeeds.
#[tokio::test(start_paused = true)]
async fn a_prepare_never_takes_the_slice_of_a_force_deleted_claim_the_kubelet_still_holds() {
    let s = setup("H100-80GB:1", inline());
    let old = s.one_device("old", UID_A, "gpu-0-mig-7g-80gb-0");
    s.p.prepare_claim(&old).await.unwrap();
    let kept = s.live_migs();
    s.api.delete(&old);
    let new = s.one_device("new", UID_B, "gpu-0-mig-7g-80gb-0");
    let t0 = tokio::time::Instant::now();
    let e = s.p.prepare_claim(&new).await.unwrap_err();
    assert_eq!(t0.elapsed(), super::preparer::PLACEMENT_WAIT);
    assert_eq!(e.metric_label(), "placement_held", "{e}");
    let text = e.to_string();
    assert!(
        text.contains("gpu-0-mig-7g-80gb-0") && text.contains(&format!("claim ns/old ({UID_A})")),
        "{text}"
    );
    assert_eq!(s.live_migs(), kept, "the old claim's slice is untouched");
    assert!(
        s.p.record_of(UID_B).is_none(),
        "nothing recorded for the new claim"
    );
    // Start-up does not release it either.
    let restarted = preparer(s.dir.path(), s.emu.clone(), s.api.clone(), inline());
    let report = restarted.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.kept, [old.to_string()], "{report:?}");
    assert_eq!(s.live_migs(), kept);
    // The kubelet unprepares the old claim once its containers are gone; its retry succeeds.
    restarted.unprepare_claim(&old).await.unwrap();
    restarted.prepare_claim(&new).await.unwrap();
    assert_eq!(s.live_migs(), s.spec_migs(&new));
    assert!(
        s.p.metrics
            .probe
            .encode()
            .contains(r#"das_kubelet_plugin_placement_wait_seconds_count{result="timeout"} 1"#)
    );
}

/// A holder the API server still allocates is not released either: the same error.
#[tokio::test(start_paused = true)]
async fn a_prepare_never_releases_a_claim_that_is_still_allocated() {
    let s = setup("H100-80GB:1", inline());
    let old = s.one_device("old", UID_A, "gpu-0-mig-7g-80gb-0");
    s.p.prepare_claim(&old).await.unwrap();
    let kept = s.live_migs();
    let new = s.one_device("new", UID_B, "gpu-0-mig-7g-80gb-0");
    let e = s.p.prepare_claim(&new).await.unwrap_err();
    assert_eq!(e.metric_label(), "placement_held", "{e}");
    assert_eq!(s.live_migs(), kept, "the old claim's slice is untouched");
}

/// Issue 30, item 4: a destroy that NVML answers `IN_USE` is retried without holding the GPU's
/// lock, so another claim's prepare on the same GPU goes on meanwhile instead of waiting out
/// the retries (0.1 + 0.4 + 1 + 2 s).
#[tokio::test(start_paused = true)]
async fn a_destroy_retried_for_in_use_does_not_stall_the_gpus_other_claims() {
    let s = setup("H100-80GB:1", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    s.p.prepare_claim(&a).await.unwrap();
    s.emu.inject_destroy_faults(0, 3, FaultKind::InUse);
    let p = s.p.clone();
    let unprepare = tokio::spawn(async move { p.unprepare_claim(&a).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!unprepare.is_finished(), "the destroy is being retried");
    let b = s.one_device("b", UID_B, "gpu-0-mig-1g-10gb-5");
    let t0 = tokio::time::Instant::now();
    s.p.prepare_claim(&b).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );
    assert!(!unprepare.is_finished(), "b did not wait for a's retries");
    unprepare.await.unwrap().unwrap();
    assert_eq!(s.live_migs(), s.spec_migs(&b));
    assert!(s.p.record_of(UID_A).is_none());
}

/// Bad input: a CDI spec file of a prepared claim that is corrupt (truncated, edited) is written
/// again at start-up, from the record and the live instance; a stale one of a gone claim is removed.
#[tokio::test(start_paused = true)]
async fn start_up_writes_a_corrupt_cdi_spec_again_and_removes_stale_ones() {
    let s = setup("H100-80GB:1", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    s.p.prepare_claim(&a).await.unwrap();
    let good = s.spec_migs(&a);
    let dir = s.dir.path().join("cdi");
    std::fs::write(
        cdi::spec_path(&dir, UID_A),
        b"{\"cdiVersion\": \"0.5.0\", \"kin",
    )
    .unwrap();
    std::fs::write(cdi::spec_path(&dir, UID_B), b"{}").unwrap();
    let restarted = preparer(s.dir.path(), s.emu.clone(), s.api.clone(), inline());
    let report = restarted.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.cdi_specs_rewritten, 1, "{report:?}");
    assert_eq!(report.stale_cdi_specs, 1, "{report:?}");
    assert_eq!(s.spec_migs(&a), good);
    assert!(!cdi::spec_path(&dir, UID_B).exists());
}

/// A setup whose preparer asks `runtime` (the orphan rule's evidence) after the default delay.
fn with_runtime(gpus: &str) -> (Setup, Arc<MemoryRuntime>) {
    let s = setup(gpus, inline());
    let runtime = Arc::new(MemoryRuntime::default());
    let p = Arc::new(preparer_with(
        s.dir.path(),
        s.emu.clone(),
        s.api.clone(),
        inline(),
        OrphanPolicy {
            delay: DEFAULT_ORPHAN_DELAY,
            runtime: Some(runtime.clone()),
        },
    ));
    (Setup { p, ..s }, runtime)
}

fn events(s: &Setup, reason: &str) -> Vec<String> {
    s.api
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| r == reason)
        .map(|(_, n)| n.clone())
        .collect()
}

/// Issue 30, the orphan rule: a prepared claim the API server no longer has and the kubelet
/// never unprepares (found at start-up) keeps its MIG instance before the delay and while the runtime
/// still has a container of its pod; it goes once the runtime has none.
#[tokio::test(start_paused = true)]
async fn an_orphan_is_released_only_after_the_delay_and_once_its_pod_has_no_container() {
    let (s, runtime) = with_runtime("H100-80GB:1");
    let old = s.one_device("old", UID_A, "gpu-0-mig-7g-80gb-0");
    s.p.prepare_claim(&old).await.unwrap();
    let kept = s.live_migs();
    runtime.pods.lock().unwrap().insert(pod_of(UID_A));
    s.api.delete(&old);
    let report = s.p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.kept, [old.to_string()]);
    assert!(s.p.lifecycle.orphans.is_suspect(UID_A));
    assert_eq!(
        s.p.check_orphans().await,
        OrphanReport::default(),
        "not due"
    );
    tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
    let r = s.p.check_orphans().await;
    assert!(
        r.kept[0].1.contains("still has a sandbox or container"),
        "{r:?}"
    );
    assert_eq!(s.live_migs(), kept);
    assert_eq!(events(&s, "OrphanedSliceKept").len(), 1);
    // Its containers are gone: released at the next check, with an event.
    runtime.pods.lock().unwrap().clear();
    runtime.failing.store(1, Ordering::SeqCst);
    tokio::time::advance(RECHECK).await;
    let r = s.p.check_orphans().await;
    assert!(
        r.kept[0].1.contains("could not say"),
        "an error is no evidence: {r:?}"
    );
    tokio::time::advance(RECHECK).await;
    assert_eq!(s.p.check_orphans().await.released, [UID_A]);
    assert!(s.live_migs().is_empty());
    assert!(s.p.record_of(UID_A).is_none());
    assert!(!s.p.lifecycle.orphans.is_suspect(UID_A));
    let released = events(&s, "OrphanedSliceReleased");
    assert!(released[0].contains(&pod_of(UID_A)), "{released:?}");
    assert!(
        s.p.metrics
            .probe
            .encode()
            .contains(r#"das_kubelet_plugin_orphan_releases_total{result="success"} 1"#)
    );
}

/// Without a container runtime an orphan is kept for good (one event per reason, not one per
/// check); a suspect the API server still allocates is dropped from the suspects; a holder a
/// prepare found in its way becomes a suspect and, once released by the rule, frees the
/// placement for the kubelet's retry.
#[tokio::test(start_paused = true)]
async fn an_orphan_without_evidence_is_kept_and_a_held_placement_makes_its_holder_a_suspect() {
    let s = setup("H100-80GB:1", inline());
    let old = s.one_device("old", UID_A, "gpu-0-mig-7g-80gb-0");
    s.p.prepare_claim(&old).await.unwrap();
    s.api.delete(&old);
    let new = s.one_device("new", UID_B, "gpu-0-mig-7g-80gb-0");
    assert_eq!(
        s.p.prepare_claim(&new).await.unwrap_err().metric_label(),
        "placement_held"
    );
    assert!(
        s.p.lifecycle.orphans.is_suspect(UID_A),
        "the holder is suspected"
    );
    for _ in 0..3 {
        tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
        let r = s.p.check_orphans().await;
        assert!(r.kept[0].1.contains("no container runtime"), "{r:?}");
    }
    assert_eq!(
        events(&s, "OrphanedSliceKept").len(),
        1,
        "one event per reason"
    );
    assert!(s.p.record_of(UID_A).is_some());
    // The same rule with a runtime that has no container of the pod: released, and the
    // kubelet's retry of the new prepare succeeds.
    let (t, _runtime) = with_runtime("H100-80GB:1");
    let old = t.one_device("old", UID_A, "gpu-0-mig-7g-80gb-0");
    t.p.prepare_claim(&old).await.unwrap();
    t.api.delete(&old);
    let new = t.one_device("new", UID_B, "gpu-0-mig-7g-80gb-0");
    assert!(t.p.prepare_claim(&new).await.is_err());
    tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
    assert_eq!(t.p.check_orphans().await.released, [UID_A]);
    t.p.prepare_claim(&new).await.unwrap();
    assert_eq!(t.live_migs(), t.spec_migs(&new));
    // A suspect the API server allocates as recorded is no orphan: dropped from the suspects.
    t.p.suspect_holders(std::iter::once(&new.uid));
    tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
    assert_eq!(t.p.check_orphans().await.allocated, [UID_B]);
    assert!(!t.p.lifecycle.orphans.is_suspect(UID_B));
    assert_eq!(t.live_migs(), t.spec_migs(&new));
}

/// A shared claim gains pods: a retried prepare for a second pod adds it to the record, which
/// the orphan rule then asks about too.
#[tokio::test(start_paused = true)]
async fn a_shared_claim_records_every_pod_it_was_prepared_for() {
    let s = setup("H100-80GB:1", inline());
    let a = s.one_device("a", UID_A, "gpu-0-mig-1g-10gb-6");
    s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(s.p.record_of(UID_A).unwrap().pods, [pod_of(UID_A)]);
    s.api.reserve_for(&a, &["second-pod"]);
    s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(
        s.p.record_of(UID_A).unwrap().pods,
        [pod_of(UID_A), "second-pod".to_string()]
    );
}
