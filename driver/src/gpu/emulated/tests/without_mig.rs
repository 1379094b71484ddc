//! Emulated GPUs without MIG (`--emulated-gpus=L4:1,H100-80GB:1`, a mixed node): MIG mode off for
//! good (a spec cannot turn it on), served whole with `--whole-gpus` with synthetic PCI facts and
//! NUMA node, and NVML's `NOT_SUPPORTED` for every MIG instance or switch.

use super::*;
use crate::gpu::MigSwitch;

const MIXED: &str = "L4:1,H100-80GB:1";

#[test]
fn a_model_without_mig_is_always_mig_off() {
    let s = parse_emulated_spec("L4:2, t4, L40S:1:mig-off, H100-80GB").unwrap();
    let summary: Vec<(&str, u32, bool)> = s
        .iter()
        .map(|e| (e.model.name.as_str(), e.count, e.mig_enabled))
        .collect();
    assert_eq!(
        summary,
        [
            ("L4", 2, false),
            ("T4", 1, false),
            ("L40S", 1, false),
            ("H100-SXM5-80GB", 1, true)
        ]
    );
    let e = parse_emulated_spec("L4:1:mig-on").unwrap_err().to_string();
    assert!(
        e.contains("L4 has no MIG") && e.contains("leave out :mig-on"),
        "{e}"
    );
}

#[test]
fn a_mixed_node_serves_the_l4_whole_with_whole_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let without = open(dir.path(), MIXED);
    assert_eq!(without.gpu_indices(), [1], "the L4 needs --whole-gpus");
    let e = without.mig_mode(0).unwrap_err();
    assert!(e.to_string().contains("--whole-gpus"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), MIXED)
        .with_whole_gpus(true)
        .with_mig_mode_switching(true);
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 2);
    let l4 = &inv[0];
    assert_eq!((l4.model.name.as_str(), l4.mig_enabled), ("L4", false));
    assert_eq!(l4.mig_switch, MigSwitch::no_mig(), "never switchable");
    assert!(l4.only_whole());
    assert_eq!(l4.memory_mib, 23034);
    assert_eq!(l4.product_name, "NVIDIA L4");
    assert_eq!(l4.numa_node, Some(0));
    assert_eq!(l4.pcie_root.as_deref(), Some("pci0000:10"));
    assert!(inv[1].mig_enabled && inv[1].mig_switch.allowed());
    // What the hardware view (`--print-inventory`) says of it.
    let all = emulated_inventory(MIXED, "node-a").unwrap();
    assert_eq!(all[0].mig_switch, MigSwitch::no_mig());
    assert!(!all[0].served(false) && all[0].served(true));
}

#[test]
fn a_gpu_without_mig_refuses_mig_instances_and_switches() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), MIXED).with_whole_gpus(true);
    assert_eq!(
        b.mig_mode(0).unwrap(),
        MigModeState {
            current: false,
            pending: false
        }
    );
    let e = b.create_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(
        matches!(&e, BackendError::NotSupported { reason, .. } if reason.contains("L4 has no MIG")),
        "{e}"
    );
    let e = b.create_foreign_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    let e = b.set_mig_mode(0, true).unwrap_err();
    assert!(
        matches!(&e, BackendError::NotSupported { reason, .. } if reason.contains("has no MIG")),
        "{e}"
    );
    assert!(!b.mig_mode(0).unwrap().current);
    assert!(b.instances_on(0).unwrap().is_empty());
    // The H100 beside it carves as usual.
    b.create_instance(1, "1g.10gb", 0).unwrap();
    assert_eq!(b.all_instances().unwrap().len(), 1);
}

/// A state file that records MIG mode on for a GPU without MIG is corrupt (and is moved aside
/// by `open_or_reset`, never a crash loop).
#[test]
fn a_state_with_mig_on_for_a_gpu_without_mig_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), MIXED));
    let path = dir.path().join(STATE_FILE);
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    state["gpus"][0]["migEnabled"] = true.into();
    std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();
    let e = EmulatedBackend::open(MIXED, "node-a", dir.path()).unwrap_err();
    assert!(
        e.to_string()
            .contains("GPU 0 (L4) has no MIG, yet its MIG mode is recorded on"),
        "{e}"
    );
    let (b, aside) = EmulatedBackend::open_or_reset(MIXED, "node-a", dir.path()).unwrap();
    assert!(aside.is_some());
    assert!(!b.with_whole_gpus(true).mig_mode(0).unwrap().current);
}

/// The L4's time slice (docs/design.md §7, "Time-slicing"): the level is kept in the state file,
/// where tests read it, and survives a restart; an injected fault answers once.
#[test]
fn the_time_slice_is_recorded_in_the_state_and_faults_answer_once() {
    use das_api::device_config::TimeSliceInterval;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), MIXED).with_whole_gpus(true);
    let level = |dir: &Path| -> u64 {
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(STATE_FILE)).unwrap()).unwrap();
        state["gpus"][0]["timeSlice"].as_u64().unwrap_or(0)
    };
    b.set_time_slice(0, TimeSliceInterval::Long).unwrap();
    assert_eq!(level(dir.path()), 3);
    let again = open(dir.path(), MIXED).with_whole_gpus(true);
    again.inject(Op::SetTimeSlice, 0, 1, FaultKind::NotSupported);
    assert!(matches!(
        again.set_time_slice(0, TimeSliceInterval::Default),
        Err(BackendError::NotSupported { .. })
    ));
    assert_eq!(level(dir.path()), 3, "a refused change changes nothing");
    again.set_time_slice(0, TimeSliceInterval::Default).unwrap();
    assert_eq!(level(dir.path()), 0, "the default is written as no key");
    again.set_gpu_lost(0, true);
    assert!(matches!(
        again.set_time_slice(0, TimeSliceInterval::Short),
        Err(BackendError::GpuLost { .. })
    ));
}
