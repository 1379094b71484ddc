//! MIG mode switches of the emulated GPUs (`set_mig_mode`, `emulated/mig_mode.rs`): Hopper at
//! once, Ampere pending a reset, refused with instances, faults and latency from code and the
//! control file, the state file, and whether the inventory allows switching.

use super::*;
use crate::gpu::{MigModeState, MigSwitch};

/// An H100 with MIG on, an H100 with MIG off, an A100 with MIG on.
const SPEC: &str = "H100-80GB:1,H100-80GB:1:mig-off,A100-SXM4-40GB:1";

fn switching(dir: &Path) -> EmulatedBackend {
    open(dir, SPEC)
        .with_whole_gpus(true)
        .with_mig_mode_switching(true)
}

fn mode(current: bool, pending: bool) -> MigModeState {
    MigModeState { current, pending }
}

fn modes(b: &EmulatedBackend) -> Vec<bool> {
    b.inventory()
        .unwrap()
        .iter()
        .map(|g| g.mig_enabled)
        .collect()
}

#[test]
fn an_h100_switches_off_and_on_and_the_inventory_follows() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    assert_eq!(modes(&b), [true, false, true]);
    b.set_mig_mode(0, false).unwrap();
    assert_eq!(b.mig_mode(0).unwrap(), mode(false, false));
    b.set_mig_mode(1, true).unwrap();
    assert_eq!(b.mig_mode(1).unwrap(), mode(true, true));
    assert_eq!(modes(&b), [false, true, true]);
    // MIG mode off: no MIG instance, as NVML's NOT_SUPPORTED.
    let e = b.create_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    assert!(e.to_string().contains("MIG mode is off"), "{e}");
    // Switched on: instances work.
    b.create_instance(1, "1g.10gb", 0).unwrap();
    // The same mode again is a no-op.
    b.set_mig_mode(1, true).unwrap();
    assert_eq!(b.instances_on(1).unwrap().len(), 1);
}

#[test]
fn the_inventory_allows_switching_only_with_the_option_on_a_model_without_reset() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    let inv = b.inventory().unwrap();
    assert_eq!(inv[0].mig_switch, MigSwitch::Allowed);
    assert_eq!(inv[1].mig_switch, MigSwitch::Allowed);
    assert!(inv[0].offers_mig() && inv[0].offers_whole_gpu());
    assert!(inv[1].offers_mig() && inv[1].offers_whole_gpu());
    let MigSwitch::Refused(why) = &inv[2].mig_switch else {
        panic!("an A100 needs a reset: {:?}", inv[2].mig_switch);
    };
    assert_eq!(
        why,
        "A100-SXM4-40GB (Ampere): a MIG mode change needs a GPU reset"
    );
    assert!(inv[2].offers_mig() && !inv[2].offers_whole_gpu());
    drop(b);
    // Without the option (the default) nothing is allowed.
    let b = open(dir.path(), SPEC).with_whole_gpus(true);
    let inv = b.inventory().unwrap();
    assert!(
        inv.iter().all(|g| g.mig_switch == MigSwitch::off()),
        "{inv:?}"
    );
    assert!(!inv[1].offers_mig());
    // The "hardware" switches either way: the option is DAS's policy.
    b.set_mig_mode(1, true).unwrap();
    assert!(b.inventory().unwrap()[1].mig_enabled);
}

#[test]
fn an_a100_change_goes_pending_a_reset_and_a_revert_clears_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    let e = b.set_mig_mode(2, false).unwrap_err();
    assert!(matches!(e, BackendError::ResetRequired { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("MIG mode change to off is pending a GPU reset (A100-SXM4-40GB, Ampere)"),
        "{e}"
    );
    assert_eq!(b.mig_mode(2).unwrap(), mode(true, false));
    let inv = b.inventory().unwrap();
    assert!(inv[2].mig_enabled, "the mode now is unchanged");
    // Still MIG on now: instances work.
    b.create_instance(2, "1g.5gb", 0).unwrap();
    // The pending mode survives a restart (it is in the state file) ...
    drop(b);
    let b = switching(dir.path());
    assert_eq!(b.mig_mode(2).unwrap(), mode(true, false));
    // ... until the caller sets the mode it has back (no-op for the instances).
    b.set_mig_mode(2, true).unwrap();
    assert_eq!(b.mig_mode(2).unwrap(), mode(true, true));
    assert_eq!(b.instances_on(2).unwrap().len(), 1);
}

#[test]
fn a_pending_change_refuses_switching_in_the_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    // An H100 in a VM that cannot reset it: the injected ResetRequired leaves it pending.
    b.inject_set_mig_mode_faults(0, 1, FaultKind::ResetRequired);
    let e = b.set_mig_mode(0, false).unwrap_err();
    assert!(matches!(e, BackendError::ResetRequired { .. }), "{e}");
    assert_eq!(b.mig_mode(0).unwrap(), mode(true, false));
    assert_eq!(
        b.inventory().unwrap()[0].mig_switch,
        MigSwitch::Refused("a MIG mode change to off is pending a GPU reset".into())
    );
    b.set_mig_mode(0, true).unwrap();
    assert_eq!(b.mig_mode(0).unwrap(), mode(true, true));
    assert_eq!(b.inventory().unwrap()[0].mig_switch, MigSwitch::Allowed);
}

#[test]
fn a_gpu_with_instances_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    b.create_instance(0, "1g.10gb", 0).unwrap();
    b.create_foreign_instance(0, "1g.10gb", 1).unwrap();
    let e = b.set_mig_mode(0, false).unwrap_err();
    assert!(matches!(e, BackendError::InUse { .. }), "{e}");
    assert!(e.to_string().contains("2 MIG instances exist"), "{e}");
    assert_eq!(b.mig_mode(0).unwrap(), mode(true, true));
    // On the A100 too: in use comes before the reset.
    b.create_instance(2, "1g.5gb", 0).unwrap();
    let e = b.set_mig_mode(2, false).unwrap_err();
    assert!(matches!(e, BackendError::InUse { .. }), "{e}");
    assert_eq!(b.mig_mode(2).unwrap(), mode(true, true));
}

#[test]
fn injected_faults_and_latency_from_code() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    b.inject_set_mig_mode_faults(1, 2, FaultKind::InUse);
    for _ in 0..2 {
        let e = b.set_mig_mode(1, true).unwrap_err();
        assert!(matches!(e, BackendError::InUse { .. }), "{e}");
    }
    assert_eq!(
        b.mig_mode(1).unwrap(),
        mode(false, false),
        "nothing changed"
    );
    assert_eq!(b.pending_faults(), 0);
    b.set_latency(Latency {
        mig_mode_switch: Duration::from_millis(30),
        ..Latency::default()
    });
    let t = std::time::Instant::now();
    b.set_mig_mode(1, true).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(30));
    // No sleep for a no-op.
    let t = std::time::Instant::now();
    b.set_mig_mode(1, true).unwrap();
    assert!(t.elapsed() < Duration::from_millis(30));
    // A lost GPU answers GpuLost, as for every call.
    b.set_gpu_lost(1, true);
    for e in [
        b.set_mig_mode(1, false).unwrap_err(),
        b.mig_mode(1).unwrap_err(),
    ] {
        assert!(matches!(e, BackendError::GpuLost { .. }), "{e}");
    }
}

#[test]
fn the_control_file_injects_switch_faults_and_latency() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    // The file's spelling (docs/emulated-mode.md).
    let control: Control = serde_json::from_str(
        r#"{"latencyMs": {"migModeSwitch": 30},
            "setMigModeFaults": [{"gpu": 1, "count": 1, "kind": "ResetRequired"},
                                 {"gpu": 0, "count": 1, "kind": "InUse"}]}"#,
    )
    .unwrap();
    assert_eq!(control.latency_ms.mig_mode_switch, 30);
    control.write(dir.path()).unwrap();
    let e = b.set_mig_mode(1, true).unwrap_err();
    assert!(matches!(e, BackendError::ResetRequired { .. }), "{e}");
    assert!(e.to_string().contains("injected fault"), "{e}");
    assert_eq!(b.mig_mode(1).unwrap(), mode(false, true));
    let e = b.set_mig_mode(0, false).unwrap_err();
    assert!(matches!(e, BackendError::InUse { .. }), "{e}");
    let t = std::time::Instant::now();
    b.set_mig_mode(0, false).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(30), "latency applied");
    // A kind the file does not know is refused by name, listing the valid ones.
    let e = serde_json::from_str::<Control>(
        r#"{"setMigModeFaults": [{"gpu": 0, "count": 1, "kind": "Busy"}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("Busy") && e.contains("ResetRequired"), "{e}");
}

#[test]
fn a_switched_mode_is_kept_in_the_state_file_and_reopens_without_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    b.set_mig_mode(0, false).unwrap();
    b.set_mig_mode(1, true).unwrap();
    let _ = b.set_mig_mode(2, false);
    drop(b);
    let text = fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["gpus"][0]["migEnabled"], false);
    assert!(json["gpus"][1].get("migEnabled").is_none(), "{text}");
    assert!(json["gpus"][1].get("migPending").is_none(), "{text}");
    assert_eq!(json["gpus"][2]["migPending"], false);
    // Reopened with the spec that seeded it: the file's modes, no mismatch.
    let b = switching(dir.path());
    assert_eq!(modes(&b), [false, true, true]);
    assert_eq!(b.mig_mode(2).unwrap(), mode(true, false));
    // Without --whole-gpus the GPU now off is not served; the one now on is.
    drop(b);
    let b = open(dir.path(), SPEC);
    assert_eq!(b.gpu_indices(), [1, 2]);
    b.create_instance(1, "1g.10gb", 0).unwrap();
}

#[test]
fn a_state_file_without_a_pending_mode_reads_as_none_pending() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), SPEC));
    let text = fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    assert!(!text.contains("migPending"), "{text}");
    let state: StateFile = serde_json::from_str(&text).unwrap();
    assert!(
        state
            .gpus
            .iter()
            .all(|g| g.mode().pending == g.mode().current)
    );
}

#[test]
fn instances_recorded_on_a_gpu_switched_off_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let b = switching(dir.path());
    b.create_instance(0, "1g.10gb", 0).unwrap();
    drop(b);
    let path = dir.path().join(STATE_FILE);
    let mut state: StateFile = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    state.gpus[0].mig_enabled = false;
    write_atomically(&path, &state).unwrap();
    let e = EmulatedBackend::open(SPEC, "node-a", dir.path()).unwrap_err();
    assert!(matches!(e, EmulatedError::CorruptState { .. }), "{e}");
    assert!(e.to_string().contains("MIG mode is off"), "{e}");
}
