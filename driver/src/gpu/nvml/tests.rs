//! Unit tests of the NVML backend against [`FakeNvml`].

use std::fs;
use std::path::Path;

use super::backend::map_error;
use super::procfs::{ci_access_path, gi_access_path, parse_caps_major, read_caps_major};
use super::*;
use crate::gpu::catalog::find_model;
use std::time::Duration;

use crate::gpu::{BackendError, GpuBackend, HealthEvent, Target, ci_cap_minor, gi_cap_minor};

fn model(name: &str) -> std::sync::Arc<crate::gpu::GpuModel> {
    find_model(name).unwrap().unwrap()
}

fn a100(mig: bool) -> FakeGpuSpec {
    FakeGpuSpec::mig(model("A100-SXM4-40GB"), mig)
}

fn h100(mig: bool) -> FakeGpuSpec {
    FakeGpuSpec::mig(model("H100-SXM5-80GB"), mig)
}

fn options(proc_root: &Path) -> NvmlOptions {
    NvmlOptions {
        proc_root: proc_root.to_path_buf(),
        enable_mig_mode: false,
    }
}

/// A backend over one A100-40GB with MIG on, and a procfs root without capability files.
fn one_a100() -> NvmlBackend<FakeNvml> {
    let fake = FakeNvml::new(vec![a100(true)]);
    NvmlBackend::new(fake, options(Path::new("/nonexistent-proc"))).unwrap()
}

#[test]
fn inventory_skips_non_mig_ampere_off_and_hopper_off_by_default() {
    let fake = FakeNvml::new(vec![
        a100(true),
        FakeGpuSpec::non_mig("Tesla T4"),
        a100(false),
        h100(false),
        h100(true),
    ]);
    let b = NvmlBackend::new(fake, NvmlOptions::default()).unwrap();
    let inv = b.inventory().unwrap();
    let got: Vec<(u32, &str, bool)> = inv
        .iter()
        .map(|g| (g.index, g.model.name.as_str(), g.mig_enabled))
        .collect();
    assert_eq!(
        got,
        vec![(0, "A100-SXM4-40GB", true), (4, "H100-SXM5-80GB", true)]
    );
    assert_eq!(inv[0].product_name, "NVIDIA A100-SXM4-40GB");
    assert_eq!(inv[0].driver_version, "580.95.05");
    assert_eq!(inv[1].minor, 4);
    // The default never changes MIG mode.
    assert!(
        b.api()
            .calls()
            .iter()
            .all(|c| !c.starts_with("set_mig_mode"))
    );
    assert!(!b.api().mig_mode_of(3).current);
}

#[test]
fn enable_mig_mode_switches_hopper_but_never_ampere() {
    let fake = FakeNvml::new(vec![a100(false), h100(false)]);
    let opts = NvmlOptions {
        enable_mig_mode: true,
        ..NvmlOptions::default()
    };
    let b = NvmlBackend::new(fake, opts).unwrap();
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0].index, 1);
    assert_eq!(b.api().calls(), vec!["set_mig_mode 1 true".to_string()]);
    assert!(!b.api().mig_mode_of(0).current);
}

#[test]
fn create_at_exact_placement_with_driver_assigned_gi_and_uuid() {
    let b = one_a100();
    let s = b.create_instance(0, "1g.5gb", 3).unwrap();
    assert_eq!(s.placement, Placement { start: 3, size: 1 });
    assert_eq!(s.profile, "1g.5gb");
    assert_eq!(s.profile_id, 19);
    assert_eq!(s.gi_id, 9, "GI IDs come from the driver, not the placement");
    assert_eq!(s.ci_id, 0);
    assert!(s.mig_uuid.starts_with("MIG-"), "{}", s.mig_uuid);
    assert_eq!(s.created_by_das, None);
    assert_eq!(s.gpu_uuid, b.inventory().unwrap()[0].uuid);
    // No capability files: the mig-minors formula.
    assert_eq!(s.gi_cap_minor, gi_cap_minor(0, 9));
    assert_eq!(s.ci_cap_minor, ci_cap_minor(0, 9, 0));
    assert_eq!(
        b.api().calls(),
        vec!["create_gi 0 19 3:1", "create_ci 0/9 0"]
    );
    // The full-size CI by slice count: 3g → CI profile 2.
    let s = b.create_instance(0, "3g.20gb", 4).unwrap();
    assert_eq!(s.placement, Placement { start: 4, size: 4 });
    assert!(b.api().calls().contains(&"create_ci 0/7 2".to_string()));
    assert_eq!(b.all_instances().unwrap().len(), 2);
}

#[test]
fn overlapping_placement_is_placement_taken() {
    let b = one_a100();
    b.create_instance(0, "1g.5gb", 1).unwrap();
    let e = b.create_instance(0, "2g.10gb", 0).unwrap_err();
    assert!(
        matches!(e, BackendError::InsufficientResources { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("placement taken"), "{e}");
    assert!(
        e.to_string()
            .contains("GPU 0, profile 2g.10gb, placement 0:2"),
        "{e}"
    );
    // Nothing left behind.
    assert_eq!(b.all_instances().unwrap().len(), 1);
}

#[test]
fn second_media_extension_is_insufficient_resources() {
    let b = one_a100();
    b.create_instance(0, "1g.5gb+me", 0).unwrap();
    let e = b.create_instance(0, "1g.5gb+me", 1).unwrap_err();
    assert!(
        matches!(e, BackendError::InsufficientResources { .. }),
        "{e}"
    );
}

#[test]
fn bad_profile_or_start_is_invalid_argument_without_nvml_calls() {
    let b = one_a100();
    let e = b.create_instance(0, "2g.10gb", 6).unwrap_err();
    assert!(matches!(e, BackendError::InvalidArgument { .. }), "{e}");
    let e = b.create_instance(0, "5g.50gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::InvalidArgument { .. }), "{e}");
    let e = b.create_instance(7, "1g.5gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
    assert!(b.api().calls().is_empty());
}

#[test]
fn destroy_removes_compute_instance_then_gpu_instance() {
    let b = one_a100();
    let s = b.create_instance(0, "2g.10gb", 2).unwrap();
    b.destroy_instance(0, s.gi_id).unwrap();
    let calls = b.api().calls();
    assert_eq!(
        &calls[2..],
        &[
            format!("destroy_ci 0/{}/0", s.gi_id),
            format!("destroy_gi 0/{}", s.gi_id)
        ]
    );
    assert!(b.all_instances().unwrap().is_empty());
    // The placement is free again.
    b.create_instance(0, "2g.10gb", 2).unwrap();
    let e = b.destroy_instance(0, 14).unwrap_err();
    assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
}

#[test]
fn fake_refuses_to_destroy_a_gpu_instance_with_compute_instances() {
    let b = one_a100();
    let s = b.create_instance(0, "1g.5gb", 0).unwrap();
    let e = b.api().destroy_gi(0, s.gi_id).unwrap_err();
    assert_eq!(e.code, code::IN_USE);
    assert_eq!(e.call, "nvmlGpuInstanceDestroy");
}

#[test]
fn busy_compute_instance_is_in_use_and_the_slice_stays() {
    let b = one_a100();
    let s = b.create_instance(0, "1g.5gb", 0).unwrap();
    b.api().set_ci_busy(0, s.gi_id, s.ci_id, true);
    let e = b.destroy_instance(0, s.gi_id).unwrap_err();
    assert!(matches!(e, BackendError::InUse { .. }), "{e}");
    assert!(e.to_string().contains("compute instance 0"), "{e}");
    assert_eq!(b.all_instances().unwrap(), vec![s.clone()]);
    b.api().set_ci_busy(0, s.gi_id, s.ci_id, false);
    b.destroy_instance(0, s.gi_id).unwrap();
}

#[test]
fn mig_uuid_is_found_by_walking_mig_devices_and_is_fresh_on_recreate() {
    let b = one_a100();
    let a = b.create_instance(0, "1g.5gb", 0).unwrap();
    let c = b.create_instance(0, "1g.5gb", 1).unwrap();
    assert_ne!(a.mig_uuid, c.mig_uuid);
    assert_eq!(
        b.mig_uuid(0, c.gi_id, c.ci_id).unwrap(),
        Some(c.mig_uuid.clone())
    );
    // Free the first slot: the walk skips the empty (NOT_FOUND) slot.
    b.destroy_instance(0, a.gi_id).unwrap();
    assert_eq!(
        b.mig_uuid(0, c.gi_id, c.ci_id).unwrap(),
        Some(c.mig_uuid.clone())
    );
    assert_eq!(b.mig_uuid(0, a.gi_id, 0).unwrap(), None);
    let again = b.create_instance(0, "1g.5gb", 0).unwrap();
    assert_ne!(again.mig_uuid, a.mig_uuid);
}

#[test]
fn capability_minors_come_from_procfs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (path, minor) in [
        (gi_access_path(root, 0, 9), 1234),
        (ci_access_path(root, 0, 9, 0), 1235),
    ] {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(
            &path,
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
        )
        .unwrap();
    }
    assert!(gi_access_path(root, 0, 9).ends_with("driver/nvidia/capabilities/gpu0/mig/gi9/access"));
    assert!(ci_access_path(root, 0, 9, 0).ends_with("gpu0/mig/gi9/ci0/access"));
    fs::write(
        root.join("devices"),
        "Character devices:\n  1 mem\n195 nvidia\n236 nvidia-caps-imex-channels\n237 nvidia-caps\n\nBlock devices:\n  8 sd\n",
    )
    .unwrap();
    assert_eq!(read_caps_major(root).unwrap(), 237);
    let b = NvmlBackend::new(FakeNvml::new(vec![a100(true)]), options(root)).unwrap();
    let s = b.create_instance(0, "1g.5gb", 0).unwrap();
    assert_eq!((s.gi_cap_minor, s.ci_cap_minor), (1234, 1235));
}

#[test]
fn caps_major_needs_the_exact_name() {
    assert_eq!(
        parse_caps_major("Character devices:\n508 nvidia-caps-imex-channels\n"),
        None
    );
    assert_eq!(
        parse_caps_major("Character devices:\n 238 nvidia-caps\n"),
        Some(238)
    );
    assert!(read_caps_major(Path::new("/nonexistent-proc")).is_err());
}

#[test]
fn nvml_errors_map_to_backend_errors() {
    let t = || Target::gpu(1);
    let e = |c| NvmlCallError::new("nvmlX", c);
    assert!(matches!(
        map_error(t(), &e(code::INSUFFICIENT_RESOURCES)),
        BackendError::InsufficientResources { .. }
    ));
    assert!(matches!(
        map_error(t(), &e(code::IN_USE)),
        BackendError::InUse { .. }
    ));
    assert!(matches!(
        map_error(t(), &e(code::NOT_SUPPORTED)),
        BackendError::NotSupported { .. }
    ));
    assert!(matches!(
        map_error(t(), &e(code::NOT_FOUND)),
        BackendError::NotFound { .. }
    ));
    assert!(matches!(
        map_error(t(), &e(code::INVALID_ARGUMENT)),
        BackendError::InvalidArgument { .. }
    ));
    let lost = map_error(t(), &e(code::GPU_IS_LOST));
    assert!(matches!(lost, BackendError::GpuLost { .. }));
    assert!(lost.to_string().contains("GPU is lost"), "{lost}");
    assert!(
        lost.to_string().contains("NVML_ERROR_GPU_IS_LOST"),
        "{lost}"
    );
    let perm = map_error(t(), &e(code::NO_PERMISSION));
    assert!(perm.to_string().contains("CAP_SYS_ADMIN"), "{perm}");
}

#[test]
fn lost_gpu_fails_create_clearly() {
    let b = one_a100();
    b.api().lose_gpu(0);
    let e = b.create_instance(0, "1g.5gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::GpuLost { .. }), "{e}");
    assert!(e.to_string().contains("GPU is lost"), "{e}");
    assert!(b.all_instances().is_err());
}

/// Issue 11 finding 5: one lost GPU must not take the node down, and the inventory (which health
/// is judged from) is read again instead of served from the start-up copy.
#[test]
fn a_lost_gpu_leaves_the_other_gpus_listable_and_drops_out_of_the_inventory() {
    let fake = FakeNvml::new(vec![a100(true), h100(true)]);
    let b = NvmlBackend::new(fake, options(Path::new("/nonexistent-proc"))).unwrap();
    b.create_instance(1, "1g.10gb", 6).unwrap();
    assert_eq!(b.inventory().unwrap().len(), 2);
    b.api().lose_gpu(0);
    let inv = b.inventory().unwrap();
    assert_eq!(inv.iter().map(|g| g.index).collect::<Vec<_>>(), [1]);
    assert_eq!(b.gpu_indices(), [0, 1], "the managed GPUs stay the same");
    assert!(matches!(
        b.instances_on(0),
        Err(BackendError::GpuLost { .. })
    ));
    assert_eq!(b.instances_on(1).unwrap().len(), 1);
}

#[test]
fn failed_compute_instance_rolls_back_the_gpu_instance() {
    let b = one_a100();
    b.api().fail_next(
        "nvmlGpuInstanceCreateComputeInstance",
        code::INSUFFICIENT_RESOURCES,
    );
    let e = b.create_instance(0, "1g.5gb", 0).unwrap_err();
    assert!(
        matches!(e, BackendError::InsufficientResources { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("GI 9"), "{e}");
    assert_eq!(b.api().calls().last().unwrap(), "destroy_gi 0/9");
    assert!(b.all_instances().unwrap().is_empty());
    b.create_instance(0, "1g.5gb", 0).unwrap();
}

#[test]
fn mig_mode_off_after_start_is_not_supported() {
    let b = one_a100();
    b.api().fail_next(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        code::NOT_SUPPORTED,
    );
    let e = b.create_instance(0, "1g.5gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
}

#[test]
fn list_includes_foreign_instances_and_gpu_instances_without_compute_instance() {
    let b = one_a100();
    let ours = b.create_instance(0, "1g.5gb", 6).unwrap();
    // Someone else (nvidia-smi) made a 3g at 0 with its CI, and a bare 1g.10gb GI at 4.
    let gi = b
        .api()
        .create_gi(0, 9, Placement { start: 0, size: 4 })
        .unwrap();
    b.api().create_ci(0, gi.id, 2).unwrap();
    let bare = b
        .api()
        .create_gi(0, 15, Placement { start: 4, size: 2 })
        .unwrap();
    let list = b.all_instances().unwrap();
    let got: Vec<(u32, &str, bool)> = list
        .iter()
        .map(|s| (s.placement.start, s.profile.as_str(), s.mig_uuid.is_empty()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "3g.20gb", false),
            (4, "1g.10gb", true),
            (6, "1g.5gb", false)
        ]
    );
    assert!(list.iter().all(|s| s.created_by_das.is_none()));
    assert_eq!(list[2], ours);
    // The bare GI can be destroyed (no CI to remove first).
    b.destroy_instance(0, bare.id).unwrap();
}

#[test]
fn unknown_gpu_gets_a_model_from_nvml_tables() {
    let mut spec = a100(true);
    spec.pci_device_id = 0xDEAD_10DE;
    spec.name = "NVIDIA A100X-FUTURE".into();
    let b = NvmlBackend::new(FakeNvml::new(vec![spec]), NvmlOptions::default()).unwrap();
    let inv = b.inventory().unwrap();
    assert_eq!(inv.len(), 1);
    let m = &inv[0].model;
    let known = model("A100-SXM4-40GB");
    assert_eq!(m.name, "A100X-FUTURE");
    assert_eq!(m.memory_slices, 8);
    assert_eq!(m.max_gpu_instances, 7);
    assert!(m.mig_mode_change_requires_reset);
    let mut ids: Vec<(u32, &str, &[u32], u32)> = m
        .profiles
        .iter()
        .map(|p| {
            (
                p.id,
                p.name.as_str(),
                p.placement_starts.as_slice(),
                p.compute_instance.id,
            )
        })
        .collect();
    let mut want: Vec<(u32, &str, &[u32], u32)> = known
        .profiles
        .iter()
        .map(|p| {
            (
                p.id,
                p.name.as_str(),
                p.placement_starts.as_slice(),
                p.compute_instance.id,
            )
        })
        .collect();
    ids.sort();
    want.sort();
    assert_eq!(ids, want);
    b.create_instance(0, "4g.20gb", 0).unwrap();
}

#[test]
fn print_inventory_report_is_read_only() {
    let fake = FakeNvml::new(vec![
        a100(true),
        FakeGpuSpec::non_mig("Tesla T4"),
        h100(false),
    ]);
    fake.create_gi(0, 14, Placement { start: 2, size: 2 })
        .unwrap();
    let calls_before = fake.calls();
    let text = inventory_report(&fake);
    assert_eq!(
        fake.calls(),
        calls_before,
        "the report must not change anything"
    );
    assert!(text.contains("3 GPU(s)"), "{text}");
    assert!(
        text.contains("DAS model: A100-SXM4-40GB (a100-sxm4-40gb.toml)"),
        "{text}"
    );
    assert!(text.contains("MIG mode: current on, pending on"), "{text}");
    assert!(text.contains("MIG: not supported"), "{text}");
    assert!(
        text.contains("MIG mode: current off, pending off"),
        "{text}"
    );
    assert!(
        text.contains("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"),
        "{text}"
    );
    assert!(text.contains("{0,1,2,3,4,5,6}:1"), "{text}");
    assert!(text.contains("{0,2,4,6}:2"), "{text}");
    assert!(text.contains("GI  9 2g.10gb at 2:2"), "{text}");
}

#[test]
fn fake_follows_nvml_id_namespaces_and_argument_rules() {
    let fake = FakeNvml::new(vec![a100(true)]);
    // Enum 9 (1_SLICE_REV2) is real ID 15.
    assert_eq!(fake.gi_profile_info(0, 9).unwrap().id, 15);
    assert_eq!(
        fake.gi_profile_info(0, 5).unwrap_err().code,
        code::NOT_SUPPORTED
    );
    assert_eq!(
        fake.gi_profile_info(0, GI_PROFILE_ENUM_COUNT)
            .unwrap_err()
            .code,
        code::INVALID_ARGUMENT
    );
    let e = fake
        .create_gi(0, 14, Placement { start: 6, size: 2 })
        .unwrap_err();
    assert_eq!(e.code, code::INVALID_ARGUMENT);
    let gi = fake
        .create_gi(0, 5, Placement { start: 0, size: 4 })
        .unwrap();
    assert_eq!(fake.ci_profile_info(0, gi.id, 3).unwrap().slice_count, 4);
    assert_eq!(
        fake.ci_profile_info(0, gi.id, 4).unwrap_err().code,
        code::NOT_SUPPORTED
    );
}

#[test]
fn xid_and_ecc_events_become_health_events_with_their_gpu_and_instance() {
    let b = one_a100();
    let mask = b.api().registered_events(0);
    assert_eq!(
        mask,
        super::event::XID_CRITICAL_ERROR | super::event::DOUBLE_BIT_ECC_ERROR,
        "both types registered at start"
    );
    let raw = |event_type, data, gpu_instance| super::RawEvent {
        dev: Some(0),
        event_type,
        data,
        gpu_instance,
    };
    b.api()
        .push_event(raw(super::event::XID_CRITICAL_ERROR, 79, None));
    b.api()
        .push_event(raw(super::event::XID_CRITICAL_ERROR, 31, Some(3)));
    b.api()
        .push_event(raw(super::event::DOUBLE_BIT_ECC_ERROR, 0, None));
    // A device handle that is not ours, and a type nobody registered, are dropped.
    b.api().push_event(super::RawEvent {
        dev: None,
        ..raw(super::event::XID_CRITICAL_ERROR, 48, None)
    });
    b.api().push_event(raw(0x4, 0, None));
    let got = b.wait_health_events(Duration::from_millis(1)).unwrap();
    assert_eq!(
        got,
        [
            HealthEvent::Xid {
                gpu: 0,
                xid: 79,
                gpu_instance: None
            },
            HealthEvent::Xid {
                gpu: 0,
                xid: 31,
                gpu_instance: Some(3)
            },
            HealthEvent::UncorrectableEcc { gpu: 0 },
        ]
    );
    assert!(
        b.wait_health_events(Duration::from_millis(1))
            .unwrap()
            .is_empty()
    );
}
