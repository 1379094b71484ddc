//! Unit tests of [`super`] (`mod.rs`).

use super::sim::{FirstFit, Policy};
use super::*;
use crate::gpu::find_model;
use std::sync::Arc;

fn model(name: &str) -> Arc<GpuModel> {
    find_model(name).unwrap().unwrap()
}

fn starts_of(order: &[Candidate], gpus: &[GpuView<'_>], gpu: usize, profile: &str) -> Vec<u32> {
    order
        .iter()
        .filter(|c| c.gpu == gpu && c.profile_of(gpus).name == profile)
        .map(|c| c.start)
        .collect()
}

#[test]
fn eight_slice_order_is_small_high_large_low() {
    let m = model("H100-80GB");
    let gpus = [GpuView {
        index: 0,
        model: &m,
    }];
    let order = publish_order(&gpus);
    // 1g at 6 would strand slice 7, so 5 and 4 come first.
    assert_eq!(
        starts_of(&order, &gpus, 0, "1g.10gb"),
        vec![5, 4, 6, 3, 2, 1, 0]
    );
    assert_eq!(starts_of(&order, &gpus, 0, "1g.20gb"), vec![6, 4, 2, 0]);
    assert_eq!(starts_of(&order, &gpus, 0, "2g.20gb"), vec![4, 2, 0]);
    assert_eq!(starts_of(&order, &gpus, 0, "3g.40gb"), vec![4, 0]);
    assert_eq!(starts_of(&order, &gpus, 0, "7g.80gb"), vec![0]);
    // Every placement of every profile is published exactly once.
    assert_eq!(order.len(), 7 + 7 + 4 + 3 + 2 + 1 + 1);
    // Small profiles are listed before large ones.
    assert_eq!(order[0].profile_of(&gpus).name, "1g.10gb");
    assert_eq!(order.last().unwrap().profile_of(&gpus).name, "7g.80gb");
}

#[test]
fn other_grids_follow_the_same_shape() {
    let a30 = model("A30");
    let rtx = model("RTX-PRO-6000");
    let gpus = [
        GpuView {
            index: 0,
            model: &a30,
        },
        GpuView {
            index: 1,
            model: &rtx,
        },
    ];
    let order = publish_order(&gpus);
    assert_eq!(starts_of(&order, &gpus, 0, "1g.6gb"), vec![3, 2, 1, 0]);
    assert_eq!(starts_of(&order, &gpus, 0, "2g.12gb"), vec![2, 0]);
    assert_eq!(starts_of(&order, &gpus, 1, "1g.24gb"), vec![9, 6, 3, 0]);
    assert_eq!(starts_of(&order, &gpus, 1, "2g.48gb"), vec![6, 0]);
    // GPU 0's devices come before GPU 1's.
    let first_gpu1 = order.iter().position(|c| c.gpu == 1).unwrap();
    assert!(order[..first_gpu1].iter().all(|c| c.gpu == 0));
}

/// NVIDIA DRA driver issue #933 (kubernetes-sigs/dra-driver-nvidia-gpu): 1g at 0, 1, 5 on H100 leaves four slices free but
/// blocks 3g and 4g. Three 1g requests under DAS's order must not do that.
#[test]
fn three_1g_keep_3g_and_4g_placeable() {
    let m = model("H100-80GB");
    let gpus = [GpuView {
        index: 0,
        model: &m,
    }];
    let mut ff = FirstFit::new(&gpus, Policy::Das);
    let got: Vec<u32> = (0..3)
        .map(|_| ff.allocate("1g.10gb").unwrap().start)
        .collect();
    assert_eq!(got, vec![5, 4, 6]);
    let mut with_4g = ff.clone();
    assert_eq!(with_4g.allocate("4g.40gb").map(|c| c.start), Some(0));
    assert_eq!(ff.allocate("3g.40gb").map(|c| c.start), Some(0));
}

/// Two 1g then a 1g with twice the memory: the pair lands at 6:2, not in the 4g's slices.
#[test]
fn small_mix_leaves_the_4g_region_alone() {
    let m = model("H100-80GB");
    let gpus = [GpuView {
        index: 0,
        model: &m,
    }];
    let mut ff = FirstFit::new(&gpus, Policy::Das);
    assert_eq!(
        ff.placed_before_first_rejection(&["1g.10gb", "1g.10gb", "1g.20gb", "4g.40gb"]),
        4
    );
    assert_eq!(ff.occupancy()[0].used_slices(), 0xff);
}

#[test]
fn name_order_strands_4g_where_das_does_not() {
    let m = model("H100-80GB");
    let gpus = [GpuView {
        index: 0,
        model: &m,
    }];
    let mut naive = FirstFit::new(&gpus, Policy::NameOrder);
    let got: Vec<u32> = (0..3)
        .map(|_| naive.allocate("1g.10gb").unwrap().start)
        .collect();
    assert_eq!(got, vec![0, 1, 2]);
    assert!(naive.allocate("4g.40gb").is_none());
}

/// After k small slices the large one must still fit whenever the optimum can hold k small
/// slices and the large one together: DAS fills the memory slices beside the 4g first.
#[test]
fn small_slices_keep_4g_placeable_as_long_as_possible() {
    for (name, small, large) in [
        ("A100-SXM4-40GB", "1g.5gb", "4g.20gb"),
        ("A100-SXM4-40GB", "1g.10gb", "4g.20gb"),
        ("H100-80GB", "1g.10gb", "4g.40gb"),
        ("H100-80GB", "2g.20gb", "4g.40gb"),
        ("H200", "1g.18gb", "4g.71gb"),
        ("A30", "1g.6gb", "2g.12gb"),
    ] {
        let m = model(name);
        let gpus = [GpuView {
            index: 0,
            model: &m,
        }];
        let best = super::optimum::Optimum::new(&gpus);
        let k_opt = (0..8)
            .take_while(|&k| {
                let mut demand = vec![small; k];
                demand.push(large);
                best.feasible(&demand)
            })
            .count();
        let mut ff = FirstFit::new(&gpus, Policy::Das);
        let mut k_das = 0;
        while ff.allocate(small).is_some() && ff.clone().allocate(large).is_some() {
            k_das += 1;
        }
        assert!(k_opt >= 2, "{name}: {k_opt}");
        assert_eq!(k_das + 1, k_opt, "{name}: {small} then {large}");
    }
}

/// `1g.10gb` is 2 of 8 memory slices on A100-40GB and 1 of 8 on H100-80GB. Its devices are
/// merged across the two models by damage, whatever the GPUs' indices; the old GPU-major
/// order listed all of GPU 0's first (A100 6, 4, 2, 0, then the H100's).
#[test]
fn shared_profile_is_merged_across_models_by_damage() {
    let a100 = model("A100-SXM4-40GB");
    let h100 = model("H100-80GB");
    let expected = [
        ("A100", 6),
        ("H100", 5),
        ("H100", 4),
        ("A100", 4),
        ("H100", 6),
        ("H100", 3),
        ("H100", 2),
        ("H100", 1),
        ("H100", 0),
        ("A100", 2),
        ("A100", 0),
    ];
    for (first, second) in [(&a100, &h100), (&h100, &a100)] {
        let gpus = [
            GpuView {
                index: 0,
                model: first,
            },
            GpuView {
                index: 1,
                model: second,
            },
        ];
        let order = publish_order(&gpus);
        let got: Vec<(&str, u32)> = order
            .iter()
            .filter(|c| c.profile_of(&gpus).name == "1g.10gb")
            .map(|c| (&gpus[c.gpu].model.name[..4], c.start))
            .collect();
        assert_eq!(got, expected);
        // Profiles of one model only keep their places: GPU-major, as on one GPU.
        let own = |gpu: usize| -> Vec<Candidate> {
            order
                .iter()
                .copied()
                .filter(|c| c.gpu == gpu && c.profile_of(&gpus).name != "1g.10gb")
                .collect()
        };
        let first_other = order
            .iter()
            .position(|c| c.gpu == 1 && c.profile_of(&gpus).name != "1g.10gb")
            .unwrap();
        assert!(own(0).iter().all(|c| order[..first_other].contains(c)));
    }
}

/// On 2 × A100-40GB + 2 × H100-80GB the second GPU of each model gets `1g.10gb` only when the
/// first GPUs of both are full, and a stream that filled both A100s under the old order
/// (`1g.5gb` rejected after 6) now fits.
#[test]
fn shared_profile_fills_first_gpus_of_every_model_first() {
    let a100 = model("A100-SXM4-40GB");
    let h100 = model("H100-80GB");
    let gpus: Vec<GpuView<'_>> = [&a100, &a100, &h100, &h100]
        .into_iter()
        .enumerate()
        .map(|(i, m)| GpuView {
            index: i as u32,
            model: m,
        })
        .collect();
    let gpus_of_1g: Vec<usize> = publish_order(&gpus)
        .iter()
        .filter(|c| c.profile_of(&gpus).name == "1g.10gb")
        .map(|c| c.gpu)
        .collect();
    let last_first_gpu = gpus_of_1g.iter().rposition(|&g| g == 0 || g == 2);
    let first_second_gpu = gpus_of_1g.iter().position(|&g| g == 1 || g == 3);
    assert!(last_first_gpu < first_second_gpu);
    let stream = [
        "1g.10gb", "1g.10gb", "3g.20gb", "1g.10gb", "3g.20gb", "1g.10gb", "1g.5gb",
    ];
    let mut ff = FirstFit::new(&gpus, Policy::Das);
    assert_eq!(ff.placed_before_first_rejection(&stream), stream.len());
}

#[test]
fn occupancy_order_puts_fitting_placements_first() {
    let m = model("H100-80GB");
    let gpus = [GpuView {
        index: 0,
        model: &m,
    }];
    let mut occ = vec![Occupancy::empty(&m)];
    let (three, _) = m.profile("3g.40gb").unwrap();
    occ[0].add(&m, three, 4);
    let order = order_for_occupancy(&gpus, &occ);
    assert_eq!(starts_of(&order, &gpus, 0, "1g.10gb")[0], 3);
    assert_eq!(starts_of(&order, &gpus, 0, "3g.40gb"), vec![0, 4]);
}

/// GPUs offered only whole (no MIG placement in the order: no MIG, or MIG mode off) come
/// first, in index order; a switchable GPU's whole device follows the devices of its GPU and of
/// the lower ones; the MIG devices keep their order.
#[test]
fn whole_gpus_go_first_unless_their_gpu_also_offers_slices() {
    let h = model("H100-80GB");
    let gpus = [
        GpuView {
            index: 1,
            model: &h,
        },
        GpuView {
            index: 3,
            model: &h,
        },
    ];
    let mig = publish_order(&gpus);
    // 0, 2 and 4 are offered only whole; 1 and 3 also as MIG placements (switchable).
    let listed = with_whole_gpus(mig.clone(), &[4, 3, 0, 2, 1]);
    assert_eq!(listed.len(), mig.len() + 5);
    assert_eq!(
        listed[..3],
        [
            Listed::WholeGpu { gpu_index: 0 },
            Listed::WholeGpu { gpu_index: 2 },
            Listed::WholeGpu { gpu_index: 4 }
        ]
    );
    let at = |i: u32| {
        listed
            .iter()
            .position(|l| *l == Listed::WholeGpu { gpu_index: i })
            .unwrap()
    };
    let last_mig_of = |i: u32| {
        listed
            .iter()
            .rposition(|l| matches!(l, Listed::Mig(c) if c.gpu_index == i))
            .unwrap()
    };
    assert_eq!(at(1), last_mig_of(1) + 1);
    assert_eq!(listed[at(1) + 1].gpu_index(), 3);
    assert_eq!(at(3), listed.len() - 1);
    // The MIG devices keep their order.
    let kept: Vec<Candidate> = listed
        .iter()
        .filter_map(|l| match l {
            Listed::Mig(c) => Some(*c),
            Listed::WholeGpu { .. } => None,
        })
        .collect();
    assert_eq!(kept, mig);
    assert_eq!(
        with_whole_gpus(Vec::new(), &[1, 0]),
        [
            Listed::WholeGpu { gpu_index: 0 },
            Listed::WholeGpu { gpu_index: 1 }
        ]
    );
}

#[test]
fn first_fit_on_switchable_gpus_against_the_optimum() {
    use super::optimum::Optimum;
    use super::sim::WholeOrder;
    let h = model("H100-80GB");
    let gpus = GpuView::of_models(&[&h, &h]);
    let optimum = Optimum::new(&gpus).with_switchable_gpus(&[0, 1]);
    let placed = |stream: &[&str], order| {
        FirstFit::new(&gpus, Policy::Das)
            .with_switchable_gpus(&[0, 1])
            .with_whole_order(order)
            .placed_before_first_rejection(stream)
    };
    // Whole GPUs and 7g each need a GPU of their own.
    let stream = ["gpu", "7g.80gb", "gpu"];
    assert_eq!(placed(&stream, WholeOrder::Index), 2);
    assert_eq!(optimum.longest_feasible_prefix(&stream), 2);
    // First fit puts 2g at 4, then 2 (small profiles from the high slices down), so the 3g finds
    // neither of its starts (0, 4) free on GPU 0 and takes GPU 1, which the whole GPU needed;
    // the optimum puts the 2g at 0 and 2 and the 3g at 4. Either whole order, as the GPUs are
    // alike.
    let stream = ["2g.20gb", "2g.20gb", "3g.40gb", "gpu"];
    assert_eq!(placed(&stream, WholeOrder::Index), 3);
    assert_eq!(placed(&stream, WholeOrder::Reversed), 3);
    assert_eq!(optimum.longest_feasible_prefix(&stream), 4);
    // With the whole GPU first, the slices have one GPU and first fit loses the 3g there.
    let stream = ["gpu", "2g.20gb", "2g.20gb", "3g.40gb"];
    assert_eq!(placed(&stream, WholeOrder::Index), 3);
    assert_eq!(optimum.longest_feasible_prefix(&stream), 4);
    // A static split (GPU 0 MIG on, GPU 1 off) holds one of each kind; switching two of either.
    let stream = ["gpu", "gpu"];
    assert_eq!(placed(&stream, WholeOrder::Index), 2);
    let static_split = |stream: &[&str]| {
        FirstFit::new(&gpus[..1], Policy::Das)
            .with_whole_gpus(&[1])
            .placed_before_first_rejection(stream)
    };
    assert_eq!(static_split(&stream), 1);
    let stream = ["7g.80gb", "7g.80gb"];
    assert_eq!(placed(&stream, WholeOrder::Index), 2);
    assert_eq!(static_split(&stream), 1);
}
