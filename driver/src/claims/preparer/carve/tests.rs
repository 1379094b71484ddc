//! Carve before bind on the request path (issue 34), over the emulated backend and the
//! in-memory API server: the carve, its failure, the prepare of a carved claim, a carved claim
//! that never reaches a prepare, a restart between carve and prepare, and the watch's
//! decisions.

use std::sync::Arc;

use kube::runtime::watcher::Event;

use super::*;
use crate::claims::carve_watch::CarveWatch;
use crate::claims::cdi;
use crate::claims::testing::{MemoryApi, NODE, UID_A, UID_B, inline, preparer};
use crate::gpu::{EmulatedBackend, FaultKind, GpuBackend};

const DEVICE: &str = "gpu-0-mig-1g-10gb-6";

struct Setup {
    dir: tempfile::TempDir,
    emu: Arc<EmulatedBackend>,
    api: Arc<MemoryApi>,
    p: Arc<Preparer>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let emu =
        Arc::new(EmulatedBackend::open("H100-80GB:2", NODE, &dir.path().join("emu")).unwrap());
    let api = Arc::new(MemoryApi::default());
    let p = Arc::new(preparer(dir.path(), emu.clone(), api.clone(), inline()));
    Setup { dir, emu, api, p }
}

impl Setup {
    /// Claim `ns/<name>` with `uid`, allocated [`DEVICE`] (or `device`), waiting for its carve.
    fn waiting(&self, name: &str, uid: &str, device: &str) -> ClaimRef {
        let c = self.api.allocate("ns", name, uid, &[("gpu", device)]);
        self.api.wait_for_carve(&c);
        c
    }

    fn live_migs(&self) -> Vec<String> {
        let live = self.emu.all_instances().unwrap();
        live.into_iter().map(|s| s.mig_uuid).collect()
    }

    fn spec_exists(&self, claim: &ClaimRef) -> bool {
        cdi::spec_path(&self.dir.path().join("cdi"), &claim.uid).exists()
    }

    fn carve_of(&self, claim: &ClaimRef) -> Option<CarveOutcome> {
        self.api.carves.lock().unwrap().get(&claim.uid).cloned()
    }

    /// A new preparer over the same GPUs, checkpoint and API server (a plugin restart).
    fn restart(&mut self) {
        self.p = Arc::new(preparer(
            self.dir.path(),
            self.emu.clone(),
            self.api.clone(),
            inline(),
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn a_carve_creates_records_and_says_slice_ready() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    assert_eq!(s.p.carve_claim(&a).await.unwrap(), Carved::Ready);
    let r = s.p.record_of(UID_A).unwrap();
    assert_eq!(r.state, PrepareState::Carved);
    assert_eq!(s.live_migs(), [r.devices[0].mig_uuid().unwrap()]);
    assert!(!s.spec_exists(&a), "no CDI spec before the prepare");
    assert_eq!(s.carve_of(&a), Some(CarveOutcome::Ready));
    let rc = s.api.claim(&a).unwrap();
    assert!(carve::carve_answered(&rc, NODE));
    let text = s.p.metrics.probe.encode();
    assert!(
        text.contains(r#"das_kubelet_plugin_carves_total{result="ok"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("das_kubelet_plugin_carved_slices 1"),
        "{text}"
    );
    // Carved once: a second call (another watch event) does nothing.
    assert_eq!(s.p.carve_claim(&a).await.unwrap(), Carved::Skipped);
    assert_eq!(s.live_migs().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_carve_leaves_nothing_and_says_slice_failed() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    s.emu.inject_create_faults(0, 1, FaultKind::Other);
    let Carved::Failed(message) = s.p.carve_claim(&a).await.unwrap() else {
        panic!("expected a failed carve");
    };
    assert!(message.contains(DEVICE), "{message}");
    assert!(s.live_migs().is_empty(), "{:?}", s.live_migs());
    assert!(s.p.record_of(UID_A).is_none());
    assert_eq!(s.carve_of(&a), Some(CarveOutcome::Failed(message.clone())));
    let rc = s.api.claim(&a).unwrap();
    let condition = rc.status.unwrap().devices.unwrap()[0]
        .conditions
        .clone()
        .unwrap()[0]
        .clone();
    assert_eq!(condition.type_, carve::SLICE_FAILED);
    assert_eq!(condition.reason, carve::REASON_CARVE_FAILED);
    assert_eq!(condition.message, message);
    let text = s.p.metrics.probe.encode();
    assert!(
        text.contains(r#"das_kubelet_plugin_carves_total{result="failed"} 1"#),
        "{text}"
    );
    // Answered: the watch's next event does not carve it again.
    assert_eq!(s.p.carve_claim(&a).await.unwrap(), Carved::Skipped);
}

#[tokio::test(start_paused = true)]
async fn the_prepare_of_a_carved_claim_creates_nothing() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    s.p.carve_claim(&a).await.unwrap();
    let carved = s.live_migs();
    // Any create now would fail: the prepare must not create.
    s.emu.inject_create_faults(0, 5, FaultKind::Other);
    let devices = s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        s.live_migs(),
        carved,
        "the carved slice is the prepared one"
    );
    let r = s.p.record_of(UID_A).unwrap();
    assert_eq!(r.state, PrepareState::PrepareCompleted);
    assert!(!r.cdi_device_ids.is_empty());
    assert!(s.spec_exists(&a));
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(s.api.statuses.lock().unwrap()[UID_A], carved);
    let text = s.p.metrics.probe.encode();
    assert!(
        text.contains("das_kubelet_plugin_carved_slices 0"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_carved_slice_gone_before_the_prepare_is_created_again() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    s.p.carve_claim(&a).await.unwrap();
    let live = s.emu.all_instances().unwrap();
    s.emu
        .destroy_instance(live[0].gpu_index, live[0].gi_id)
        .unwrap();
    s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(s.live_migs().len(), 1);
    let r = s.p.record_of(UID_A).unwrap();
    assert_eq!(r.state, PrepareState::PrepareCompleted);
    assert_eq!(s.live_migs(), [r.devices[0].mig_uuid().unwrap()]);
}

#[tokio::test(start_paused = true)]
async fn a_carved_claim_deleted_before_its_prepare_is_destroyed() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    s.p.carve_claim(&a).await.unwrap();
    // Still allocated as recorded: kept.
    assert!(!s.p.release_carved(&a).await.unwrap());
    assert_eq!(s.live_migs().len(), 1);
    // A claim that cannot be read is no answer: the caller (the watch) asks again.
    s.api
        .failing_reads
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let e = s.p.release_carved(&a).await.unwrap_err();
    assert_eq!(e.metric_label(), "api_read", "{e}");
    assert_eq!(s.live_migs().len(), 1);
    let rc = s.api.claim(&a).unwrap();
    s.api.delete(&a);
    let mut watch = CarveWatch::new(s.p.clone(), NODE);
    watch.handle(Event::Delete(rc));
    watch.finish().await;
    assert!(s.live_migs().is_empty(), "{:?}", s.live_migs());
    assert!(s.p.record_of(UID_A).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_carved_claim_allocated_otherwise_is_destroyed_and_a_prepared_one_kept() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    let b = s.waiting("b", UID_B, "gpu-1-mig-1g-10gb-6");
    s.p.carve_claim(&a).await.unwrap();
    s.p.carve_claim(&b).await.unwrap();
    s.p.prepare_claim(&b).await.unwrap();
    // The scheduler gave up on a and allocated it another device; b was deallocated, but it is
    // prepared: only the kubelet's unprepare releases it.
    s.api
        .allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-5")]);
    s.api
        .change(&b, |rc| rc.status.as_mut().unwrap().allocation = None);
    let mut watch = CarveWatch::new(s.p.clone(), NODE);
    watch.handle(Event::Apply(s.api.claim(&a).unwrap()));
    watch.handle(Event::Apply(s.api.claim(&b).unwrap()));
    watch.finish().await;
    assert!(
        s.p.record_of(UID_A).is_none(),
        "a's carved slice is destroyed"
    );
    assert_eq!(
        s.p.record_of(UID_B).unwrap().state,
        PrepareState::PrepareCompleted
    );
    assert_eq!(s.live_migs().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_watch_carves_what_waits_and_a_listing_releases_what_is_gone() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    s.api
        .allocate("ns", "plain", UID_B, &[("gpu", "gpu-1-mig-1g-10gb-6")]);
    let mut watch = CarveWatch::new(s.p.clone(), NODE);
    watch.handle(Event::Apply(s.api.claim(&a).unwrap()));
    let plain = s.api.claim(&ClaimRef {
        namespace: "ns".into(),
        name: "plain".into(),
        uid: UID_B.into(),
    });
    watch.handle(Event::Apply(plain.unwrap()));
    watch.finish().await;
    assert_eq!(s.p.record_of(UID_A).unwrap().state, PrepareState::Carved);
    assert!(
        s.p.record_of(UID_B).is_none(),
        "no binding condition: not carved"
    );
    // A relisting without the claim (deleted while the watch was down).
    s.api.delete(&a);
    let mut watch = CarveWatch::new(s.p.clone(), NODE);
    watch.handle(Event::Init);
    watch.handle(Event::InitDone);
    watch.finish().await;
    assert!(s.p.record_of(UID_A).is_none());
    assert!(s.live_migs().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_restart_between_carve_and_prepare_keeps_and_uses_the_carved_slice() {
    let mut s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    let gone = s.waiting("gone", UID_B, "gpu-1-mig-1g-10gb-6");
    s.p.carve_claim(&a).await.unwrap();
    s.p.carve_claim(&gone).await.unwrap();
    s.api.delete(&gone);
    s.restart();
    let report = s.p.reconcile_at_startup(false, false).await.unwrap();
    assert!(report.kept.contains(&a.to_string()), "{report:?}");
    assert!(
        s.p.record_of(UID_B).is_none(),
        "the deleted claim's carve is released"
    );
    let carved = s.live_migs();
    assert_eq!(carved.len(), 1);
    s.emu.inject_create_faults(0, 5, FaultKind::Other);
    s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(s.live_migs(), carved);
    assert_eq!(
        s.p.record_of(UID_A).unwrap().state,
        PrepareState::PrepareCompleted
    );
}

/// Issue 41 item 7: a carve whose claim cannot be read is retried with backoff for as long as
/// the reads fail (here 8, past the 5 tries it used to give up after), then carved.
#[tokio::test(start_paused = true)]
async fn the_watch_retries_a_carve_until_its_claim_can_be_read() {
    let s = setup();
    let a = s.waiting("a", UID_A, DEVICE);
    s.api
        .failing_reads
        .store(8, std::sync::atomic::Ordering::SeqCst);
    let t0 = tokio::time::Instant::now();
    let mut watch = CarveWatch::new(s.p.clone(), NODE);
    watch.handle(Event::Apply(s.api.claim(&a).unwrap()));
    watch.finish().await;
    assert_eq!(s.p.record_of(UID_A).unwrap().state, PrepareState::Carved);
    assert_eq!(s.carve_of(&a), Some(CarveOutcome::Ready));
    // 1 + 2 + 4 + 8 + 16 + 30 + 30 + 30 s of pauses: the backoff doubles up to its cap.
    assert_eq!(t0.elapsed().as_secs(), 121);
}
