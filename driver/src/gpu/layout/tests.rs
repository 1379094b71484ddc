//! Unit tests of [`super`] (`layout.rs`): occupancy and the hardware and counter rules.

use super::*;
use crate::gpu::catalog::{builtin_models, find_model};

fn idx(model: &GpuModel, name: &str) -> usize {
    model.profile(name).unwrap().0
}

#[test]
fn masks() {
    assert_eq!(slice_mask(0, 8), 0xff);
    assert_eq!(slice_mask(6, 2), 0xc0);
    assert_eq!(slice_mask(0, 0), 0);
    assert_eq!(mask_list(0b101), "[0, 2]");
    assert_eq!(Placement { start: 6, size: 2 }.to_string(), "6:2");
}

#[test]
fn hardware_rules_follow_nvml() {
    let m = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let mut occ = Occupancy::empty(&m);
    let one = idx(&m, "1g.5gb");
    let me = idx(&m, "1g.5gb+me");
    let four = idx(&m, "4g.20gb");
    assert!(matches!(
        occ.check_hardware(&m, one, 7),
        Err(Conflict::StartNotAllowed { .. })
    ));
    occ.add(&m, four, 0);
    assert_eq!(
        occ.check_hardware(&m, one, 3),
        Err(Conflict::Overlap(0b1000))
    );
    occ.add(&m, me, 4);
    assert_eq!(
        occ.check_hardware(&m, me, 5),
        Err(Conflict::MaxInstances(1))
    );
    assert_eq!(occ.check_hardware(&m, one, 5), Ok(()));
    occ.remove(&m, me, 4);
    assert_eq!(occ.check_hardware(&m, me, 5), Ok(()));
    // A30 has two +me profiles; only one +me instance may exist (docs/reference/mig.md, "Memory slices and placements").
    let a30 = find_model("A30").unwrap().unwrap();
    let mut occ = Occupancy::empty(&a30);
    occ.add(&a30, idx(&a30, "1g.6gb+me"), 0);
    assert_eq!(
        occ.check_hardware(&a30, idx(&a30, "2g.12gb+me"), 2),
        Err(Conflict::MediaExtensionInUse)
    );
}

/// The A100-40GB "Free/Total" sequence of a public `nvidia-smi mig -lgip` capture: 4g at 0, 2g at 4, 1g at 6 → nothing fits.
#[test]
fn a100_remaining_capacity_vector() {
    let m = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let mut occ = Occupancy::empty(&m);
    occ.add(&m, idx(&m, "4g.20gb"), 0);
    occ.add(&m, idx(&m, "2g.10gb"), 4);
    occ.add(&m, idx(&m, "1g.5gb"), 6);
    for (i, p) in m.profiles.iter().enumerate() {
        for &s in &p.placement_starts {
            assert!(occ.check_hardware(&m, i, s).is_err(), "{} at {s}", p.name);
        }
    }
}

/// The counters DAS publishes accept exactly the layouts the hardware accepts: walk every
/// counter-feasible layout and check the hardware takes each step.
#[test]
fn counters_match_hardware_for_every_model() {
    for m in builtin_models().unwrap() {
        let placements = all_placements(m);
        let mut occ = Occupancy::empty(m);
        let mut seen = 0usize;
        counter_walk(m, &placements, 0, &mut occ, &mut seen);
        let mut valid = 0usize;
        for_each_layout(m, |_| {
            valid += 1;
            true
        });
        assert_eq!(
            seen, valid,
            "{}: counter layouts vs hardware layouts",
            m.name
        );
    }
}

fn counter_walk(
    m: &GpuModel,
    pl: &[(usize, u32)],
    from: usize,
    occ: &mut Occupancy,
    seen: &mut usize,
) {
    *seen += 1;
    for (i, &(p, s)) in pl.iter().enumerate().skip(from) {
        if occ.check_counters(m, p, s).is_ok() {
            assert_eq!(
                occ.check_hardware(m, p, s),
                Ok(()),
                "{}: counters accept {} at {s} on {occ:?}",
                m.name,
                m.profiles[p].name
            );
            occ.add(m, p, s);
            counter_walk(m, pl, i + 1, occ, seen);
            occ.remove(m, p, s);
        }
    }
}

#[test]
fn only_the_counters_the_hardware_rules_need_are_published() {
    for m in builtin_models().unwrap() {
        let kept = &m.published_counters;
        assert!(
            kept.contains(&das_api::counters::MEMORY),
            "{}: {kept:?}",
            m.name
        );
        assert!(kept.len() < 7, "{}: nothing dropped: {kept:?}", m.name);
        // Dropping any kept counter but `memory` lets an invalid layout through.
        for name in kept.iter().filter(|n| **n != das_api::counters::MEMORY) {
            let fewer: Vec<&'static str> = kept.iter().copied().filter(|k| k != name).collect();
            assert_eq!(counters_exact(m, &fewer), Some(false), "{}: {name}", m.name);
        }
    }
    let h100 = find_model("H100-80GB").unwrap().unwrap();
    assert_eq!(h100.published_counters, ["memory", "ofa-engines"]);
}

#[test]
fn maximal_vectors_include_full_gpu_and_seven_small() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let v = maximal_count_vectors(&m);
    let mut seven_small = vec![0; m.profiles.len()];
    seven_small[idx(&m, "1g.10gb")] = 7;
    assert!(v.contains(&seven_small));
    let mut full = vec![0; m.profiles.len()];
    full[idx(&m, "7g.80gb")] = 1;
    assert!(v.contains(&full));
}
