//! The NVML backend with `--whole-gpus` ([`NvmlBackend::with_whole_gpus`]) on the fake NVML: GPUs
//! whose MIG mode is off are kept only with the option, after `--enable-mig-mode` had its say.

use super::*;

fn inventory_of(b: &NvmlBackend<FakeNvml>) -> Vec<(u32, bool)> {
    b.inventory()
        .unwrap()
        .iter()
        .map(|g| (g.index, g.mig_enabled))
        .collect()
}

#[test]
fn mig_off_gpus_are_kept_only_with_whole_gpus() {
    let specs = || {
        vec![
            a100(true),
            FakeGpuSpec::non_mig("Tesla T4"),
            a100(false),
            h100(false),
        ]
    };
    let without = NvmlBackend::with_whole_gpus(
        FakeNvml::new(specs()),
        options(Path::new("/nonexistent-proc")),
        false,
    )
    .unwrap();
    assert_eq!(inventory_of(&without), [(0, true)]);
    let with = NvmlBackend::with_whole_gpus(
        FakeNvml::new(specs()),
        options(Path::new("/nonexistent-proc")),
        true,
    )
    .unwrap();
    // The GPU without MIG is served whole too (`tests/without_mig.rs`). Hopper with MIG off is
    // not switched on (no --enable-mig-mode) and offers no MIG placements.
    assert_eq!(
        inventory_of(&with),
        [(0, true), (1, false), (2, false), (3, false)]
    );
    let inv = with.inventory().unwrap();
    assert!(inv[3].offers_whole_gpu() && !inv[3].offers_mig());
    assert_eq!(inv[2].model.name, "A100-SXM4-40GB");
    // NVML's `00000000:12:00.0` in the standard form of `resource.kubernetes.io/pciBusID`.
    assert_eq!(inv[2].pci_bus_id.as_deref(), Some("0000:12:00.0"));
    assert_eq!(with.gpu_indices(), [0, 1, 2, 3]);
    assert!(
        with.api()
            .calls()
            .iter()
            .all(|c| !c.starts_with("set_mig_mode"))
    );
}

#[test]
fn enable_mig_mode_comes_first_and_whole_gpus_takes_what_stays_off() {
    let fake = FakeNvml::new(vec![a100(false), h100(false)]);
    let opts = NvmlOptions {
        enable_mig_mode: true,
        ..options(Path::new("/nonexistent-proc"))
    };
    let b = NvmlBackend::with_whole_gpus(fake, opts, true).unwrap();
    assert_eq!(inventory_of(&b), [(0, false), (1, true)]);
    assert_eq!(b.api().calls(), ["set_mig_mode 1 true"]);
    // A Hopper whose switch fails (busy) stays off: served whole.
    let fake = FakeNvml::new(vec![h100(false)]);
    fake.fail_next("nvmlDeviceSetMigMode", code::IN_USE);
    let opts = NvmlOptions {
        enable_mig_mode: true,
        ..options(Path::new("/nonexistent-proc"))
    };
    let b = NvmlBackend::with_whole_gpus(fake, opts, true).unwrap();
    assert_eq!(inventory_of(&b), [(0, false)]);
}

#[test]
fn a_whole_gpu_has_no_instances_and_refuses_one() {
    let fake = FakeNvml::new(vec![h100(false), a100(true)]);
    let b =
        NvmlBackend::with_whole_gpus(fake, options(Path::new("/nonexistent-proc")), true).unwrap();
    assert!(b.instances_on(0).unwrap().is_empty());
    assert!(b.cached_instances_on(0).unwrap().is_empty());
    assert!(
        b.all_instances().unwrap().is_empty(),
        "start-up listing works"
    );
    let e = b.create_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    assert!(b.all_instances().unwrap().is_empty());
    // Someone switches MIG on behind DAS's back and makes an instance: it is listed (the health
    // monitor then withdraws the whole GPU it overlaps).
    b.api().set_mig_mode(0, true).unwrap();
    let gi = b.api().admin_create(0, 19, Placement { start: 3, size: 1 });
    let list = b.instances_on(0).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].gi_id, list[0].placement.start), (gi, 3));
    // The MIG-on GPU is untouched.
    b.create_instance(1, "1g.5gb", 0).unwrap();
    assert_eq!(b.instances_on(1).unwrap().len(), 1);
}
