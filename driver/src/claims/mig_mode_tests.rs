//! MIG mode follows demand on the request path (issue 32, docs/design.md §7, "MIG mode follows
//! demand"): a MIG instance's prepare switches its GPU's MIG mode on, a whole GPU's prepare switches it
//! off once nothing holds the GPU, an unprepare never switches; a failed switch fails the
//! prepare, keeps the mode, posts a Node event and has the GPU serve its current mode only; a
//! switch interrupted by a restart is recovered at start-up. Two emulated H100s with MIG mode
//! off, switching on: both are published whole and as every MIG placement.

use std::sync::Arc;

use super::testing::{MemoryApi, NODE, UID_A, UID_B, inline, preparer};
use super::{PrepareError, Preparer};
use crate::claims::checkpoint::{Checkpoint, CheckpointStore};
use crate::gpu::{EmulatedBackend, FaultKind, GpuBackend, MigModeState, MigSwitch};
use crate::publish::desired::HealthFacts;
use crate::publish::devices::DeviceKind;

struct Setup {
    dir: tempfile::TempDir,
    emu: Arc<EmulatedBackend>,
    api: Arc<MemoryApi>,
    p: Arc<Preparer>,
}

fn open(dir: &tempfile::TempDir, spec: &str) -> Arc<EmulatedBackend> {
    Arc::new(
        EmulatedBackend::open(spec, NODE, &dir.path().join("emu"))
            .unwrap()
            .with_whole_gpus(true)
            .with_mig_mode_switching(true),
    )
}

fn setup(spec: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let emu = open(&dir, spec);
    let api = Arc::new(MemoryApi::default());
    let p = Arc::new(preparer(dir.path(), emu.clone(), api.clone(), inline()));
    Setup { dir, emu, api, p }
}

impl Setup {
    fn mode(&self, gpu: u32) -> MigModeState {
        self.emu.mig_mode(gpu).unwrap()
    }

    fn events(&self, reason: &str) -> Vec<String> {
        let events = self.api.events.lock().unwrap();
        events
            .iter()
            .filter(|(r, _)| r == reason)
            .map(|(_, n)| n.clone())
            .collect()
    }

    fn metrics(&self) -> String {
        self.p.metrics.probe.encode()
    }
}

const OFF: MigModeState = MigModeState {
    current: false,
    pending: false,
};
const ON: MigModeState = MigModeState {
    current: true,
    pending: true,
};

#[tokio::test(start_paused = true)]
async fn a_slice_switches_mig_mode_on_and_a_whole_gpu_switches_it_off_once_nothing_holds_the_gpu() {
    let s = setup("H100-80GB:2:mig-off");
    assert!(s.p.node.devices.contains_key("gpu-0"));
    assert!(s.p.node.devices.contains_key("gpu-0-mig-1g-10gb-0"));
    assert_eq!(s.mode(0), OFF);
    let a = s
        .api
        .allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-0")]);
    s.p.prepare_claim(&a).await.unwrap();
    assert_eq!(s.mode(0), ON, "switched on for the slice");
    assert_eq!(s.emu.instances_on(0).unwrap().len(), 1);
    assert_eq!(s.mode(1), OFF, "the other GPU is untouched");
    // An unprepare never switches: the mode stays while demand may come back.
    s.p.unprepare_claim(&a).await.unwrap();
    assert_eq!(s.mode(0), ON);
    let b = s.api.allocate("ns", "b", UID_B, &[("gpu", "gpu-0")]);
    s.p.prepare_claim(&b).await.unwrap();
    assert_eq!(s.mode(0), OFF, "switched off for the whole GPU");
    assert!(s.emu.instances_on(0).unwrap().is_empty());
    s.p.checkpoint().read(|cp| {
        assert!(cp.mig_mode_switches.is_empty(), "no switch left recorded");
    });
    let m = s.metrics();
    for line in [
        r#"das_kubelet_plugin_mig_mode_switches_total{to="on",result="ok"} 1"#,
        r#"das_kubelet_plugin_mig_mode_switches_total{to="off",result="ok"} 1"#,
        r#"das_kubelet_plugin_gpu_mig_mode_switchable{gpu="0"} 1"#,
    ] {
        assert!(m.contains(line), "{line} missing from\n{m}");
    }
    assert!(s.events("MigModeSwitchFailed").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_whole_gpu_is_not_switched_off_under_a_slice_another_claim_holds() {
    let s = setup("H100-80GB:1");
    let a = s
        .api
        .allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-0")]);
    s.p.prepare_claim(&a).await.unwrap();
    let b = s.api.allocate("ns", "b", UID_B, &[("gpu", "gpu-0")]);
    // The placement wait (the force-delete race) gives up first: the MIG instance is never taken.
    let err = s.p.prepare_claim(&b).await.unwrap_err();
    assert!(matches!(err, PrepareError::PlacementHeld { .. }), "{err}");
    assert_eq!(s.mode(0), ON);
    assert_eq!(s.emu.instances_on(0).unwrap().len(), 1);
    assert!(s.p.record_of(UID_B).is_none());
}

#[tokio::test(start_paused = true)]
async fn an_instance_no_claim_holds_keeps_mig_mode_on() {
    let s = setup("H100-80GB:1");
    // An administrator's MIG instance, not DAS's.
    s.emu.create_instance(0, "1g.10gb", 0).unwrap();
    let b = s.api.allocate("ns", "b", UID_B, &[("gpu", "gpu-0")]);
    let err = s.p.prepare_claim(&b).await.unwrap_err();
    let PrepareError::MigModeSwitch { gpu, reason, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(*gpu, 0);
    assert!(reason.contains("1 MIG instance"), "{err}");
    assert_eq!(s.mode(0), ON);
    assert!(s.p.record_of(UID_B).is_none(), "rolled back");
    assert!(
        s.events("MigModeSwitchFailed").is_empty(),
        "nothing was tried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_switch_fails_the_prepare_keeps_the_mode_and_the_gpu_serves_its_mode_only() {
    let s = setup("H100-80GB:2");
    let (tx, rx) = tokio::sync::watch::channel(HealthFacts::default());
    s.p.report_mig_modes_to(tx);
    s.emu
        .inject_set_mig_mode_faults(0, 1, FaultKind::ResetRequired);
    let b = s.api.allocate("ns", "b", UID_B, &[("gpu", "gpu-0")]);
    let err = s.p.prepare_claim(&b).await.unwrap_err();
    assert_eq!(err.metric_label(), "mig_mode_switch");
    let msg = err.to_string();
    assert!(
        msg.contains("GPU 0 cannot be switched to MIG mode off")
            && msg.contains("reset required")
            && msg.contains("has MIG mode on"),
        "{msg}"
    );
    // The pending change the fault left is set back; nothing is recorded.
    assert_eq!(s.mode(0), ON);
    assert!(s.p.record_of(UID_B).is_none());
    s.p.checkpoint()
        .read(|cp| assert!(cp.mig_mode_switches.is_empty()));
    // One Warning on the Node, naming the GPU and the error.
    let events = s.events("MigModeSwitchFailed");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with("GPU 0 (GPU-") && events[0].contains("set back"),
        "{}",
        events[0]
    );
    // The publisher learns that GPU 0 serves MIG instances only; GPU 1 keeps both.
    assert_eq!(
        rx.borrow().serves_only,
        [(0, DeviceKind::Mig)].into_iter().collect()
    );
    assert!(matches!(s.p.modes.switch_of(0), MigSwitch::Refused(_)));
    assert_eq!(s.p.modes.switch_of(1), MigSwitch::Allowed);
    let m = s.metrics();
    assert!(
        m.contains(
            r#"das_kubelet_plugin_mig_mode_switches_total{to="off",result="reset_required"} 1"#
        ) && m.contains(r#"das_kubelet_plugin_gpu_mig_mode_switchable{gpu="0"} 0"#),
        "{m}"
    );
    // A retry is refused without another switch (and without another event); MIG instances still work.
    let err = s.p.prepare_claim(&b).await.unwrap_err();
    assert!(err.to_string().contains("DAS does not switch it"), "{err}");
    assert_eq!(s.events("MigModeSwitchFailed").len(), 1);
    let a = s
        .api
        .allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-0")]);
    s.p.prepare_claim(&a).await.unwrap();
    // GPU 1 still switches.
    s.p.unprepare_claim(&b).await.unwrap();
    let c = s.api.allocate(
        "ns",
        "c",
        "cccccccc-0000-0000-0000-000000000003",
        &[("gpu", "gpu-1")],
    );
    s.p.prepare_claim(&c).await.unwrap();
    assert_eq!(s.mode(1), OFF);
}

#[tokio::test(start_paused = true)]
async fn a_busy_gpu_fails_the_switch_the_same_way() {
    let s = setup("H100-80GB:1:mig-off");
    s.emu.inject_set_mig_mode_faults(0, 1, FaultKind::InUse);
    let a = s
        .api
        .allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-0")]);
    let err = s.p.prepare_claim(&a).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot be switched to MIG mode on")
            && err.to_string().contains("in use"),
        "{err}"
    );
    assert_eq!(s.mode(0), OFF);
    assert!(s.emu.instances_on(0).unwrap().is_empty());
    assert_eq!(
        s.p.serves_only(),
        [(0, DeviceKind::WholeGpu)].into_iter().collect()
    );
}

/// A checkpoint recording a switch under way on GPU 0, as a plugin that stopped mid-switch
/// leaves it.
fn interrupted(s: &Setup, mig_enabled: bool) {
    let path = s.dir.path().join("checkpoint.json");
    let mut cp = match Checkpoint::load(&path, "boot").unwrap() {
        crate::claims::checkpoint::LoadOutcome::Loaded(cp) => cp,
        _ => Checkpoint::new("boot"),
    };
    let uuid = s.emu.inventory().unwrap()[0].uuid.clone();
    cp.set_mig_mode_switch(0, &uuid, mig_enabled, UID_A);
    cp.save(&path).unwrap();
}

#[tokio::test(start_paused = true)]
async fn start_up_keeps_a_switch_that_took_effect_and_forgets_one_that_never_started() {
    for (mode_now, to) in [(OFF, false), (ON, false)] {
        let s = setup(if mode_now.current {
            "H100-80GB:1"
        } else {
            "H100-80GB:1:mig-off"
        });
        interrupted(&s, to);
        let p = preparer(s.dir.path(), s.emu.clone(), s.api.clone(), inline());
        p.reconcile_at_startup(false, false).await.unwrap();
        p.checkpoint()
            .read(|cp| assert!(cp.mig_mode_switches.is_empty()));
        assert_eq!(s.mode(0), mode_now, "the mode is left as found");
        assert_eq!(p.modes.switch_of(0), MigSwitch::Allowed);
    }
}

#[tokio::test(start_paused = true)]
async fn start_up_sets_back_a_switch_left_pending_a_reset() {
    let s = setup("H100-80GB:1");
    // The plugin died after the driver set the pending mode (a VM that cannot reset its GPU).
    s.emu
        .inject_set_mig_mode_faults(0, 1, FaultKind::ResetRequired);
    assert!(s.emu.set_mig_mode(0, false).is_err());
    assert_eq!(
        s.mode(0),
        MigModeState {
            current: true,
            pending: false
        }
    );
    interrupted(&s, false);
    let p = preparer(s.dir.path(), s.emu.clone(), s.api.clone(), inline());
    // The backend reports the GPU as not switchable already (a change is pending).
    assert!(matches!(p.modes.switch_of(0), MigSwitch::Refused(_)));
    p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(s.mode(0), ON, "the pending change is set back");
    p.checkpoint()
        .read(|cp| assert!(cp.mig_mode_switches.is_empty()));
    assert!(matches!(p.modes.switch_of(0), MigSwitch::Refused(_)));
    // Only its MIG placements are published (as read at start-up).
    assert!(!p.node.devices.contains_key("gpu-0"));
    assert!(p.node.devices.contains_key("gpu-0-mig-1g-10gb-0"));
}

#[tokio::test(start_paused = true)]
async fn an_ampere_gpu_is_never_switched_and_serves_its_mode_only() {
    let s = setup("A100-SXM4-40GB:1,A100-SXM4-40GB:1:mig-off");
    assert!(matches!(s.p.modes.switch_of(0), MigSwitch::Refused(ref w) if w.contains("reset")));
    assert!(!s.p.node.devices.contains_key("gpu-0"));
    assert!(s.p.node.devices.contains_key("gpu-0-mig-1g-5gb-0"));
    assert!(s.p.node.devices.contains_key("gpu-1"));
    assert!(!s.p.node.devices.contains_key("gpu-1-mig-1g-5gb-0"));
    let b = s.api.allocate("ns", "b", UID_B, &[("gpu", "gpu-1")]);
    s.p.prepare_claim(&b).await.unwrap();
    assert_eq!(s.mode(1), OFF);
    assert!(
        s.p.metrics
            .probe
            .encode()
            .contains(r#"das_kubelet_plugin_gpu_mig_mode_switchable{gpu="0"} 0"#)
    );
}

/// The checkpoint store's persisted file holds a recorded switch in the version-5 form and reads
/// back the same.
#[test]
fn a_recorded_switch_survives_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cp.json");
    let mut cp = Checkpoint::new("boot");
    cp.set_mig_mode_switch(3, "GPU-x", false, UID_A);
    cp.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(r#""migModeSwitches""#) && text.contains(r#""migEnabled": false"#),
        "{text}"
    );
    let store = CheckpointStore::new(
        match Checkpoint::load(&path, "boot").unwrap() {
            crate::claims::checkpoint::LoadOutcome::Loaded(cp) => cp,
            other => panic!("{other:?}"),
        },
        path,
    );
    store.read(|back| assert_eq!(back, &cp));
}

/// Two MIG instances prepared at once on a GPU with MIG mode off both need it on: neither stands in
/// the other's way (one switches, the other finds it on), whatever order the calls interleave in.
#[tokio::test(start_paused = true)]
async fn two_slices_prepared_at_once_on_a_gpu_with_mig_mode_off_both_get_it_on() {
    let s = setup("H100-80GB:1:mig-off");
    let a = s
        .api
        .allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-0")]);
    let b = s
        .api
        .allocate("ns", "b", UID_B, &[("gpu", "gpu-0-mig-1g-10gb-1")]);
    let (ra, rb) = tokio::join!(s.p.prepare_claim(&a), s.p.prepare_claim(&b));
    ra.unwrap();
    rb.unwrap();
    assert_eq!(s.mode(0), ON);
    assert_eq!(s.emu.instances_on(0).unwrap().len(), 2);
    assert!(
        s.metrics()
            .contains(r#"das_kubelet_plugin_mig_mode_switches_total{to="on",result="ok"} 1"#),
        "one switch"
    );
}

/// A recorded switch of a GPU that is no longer at its index (the boards changed) is forgotten
/// without touching the GPU there.
#[tokio::test(start_paused = true)]
async fn start_up_forgets_a_switch_of_another_gpu() {
    let s = setup("H100-80GB:1");
    let path = s.dir.path().join("checkpoint.json");
    let mut cp = Checkpoint::new("boot");
    cp.set_mig_mode_switch(0, "GPU-not-this-one", false, UID_A);
    cp.save(&path).unwrap();
    let p = preparer(s.dir.path(), s.emu.clone(), s.api.clone(), inline());
    p.reconcile_at_startup(false, false).await.unwrap();
    p.checkpoint()
        .read(|cp| assert!(cp.mig_mode_switches.is_empty()));
    assert_eq!(s.mode(0), ON);
    assert_eq!(p.modes.switch_of(0), MigSwitch::Allowed);
}
