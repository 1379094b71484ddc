//! Benchmark: cluster-wide packing through the real scheduler.
//!
//! A local cluster of 8 hollow nodes × 2 emulated GPUs (a row of H100-80GB nodes, and a row with
//! A100-SXM4-40GB and H100-80GB nodes alternating), each node with `das-kubelet-plugin` (release
//! build) installed from the chart. For seeded random streams of single-slice requests (the
//! mixes of the single-node packing benchmark, `driver/benches/packing.rs`), pods are submitted
//! one at a time, each after the previous one is bound, until the first pod the scheduler finds
//! unschedulable. Reported per row, mean over the streams:
//!
//! - slices the real scheduler placed (kube-scheduler's DynamicResources plugin over DAS's
//!   ResourceSlices, choosing among the nodes that fit as it does: by score, ties at random);
//! - the offline optimum: the longest prefix of the stream the cluster can hold at once
//!   (`placement::optimum` over all 16 GPUs: every request is one device, so nodes add no
//!   constraint beyond their GPUs, and the single-node optimum over the union is exact);
//! - what first-fit over DAS's order and over device-name order would place if the 16 GPUs were
//!   one node (`placement::sim`): the difference from the real run is what spreading pods over
//!   nodes costs.
//!
//! A third row runs the H100 cluster with the smallest fix for spreading this benchmark found:
//! kube-scheduler's NodeResourcesFit scoring `MostAllocated` over cpu and memory instead of the
//! default `LeastAllocated`, so the fullest node wins and pods fill a node before the next. The
//! configuration is the file users copy, `docs/examples/scheduler/packing.yaml`.
//!
//! Run: `make bench-packing` (`DAS_BENCH_SEEDS=<n>` streams per row, default 4;
//! `DAS_BENCH_ROWS=h100` only the H100 cluster: on the mixed one the optimum's search over 16 GPUs
//! of two models can take many minutes per stream).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use das_driver::gpu::{GpuModel, find_model};
use das_driver::publish::placement::GpuView;
use das_driver::publish::placement::optimum::Optimum;
use das_driver::publish::placement::sim::{
    FirstFit, Mix, Policy, SplitMix64, profile_weights, request_stream,
};
use das_e2e::install::{self, Binaries};
use das_e2e::workload::{
    NS, bound_or_unschedulable, create_pod, create_template, delete_pods_and_claims,
};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

const NODES: usize = 8;
const GPUS_PER_NODE: usize = 2;
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(60);
fn model(name: &str) -> std::sync::Arc<GpuModel> {
    find_model(name)
        .expect("embedded GPU models load")
        .unwrap_or_else(|| panic!("no GPU model {name}"))
}

/// Template name of a profile: `p-` and the profile with `.` and `+` as `-`.
fn template_of(profile: &str) -> String {
    format!("p-{}", profile.replace(['.', '+'], "-"))
}

/// Submits `stream` one pod at a time; returns how many were placed before the first
/// unschedulable one.
async fn submit(client: &Client, tag: &str, stream: &[String]) -> Result<usize> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for (i, profile) in stream.iter().enumerate() {
        let name = format!("{tag}-{i:03}");
        create_pod(client, &name, &template_of(profile), None).await?;
        if !bound_or_unschedulable(&pods, &name, SCHEDULE_TIMEOUT).await? {
            return Ok(i);
        }
    }
    Ok(stream.len())
}

struct Row {
    label: String,
    mix: &'static str,
    real: f64,
    opt: f64,
    das_one_node: f64,
    name_one_node: f64,
    real_is_opt: f64,
    secs: f64,
}

async fn row(
    client: &Client,
    label: &str,
    models: &[&GpuModel],
    mix: (Mix, &'static str),
    seeds: u64,
) -> Result<Row> {
    let gpus = GpuView::of_models(models);
    let weights = profile_weights(&gpus, mix.0);
    for (profile, _) in &weights {
        let name = template_of(profile);
        let api: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
            Api::namespaced(client.clone(), NS);
        if api.get_opt(&name).await?.is_none() {
            create_template(client, &name, profile, 1).await?;
        }
    }
    let optimum = Optimum::new(&gpus);
    let len = gpus
        .iter()
        .map(|g| g.model.max_gpu_instances as usize)
        .sum::<usize>()
        + 1;
    let t0 = Instant::now();
    let (mut real, mut opt, mut das, mut name, mut same) = (0, 0, 0, 0, 0);
    for seed in 0..seeds {
        let mut rng = SplitMix64::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xc1u64);
        let stream = request_stream(&weights, &mut rng, len);
        let r = submit(client, &format!("s{seed}"), &stream).await?;
        delete_pods_and_claims(client).await?;
        let d = FirstFit::new(&gpus, Policy::Das).placed_before_first_rejection(&stream);
        let n = FirstFit::new(&gpus, Policy::NameOrder).placed_before_first_rejection(&stream);
        eprintln!(
            "  {label} {} seed {seed}: placed {r}; one node: DAS order {d}, name order {n}",
            mix.1
        );
        // The optimum last: on 16 GPUs of two models its search can take minutes.
        let o = optimum.longest_feasible_prefix_from(&stream, r.max(d).max(n));
        if r > o {
            bail!("seed {seed}: the scheduler placed {r}, more than the optimum {o}");
        }
        eprintln!("  {label} {} seed {seed}: optimum {o}", mix.1);
        real += r;
        opt += o;
        das += d;
        name += n;
        same += usize::from(r == o);
    }
    let mean = |x: usize| x as f64 / seeds as f64;
    Ok(Row {
        label: label.to_string(),
        mix: mix.1,
        real: mean(real),
        opt: mean(opt),
        das_one_node: mean(das),
        name_one_node: mean(name),
        real_is_opt: 100.0 * mean(same),
        secs: t0.elapsed().as_secs_f64() / seeds as f64,
    })
}

async fn run(
    cluster: &mut Cluster,
    models: &[&str],
    seeds: u64,
    packing: bool,
) -> Result<Vec<Row>> {
    let gpus: Vec<(String, String)> = (0..NODES)
        .map(|i| {
            (
                format!("n{i}"),
                format!("{}:{GPUS_PER_NODE}", models[i % models.len()]),
            )
        })
        .collect();
    let bins = Binaries::in_target_dir("release", false)?;
    let bins = Binaries {
        controller: None,
        ..bins
    };
    install::install(cluster, &gpus, &bins).await?;
    // The data files' names of the emulated models, in the nodes' GPU order.
    let data = |m: &str| match m {
        "H100-80GB" => "H100-SXM5-80GB",
        "A100-SXM4-40GB" => "A100-SXM4-40GB",
        other => panic!("no data file name for {other}"),
    };
    let loaded: Vec<_> = (0..NODES * GPUS_PER_NODE)
        .map(|g| model(data(models[(g / GPUS_PER_NODE) % models.len()])))
        .collect();
    let refs: Vec<&GpuModel> = loaded.iter().map(|m| m.as_ref()).collect();
    let label = format!(
        "{NODES} nodes × {GPUS_PER_NODE} {}{}",
        models.join(" / "),
        if packing {
            ", MostAllocated (packing.yaml)"
        } else {
            ""
        }
    );
    let client = cluster.client();
    let mut rows = Vec::new();
    for mix in [(Mix::Uniform, "uniform"), (Mix::SmallHeavy, "small-heavy")] {
        rows.push(row(&client, &label, &refs, mix, seeds).await?);
    }
    Ok(rows)
}

#[tokio::main]
async fn main() -> Result<()> {
    let seeds: u64 = std::env::var("DAS_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let names: Vec<String> = (0..NODES).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mixed = std::env::var("DAS_BENCH_ROWS").map_or(true, |r| r != "h100");
    let h100: &[&str] = &["H100-80GB"];
    let mut clusters: Vec<(&[&str], bool)> = vec![(h100, false), (h100, true)];
    if mixed {
        clusters.push((&["A100-SXM4-40GB", "H100-80GB"], false));
    }
    let mut rows = Vec::new();
    for (models, packing) in clusters {
        let mut config = ClusterConfig::with_nodes(&refs);
        if packing {
            config.scheduler_profiles = Some(das_e2e::das::packing_scheduler_profiles()?);
        }
        let mut cluster = Cluster::start(config).await?;
        let r = run(&mut cluster, models, seeds, packing).await;
        if r.is_err() {
            cluster.print_log_tails(20);
        }
        cluster.stop();
        rows.extend(r.context("cluster packing run")?);
    }
    println!(
        "\nSlices placed before the first unschedulable pod, mean over {seeds} seeded streams per row\n\
         (real kube-scheduler over DAS's ResourceSlices; optimum = longest prefix the 16 GPUs hold at once;\n\
         one-node columns: first-fit over the same 16 GPUs as if they were one node).\n"
    );
    println!(
        "| cluster | mix | real scheduler | optimum | real / optimum | real = opt | DAS order, one node | name order, one node | s per stream |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.1} % | {:.0} % | {:.2} | {:.2} | {:.0} |",
            r.label,
            r.mix,
            r.real,
            r.opt,
            100.0 * r.real / r.opt,
            r.real_is_opt,
            r.das_one_node,
            r.name_one_node,
            r.secs
        );
    }
    println!(
        "CPUs: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    Ok(())
}
