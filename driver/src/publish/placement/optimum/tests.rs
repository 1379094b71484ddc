//! Unit tests of [`super`] (`optimum.rs`).

use super::*;
use crate::gpu::find_model;

#[test]
fn single_h100() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let o = Optimum::new(&[GpuView {
        index: 0,
        model: &m,
    }]);
    assert!(o.feasible(&["1g.10gb"; 7]));
    assert!(!o.feasible(&["1g.10gb"; 8]));
    assert!(o.feasible(&["3g.40gb", "4g.40gb"]));
    assert!(!o.feasible(&["4g.40gb", "4g.40gb"]));
    assert!(o.feasible(&["4g.40gb", "2g.20gb", "1g.20gb"]));
    assert!(!o.feasible(&["4g.40gb", "2g.20gb", "2g.20gb"]));
    assert!(!o.feasible(&["1g.10gb+me", "1g.10gb+me"]));
    assert!(!o.feasible(&["unknown"]));
    assert_eq!(
        o.longest_feasible_prefix(&["7g.80gb", "1g.10gb", "1g.10gb"]),
        1
    );
}

#[test]
fn mixed_node_shares_profile_names() {
    // "1g.10gb" is the 2x-memory 1g on A100-40GB and the plain 1g on H100.
    let a = find_model("A100-SXM4-40GB").unwrap().unwrap();
    let h = find_model("H100-80GB").unwrap().unwrap();
    let gpus = [
        GpuView {
            index: 0,
            model: &a,
        },
        GpuView {
            index: 1,
            model: &h,
        },
    ];
    let o = Optimum::new(&gpus);
    assert!(o.feasible(&["1g.10gb"; 11]));
    assert!(!o.feasible(&["1g.10gb"; 12]));
}

#[test]
fn eight_gpus_are_fast() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let gpus: Vec<GpuView<'_>> = (0..8)
        .map(|i| GpuView {
            index: i,
            model: &m,
        })
        .collect();
    let o = Optimum::new(&gpus);
    // 16 half-GPU slots: 4g only in the lower half, 3g in either.
    let mut reqs = vec!["3g.40gb"; 10];
    reqs.extend(["4g.40gb"; 7]);
    assert!(!o.feasible(&reqs));
    reqs.pop();
    assert!(o.feasible(&reqs));
}

#[test]
fn whole_gpus_hold_one_whole_gpu_request_each_and_no_slice() {
    let m = find_model("A30").unwrap().unwrap();
    let o = Optimum::new(&[GpuView {
        index: 0,
        model: &m,
    }])
    .with_whole_gpus(2);
    assert!(o.feasible(&["gpu", "4g.24gb", "gpu"]));
    assert!(!o.feasible(&["gpu", "gpu", "gpu"]));
    // The whole GPUs take no slice.
    assert!(!o.feasible(&["4g.24gb", "4g.24gb"]));
    assert_eq!(
        o.longest_feasible_prefix(&["gpu", "1g.6gb", "gpu", "2g.12gb", "gpu", "1g.6gb"]),
        4
    );
    // Without whole GPUs, a whole-GPU request never fits.
    let none = Optimum::new(&[GpuView {
        index: 0,
        model: &m,
    }]);
    assert!(!none.feasible(&["gpu"]));
}

#[test]
fn switchable_gpus_hold_a_whole_gpu_request_or_slices() {
    let m = find_model("H100-80GB").unwrap().unwrap();
    let gpus = GpuView::of_models(&[&m, &m]);
    let both = Optimum::new(&gpus).with_switchable_gpus(&[0, 1]);
    assert!(both.feasible(&["gpu", "gpu"]));
    assert!(!both.feasible(&["gpu", "gpu", "1g.10gb"]));
    assert!(both.feasible(&["gpu", "7g.80gb"]));
    assert_eq!(both.longest_feasible_prefix(&["gpu", "7g.80gb", "gpu"]), 2);
    // The slices of a GPU that is not held whole still pack as on their own.
    assert!(both.feasible(&["gpu", "4g.40gb", "2g.20gb", "1g.20gb"]));
    assert!(!both.feasible(&["gpu", "4g.40gb", "4g.40gb"]));
    assert!(both.feasible(&["4g.40gb", "4g.40gb", "3g.40gb", "3g.40gb"]));
    // Only GPU 1 switchable: one whole GPU at most.
    let one = Optimum::new(&gpus).with_switchable_gpus(&[1]);
    assert!(one.feasible(&["gpu", "7g.80gb"]));
    assert!(!one.feasible(&["gpu", "gpu"]));
    // A GPU with MIG mode off beside a switchable one.
    let mixed = Optimum::new(&gpus[..1])
        .with_switchable_gpus(&[0])
        .with_whole_gpus(1);
    assert!(mixed.feasible(&["gpu", "1g.10gb"]));
    assert!(mixed.feasible(&["gpu", "gpu"]));
    assert!(!mixed.feasible(&["gpu", "gpu", "1g.10gb"]));
    assert!(!mixed.feasible(&["unknown"]));
}
