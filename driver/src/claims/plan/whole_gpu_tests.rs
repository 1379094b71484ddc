//! Unit tests of the transaction's rules about whole GPUs ([`super`], [`super::spec`]): a whole
//! GPU overlaps every placement of its GPU, is never matched to a live instance, and takes
//! every free placement and no instance count. (The whole-GPU kind's own checks are tested in
//! `crate::claims::kinds::whole_gpu`.)

use std::collections::BTreeMap;

use das_api::WHOLE_GPU_PROFILE;

use super::*;
use crate::claims::testing::planned_on;
use crate::gpu::{Placement, find_model};

fn live(gpu: u32, profile: &str, start: u32, size: u32, gi: u32) -> MigInstance {
    MigInstance {
        gpu_index: gpu,
        gpu_uuid: format!("GPU-{gpu}"),
        gpu_minor: gpu,
        profile: profile.into(),
        profile_id: 19,
        placement: Placement { start, size },
        gi_id: gi,
        ci_id: 0,
        mig_uuid: format!("MIG-{gi}"),
        gi_cap_minor: 3 + 9 * gi,
        ci_cap_minor: 4 + 9 * gi,
        created_by_das: Some(true),
    }
}

fn holding(uid: &str, devices: Vec<RecordedDevice>) -> Checkpoint {
    let mut cp = Checkpoint::new("boot");
    cp.set_completed(uid, "ns", uid, devices, BTreeMap::new());
    cp
}

/// The isolation rule, both ways: a whole GPU blocks every MIG instance of its GPU and is blocked by
/// any of them; other GPUs are not concerned.
#[test]
fn a_whole_gpu_and_every_slice_of_its_gpu_hold_each_other() {
    let cp = holding("uid-whole", vec![record(&planned_on(0, None, "gpu"))]);
    for start in [0, 3, 6] {
        let slice = planned_on(0, Some(start), "gpu");
        assert_eq!(
            placement_holders(&cp, "uid-new", std::slice::from_ref(&slice)),
            BTreeMap::from([("uid-whole".to_string(), slice.device.clone())])
        );
    }
    assert!(placement_holders(&cp, "uid-new", &[planned_on(1, Some(6), "gpu")]).is_empty());
    let cp = holding("uid-slice", vec![record(&planned_on(0, Some(6), "gpu"))]);
    assert_eq!(
        placement_holders(&cp, "uid-new", &[planned_on(0, None, "gpu")]),
        BTreeMap::from([("uid-slice".to_string(), "gpu-0".to_string())])
    );
    assert!(placement_holders(&cp, "uid-new", &[planned_on(1, None, "gpu")]).is_empty());
}

/// A whole GPU's record holds no instance: it never matches a live one (not even one at start
/// 0 covering the GPU), so the instance is unclaimed, an orphan if DAS made it, and the
/// record's entry is taken from the published device's minor.
#[test]
fn a_whole_gpu_is_never_matched_to_a_live_instance() {
    let d = record(&planned_on(0, None, "gpu"));
    assert_eq!((d.kind, d.instance.clone()), (DeviceKind::WholeGpu, None));
    let mut full = live(0, WHOLE_GPU_PROFILE, 0, 8, 1);
    assert!(!is_instance(&d, &full));
    full.profile = "7g.40gb".into();
    assert_eq!(
        match_devices(std::slice::from_ref(&d), &[full.clone()], |_| false),
        [None]
    );
    let cp = holding("uid-whole", vec![d.clone()]);
    assert_eq!(unclaimed(&[full.clone()], &cp), [full.clone()]);
    assert_eq!(orphans(&[full.clone()], &cp, false).destroy, [full.clone()]);
    assert_eq!(
        holdings(std::slice::from_ref(&d), &[Some(full)], |_| Some(4)),
        [Some(Holding::WholeGpu { minor: 4 })]
    );
    assert_eq!(holdings(&[d], &[None], |_| None), [None]);
}

/// A GPU held whole has no free placement and no MIG instance; its memory slices are all in use.
#[test]
fn a_gpu_held_whole_has_no_free_placement_and_no_instance() {
    let model = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let whole = record(&planned_on(0, None, "gpu"));
    let free = free_placements(&model, std::iter::once(&whole));
    assert!(free.iter().all(|(_, n)| *n == 0), "{free:?}");
    assert_eq!(free.len(), model.profiles.len());
    let use_ = per_gpu(std::iter::once(&whole));
    assert_eq!(
        use_[&0],
        GpuUse {
            instances: 0,
            memory_slices: 8
        }
    );
}

/// A claim with a whole GPU and a MIG instance in one request: each gets its CDI device, numbered in
/// allocation order across both kinds.
#[test]
fn spec_devices_number_whole_gpus_and_slices_alike() {
    let p = [planned_on(1, None, "a"), planned_on(0, Some(6), "a/x")];
    let s = live(0, "1g.5gb", 6, 1, 2);
    let devices = [record(&p[0]), with_instance(&record(&p[1]), &s)];
    let held = [Holding::WholeGpu { minor: 1 }, Holding::Instance(s)];
    let specs = spec_devices(&devices, &held, 508, &[]);
    assert_eq!(specs.len(), 2);
    assert_eq!(specs[0].key, "gpu-1");
    assert!(specs[0].instances.is_empty());
    assert_eq!(
        (
            specs[0].gpus[0].gpu_uuid.as_str(),
            specs[0].gpus[0].minor,
            specs[0].gpus[0].index
        ),
        ("GPU-1", 1, 0)
    );
    assert!(specs[1].gpus.is_empty());
    assert_eq!(
        (
            specs[1].instances[0].request.as_str(),
            specs[1].instances[0].index
        ),
        ("a", 1)
    );
}
