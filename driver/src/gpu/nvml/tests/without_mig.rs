//! GPUs without MIG on the fake NVML (`nvmlDeviceGetMigMode` answers `NOT_SUPPORTED`, as on a
//! T4 or an L4): discovery does not fail or skip them with `--whole-gpus`, finds their data
//! file (by PCI device ID, and subsystem ID or name where two products share one), or builds a
//! model from NVML's identity; the backend then answers every MIG call as NVML would, without
//! asking NVML what it already knows.

use super::*;
use crate::gpu::{GpuInfo, MigSwitch};

fn spec(name: &str) -> FakeGpuSpec {
    FakeGpuSpec::without_mig(model(name))
}

fn backend(specs: Vec<FakeGpuSpec>, whole_gpus: bool) -> NvmlBackend<FakeNvml> {
    NvmlBackend::with_whole_gpus(
        FakeNvml::new(specs),
        options(Path::new("/nonexistent-proc")),
        whole_gpus,
    )
    .unwrap()
}

fn models(inv: &[GpuInfo]) -> Vec<(u32, &str, bool)> {
    inv.iter()
        .map(|g| (g.index, g.model.name.as_str(), g.model.mig))
        .collect()
}

/// A mixed node (an L4, an H100 with MIG on, a T4): with `--whole-gpus` the GPUs without MIG are
/// served whole from their data files, with NVML's memory; without it they are skipped.
#[test]
fn gpus_without_mig_are_served_whole_with_whole_gpus() {
    let specs = || {
        let t4 = FakeGpuSpec {
            // ECC reserves memory: NVML's total is what counts.
            memory_mib: 15000,
            ..spec("T4")
        };
        vec![spec("L4"), h100(true), t4]
    };
    let b = backend(specs(), true);
    let inv = b.inventory().unwrap();
    assert_eq!(
        models(&inv),
        [
            (0, "L4", false),
            (1, "H100-SXM5-80GB", true),
            (2, "T4", false)
        ]
    );
    let l4 = &inv[0];
    assert!(!l4.mig_enabled && l4.only_whole() && l4.offers_whole_gpu() && !l4.offers_mig());
    assert_eq!(l4.mig_switch, MigSwitch::no_mig());
    assert_eq!(l4.product_name, "NVIDIA L4");
    assert_eq!(l4.memory_mib, 23034);
    assert_eq!(l4.pci_bus_id.as_deref(), Some("0000:10:00.0"));
    assert_eq!(inv[2].memory_mib, 15000);
    assert_eq!(inv[2].whole_gpu_memory_bytes(), 15000 << 20);
    assert_eq!(b.gpu_indices(), [0, 1, 2]);
    // Without --whole-gpus only the H100 is served.
    let without = backend(specs(), false);
    assert_eq!(
        models(&without.inventory().unwrap()),
        [(1, "H100-SXM5-80GB", true)]
    );
    // Even with --mig-mode-switching a GPU without MIG is never switchable.
    let opts = NvmlOptions {
        mig_mode_switching: true,
        ..options(Path::new("/nonexistent-proc"))
    };
    let b = NvmlBackend::with_whole_gpus(FakeNvml::new(specs()), opts, true).unwrap();
    let inv = b.inventory().unwrap();
    assert_eq!(inv[0].mig_switch, MigSwitch::no_mig());
    assert!(inv[1].mig_switch.allowed());
}

/// The backend answers for a GPU without MIG: MIG mode off now and pending, no instances (no
/// NVML call), a create or switch refused as NVML refuses it; the H100 beside it works.
#[test]
fn a_gpu_without_mig_answers_every_mig_call() {
    let b = backend(vec![spec("L4"), h100(true)], true);
    let before = b.api().call_counts();
    assert_eq!(
        b.mig_mode(0).unwrap(),
        MigModeState {
            current: false,
            pending: false
        }
    );
    assert!(b.instances_on(0).unwrap().is_empty());
    assert!(b.cached_instances_on(0).unwrap().is_empty());
    assert_eq!(
        b.api().call_counts(),
        before,
        "no NVML call for what a GPU without MIG cannot have"
    );
    let e = b.create_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(
        matches!(&e, BackendError::NotSupported { reason, .. } if reason.contains("L4 has no MIG")),
        "{e}"
    );
    let e = b.set_mig_mode(0, true).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    // NVML itself: no MIG mode, no MIG profiles.
    assert_eq!(b.api().mig_mode(0).unwrap_err().code, code::NOT_SUPPORTED);
    assert_eq!(
        b.api().gi_profile_info(0, 0).unwrap_err().code,
        code::NOT_SUPPORTED
    );
    assert!(
        b.all_instances().unwrap().is_empty(),
        "start-up listing works"
    );
    b.create_instance(1, "1g.10gb", 0).unwrap();
    assert_eq!(b.all_instances().unwrap().len(), 1);
}

/// A2 and A16 share PCI device ID 0x25B6: each GPU gets its own file by its subsystem ID.
#[test]
fn a2_and_a16_are_told_apart_by_their_subsystem_ids() {
    let b = backend(vec![spec("A16"), spec("A2"), spec("A16")], true);
    let inv = b.inventory().unwrap();
    assert_eq!(
        models(&inv),
        [(0, "A16", false), (1, "A2", false), (2, "A16", false)]
    );
    // An OEM board whose subsystem no file lists: the NVML name decides.
    let oem = FakeGpuSpec {
        pci_subsystem_id: 0x1234_1028,
        ..spec("A2")
    };
    assert_eq!(
        models(&backend(vec![oem], true).inventory().unwrap())[0].1,
        "A2"
    );
}

/// A GPU without MIG that no data file describes is served from what NVML reports: its name,
/// memory, architecture (NVIDIA's DRA driver's name) and compute capability; no SM count.
#[test]
fn an_unknown_gpu_without_mig_gets_a_model_from_nvml() {
    let b = backend(vec![FakeGpuSpec::non_mig("Tesla V100-PCIE-16GB")], true);
    let inv = b.inventory().unwrap();
    let m = &inv[0].model;
    assert_eq!(
        (
            m.name.as_str(),
            m.product_name.as_str(),
            m.architecture.as_str(),
            m.cuda_compute_capability.as_str(),
            m.memory_mib,
            m.multiprocessors,
            m.mig,
            m.memory_slices
        ),
        (
            "Tesla-V100-PCIE-16GB",
            "Tesla V100-PCIE-16GB",
            "Volta",
            "7.0",
            16160,
            None,
            false,
            1
        )
    );
    assert_eq!(m.pci_device_ids, [0x1DB4_10DE]);
    assert!(inv[0].only_whole());
}

/// NVML has the last word on MIG: a GPU whose data file says MIG but NVML answers
/// `NOT_SUPPORTED` (an A100 passed through without MIG) is served whole from NVML's identity;
/// one whose file says no MIG but NVML reports a MIG mode gets NVML's MIG tables.
#[test]
fn nvml_decides_whether_a_gpu_has_mig() {
    let a100_without_mig = FakeGpuSpec {
        model: None,
        ..a100(false)
    };
    let l4_with_mig = FakeGpuSpec {
        pci_device_id: 0x27B8_10DE,
        name: "NVIDIA L4".into(),
        ..a100(true)
    };
    let b = backend(vec![a100_without_mig, l4_with_mig], true);
    let inv = b.inventory().unwrap();
    assert_eq!(
        (inv[0].model.name.as_str(), inv[0].model.mig),
        ("A100-SXM4-40GB", false)
    );
    assert_eq!(inv[0].model.source_file, "nvml:NVIDIA A100-SXM4-40GB");
    assert_eq!(inv[0].model.architecture, "Ampere");
    assert!(inv[1].model.mig && inv[1].mig_enabled);
    assert_eq!(inv[1].model.name, "L4");
    assert_eq!(inv[1].model.memory_slices, 8, "NVML's A100 tables");
}

/// The read-only report says which file a GPU without MIG matches and how DAS serves it.
#[test]
fn the_inventory_report_names_the_file_of_a_gpu_without_mig() {
    let fake = FakeNvml::new(vec![spec("L4"), spec("A16")]);
    let text = inventory_report(&fake);
    assert!(text.contains("DAS model: L4 (l4.toml, no MIG)"), "{text}");
    assert!(text.contains("subsystem 0x14a910de"), "{text}");
    assert!(
        text.contains("MIG: not supported (served whole with --whole-gpus"),
        "{text}"
    );
    assert!(text.contains("Ada Lovelace"), "{text}");
}
