//! Packing benchmark of the placement policy (docs/design.md §5).
//!
//! For seeded random streams of single-slice requests, counts the slices placed before the first
//! request that does not fit, under the upstream first-fit allocator walking
//!
//! - DAS's static publishing order (the default),
//! - DAS's order recomputed on the occupancy before every request (as if republished each time),
//! - plain device-name order (what a driver that does not think about order gets),
//!
//! against the offline optimum (the longest prefix of the stream the node can hold at once).
//!
//! Run: `cargo bench -p das-driver --features testing --bench packing` (`DAS_BENCH_SEEDS=<n>` streams per row,
//! default 500). Prints a Markdown table.

use std::time::Instant;

use das_driver::gpu::{GpuModel, find_model};
use das_driver::publish::placement::GpuView;
use das_driver::publish::placement::optimum::Optimum;
use das_driver::publish::placement::sim::{
    FirstFit, Mix, Policy, SplitMix64, profile_weights, request_stream,
};

struct Row {
    das: f64,
    adaptive: f64,
    name: f64,
    opt: f64,
    das_opt: f64,
    name_opt: f64,
}

fn run(gpus: &[GpuView<'_>], mix: Mix, seeds: u64) -> Row {
    let weights = profile_weights(gpus, mix);
    let optimum = Optimum::new(gpus);
    let len = gpus
        .iter()
        .map(|g| g.model.max_gpu_instances as usize)
        .sum::<usize>()
        + 1;
    let (mut das, mut adaptive, mut name, mut opt, mut das_opt, mut name_opt) = (0, 0, 0, 0, 0, 0);
    for seed in 0..seeds {
        let mut rng = SplitMix64::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xda5);
        let stream = request_stream(&weights, &mut rng, len);
        let d = FirstFit::new(gpus, Policy::Das).placed_before_first_rejection(&stream);
        let a = FirstFit::new(gpus, Policy::DasAdaptive).placed_before_first_rejection(&stream);
        let n = FirstFit::new(gpus, Policy::NameOrder).placed_before_first_rejection(&stream);
        let o = optimum.longest_feasible_prefix_from(&stream, d.max(a).max(n));
        assert!(optimum.feasible(&stream[..d.max(a).max(n)]));
        assert!(
            d <= o && a <= o && n <= o,
            "seed {seed}: a policy beat the optimum"
        );
        das += d;
        adaptive += a;
        name += n;
        opt += o;
        das_opt += usize::from(d == o);
        name_opt += usize::from(n == o);
    }
    let mean = |x: usize| x as f64 / seeds as f64;
    Row {
        das: mean(das),
        adaptive: mean(adaptive),
        name: mean(name),
        opt: mean(opt),
        das_opt: 100.0 * mean(das_opt),
        name_opt: 100.0 * mean(name_opt),
    }
}

/// The mixes a row runs and the share of the streams: the offline optimum over 16 GPUs takes
/// about a second per uniform stream and several per small-heavy one (500 small-heavy streams
/// did not finish in 15 minutes), so that row runs the uniform mix over a fifth of the streams;
/// `make bench-packing` measures both mixes on the same 16 GPUs over fewer streams.
fn mixes(gpus: usize, seeds: u64) -> Vec<(Mix, &'static str, u64)> {
    if gpus > 8 {
        vec![(Mix::Uniform, "uniform", seeds.div_ceil(5))]
    } else {
        vec![
            (Mix::Uniform, "uniform", seeds),
            (Mix::SmallHeavy, "small-heavy", seeds),
        ]
    }
}

fn model(name: &str) -> std::sync::Arc<GpuModel> {
    find_model(name)
        .expect("embedded GPU models load")
        .unwrap_or_else(|| panic!("no GPU model {name}"))
}

fn main() {
    let seeds: u64 = std::env::var("DAS_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let h100 = model("H100-SXM5-80GB");
    let a100 = model("A100-SXM4-40GB");
    let a30 = model("A30-24GB");
    let scenarios: Vec<(&str, Vec<&GpuModel>)> = vec![
        ("1 × H100-SXM5-80GB", vec![&h100]),
        ("8 × H100-SXM5-80GB", vec![&h100; 8]),
        // The 16 GPUs of `make bench-packing`'s cluster (8 nodes × 2) as one node: what the
        // real scheduler places there when it fills one node before the next. Uniform mix, a
        // fifth of the streams (see `mixes`).
        ("16 × H100-SXM5-80GB", vec![&h100; 16]),
        ("4 × A100-SXM4-40GB", vec![&a100; 4]),
        ("4 × A30-24GB", vec![&a30; 4]),
        (
            "2 × A100-40GB + 2 × H100-80GB",
            vec![&a100, &a100, &h100, &h100],
        ),
    ];
    println!(
        "Slices placed before the first rejection, mean over {seeds} seeded streams per row ({} on 16 GPUs)",
        seeds.div_ceil(5)
    );
    println!("(first-fit allocator; optimum = longest prefix the node can hold at once).\n");
    println!(
        "| node | mix | DAS order | DAS adaptive | name order | optimum | DAS = opt | name = opt |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let started = Instant::now();
    for (label, models) in &scenarios {
        let gpus = GpuView::of_models(models);
        for (mix, mix_name, seeds) in mixes(models.len(), seeds) {
            let r = run(&gpus, mix, seeds);
            println!(
                "| {label} | {mix_name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} % | {:.0} % |",
                r.das, r.adaptive, r.name, r.opt, r.das_opt, r.name_opt
            );
        }
    }
    println!("\n({:.1} s)", started.elapsed().as_secs_f64());
}
