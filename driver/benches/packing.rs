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
//! A third table takes the same kind of streams on nodes whose GPUs are all switchable
//! (`--mig-mode-switching`, docs/design.md §7, "MIG mode follows demand"): each GPU is published
//! whole and as its MIG placements, the counters let one GPU hold a whole-GPU request or slices,
//! never both. It reports requests placed before the first rejection under DAS's order (whole
//! GPUs in index order), under the alternative of whole GPUs from the highest index down, and the
//! optimum (the best split of the GPUs into whole and MIG for the prefix), against the best
//! static split of the same GPUs on the same streams.
//!
//! Run: `cargo bench -p das-driver --features testing --bench packing` (`DAS_BENCH_SEEDS=<n>` streams per row,
//! default 500; `DAS_BENCH_ROWS=slices`, `mixed` or `switching` runs one table only). Prints Markdown
//! tables.

use std::time::Instant;

use das_api::WHOLE_GPU_PROFILE;
use das_driver::gpu::{GpuModel, find_model};
use das_driver::publish::placement::GpuView;
use das_driver::publish::placement::optimum::Optimum;
use das_driver::publish::placement::sim::{
    FirstFit, Mix, Policy, SplitMix64, WholeOrder, profile_weights, request_stream,
    with_whole_gpu_share,
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
    let all = !["slices", "mixed", "switching"].contains(&rows.as_str());
    if all || rows == "slices" {
        slices_table(seeds);
    }
    if all || rows == "mixed" {
        mixed_table(seeds);
    }
    if all || rows == "switching" {
        switching_table(seeds);
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

/// Means over the streams of one row of switchable GPUs.
struct SwitchRow {
    /// Whole GPUs (MIG mode off, the last ones) of the static split that placed the most.
    split: usize,
    /// That split: DAS order, optimum.
    static_das: f64,
    static_opt: f64,
    /// All switchable: DAS order, whole GPUs from the highest index down, optimum.
    das: f64,
    reversed: f64,
    opt: f64,
    das_opt: f64,
    /// Whole GPUs and slices placed before the first rejection (DAS order).
    whole: f64,
    slices: f64,
}

/// Mixed streams, whole-GPU requests at `percent` %, on `gpus` all switchable, and on every
/// static split of them (the first `n - k` MIG on, the last `k` MIG off) over the same streams.
fn run_switchable(gpus: &[GpuView<'_>], mix: Mix, percent: u64, seeds: u64) -> SwitchRow {
    let n = gpus.len();
    let weights = with_whole_gpu_share(&profile_weights(gpus, mix), percent);
    let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let optimum = Optimum::new(gpus).with_switchable_gpus(&indices);
    let static_optimum: Vec<Optimum> = (0..=n)
        .map(|k| Optimum::new(&gpus[..n - k]).with_whole_gpus(k))
        .collect();
    // Alike GPUs: switching then places at least what any static split places, stream by stream
    // (the slices meet their GPUs in the same order, and a GPU is left for every whole GPU).
    let alike = gpus.iter().all(|g| g.model.name == gpus[0].model.name);
    let slots = gpus
        .iter()
        .map(|g| g.model.max_gpu_instances as usize)
        .sum::<usize>()
        + 1;
    let len = (slots * 100).div_ceil(100 - percent as usize);
    let switchable = |order| {
        FirstFit::new(gpus, Policy::Das)
            .with_switchable_gpus(&indices)
            .with_whole_order(order)
    };
    // Sums over the streams: das, reversed, opt, das = opt, whole, slices; per split: das, opt.
    let mut sum = [0usize; 6];
    let mut split_sum = vec![(0usize, 0usize); n + 1];
    for seed in 0..seeds {
        let mut rng = SplitMix64::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xda5);
        let stream = request_stream(&weights, &mut rng, len);
        let mut das = switchable(WholeOrder::Index);
        let d = das.placed_before_first_rejection(&stream);
        let r = switchable(WholeOrder::Reversed).placed_before_first_rejection(&stream);
        let o = optimum.longest_feasible_prefix_from(&stream, d.max(r));
        assert!(optimum.feasible(&stream[..d.max(r)]));
        assert!(d <= o && r <= o, "seed {seed}: a policy beat the optimum");
        for (k, total) in split_sum.iter_mut().enumerate() {
            let s = FirstFit::new(&gpus[..n - k], Policy::Das)
                .with_whole_gpus(&indices[n - k..])
                .placed_before_first_rejection(&stream);
            let so = static_optimum[k].longest_feasible_prefix_from(&stream, s);
            assert!(
                so <= o,
                "seed {seed}: a static split beat switching's optimum"
            );
            assert!(
                !alike || s <= d,
                "seed {seed}: a static split beat switching"
            );
            total.0 += s;
            total.1 += so;
        }
        let row = [
            d,
            r,
            o,
            usize::from(d == o),
            das.whole_allocated(),
            das.slices_allocated(),
        ];
        for (total, v) in sum.iter_mut().zip(row) {
            *total += v;
        }
    }
    let mean = |x: usize| x as f64 / seeds as f64;
    let (split, (static_das, static_opt)) = split_sum
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(k, (das, _))| (*das, std::cmp::Reverse(*k)))
        .expect("at least the split with no whole GPU");
    SwitchRow {
        split,
        static_das: mean(static_das),
        static_opt: mean(static_opt),
        das: mean(sum[0]),
        reversed: mean(sum[1]),
        opt: mean(sum[2]),
        das_opt: 100.0 * mean(sum[3]),
        whole: mean(sum[4]),
        slices: mean(sum[5]),
    }
}

/// Nodes whose GPUs are all switchable, at two whole-GPU shares, against the best static split.
fn switching_table(seeds: u64) {
    let h100 = model("H100-SXM5-80GB");
    let h200 = model("H200-141GB");
    let scenarios: Vec<(&str, Vec<&GpuModel>, Vec<u64>)> = vec![
        ("8 × H100-SXM5-80GB", vec![&h100; 8], vec![15, 30]),
        ("4 × H100-SXM5-80GB", vec![&h100; 4], vec![15, 30]),
        // Two models: the only kind of node where the whole GPUs' order can matter.
        (
            "2 × H100-SXM5-80GB + 2 × H200-141GB",
            vec![&h100, &h100, &h200, &h200],
            vec![15],
        ),
    ];
    println!(
        "\nMixed streams on switchable GPUs (MIG mode follows demand), mean over {seeds} seeded streams"
    );
    println!(
        "per row: requests placed before the first rejection, for the static split (MIG on + MIG off)"
    );
    println!(
        "that placed the most and for all GPUs switchable (DAS order, whole GPUs from the highest index"
    );
    println!("down, optimum), with the whole GPUs and slices DAS placed.\n");
    println!(
        "| node | mix | whole-GPU share | best static split | static: DAS | static: optimum | switchable: DAS | switchable: whole GPUs high → low | switchable: optimum | DAS = opt | whole GPUs placed | slices placed |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, models, percents) in &scenarios {
        let gpus = GpuView::of_models(models);
        for percent in percents {
            for (mix, mix_name, seeds) in mixes(models.len(), seeds) {
                let r = run_switchable(&gpus, mix, *percent, seeds);
                println!(
                    "| {label} | {mix_name} | {percent} % | {} + {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} % | {:.2} | {:.2} |",
                    models.len() - r.split,
                    r.split,
                    r.static_das,
                    r.static_opt,
                    r.das,
                    r.reversed,
                    r.opt,
                    r.das_opt,
                    r.whole,
                    r.slices
                );
            }
        }
    }
}
