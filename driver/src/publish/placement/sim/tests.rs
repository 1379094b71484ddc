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
