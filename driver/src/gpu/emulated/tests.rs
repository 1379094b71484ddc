//! Unit tests of [`super`] (`emulated.rs`).

use super::identity::format_uuid;
use super::*;
use crate::gpu::gi_cap_minor;

fn open(dir: &Path, spec: &str) -> EmulatedBackend {
    EmulatedBackend::open(spec, "node-a", dir).unwrap()
}

#[test]
fn spec_parsing() {
    let s = parse_emulated_spec("A100-SXM4-40GB:2, h100-80gb:3,A30").unwrap();
    let summary: Vec<(String, u32)> = s.iter().map(|e| (e.model.name.clone(), e.count)).collect();
    assert_eq!(
        summary,
        vec![
            ("A100-SXM4-40GB".to_string(), 2),
            ("H100-SXM5-80GB".to_string(), 3),
            ("A30-24GB".to_string(), 1)
        ]
    );
    let e = parse_emulated_spec("V100:1").unwrap_err().to_string();
    assert!(
        e.contains("unknown GPU model V100") && e.contains("A100-SXM4-40GB"),
        "{e}"
    );
    assert!(parse_emulated_spec("A30:0").is_err());
    assert!(parse_emulated_spec("A30:x").is_err());
    assert!(parse_emulated_spec("A30,,A30").is_err());
    assert!(parse_emulated_spec("A30:33").is_err());
    assert!(parse_emulated_spec("A30:20,A30:20").is_err());
}

#[test]
fn uuids_are_deterministic_and_well_formed() {
    let a = format_uuid("GPU-", &[b"node-a", &0u32.to_le_bytes()]);
    assert_eq!(a, format_uuid("GPU-", &[b"node-a", &0u32.to_le_bytes()]));
    assert_ne!(a, format_uuid("GPU-", &[b"node-a", &1u32.to_le_bytes()]));
    assert_ne!(a, format_uuid("GPU-", &[b"node-b", &0u32.to_le_bytes()]));
    let groups: Vec<usize> = a
        .trim_start_matches("GPU-")
        .split('-')
        .map(str::len)
        .collect();
    assert_eq!(groups, vec![8, 4, 4, 4, 12]);
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30:2");
    let inv = b.inventory().unwrap();
    assert_eq!(
        inv[1].uuid,
        format_uuid("GPU-", &[b"node-a", &1u32.to_le_bytes()])
    );
    assert_eq!(inv[1].model.name, "A30-24GB");
    assert!(inv.iter().all(|g| g.mig_enabled));
    // Synthetic but well-formed PCI addresses (docs/emulated-mode.md), one root per GPU pair,
    // and fixed brand and CUDA driver version.
    let pci: Vec<(Option<&str>, Option<&str>)> = inv
        .iter()
        .map(|g| (g.pci_bus_id.as_deref(), g.pcie_root.as_deref()))
        .collect();
    assert_eq!(
        pci,
        [
            (Some("0000:10:00.0"), Some("pci0000:10")),
            (Some("0000:11:00.0"), Some("pci0000:10"))
        ]
    );
    assert!(inv.iter().all(|g| g.brand.as_deref() == Some("Nvidia")
        && g.cuda_driver_version.as_deref() == Some("13.0")));
}

#[test]
fn create_list_destroy_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A100-SXM4-40GB:1,H100-80GB:1");
    let s = b.create_instance(1, "1g.20gb", 6).unwrap();
    assert_eq!(
        (s.gpu_index, s.placement, s.gi_id, s.ci_id, s.profile_id),
        (1, Placement { start: 6, size: 2 }, 0, 0, 15)
    );
    assert_eq!(s.gi_cap_minor, gi_cap_minor(1, 0));
    assert_eq!(s.ci_cap_minor, s.gi_cap_minor + 1);
    assert_eq!(s.created_by_das, Some(true));
    assert!(s.mig_uuid.starts_with("MIG-"));
    let t = b.create_instance(1, "1g.10gb", 0).unwrap();
    assert_eq!(t.gi_id, 1);
    assert_ne!(s.mig_uuid, t.mig_uuid);
    drop(b);

    let b = open(dir.path(), "A100-SXM4-40GB:1,H100-80GB:1");
    assert_eq!(b.all_instances().unwrap(), vec![t.clone(), s.clone()]);
    b.destroy_instance(1, 0).unwrap();
    // GI 0 is free again: the lowest free ID is reused, the MIG UUID is fresh.
    let u = b.create_instance(1, "1g.20gb", 6).unwrap();
    assert_eq!(u.gi_id, 0);
    assert_ne!(u.mig_uuid, s.mig_uuid);
    assert!(matches!(
        b.destroy_instance(1, 9),
        Err(BackendError::NotFound { .. })
    ));
}

#[test]
fn nvml_like_errors() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "H100-80GB:1");
    b.create_instance(0, "1g.10gb", 5).unwrap();
    let e = b.create_instance(0, "3g.40gb", 4).unwrap_err();
    assert!(
        matches!(e, BackendError::InsufficientResources { .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("GPU 0, profile 3g.40gb, placement 4:4"),
        "{e}"
    );
    assert!(e.to_string().contains("GI 0 (1g.10gb at 5:1)"), "{e}");
    let e = b.create_instance(0, "2g.20gb", 6).unwrap_err();
    assert!(matches!(e, BackendError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("[0, 2, 4]"), "{e}");
    let e = b.create_instance(0, "9g.99gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::InvalidArgument { .. }), "{e}");
    b.create_instance(0, "1g.10gb+me", 0).unwrap();
    let e = b.create_instance(0, "1g.10gb+me", 1).unwrap_err();
    assert!(e.to_string().contains("+me"), "{e}");
    let e = b.create_instance(3, "1g.10gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
}

#[test]
fn profile_max_count_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A100-SXM4-40GB");
    for start in [0, 1, 2, 3, 4, 5, 6] {
        b.create_instance(0, "1g.5gb", start).unwrap();
    }
    assert_eq!(b.all_instances().unwrap().len(), 7);
    let e = b.create_instance(0, "1g.5gb", 6).unwrap_err();
    assert!(matches!(e, BackendError::InsufficientResources { .. }));
}

#[test]
fn faults_and_latency() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30:2");
    b.inject_create_faults(1, 2, FaultKind::Other);
    b.inject_destroy_faults(0, 1, FaultKind::InUse);
    assert!(matches!(
        b.create_instance(1, "1g.6gb", 0),
        Err(BackendError::Other { .. })
    ));
    assert!(b.create_instance(0, "1g.6gb", 0).is_ok());
    assert!(matches!(
        b.create_instance(1, "1g.6gb", 0),
        Err(BackendError::Other { .. })
    ));
    assert!(b.create_instance(1, "1g.6gb", 0).is_ok());
    assert!(matches!(
        b.destroy_instance(0, 0),
        Err(BackendError::InUse { .. })
    ));
    b.destroy_instance(0, 0).unwrap();
    b.set_latency(Latency {
        create: Duration::from_millis(20),
        ..Latency::default()
    });
    let t = std::time::Instant::now();
    b.create_instance(0, "1g.6gb", 1).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(20));
}

#[test]
fn a_lost_gpu_fails_only_its_own_calls_and_keeps_its_instances() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30:2");
    let s = b.create_instance(1, "1g.6gb", 0).unwrap();
    b.set_gpu_lost(1, true);
    assert_eq!(
        b.inventory().unwrap().len(),
        1,
        "the lost GPU is not listed"
    );
    for e in [
        b.instances_on(1).unwrap_err(),
        b.create_instance(1, "1g.6gb", 1).unwrap_err(),
        b.destroy_instance(1, s.gi_id).unwrap_err(),
    ] {
        assert!(matches!(e, BackendError::GpuLost { .. }), "{e}");
    }
    assert!(b.all_instances().is_err(), "the whole-node listing fails");
    b.create_instance(0, "1g.6gb", 0).unwrap();
    assert_eq!(b.instances_on(0).unwrap().len(), 1, "the other GPU works");
    b.set_gpu_lost(1, false);
    assert_eq!(b.instances_on(1).unwrap(), vec![s]);
}

#[test]
fn the_control_file_injects_latency_lost_gpus_and_faults_once_per_content() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30:2");
    let control = Control {
        latency_ms: LatencyMs {
            create: 30,
            ..LatencyMs::default()
        },
        lost_gpus: vec![1],
        create_faults: vec![ControlFault {
            gpu: 0,
            count: 1,
            kind: FaultKind::InUse,
        }],
        destroy_faults: vec![],
        ..Control::default()
    };
    control.write(dir.path()).unwrap();
    let t = std::time::Instant::now();
    assert!(matches!(
        b.create_instance(0, "1g.6gb", 0),
        Err(BackendError::InUse { .. })
    ));
    assert!(t.elapsed() >= Duration::from_millis(30), "latency applied");
    // The same content again queues no second fault.
    b.create_instance(0, "1g.6gb", 0).unwrap();
    assert!(matches!(
        b.instances_on(1),
        Err(BackendError::GpuLost { .. })
    ));
    Control::default().write(dir.path()).unwrap();
    assert!(b.instances_on(1).unwrap().is_empty(), "GPU 1 is back");
    // A file that does not parse changes nothing.
    fs::write(dir.path().join(CONTROL_FILE), b"{nope").unwrap();
    assert!(b.instances_on(1).is_ok());
}

#[test]
fn foreign_slices_are_marked() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30");
    let s = b.create_foreign_instance(0, "4g.24gb", 0).unwrap();
    assert_eq!(s.created_by_das, Some(false));
}

#[test]
fn corrupt_and_mismatching_state_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "A30"));
    let e = EmulatedBackend::open("A30:2", "node-a", dir.path()).unwrap_err();
    assert!(matches!(e, EmulatedError::StateMismatch { .. }), "{e}");
    let e = EmulatedBackend::open("A30", "node-b", dir.path()).unwrap_err();
    assert!(matches!(e, EmulatedError::StateMismatch { .. }), "{e}");
    fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
    let e = EmulatedBackend::open("A30", "node-a", dir.path()).unwrap_err();
    assert!(matches!(e, EmulatedError::CorruptState { .. }), "{e}");
    let aside = move_state_aside(dir.path()).unwrap().unwrap();
    assert!(aside.exists());
    assert!(EmulatedBackend::open("A30", "node-a", dir.path()).is_ok());
}

#[test]
fn a_state_of_other_gpus_or_corrupt_is_moved_aside_and_started_empty() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30");
    b.create_instance(0, "1g.6gb", 0).unwrap();
    drop(b);
    let (b, reset) = EmulatedBackend::open_or_reset("A30:2", "node-a", dir.path()).unwrap();
    let (aside, why) = reset.expect("moved aside");
    assert!(matches!(why, EmulatedError::StateMismatch { .. }), "{why}");
    assert!(aside.exists());
    assert!(b.all_instances().unwrap().is_empty());
    fs::write(dir.path().join(STATE_FILE), b"{garbage").unwrap();
    let (_, reset) = EmulatedBackend::open_or_reset("A30:2", "node-a", dir.path()).unwrap();
    assert!(matches!(
        reset,
        Some((_, EmulatedError::CorruptState { .. }))
    ));
    let (_, reset) = EmulatedBackend::open_or_reset("A30:2", "node-a", dir.path()).unwrap();
    assert!(reset.is_none(), "a good state is kept");
}

#[test]
fn overlapping_instances_in_state_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30");
    b.create_instance(0, "2g.12gb", 0).unwrap();
    drop(b);
    let path = dir.path().join(STATE_FILE);
    let mut state: StateFile = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let mut dup = state.gpus[0].instances[0].clone();
    dup.gi_id = 5;
    dup.start = 0;
    state.gpus[0].instances.push(dup);
    write_atomically(&path, &state).unwrap();
    let e = EmulatedBackend::open("A30", "node-a", dir.path()).unwrap_err();
    assert!(e.to_string().contains("already occupied"), "{e}");
}

#[test]
fn different_gpus_work_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let b = Arc::new(open(dir.path(), "H100-80GB:4"));
    let handles: Vec<_> = (0..4u32)
        .map(|g| {
            let b = b.clone();
            std::thread::spawn(move || {
                for s in 0..7 {
                    b.create_instance(g, "1g.10gb", s).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(b.all_instances().unwrap().len(), 28);
}

#[test]
fn help_lists_aliases() {
    assert!(
        emulated_model_help()
            .unwrap()
            .contains("H100-SXM5-80GB|H100-80GB")
    );
}

#[test]
fn health_events_come_from_code_and_from_the_control_file_once_per_content() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "A30:2");
    let quick = Duration::from_millis(10);
    assert!(b.wait_health_events(quick).unwrap().is_empty());
    b.raise_health_event(HealthEvent::UncorrectableEcc { gpu: 1 });
    assert_eq!(
        b.wait_health_events(quick).unwrap(),
        [HealthEvent::UncorrectableEcc { gpu: 1 }]
    );
    let control = Control {
        xid_events: vec![
            ControlXid {
                gpu: 0,
                xid: 79,
                gpu_instance: None,
            },
            ControlXid {
                gpu: 1,
                xid: 94,
                gpu_instance: Some(2),
            },
        ],
        uncorrectable_ecc_gpus: vec![1],
        ..Control::default()
    };
    control.write(dir.path()).unwrap();
    let got = b.wait_health_events(Duration::from_secs(2)).unwrap();
    assert_eq!(
        got,
        [
            HealthEvent::Xid {
                gpu: 0,
                xid: 79,
                gpu_instance: None
            },
            HealthEvent::Xid {
                gpu: 1,
                xid: 94,
                gpu_instance: Some(2)
            },
            HealthEvent::UncorrectableEcc { gpu: 1 }
        ]
    );
    // The same content raises nothing again.
    assert!(
        b.wait_health_events(Duration::from_millis(250))
            .unwrap()
            .is_empty()
    );
    // The file's spelling of an XID naming a GPU instance (docs/emulated-mode.md).
    let parsed: Control =
        serde_json::from_str(r#"{"xidEvents": [{"gpu": 1, "xid": 94, "gpuInstance": 2}]}"#)
            .unwrap();
    assert_eq!(parsed.xid_events, control.xid_events[1..]);
}

/// GPUs with MIG mode off (`:mig-off`) and `--whole-gpus`.
mod whole_gpus;

/// MIG mode switches (`set_mig_mode`) and whether DAS may make them.
mod mig_mode;

/// GPUs without MIG (`L4:1,H100-80GB:1`, a mixed node).
mod without_mig;
