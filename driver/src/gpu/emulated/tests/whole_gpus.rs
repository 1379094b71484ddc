//! Emulated GPUs with MIG mode off: the spec's mode, the state file, the inventory with and
//! without `--whole-gpus`, and NVML's `NOT_SUPPORTED` for a MIG instance there.

use super::*;

const SPEC: &str = "A100-SXM4-40GB:1:mig-off,H100-80GB:2";

#[test]
fn the_spec_takes_an_optional_mig_mode() {
    let s = parse_emulated_spec("A100-SXM4-40GB:1:mig-off, h100-80gb:2:MIG-ON,A30").unwrap();
    let summary: Vec<(&str, u32, bool)> = s
        .iter()
        .map(|e| (e.model.name.as_str(), e.count, e.mig_enabled))
        .collect();
    assert_eq!(
        summary,
        [
            ("A100-SXM4-40GB", 1, false),
            ("H100-SXM5-80GB", 2, true),
            ("A30-24GB", 1, true)
        ]
    );
    for bad in ["A30:1:mig", "A30:1:off", "A30:1:"] {
        let e = parse_emulated_spec(bad).unwrap_err().to_string();
        assert!(
            e.contains("is not mig-on or mig-off") && e.contains("MODEL[:COUNT[:mig-on|mig-off]]"),
            "{bad}: {e}"
        );
    }
    let e = parse_emulated_spec("A30:1:mig-off:x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("too many fields"), "{e}");
    // The mode needs the count before it.
    assert!(parse_emulated_spec("A30:mig-off").is_err());
}

#[test]
fn mig_off_gpus_are_skipped_without_whole_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), SPEC);
    let inv = b.inventory().unwrap();
    assert_eq!(inv.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 2]);
    assert!(inv.iter().all(|g| g.mig_enabled));
    assert_eq!(b.gpu_indices(), [1, 2]);
    let e = b.instances_on(0).unwrap_err();
    assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("--whole-gpus"), "{e}");
    assert!(b.all_instances().unwrap().is_empty());
    // The hardware view lists every GPU with its mode.
    let all = emulated_inventory(SPEC, "node-a").unwrap();
    assert_eq!(
        all.iter().map(|g| g.mig_enabled).collect::<Vec<_>>(),
        [false, true, true]
    );
    assert!(!all[0].served(false) && all[0].served(true) && all[1].served(false));
}

#[test]
fn with_whole_gpus_a_mig_off_gpu_is_listed_and_refuses_mig_instances() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), SPEC).with_whole_gpus(true);
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 3);
    assert!(!inv[0].mig_enabled && inv[0].offers_whole_gpu() && !inv[0].offers_mig());
    assert!(inv[1].mig_enabled && inv[1].offers_mig() && !inv[1].offers_whole_gpu());
    assert_eq!(b.gpu_indices(), [0, 1, 2]);
    assert!(b.instances_on(0).unwrap().is_empty());
    // As NVML answers NOT_SUPPORTED with MIG mode off: nothing upstream can carve a whole GPU.
    let e = b.create_instance(0, "1g.5gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    assert!(e.to_string().contains("MIG mode is off"), "{e}");
    let e = b.create_foreign_instance(0, "7g.40gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    assert!(b.all_instances().unwrap().is_empty());
    // The GPUs with MIG on work as before.
    b.create_instance(1, "1g.10gb", 0).unwrap();
    assert_eq!(b.all_instances().unwrap().len(), 1);
}

#[test]
fn the_mode_is_kept_in_the_state_and_the_file_s_mode_wins_over_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), SPEC).with_whole_gpus(true);
    b.create_instance(2, "1g.10gb", 3).unwrap();
    drop(b);
    let text = fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["gpus"][0]["migEnabled"], false);
    // MIG on is not written: such a file is what a plugin before `mig-off` reads and writes.
    assert!(json["gpus"][1].get("migEnabled").is_none(), "{text}");
    // A restart sees the same modes and instances.
    let b = open(dir.path(), SPEC).with_whole_gpus(true);
    assert!(!b.inventory().unwrap()[0].mig_enabled);
    assert_eq!(b.all_instances().unwrap().len(), 1);
    drop(b);
    // The spec's mode only seeds a fresh state: the same GPUs with another mode in the spec
    // keep the file's mode (a plugin may have switched it).
    let b = open(dir.path(), "A100-SXM4-40GB:1,H100-80GB:2").with_whole_gpus(true);
    assert!(!b.inventory().unwrap()[0].mig_enabled);
    assert_eq!(b.all_instances().unwrap().len(), 1);
    drop(b);
    // Other GPUs are still other hardware.
    let e = EmulatedBackend::open("A30:1,H100-80GB:2", "node-a", dir.path()).unwrap_err();
    assert!(matches!(e, EmulatedError::StateMismatch { .. }), "{e}");
    assert!(e.to_string().contains("0:A100-SXM4-40GB"), "{e}");
}

#[test]
fn an_old_state_file_reads_as_mig_on() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "A30:2"));
    let path = dir.path().join(STATE_FILE);
    let text = fs::read_to_string(&path).unwrap();
    assert!(!text.contains("migEnabled"), "{text}");
    let state: StateFile = serde_json::from_str(&text).unwrap();
    assert!(state.gpus.iter().all(|g| g.mig_enabled));
    assert!(open(dir.path(), "A30:2").inventory().unwrap()[1].mig_enabled);
}

#[test]
fn instances_recorded_on_a_mig_off_gpu_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "A30:1:mig-off"));
    let other = tempfile::tempdir().unwrap();
    let b = open(other.path(), "A30");
    b.create_instance(0, "1g.6gb", 0).unwrap();
    drop(b);
    let path = dir.path().join(STATE_FILE);
    let mut state: StateFile = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let donor: StateFile =
        serde_json::from_slice(&fs::read(other.path().join(STATE_FILE)).unwrap()).unwrap();
    state.gpus[0].instances = donor.gpus[0].instances.clone();
    write_atomically(&path, &state).unwrap();
    let e = EmulatedBackend::open("A30:1:mig-off", "node-a", dir.path()).unwrap_err();
    assert!(matches!(e, EmulatedError::CorruptState { .. }), "{e}");
    assert!(e.to_string().contains("MIG mode is off"), "{e}");
}
