//! Unit tests of the NVML backend against [`FakeNvml`].

use std::fs;
use std::path::Path;

use super::backend::map_error;
use super::procfs::{
    caps_major_if_needed, ci_access_path, gi_access_path, parse_caps_major, read_caps_major,
};
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
        ..NvmlOptions::default()
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
    // A node whose GPUs all lack MIG needs no capability nodes: no major is no error there.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(
        root.join("devices"),
        "Character devices:
237 nvidia-caps
",
    )
    .unwrap();
    assert_eq!(caps_major_if_needed(root, true).unwrap(), Some(237));
    assert_eq!(caps_major_if_needed(root, false).unwrap(), Some(237));
    let none = Path::new("/nonexistent-proc");
    assert_eq!(caps_major_if_needed(none, false).unwrap(), None);
    assert!(caps_major_if_needed(none, true).is_err());
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
    assert!(m.mig_mode_change_requires_reset());
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
    assert!(
        text.contains("NVIDIA driver 580.95.05 (CUDA 13.0), 3 GPU(s)"),
        "{text}"
    );
    assert!(text.contains("  brand: Nvidia"), "{text}");
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
    // The switching verdict the backend would give with --mig-mode-switching.
    assert!(
        text.contains("MIG mode switching (with --mig-mode-switching): refused: A100-SXM4-40GB (Ampere): a MIG mode change needs a GPU reset"),
        "{text}"
    );
    assert!(
        text.contains("MIG mode switching (with --mig-mode-switching): allowed (no reset needed)"),
        "{text}"
    );
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

/// A clock the tests move by hand (the instance cache's ages).
#[derive(Clone)]
struct ManualClock {
    base: std::time::Instant,
    offset: std::sync::Arc<std::sync::Mutex<Duration>>,
}

impl ManualClock {
    fn new() -> Self {
        Self {
            base: std::time::Instant::now(),
            offset: Default::default(),
        }
    }

    fn clock(&self) -> Clock {
        let me = self.clone();
        std::sync::Arc::new(move || me.base + *me.offset.lock().unwrap())
    }

    fn advance(&self, d: Duration) {
        *self.offset.lock().unwrap() += d;
    }
}

/// A backend over `specs` on a hand-moved clock.
fn on_manual_clock(specs: Vec<FakeGpuSpec>) -> (NvmlBackend<FakeNvml>, ManualClock) {
    let clock = ManualClock::new();
    let b = NvmlBackend::new(
        FakeNvml::new(specs),
        options(Path::new("/nonexistent-proc")),
    )
    .unwrap()
    .with_clock(clock.clock());
    (b, clock)
}

/// A cached read of GPU `gpu` and the NVML calls it made.
fn cached_read<A: NvmlApi>(
    b: &NvmlBackend<A>,
    calls: impl Fn() -> u64,
    gpu: u32,
) -> (Vec<crate::gpu::MigInstance>, u64) {
    let before = calls();
    let list = b.cached_instances_on(gpu).unwrap();
    (list, calls() - before)
}

fn gi_ids(list: &[crate::gpu::MigInstance]) -> Vec<u32> {
    list.iter().map(|s| s.gi_id).collect()
}

/// Issue 30 item 5: the health monitor's 5 s check no longer lists every GPU's instances
/// through NVML; DAS's own creates and destroys keep the list.
#[test]
fn the_cached_list_follows_creates_and_destroys_without_listing_calls() {
    let (b, _clock) = on_manual_clock(vec![a100(true)]);
    let total = || b.api().call_total();
    let (list, calls) = cached_read(&b, total, 0);
    assert!(list.is_empty());
    assert!(calls > 0, "the first read goes to NVML");
    let listings = |b: &NvmlBackend<FakeNvml>| b.api().call_counts()["nvmlDeviceGetGpuInstances"];
    let listed = listings(&b);

    let x = b.create_instance(0, "1g.5gb", 0).unwrap();
    let y = b.create_instance(0, "3g.20gb", 4).unwrap();
    let z = b.create_instance(0, "1g.5gb", 1).unwrap();
    b.destroy_instance(0, x.gi_id).unwrap();
    assert_eq!(listings(&b), listed, "creates and destroys list nothing");

    let (list, calls) = cached_read(&b, total, 0);
    assert_eq!(calls, 0, "served without any NVML call");
    assert_eq!(list, vec![z, y], "by placement start");
    assert_eq!(list, b.instances_on(0).unwrap(), "what NVML has");
}

#[test]
fn a_change_behind_das_is_seen_at_the_slow_re_read() {
    let (b, clock) = on_manual_clock(vec![a100(true)]);
    let total = || b.api().call_total();
    let x = b.create_instance(0, "1g.5gb", 0).unwrap();
    let y = b.create_instance(0, "1g.5gb", 1).unwrap();
    assert_eq!(
        gi_ids(&b.cached_instances_on(0).unwrap()),
        [x.gi_id, y.gi_id]
    );
    // An administrator destroys X and makes a 2g.10gb at 4 with nvidia-smi.
    b.api().admin_destroy(0, x.gi_id, false);
    let foreign = b.api().admin_create(0, 14, Placement { start: 4, size: 2 });

    clock.advance(INSTANCE_REFRESH - Duration::from_secs(1));
    let (list, calls) = cached_read(&b, total, 0);
    assert_eq!(
        (gi_ids(&list), calls),
        (vec![x.gi_id, y.gi_id], 0),
        "not yet"
    );
    clock.advance(Duration::from_secs(1));
    let (list, calls) = cached_read(&b, total, 0);
    assert!(calls > 0);
    assert_eq!(
        gi_ids(&list),
        [y.gi_id, foreign],
        "read again after the period"
    );
    assert_eq!(list, b.instances_on(0).unwrap());
    let (_, calls) = cached_read(&b, total, 0);
    assert_eq!(calls, 0, "and kept for the next period");
}

#[test]
fn a_health_event_makes_its_gpu_read_again() {
    let (b, _clock) = on_manual_clock(vec![a100(true), a100(true)]);
    let total = || b.api().call_total();
    let x = b.create_instance(0, "1g.5gb", 0).unwrap();
    let w = b.create_instance(1, "1g.5gb", 0).unwrap();
    b.cached_instances_on(0).unwrap();
    b.cached_instances_on(1).unwrap();
    b.api().admin_destroy(0, x.gi_id, false);
    let (list, calls) = cached_read(&b, total, 0);
    assert_eq!(
        (gi_ids(&list), calls),
        (vec![x.gi_id], 0),
        "stale until told"
    );

    b.api().push_event(super::RawEvent {
        dev: Some(0),
        event_type: super::event::XID_CRITICAL_ERROR,
        data: 43,
        gpu_instance: None,
    });
    assert_eq!(b.wait_health_events(Duration::ZERO).unwrap().len(), 1);
    let (list, calls) = cached_read(&b, total, 0);
    assert!(list.is_empty() && calls > 0, "GPU 0 read again: {list:?}");
    let (list, calls) = cached_read(&b, total, 1);
    assert_eq!((list, calls), (vec![w], 0), "the other GPU's list is kept");
}

#[test]
fn a_gpu_that_leaves_the_inventory_is_read_again() {
    let (b, _clock) = on_manual_clock(vec![a100(true), a100(true)]);
    let total = || b.api().call_total();
    b.create_instance(0, "1g.5gb", 0).unwrap();
    b.cached_instances_on(0).unwrap();
    let (list, calls) = cached_read(&b, total, 0);
    assert_eq!((list.len(), calls), (1, 0), "kept");
    b.api().lose_gpu(0);
    assert_eq!(b.inventory().unwrap().len(), 1);
    assert!(
        matches!(b.cached_instances_on(0), Err(BackendError::GpuLost { .. })),
        "not served from the list while lost"
    );
}

#[test]
fn a_failed_destroy_makes_the_gpu_read_again() {
    let (b, _clock) = on_manual_clock(vec![a100(true)]);
    let total = || b.api().call_total();
    let x = b.create_instance(0, "1g.5gb", 0).unwrap();
    let y = b.create_instance(0, "1g.5gb", 1).unwrap();
    let (_, calls) = cached_read(&b, total, 0);
    assert!(calls > 0);
    let (_, calls) = cached_read(&b, total, 0);
    assert_eq!(calls, 0, "kept");

    // The compute instance goes, the GPU instance stays: NVML lists it without a MIG UUID.
    b.api().fail_next("nvmlGpuInstanceDestroy", code::UNKNOWN);
    b.destroy_instance(0, x.gi_id).unwrap_err();
    let (list, calls) = cached_read(&b, total, 0);
    assert!(calls > 0, "read again");
    assert_eq!(gi_ids(&list), [x.gi_id, y.gi_id]);
    assert_eq!(list[0].mig_uuid, "", "the GI without its compute instance");
    assert_eq!(list[1], y);

    // NOT_FOUND: the list had Y, which an administrator destroyed.
    b.api().admin_destroy(0, y.gi_id, false);
    let (list, calls) = cached_read(&b, total, 0);
    assert_eq!((gi_ids(&list), calls), (vec![x.gi_id, y.gi_id], 0));
    let e = b.destroy_instance(0, y.gi_id).unwrap_err();
    assert!(matches!(e, BackendError::NotFound { .. }), "{e}");
    let (list, calls) = cached_read(&b, total, 0);
    assert!(calls > 0, "read again");
    assert_eq!(gi_ids(&list), [x.gi_id]);
}

#[test]
fn a_create_refused_for_insufficient_resources_makes_the_gpu_read_again() {
    let (b, _clock) = on_manual_clock(vec![a100(true)]);
    let total = || b.api().call_total();
    assert!(b.cached_instances_on(0).unwrap().is_empty());
    let foreign = b.api().admin_create(0, 19, Placement { start: 0, size: 1 });
    let (list, calls) = cached_read(&b, total, 0);
    assert_eq!((list.len(), calls), (0, 0), "not seen yet");
    let e = b.create_instance(0, "1g.5gb", 0).unwrap_err();
    assert!(
        matches!(e, BackendError::InsufficientResources { .. }),
        "{e}"
    );
    let (list, calls) = cached_read(&b, total, 0);
    assert!(calls > 0, "read again");
    assert_eq!(gi_ids(&list), [foreign]);
}

/// [`FakeNvml`] that runs a hook once, just before it lists the GIs of `profile_id` (the middle
/// of an instance listing).
struct HookedNvml {
    fake: FakeNvml,
    profile_id: u32,
    hook: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl NvmlApi for HookedNvml {
    fn device_count(&self) -> NvmlResult<u32> {
        self.fake.device_count()
    }
    fn driver_version(&self) -> NvmlResult<String> {
        self.fake.driver_version()
    }
    fn cuda_driver_version(&self) -> NvmlResult<i32> {
        self.fake.cuda_driver_version()
    }
    fn brand(&self, dev: u32) -> NvmlResult<u32> {
        self.fake.brand(dev)
    }
    fn device_identity(&self, dev: u32) -> NvmlResult<DeviceIdentity> {
        self.fake.device_identity(dev)
    }
    fn mig_mode(&self, dev: u32) -> NvmlResult<MigModeState> {
        self.fake.mig_mode(dev)
    }
    fn set_mig_mode(&self, dev: u32, enable: bool) -> NvmlResult<()> {
        self.fake.set_mig_mode(dev, enable)
    }
    fn virtualization_mode(&self, dev: u32) -> NvmlResult<u32> {
        self.fake.virtualization_mode(dev)
    }
    fn gi_profile_info(&self, dev: u32, profile_enum: u32) -> NvmlResult<GiProfileInfo> {
        self.fake.gi_profile_info(dev, profile_enum)
    }
    fn gi_possible_placements(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<Placement>> {
        self.fake.gi_possible_placements(dev, profile_id)
    }
    fn create_gi(&self, dev: u32, profile_id: u32, placement: Placement) -> NvmlResult<GiInfo> {
        self.fake.create_gi(dev, profile_id, placement)
    }
    fn gpu_instances(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<GiInfo>> {
        if profile_id == self.profile_id {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
        }
        self.fake.gpu_instances(dev, profile_id)
    }
    fn destroy_gi(&self, dev: u32, gi_id: u32) -> NvmlResult<()> {
        self.fake.destroy_gi(dev, gi_id)
    }
    fn ci_profile_info(
        &self,
        dev: u32,
        gi_id: u32,
        profile_enum: u32,
    ) -> NvmlResult<CiProfileInfo> {
        self.fake.ci_profile_info(dev, gi_id, profile_enum)
    }
    fn create_ci(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<CiInfo> {
        self.fake.create_ci(dev, gi_id, profile_id)
    }
    fn compute_instances(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<Vec<CiInfo>> {
        self.fake.compute_instances(dev, gi_id, profile_id)
    }
    fn destroy_ci(&self, dev: u32, gi_id: u32, ci_id: u32) -> NvmlResult<()> {
        self.fake.destroy_ci(dev, gi_id, ci_id)
    }
    fn max_mig_device_count(&self, dev: u32) -> NvmlResult<u32> {
        self.fake.max_mig_device_count(dev)
    }
    fn mig_device(&self, dev: u32, index: u32) -> NvmlResult<MigDeviceInfo> {
        self.fake.mig_device(dev, index)
    }
    fn register_events(&self, dev: u32, mask: u64) -> NvmlResult<()> {
        self.fake.register_events(dev, mask)
    }
    fn wait_event(&self, timeout_ms: u32) -> NvmlResult<RawEvent> {
        self.fake.wait_event(timeout_ms)
    }
}

/// The monitor's reads run outside the request path's GPU lock: a read that a create overlaps
/// (it listed the created profile before the create and the rest after) must not be kept over
/// the create.
#[test]
fn a_read_overlapped_by_a_create_is_not_kept() {
    use std::sync::Arc;
    let clock = ManualClock::new();
    let api = HookedNvml {
        fake: FakeNvml::new(vec![a100(true)]),
        profile_id: 0, // 7g.40gb: listed after 1g.5gb
        hook: Default::default(),
    };
    let b = Arc::new(
        NvmlBackend::new(api, options(Path::new("/nonexistent-proc")))
            .unwrap()
            .with_clock(clock.clock()),
    );
    let total = || b.api().fake.call_total();
    let x = b.create_instance(0, "1g.5gb", 6).unwrap();
    b.cached_instances_on(0).unwrap();
    let (_, calls) = cached_read(&*b, total, 0);
    assert_eq!(calls, 0, "kept");

    clock.advance(INSTANCE_REFRESH);
    let weak = Arc::downgrade(&b);
    let made = Arc::new(std::sync::Mutex::new(None));
    let made_by_hook = made.clone();
    *b.api().hook.lock().unwrap() = Some(Box::new(move || {
        let b = weak.upgrade().unwrap();
        *made_by_hook.lock().unwrap() = Some(b.create_instance(0, "1g.5gb", 0).unwrap());
    }));
    let (overlapped, calls) = cached_read(&*b, total, 0);
    assert!(calls > 0);
    let y = made.lock().unwrap().take().expect("the hook ran");
    assert_eq!(
        gi_ids(&overlapped),
        [x.gi_id],
        "listed 1g.5gb before Y existed"
    );

    let list = b.cached_instances_on(0).unwrap();
    assert_eq!(gi_ids(&list), [y.gi_id, x.gi_id], "Y is not lost");
    assert_eq!(list, b.instances_on(0).unwrap());
}

/// The GPU facts read for the published attributes (brand, CUDA version, PCI bus and root).
mod attributes;
/// GPUs with MIG mode off kept with `--whole-gpus`.
mod whole_gpus;
/// GPUs without MIG (T4, L4, …) discovered and served whole.
mod without_mig;
