//! Unit tests of [`super`] (`sim.rs`).

use super::*;
use crate::gpu::find_model;

#[test]
fn prng_is_deterministic_and_in_range() {
    let mut a = SplitMix64::new(7);
    let mut b = SplitMix64::new(7);
    for _ in 0..100 {
        let x = a.below(10);
        assert_eq!(x, b.below(10));
        assert!(x < 10);
    }
}

#[test]
fn weights_skip_me_and_favour_small() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let gpus = [GpuView {
        index: 0,
        model: &m,
    }];
    let w = profile_weights(&gpus, Mix::SmallHeavy);
    assert_eq!(w.len(), 6);
    assert!(w.iter().all(|(n, _)| !n.ends_with("+me")));
    let get = |n: &str| w.iter().find(|(m, _)| m == n).unwrap().1;
    assert_eq!(get("1g.10gb"), get("1g.20gb"));
    assert!(get("1g.10gb") > get("2g.20gb") && get("4g.40gb") > get("7g.80gb"));
    let mut rng = SplitMix64::new(1);
    let s = request_stream(&w, &mut rng, 50);
    assert_eq!(s.len(), 50);
}

#[test]
fn allocator_respects_counters_and_order() {
    let m = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let gpus = [
        GpuView {
            index: 0,
            model: &m,
        },
        GpuView {
            index: 1,
            model: &m,
        },
    ];
    let mut ff = FirstFit::new(&gpus, Policy::Das);
    assert_eq!(
        ff.placed_before_first_rejection(&["7g.40gb", "7g.40gb", "1g.5gb"]),
        2
    );
    let mut ff = FirstFit::new(&gpus, Policy::DasAdaptive);
    let c = ff.allocate("1g.5gb+me").unwrap();
    assert_eq!((c.gpu, c.start), (0, 5));
    // The second +me goes to the other GPU: the OFA counter of GPU 0 is used up.
    assert_eq!(ff.allocate("1g.5gb+me").unwrap().gpu, 1);
    assert!(ff.allocate("1g.5gb+me").is_none());
    assert_eq!(ff.occupancy()[0].instances(), 1);
}

#[test]
fn whole_gpus_take_whole_gpu_requests_in_index_order() {
    let m = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let gpus = [GpuView {
        index: 1,
        model: &m,
    }];
    let mut ff = FirstFit::new(&gpus, Policy::Das).with_whole_gpus(&[3, 0]);
    assert_eq!(ff.allocate_whole(), Some(0));
    // A slice never lands on a whole GPU, a whole-GPU request never on the GPU with MIG on.
    assert_eq!(ff.allocate("7g.40gb").unwrap().gpu_index, 1);
    assert!(ff.allocate("1g.5gb").is_none());
    assert_eq!(ff.allocate_whole(), Some(3));
    assert_eq!(ff.allocate_whole(), None);
    assert_eq!(ff.whole_allocated(), 2);
    // The second whole-GPU request is the first rejection.
    let mut ff = FirstFit::new(&gpus, Policy::Das).with_whole_gpus(&[0]);
    assert_eq!(
        ff.placed_before_first_rejection(&["gpu", "3g.20gb", "4g.20gb", "gpu", "1g.5gb"]),
        3
    );
}

#[test]
fn the_whole_gpu_share_of_a_stream() {
    let w = vec![("1g.5gb".to_string(), 3), ("7g.40gb".to_string(), 1)];
    let mixed = with_whole_gpu_share(&w, 25);
    assert_eq!(
        mixed,
        [
            ("1g.5gb".to_string(), 225),
            ("7g.40gb".to_string(), 75),
            ("gpu".to_string(), 100)
        ]
    );
    let mut rng = SplitMix64::new(3);
    let s = request_stream(&mixed, &mut rng, 400);
    let whole = s.iter().filter(|r| *r == "gpu").count();
    assert!((60..140).contains(&whole), "{whole}");
}

#[test]
fn switchable_gpus_take_a_whole_gpu_request_or_slices_never_both() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let gpus = GpuView::of_models(&[&m, &m]);
    let ff = || FirstFit::new(&gpus, Policy::Das).with_switchable_gpus(&[0, 1]);
    // The whole GPU takes GPU 0, so the 7g goes to GPU 1 and the second whole GPU finds none.
    let mut a = ff();
    assert_eq!(
        a.placed_before_first_rejection(&["gpu", "7g.80gb", "gpu"]),
        2
    );
    assert_eq!((a.whole_allocated(), a.slices_allocated()), (1, 1));
    assert_eq!(a.occupancy()[0].instances(), 0);
    assert_eq!(a.occupancy()[1].instances(), 1);
    // A GPU holding a slice is not free for a whole GPU; one held whole takes no slice.
    let mut b = ff();
    assert_eq!(b.allocate("1g.10gb").unwrap().gpu_index, 0);
    assert_eq!(b.allocate_whole(), Some(1));
    assert!(b.allocate("7g.80gb").is_none());
    assert_eq!(b.allocate("4g.40gb").unwrap().gpu_index, 0);
    assert_eq!(b.allocate_whole(), None);
    assert_eq!(b.slices_allocated(), 2);
    // The alternative order takes the highest free index first.
    let mut c = ff().with_whole_order(WholeOrder::Reversed);
    assert_eq!(c.allocate_whole(), Some(1));
    assert_eq!(c.allocate("1g.10gb").unwrap().gpu_index, 0);
    assert_eq!(c.allocate_whole(), None);
}

/// GPUs offered only whole (MIG mode off, or no MIG) take whole-GPU requests before switchable
/// ones, which keep their slices for slice requests meanwhile; each kind in index order.
#[test]
fn mig_off_gpus_take_whole_requests_before_switchable_ones() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let gpus = [GpuView {
        index: 2,
        model: &m,
    }];
    // GPU 2 is switchable, GPUs 1 and 3 have MIG mode off.
    let mut ff = FirstFit::new(&gpus, Policy::Das)
        .with_whole_gpus(&[3, 1])
        .with_switchable_gpus(&[2]);
    assert_eq!(ff.allocate_whole(), Some(1));
    assert_eq!(ff.allocate_whole(), Some(3));
    // GPU 2 is still free for slices: two whole GPUs cost no MIG capacity.
    assert_eq!(ff.allocate("1g.10gb").unwrap().gpu_index, 2);
    assert_eq!(ff.allocate_whole(), None);
    // Without the slice, the third whole GPU is GPU 2.
    let mut ff = FirstFit::new(&gpus, Policy::Das)
        .with_switchable_gpus(&[2])
        .with_whole_gpus(&[3, 1]);
    assert_eq!(
        [
            ff.allocate_whole(),
            ff.allocate_whole(),
            ff.allocate_whole()
        ],
        [Some(1), Some(3), Some(2)]
    );
    assert!(ff.allocate("1g.10gb").is_none());
    // A slice first keeps GPU 2 from being taken whole.
    let mut ff = FirstFit::new(&gpus, Policy::DasAdaptive)
        .with_switchable_gpus(&[2])
        .with_whole_gpus(&[1]);
    assert_eq!(
        ff.placed_before_first_rejection(&["1g.10gb", "gpu", "gpu", "1g.10gb"]),
        2
    );
}
