//! Benchmark: memory slices of whole GPUs packed through the real scheduler (docs/design.md §7,
//! "Memory slices of a whole GPU"; KEP-5075 consumable capacity).
//!
//! A local cluster of 4 hollow nodes × 2 emulated L4s (no MIG; 23034 MiB each as NVML reports
//! it), DAS installed from the chart with `sharing.profiles={gpu}` and whole GPUs: each GPU is
//! published whole (`gpu-<i>`) and as its shareable device `gpu-<i>-shared` (`shares` 4,
//! `memory` the GPU's in 256 MiB steps). For seeded random streams of memory requests (one share
//! each of 1, 2, 4, 6, 8 or 12 GiB; two mixes: small requests likelier, where the GPUs' 4 shares
//! run out first, and large ones likelier, where their memory does), pods are submitted one at a time,
//! each after the previous one is bound, until the first pod the scheduler finds unschedulable.
//! Reported per row, mean over the streams:
//!
//! - pods the real scheduler placed (kube-scheduler's DynamicResources plugin over the shareable
//!   devices' consumable capacity), and the GiB they hold;
//! - the offline optimum: the longest prefix of the stream the 8 GPUs can hold at once (exact
//!   bin packing of the prefix into 8 GPUs of 23034 MiB and 4 shares each, by a memoized search);
//! - first fit over the GPUs in index order, as if they were one node;
//! - what exclusive whole GPUs would hold of the same stream: one pod per GPU, 8.
//!
//! Run: `make bench-memory-packing` (`DAS_BENCH_SEEDS=<n>` streams, default 4). Debug binaries:
//! what is measured is where the scheduler puts pods, not how fast.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use das_e2e::install::{self, Binaries};
use das_e2e::workload::{NS, bound_or_unschedulable, create_pod, delete_pods_and_claims};
use das_e2e::{Cluster, ClusterConfig, chart};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

const NODES: usize = 4;
const GPUS_PER_NODE: usize = 2;
const GPUS: usize = NODES * GPUS_PER_NODE;
/// NVML's total memory of an L4 (`driver/data/gpus/l4.toml`), what its shareable device offers.
const GPU_MIB: u64 = 23034;
/// The `shares` of each shareable device (`sharing.sharesPerSlice`, default): every share
/// consumes 1, so a GPU holds at most this many.
const SHARES_PER_GPU: usize = 4;
/// Request sizes (GiB) and their weights in the small-heavy mix: smaller requests likelier, as
/// inference replicas are; the GPUs' 4 shares run out before their memory.
const SIZES: [(u64, u64); 6] = [(1, 4), (2, 4), (4, 3), (6, 2), (8, 2), (12, 1)];
/// The weights of the same sizes in the large-heavy mix: the GPUs' memory runs out first, so
/// how requests are packed decides how many fit.
const LARGE_HEAVY: [u64; 6] = [1, 1, 2, 3, 3, 3];
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(60);

/// A seeded stream of `n` request sizes in GiB, the sizes of [`SIZES`] drawn with `weights`
/// (SplitMix64, as the slice benchmarks draw).
fn stream(seed: u64, n: usize, weights: &[u64; 6]) -> Vec<u64> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let total: u64 = weights.iter().sum();
    (0..n)
        .map(|_| {
            let mut r = next() % total;
            SIZES
                .iter()
                .zip(weights)
                .find(|(_, w)| {
                    let hit = r < **w;
                    r = r.saturating_sub(**w);
                    hit
                })
                .map_or(1, |((gib, _), _)| *gib)
        })
        .collect()
}

/// Whether `items` (GiB, each one of [`SIZES`]) fit into `GPUS` GPUs of [`GPU_MIB`] and
/// [`SHARES_PER_GPU`] shares: the fewest GPUs that hold them ([`min_gpus`]) is at most `GPUS`.
fn fits(items: &[u64]) -> bool {
    let mut counts = [0u8; SIZES.len()];
    for gib in items {
        let i = SIZES
            .iter()
            .position(|(g, _)| g == gib)
            .expect("a size of SIZES");
        counts[i] += 1;
    }
    min_gpus(counts, &mut std::collections::HashMap::new()) <= GPUS
}

/// The fewest GPUs that hold `counts[i]` requests of `SIZES[i].0` GiB each (exact bin packing
/// by memoized search over the counts): the largest request left goes into some GPU, so each
/// step fills one GPU around it, with up to [`SHARES_PER_GPU`] − 1 more requests no larger.
fn min_gpus(
    counts: [u8; SIZES.len()],
    memo: &mut std::collections::HashMap<[u8; SIZES.len()], usize>,
) -> usize {
    let Some(j) = (0..SIZES.len()).rev().find(|&i| counts[i] > 0) else {
        return 0;
    };
    if let Some(&n) = memo.get(&counts) {
        return n;
    }
    let mut left = counts;
    left[j] -= 1;
    let mut best = usize::MAX;
    fill(
        left,
        j,
        GPU_MIB - (SIZES[j].0 << 10),
        SHARES_PER_GPU - 1,
        memo,
        &mut best,
    );
    memo.insert(counts, best);
    best
}

/// Adds to the GPU being filled (`room` MiB and `shares` left) requests of sizes at most
/// `SIZES[upto]`, in every way, and keeps in `best` the fewest GPUs found for all of them.
fn fill(
    counts: [u8; SIZES.len()],
    upto: usize,
    room: u64,
    shares: usize,
    memo: &mut std::collections::HashMap<[u8; SIZES.len()], usize>,
    best: &mut usize,
) {
    *best = (*best).min(1 + min_gpus(counts, memo));
    if shares == 0 {
        return;
    }
    for i in (0..=upto).rev() {
        let need = SIZES[i].0 << 10;
        if counts[i] > 0 && need <= room {
            let mut next = counts;
            next[i] -= 1;
            fill(next, i, room - need, shares - 1, memo, best);
        }
    }
}

/// The longest prefix of `sizes` (GiB) the GPUs hold at once, knowing the first `at_least`
/// fit (what a placement reached): prefixes that fit are a prefix of all, so it grows until
/// one does not.
fn optimum(sizes: &[u64], at_least: usize) -> usize {
    (at_least + 1..=sizes.len())
        .find(|&n| !fits(&sizes[..n]))
        .map_or(sizes.len(), |n| n - 1)
}

/// First fit over the GPUs in index order: requests placed before the first that fits none.
fn first_fit(sizes: &[u64]) -> usize {
    let mut free = [(GPU_MIB, SHARES_PER_GPU); GPUS];
    for (i, gib) in sizes.iter().enumerate() {
        let need = gib << 10;
        match free.iter_mut().find(|(m, s)| *m >= need && *s > 0) {
            Some(g) => *g = (g.0 - need, g.1 - 1),
            None => return i,
        }
    }
    sizes.len()
}

fn template_of(gib: u64) -> String {
    format!("mem-{gib}gi")
}

async fn create_templates(client: &Client) -> Result<()> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    for (gib, _) in SIZES {
        let t: ResourceClaimTemplate = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_of(gib)},
            "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                "deviceClassName": das_api::shared_whole_gpu_device_class(),
                "capacity": {"requests": {"memory": format!("{gib}Gi")}}}}]}}}
        }))?;
        api.create(&PostParams::default(), &t).await?;
    }
    Ok(())
}

/// Submits `sizes` one pod at a time; returns how many were placed before the first
/// unschedulable one.
async fn submit(client: &Client, tag: &str, sizes: &[u64]) -> Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for (i, gib) in sizes.iter().enumerate() {
        let name = format!("{tag}-{i:03}");
        create_pod(client, &name, &template_of(*gib), None).await?;
        if !bound_or_unschedulable(&pods, &name, SCHEDULE_TIMEOUT).await? {
            return Ok(i);
        }
    }
    Ok(sizes.len())
}

/// One mix's streams through the scheduler: the table row.
async fn row(
    client: &Client,
    mix: &str,
    weights: &[u64; 6],
    seeds: u64,
    len: usize,
) -> Result<String> {
    let (mut real, mut opt, mut ff, mut gib_real, mut gib_opt) = (0, 0, 0, 0, 0);
    let t0 = Instant::now();
    for seed in 0..seeds {
        let sizes = stream(seed, len, weights);
        let r = submit(client, &format!("{}{seed}", &mix[..1]), &sizes).await?;
        delete_pods_and_claims(client).await?;
        let f = first_fit(&sizes);
        let o = optimum(&sizes, r.max(f));
        if r > o {
            bail!("seed {seed}: the scheduler placed {r}, more than the optimum {o}");
        }
        if !fits(&sizes[..r]) {
            bail!(
                "seed {seed}: the scheduler placed {r}, which the optimum's search says do not fit"
            );
        }
        eprintln!("  {mix} seed {seed}: placed {r}; optimum {o}; first fit {f}; sizes {sizes:?}");
        real += r;
        opt += o;
        ff += f;
        gib_real += sizes[..r].iter().sum::<u64>();
        gib_opt += sizes[..o].iter().sum::<u64>();
    }
    let mean = |x: usize| x as f64 / seeds as f64;
    let mean_gib = |x: u64| x as f64 / seeds as f64;
    Ok(format!(
        "| {mix} | {:.2} ({:.1}) | {:.2} ({:.1}) | {:.1} % | {:.2} | {GPUS} | {:.0} |",
        mean(real),
        mean_gib(gib_real),
        mean(opt),
        mean_gib(gib_opt),
        100.0 * mean(real) / mean(opt),
        mean(ff),
        t0.elapsed().as_secs_f64() / seeds as f64
    ))
}

#[tokio::main]
async fn main() -> Result<()> {
    let seeds: u64 = std::env::var("DAS_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    check_the_optimum()?;
    let names: Vec<String> = (0..NODES).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&refs)).await?;
    let r = run(&mut cluster, seeds).await;
    if r.is_err() {
        cluster.print_log_tails(20);
    }
    cluster.stop();
    r
}

async fn run(cluster: &mut Cluster, seeds: u64) -> Result<()> {
    let gpus: Vec<(String, String)> = (0..NODES)
        .map(|i| (format!("n{i}"), format!("L4:{GPUS_PER_NODE}")))
        .collect();
    let bins = Binaries::in_target_dir("debug", false)?;
    let bins = Binaries {
        controller: None,
        ..bins
    };
    let rendered = chart::render_with(&["wholeGpus.enabled=true", "sharing.profiles={gpu}"])?;
    install::install_rendered(cluster, &rendered, &gpus, &bins)
        .await
        .context("install DAS")?;
    let client = cluster.client();
    create_templates(&client).await?;
    // More requests than 8 GPUs × 4 shares can ever hold.
    let len = GPUS * SHARES_PER_GPU + 1;
    let small: [u64; 6] = SIZES.map(|(_, w)| w);
    let mut rows = Vec::new();
    for (mix, weights) in [("small-heavy", small), ("large-heavy", LARGE_HEAVY)] {
        rows.push(row(&client, mix, &weights, seeds, len).await?);
    }
    println!(
        "\nMemory shares placed before the first unschedulable pod, mean over {seeds} seeded streams per row\n\
         ({NODES} nodes × {GPUS_PER_NODE} L4, {GPU_MIB} MiB and {SHARES_PER_GPU} shares each; optimum = longest prefix the\n\
         {GPUS} GPUs hold at once; first fit over the GPUs in index order as one node).\n"
    );
    println!(
        "| mix | real scheduler: pods (GiB) | optimum: pods (GiB) | real / optimum | first fit, one node | exclusive whole GPUs | s per stream |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
    println!(
        "CPUs: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    Ok(())
}

/// The optimum's search on cases whose answer is known, before any figure is trusted.
fn check_the_optimum() -> Result<()> {
    // 12 + 12 GiB do not share a 23034 MiB GPU: 8 of them need 8 GPUs; a ninth fits none.
    let twelves = optimum(&[12; 9], 0);
    // Four shares per GPU at most, whatever the memory: 32 of 1 GiB, not 33.
    let ones = optimum(&[1; 33], 0);
    // First fit in order strands memory the optimum uses: 6+12 pairs hold every 12 and the 8.
    let sizes = [6, 6, 6, 12, 12, 12, 12, 12, 12, 12, 12, 8];
    let (f, o) = (first_fit(&sizes), optimum(&sizes, 0));
    if (twelves, ones, f, o) != (8, 32, 10, 12) {
        bail!("the optimum's search is wrong: {twelves} {ones} {f} {o}, expected 8 32 10 12");
    }
    Ok(())
}
