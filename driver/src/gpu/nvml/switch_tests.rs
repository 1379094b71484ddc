//! The NVML backend's MIG mode switches on the fake NVML (`backend/mig_mode.rs`): whether the
//! inventory allows them (the option, the architecture, a vGPU guest, a pending change), the
//! switch and the backend's copy of the GPU, and the NVML codes a switch maps.

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::gpu::catalog::find_model;
use crate::gpu::{BackendError, GpuBackend, GpuInfo, GpuModel, MigModeState, MigSwitch};

fn model(name: &str) -> Arc<GpuModel> {
    find_model(name).unwrap().unwrap()
}

fn a100(mig: bool) -> FakeGpuSpec {
    FakeGpuSpec::mig(model("A100-SXM4-40GB"), mig)
}

fn h100(mig: bool) -> FakeGpuSpec {
    FakeGpuSpec::mig(model("H100-SXM5-80GB"), mig)
}

fn options(mig_mode_switching: bool) -> NvmlOptions {
    NvmlOptions {
        proc_root: Path::new("/nonexistent-proc").to_path_buf(),
        mig_mode_switching,
        ..NvmlOptions::default()
    }
}

/// A backend with `--whole-gpus` and, with `switching`, `--mig-mode-switching`.
fn backend(fake: FakeNvml, switching: bool) -> NvmlBackend<FakeNvml> {
    NvmlBackend::with_whole_gpus(fake, options(switching), true).unwrap()
}

fn refused(g: &GpuInfo) -> &str {
    match &g.mig_switch {
        MigSwitch::Refused(why) => why,
        MigSwitch::Allowed => panic!("GPU {} allows switching", g.index),
    }
}

fn mode(current: bool, pending: bool) -> MigModeState {
    MigModeState { current, pending }
}

#[test]
fn switching_is_allowed_on_hopper_only_with_the_option() {
    let vgpu_guest = FakeGpuSpec {
        virtualization_mode: virtualization::VGPU,
        ..h100(true)
    };
    let passthrough = FakeGpuSpec {
        virtualization_mode: virtualization::PASSTHROUGH,
        ..h100(false)
    };
    let specs = || {
        vec![
            h100(true),
            h100(false),
            a100(true),
            vgpu_guest.clone(),
            passthrough.clone(),
        ]
    };
    let b = backend(FakeNvml::new(specs()), true);
    let inv = b.inventory().unwrap();
    assert_eq!(inv[0].mig_switch, MigSwitch::Allowed);
    assert_eq!(inv[1].mig_switch, MigSwitch::Allowed);
    assert!(inv[1].offers_mig() && inv[1].offers_whole_gpu());
    assert_eq!(
        refused(&inv[2]),
        "A100-SXM4-40GB (Ampere): a MIG mode change needs a GPU reset"
    );
    assert!(refused(&inv[3]).contains("vGPU guest"), "{:?}", inv[3]);
    assert_eq!(
        inv[4].mig_switch,
        MigSwitch::Allowed,
        "passthrough is no guest"
    );
    // Ampere is never asked for its virtualization mode.
    assert_eq!(b.api().call_counts()["nvmlDeviceGetVirtualizationMode"], 4);
    // The option off (the default): every GPU refuses, and NVML is not asked.
    let b = backend(FakeNvml::new(specs()), false);
    let inv = b.inventory().unwrap();
    assert!(
        inv.iter().all(|g| g.mig_switch == MigSwitch::off()),
        "{inv:?}"
    );
    assert!(!inv[1].offers_mig());
    assert!(
        !b.api()
            .call_counts()
            .contains_key("nvmlDeviceGetVirtualizationMode")
    );
}

#[test]
fn an_unreadable_virtualization_mode_or_a_pending_change_refuses() {
    let fake = FakeNvml::new(vec![h100(true), h100(true)]);
    fake.fail_next("nvmlDeviceGetVirtualizationMode", code::UNKNOWN);
    // GPU 1 has a change to off pending (a VM that could not reset it).
    fake.set_needs_reset(1, true);
    assert_eq!(
        fake.set_mig_mode(1, false).unwrap_err().code,
        code::RESET_REQUIRED
    );
    fake.set_needs_reset(1, false);
    let b = backend(fake, true);
    let inv = b.inventory().unwrap();
    assert!(
        refused(&inv[0]).starts_with("cannot read the virtualization mode"),
        "{:?}",
        inv[0]
    );
    assert_eq!(
        refused(&inv[1]),
        "a MIG mode change to off is pending a GPU reset"
    );
    // Setting the mode it has back clears the pending change, and the switch is allowed again.
    b.set_mig_mode(1, true).unwrap();
    assert_eq!(b.mig_mode(1).unwrap(), mode(true, true));
    assert_eq!(b.inventory().unwrap()[1].mig_switch, MigSwitch::Allowed);
}

#[test]
fn a_switch_off_and_on_updates_the_inventory_and_instances() {
    let b = backend(FakeNvml::new(vec![h100(true), h100(false)]), true);
    b.set_mig_mode(0, false).unwrap();
    b.set_mig_mode(1, true).unwrap();
    assert_eq!(b.mig_mode(0).unwrap(), mode(false, false));
    assert_eq!(b.api().mig_mode_of(1), mode(true, true));
    let inv = b.inventory().unwrap();
    let got: Vec<(bool, bool)> = inv
        .iter()
        .map(|g| (g.mig_enabled, g.mig_switch.allowed()))
        .collect();
    assert_eq!(got, [(false, true), (true, true)]);
    // GPU 0 now has MIG off: no instances, NOT_SUPPORTED for a create.
    assert!(b.instances_on(0).unwrap().is_empty());
    let e = b.create_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    // GPU 1 now has MIG on: a create works and is listed, the cache included.
    let s = b.create_instance(1, "1g.10gb", 0).unwrap();
    assert_eq!(b.instances_on(1).unwrap(), std::slice::from_ref(&s));
    assert_eq!(b.cached_instances_on(1).unwrap(), [s]);
    assert_eq!(
        b.api().calls()[..2],
        ["set_mig_mode 0 false", "set_mig_mode 1 true"]
    );
}

#[test]
fn in_use_and_not_supported_are_mapped_and_change_nothing() {
    let fake = FakeNvml::new(vec![h100(true), h100(true)]);
    let b = backend(fake, true);
    b.create_instance(0, "1g.10gb", 0).unwrap();
    let e = b.set_mig_mode(0, false).unwrap_err();
    assert!(matches!(e, BackendError::InUse { .. }), "{e}");
    assert!(e.to_string().contains("NVML_ERROR_IN_USE"), "{e}");
    assert_eq!(b.mig_mode(0).unwrap(), mode(true, true));
    assert!(b.inventory().unwrap()[0].mig_enabled);
    b.api()
        .fail_next("nvmlDeviceSetMigMode", code::NOT_SUPPORTED);
    let e = b.set_mig_mode(1, false).unwrap_err();
    assert!(matches!(e, BackendError::NotSupported { .. }), "{e}");
    b.api().fail_next("nvmlDeviceSetMigMode", code::GPU_IS_LOST);
    let e = b.set_mig_mode(1, false).unwrap_err();
    assert!(matches!(e, BackendError::GpuLost { .. }), "{e}");
    assert_eq!(b.mig_mode(1).unwrap(), mode(true, true));
}

#[test]
fn reset_required_is_mapped_and_leaves_the_change_pending() {
    let fake = FakeNvml::new(vec![a100(true), h100(true), h100(true)]);
    let b = backend(fake, true);
    // Ampere: the change goes pending (the activation status).
    let e = b.set_mig_mode(0, false).unwrap_err();
    assert!(matches!(e, BackendError::ResetRequired { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("MIG mode change to off is pending a GPU reset"),
        "{e}"
    );
    assert_eq!(b.mig_mode(0).unwrap(), mode(true, false));
    assert!(
        b.inventory().unwrap()[0].mig_enabled,
        "the mode now is unchanged"
    );
    // A Hopper that cannot be reset: the same, and its switch is refused from then on ...
    b.api().set_needs_reset(1, true);
    let e = b.set_mig_mode(1, false).unwrap_err();
    assert!(matches!(e, BackendError::ResetRequired { .. }), "{e}");
    assert!(e.to_string().contains("NVML_ERROR_RESET_REQUIRED"), "{e}");
    let inv = b.inventory().unwrap();
    assert!(inv[1].mig_enabled);
    assert_eq!(
        refused(&inv[1]),
        "a MIG mode change to off is pending a GPU reset"
    );
    // ... until the caller sets the mode back.
    b.set_mig_mode(1, true).unwrap();
    assert_eq!(b.inventory().unwrap()[1].mig_switch, MigSwitch::Allowed);
    // RESET_REQUIRED returned by the call itself, with nothing pending, is mapped too.
    b.api()
        .fail_next("nvmlDeviceSetMigMode", code::RESET_REQUIRED);
    let e = b.set_mig_mode(2, false).unwrap_err();
    assert!(matches!(e, BackendError::ResetRequired { .. }), "{e}");
    assert_eq!(b.mig_mode(2).unwrap(), mode(true, true));
}

#[test]
fn a_gpu_that_re_binds_with_another_minor_is_treated_as_lost_until_a_restart() {
    let b = backend(FakeNvml::new(vec![h100(false)]), true);
    b.api().set_minor(0, 5);
    let e = b.set_mig_mode(0, true).unwrap_err();
    assert!(matches!(e, BackendError::GpuLost { .. }), "{e}");
    assert!(
        e.to_string().contains("re-bound with minor 5 (was 0)"),
        "{e}"
    );
    assert!(e.to_string().contains("restart the plugin"), "{e}");
    // Its device node is wrong everywhere DAS would use it: no inventory entry (the health
    // monitor sees it lost), and every call on it fails the same way.
    assert!(
        b.inventory().unwrap().is_empty(),
        "a re-bound GPU is served"
    );
    let create = b.create_instance(0, "1g.10gb", 0).unwrap_err();
    assert!(
        matches!(create, BackendError::GpuLost { .. }) && create.to_string().contains("re-bound"),
        "{create}"
    );
    assert!(matches!(
        b.instances_on(0).unwrap_err(),
        BackendError::GpuLost { .. }
    ));
    assert!(matches!(
        b.set_mig_mode(0, false).unwrap_err(),
        BackendError::GpuLost { .. }
    ));
}
