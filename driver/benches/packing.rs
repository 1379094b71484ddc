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
//! A second table takes mixed streams (whole GPUs and slices) on nodes whose GPUs are part MIG
//! on, part MIG off (`--whole-gpus`, docs/design.md §7, "Whole GPUs"): MIG mode is static, so a
//! whole-GPU request can only land on a GPU with MIG off, a slice only on one with MIG on. It
//! reports requests placed before the first rejection (either kind) against the optimum, which
//! kind was rejected first, and the slices placed before the first rejected slice (whole-GPU
//! requests that find no GPU wait without stopping the stream) against the optimum, to show that
//! slices still pack as tightly beside whole GPUs.
//!
//! Run: `cargo bench -p das-driver --features testing --bench packing` (`DAS_BENCH_SEEDS=<n>` streams per row,
//! default 500; `DAS_BENCH_ROWS=slices` or `mixed` runs one table only). Prints Markdown tables.

use std::time::Instant;

use das_api::WHOLE_GPU_PROFILE;
use das_driver::gpu::{GpuModel, find_model};
use das_driver::publish::placement::GpuView;
use das_driver::publish::placement::optimum::Optimum;
use das_driver::publish::placement::sim::{
    FirstFit, Mix, Policy, SplitMix64, profile_weights, request_stream, with_whole_gpu_share,
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

/// Means over the streams of one mixed row.
struct MixedRow {
    das: f64,
    name: f64,
    opt: f64,
    das_opt: f64,
    /// Share of the streams whose first rejection (DAS order) was a whole-GPU request [%].
    whole_first: f64,
    /// Whole GPUs placed before the first rejection (DAS order).
    whole: f64,
    /// Slices placed before the first rejected slice: DAS order, name order, optimum.
    slices_das: f64,
    slices_name: f64,
    slices_opt: f64,
}

/// Mixed streams on `mig` (GPUs with MIG on) beside `whole` GPUs with MIG off (indices after
/// them), whole-GPU requests at `percent` % of the stream.
fn run_mixed(mig: &[GpuView<'_>], whole: u32, mix: Mix, percent: u64, seeds: u64) -> MixedRow {
    let weights = with_whole_gpu_share(&profile_weights(mig, mix), percent);
    let whole_indices: Vec<u32> = (mig.len() as u32..mig.len() as u32 + whole).collect();
    let slice_optimum = Optimum::new(mig);
    let optimum = slice_optimum.clone().with_whole_gpus(whole as usize);
    // Long enough that the slices alone can exceed what the GPUs with MIG on hold.
    let slots = mig
        .iter()
        .map(|g| g.model.max_gpu_instances as usize)
        .sum::<usize>()
        + whole as usize
        + 1;
    let len = (slots * 100).div_ceil(100 - percent as usize);
    let ff = |policy| FirstFit::new(mig, policy).with_whole_gpus(&whole_indices);
    // Sums over the streams, in MixedRow's order.
    let mut sum = [0usize; 9];
    for seed in 0..seeds {
        let mut rng = SplitMix64::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xda5);
        let stream = request_stream(&weights, &mut rng, len);
        let mut das = ff(Policy::Das);
        let d = das.placed_before_first_rejection(&stream);
        let n = ff(Policy::NameOrder).placed_before_first_rejection(&stream);
        let o = optimum.longest_feasible_prefix_from(&stream, d.max(n));
        assert!(optimum.feasible(&stream[..d.max(n)]));
        assert!(d <= o && n <= o, "seed {seed}: a policy beat the optimum");
        let rejected_whole = stream.get(d).is_some_and(|r| r == WHOLE_GPU_PROFILE);
        // The slices alone: whole-GPU requests never touch a GPU with MIG on.
        let slices: Vec<&String> = stream.iter().filter(|r| *r != WHOLE_GPU_PROFILE).collect();
        let sd = FirstFit::new(mig, Policy::Das).placed_before_first_rejection(&slices);
        let sn = FirstFit::new(mig, Policy::NameOrder).placed_before_first_rejection(&slices);
        let so = slice_optimum.longest_feasible_prefix_from(&slices, sd.max(sn));
        assert!(
            sd <= so && sn <= so,
            "seed {seed}: a policy beat the optimum"
        );
        let row = [
            d,
            n,
            o,
            usize::from(d == o),
            usize::from(rejected_whole),
            das.whole_allocated(),
            sd,
            sn,
            so,
        ];
        for (total, v) in sum.iter_mut().zip(row) {
            *total += v;
        }
    }
    let mean = |x: usize| x as f64 / seeds as f64;
    MixedRow {
        das: mean(sum[0]),
        name: mean(sum[1]),
        opt: mean(sum[2]),
        das_opt: 100.0 * mean(sum[3]),
        whole_first: 100.0 * mean(sum[4]),
        whole: mean(sum[5]),
        slices_das: mean(sum[6]),
        slices_name: mean(sum[7]),
        slices_opt: mean(sum[8]),
    }
}

fn main() {
    let seeds: u64 = std::env::var("DAS_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let rows = std::env::var("DAS_BENCH_ROWS").unwrap_or_default();
    let started = Instant::now();
    if rows != "mixed" {
        slices_table(seeds);
    }
    if rows != "slices" {
        mixed_table(seeds);
    }
    println!("\n({:.1} s)", started.elapsed().as_secs_f64());
}

fn slices_table(seeds: u64) {
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
}

/// Nodes whose GPUs are part MIG on (listed), part MIG off (a count, indices after them), with
/// the share of whole-GPU requests in the stream [%], chosen so that either kind runs out first
/// in a fair share of the streams.
fn mixed_table(seeds: u64) {
    let h100 = model("H100-SXM5-80GB");
    let a100 = model("A100-SXM4-40GB");
    let scenarios: Vec<(&str, Vec<&GpuModel>, u32, u64)> = vec![
        ("8 × H100-SXM5-80GB: 6 MIG + 2 whole", vec![&h100; 6], 2, 15),
        ("4 × A100-SXM4-40GB: 2 MIG + 2 whole", vec![&a100; 2], 2, 30),
        (
            "2 × A100-40GB + 2 × H100-80GB: 3 MIG (A100, A100, H100) + 1 whole",
            vec![&a100, &a100, &h100],
            1,
            15,
        ),
    ];
    println!(
        "\nMixed streams (whole GPUs and slices; MIG mode static), mean over {seeds} seeded streams per row:"
    );
    println!(
        "requests placed before the first rejection of either kind, the share of streams whose first"
    );
    println!("rejection was a whole GPU, and the slices placed before the first rejected slice.\n");
    println!(
        "| node | mix | whole-GPU share | DAS order | name order | optimum | DAS = opt | first rejection a whole GPU | whole GPUs placed | slices: DAS | slices: name | slices: optimum |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, models, whole, percent) in &scenarios {
        let gpus = GpuView::of_models(models);
        for (mix, mix_name, seeds) in mixes(models.len(), seeds) {
            let r = run_mixed(&gpus, *whole, mix, *percent, seeds);
            println!(
                "| {label} | {mix_name} | {percent} % | {:.2} | {:.2} | {:.2} | {:.0} % | {:.0} % | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.das,
                r.name,
                r.opt,
                r.das_opt,
                r.whole_first,
                r.whole,
                r.slices_das,
                r.slices_name,
                r.slices_opt
            );
        }
    }
}
