use super::*;
use crate::claims::checkpoint::{DeviceKind, RecordedDevice};

fn now(current: bool, switch: &MigSwitch) -> GpuNow<'_> {
    GpuNow {
        gpu: 1,
        mode: MigModeState {
            current,
            pending: current,
        },
        switch,
        holders: Vec::new(),
        instances: 0,
    }
}

#[test]
fn a_gpu_already_in_the_mode_is_ready_whatever_is_pending_or_allowed() {
    let off = MigSwitch::off();
    assert_eq!(mode_step(true, &now(true, &off)), ModeStep::Ready);
    assert_eq!(mode_step(false, &now(false, &off)), ModeStep::Ready);
    let pending = GpuNow {
        mode: MigModeState {
            current: true,
            pending: false,
        },
        ..now(true, &off)
    };
    assert_eq!(mode_step(true, &pending), ModeStep::Ready);
}

#[test]
fn an_idle_switchable_gpu_is_switched_either_way() {
    let allowed = MigSwitch::Allowed;
    assert_eq!(mode_step(true, &now(false, &allowed)), ModeStep::Switch);
    assert_eq!(mode_step(false, &now(true, &allowed)), ModeStep::Switch);
}

#[test]
fn a_refused_gpu_is_never_switched_and_the_reason_says_why_and_what_to_do() {
    let refused = MigSwitch::Refused("Ampere: a MIG mode change needs a GPU reset".into());
    let ModeStep::Refuse(why) = mode_step(false, &now(true, &refused)) else {
        panic!("switched a refused GPU");
    };
    assert!(why.contains("MIG mode on"), "{why}");
    assert!(why.contains("needs a GPU reset"), "{why}");
    assert!(why.contains(das_api::DEVICE_CLASS_ALL), "{why}");
    assert!(why.contains("nvidia-smi -i 1 -mig 0"), "{why}");
    let ModeStep::Refuse(why) = mode_step(true, &now(false, &refused)) else {
        panic!("switched a refused GPU");
    };
    assert!(why.contains(das_api::DEVICE_CLASS_WHOLE_GPU), "{why}");
}

#[test]
fn a_gpu_another_claim_holds_is_not_switched_under_it() {
    let allowed = MigSwitch::Allowed;
    let held = GpuNow {
        holders: vec!["claim ns/a (uid-a)".into()],
        ..now(true, &allowed)
    };
    let ModeStep::Refuse(why) = mode_step(false, &held) else {
        panic!("switched a held GPU");
    };
    assert!(why.contains("claim ns/a (uid-a)"), "{why}");
}

#[test]
fn mig_mode_goes_off_only_when_no_instance_is_left() {
    let allowed = MigSwitch::Allowed;
    let busy = GpuNow {
        instances: 2,
        ..now(true, &allowed)
    };
    assert!(matches!(mode_step(false, &busy), ModeStep::Refuse(w) if w.contains("2 MIG instance")));
    // Instances do not matter to a switch on (there can be none while MIG mode is off).
    let busy_off = GpuNow {
        instances: 2,
        ..now(false, &allowed)
    };
    assert_eq!(mode_step(true, &busy_off), ModeStep::Switch);
}

#[test]
fn holders_are_the_other_claims_with_a_device_of_the_other_kind_on_the_gpu() {
    let device = |gpu: u32, kind: DeviceKind| RecordedDevice {
        time_slice: None,
        acquired: false,
        kind,
        request: "r".into(),
        pool: "node".into(),
        device: format!("d{gpu}"),
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}"),
        profile: "1g.10gb".into(),
        placement_start: 0,
        placement_size: 1,
        instance: None,
        mps: None,
        share: None,
    };
    let mut cp = Checkpoint::new("boot");
    cp.set_started("a", "ns", "a", vec![device(0, DeviceKind::Mig)]);
    cp.set_started("b", "ns", "b", vec![device(1, DeviceKind::WholeGpu)]);
    cp.set_completed(
        "c",
        "ns",
        "c",
        vec![device(1, DeviceKind::Mig)],
        Default::default(),
    );
    // MIG mode wanted on: whole GPUs stand in the way, MIG instances do not.
    assert_eq!(holders_on_gpu(&cp, "x", 1, true), vec!["claim ns/b (b)"]);
    assert!(holders_on_gpu(&cp, "x", 0, true).is_empty());
    // Wanted off: MIG instances stand in the way, in any state.
    assert_eq!(holders_on_gpu(&cp, "x", 1, false), vec!["claim ns/c (c)"]);
    assert_eq!(holders_on_gpu(&cp, "x", 0, false), vec!["claim ns/a (a)"]);
    // A claim never stands in its own way.
    assert!(holders_on_gpu(&cp, "a", 0, false).is_empty());
}
