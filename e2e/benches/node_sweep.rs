//! Benchmark: what each node of the local cluster costs, at 2, 8, 16 and 32 nodes.
//!
//! For each node count the benchmark starts the local cluster (`Cluster::start`: real etcd,
//! kube-apiserver, scheduler and controller-manager, one hollow DRA kubelet per node) and
//! installs DAS from the chart as `make cluster-up` does (`install::install`: a node plugin per
//! node with 2 emulated GPUs, A100-SXM4-40GB and H100-80GB nodes alternating, and the
//! controller; release builds). It reports:
//! - start time: cluster start, then DAS installed with every node's slices published;
//! - resident memory (`VmRSS`) per hollow kubelet and per plugin, and of the API server;
//! - idle CPU per hollow kubelet, per plugin, of the controller and of the API server, in
//!   milliseconds per minute (user + system, `/proc/<pid>/stat`), over an idle window with no
//!   workload;
//! - API writes per minute per idle node over the same window, by resource, from the API
//!   server's `apiserver_request_total` (every verb but GET, LIST, WATCH): the node plugins'
//!   ResourceSlice and ResourceClaim writes must stay at zero when nothing changes.
//!
//! Run: `make bench-nodes` (builds the release plugin and controller, then
//! `cargo bench -p das-e2e --bench node_sweep`). `DAS_SWEEP_NODES=2,8` picks the node counts,
//! `DAS_SWEEP_IDLE_S` the idle window (default 60 s). Figures go into docs/benchmarks.md by hand.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_e2e::install::{self, Binaries};
use das_e2e::{Cluster, ClusterConfig, process};

const DEFAULT_NODES: [usize; 4] = [2, 8, 16, 32];
const MODELS: [&str; 2] = ["A100-SXM4-40GB:2", "H100-80GB:2"];
/// Time for start-up writes (first node status, slice publish, controller sync) to pass before
/// the idle window.
const SETTLE: Duration = Duration::from_secs(15);

/// What kind of process a cluster pid is, from its component name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Kubelet,
    Plugin,
    Controller,
    ApiServer,
    Other,
}

fn kind_of(name: &str) -> Kind {
    if name.starts_with("dra-kubelet") {
        Kind::Kubelet
    } else if name.starts_with("das-kubelet-plugin") {
        Kind::Plugin
    } else if name.starts_with("das-controller") {
        Kind::Controller
    } else if name.starts_with("kube-apiserver") {
        Kind::ApiServer
    } else {
        Kind::Other
    }
}

/// The API server's write requests so far, by resource (`apiserver_request_total` summed over
/// every verb but the reads).
async fn writes_by_resource(cluster: &Cluster) -> Result<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = cluster.client().request_text(req).await?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let label = |k: &str| {
            let start = line.find(&format!("{k}=\""))? + k.len() + 2;
            let end = line[start..].find('"')? + start;
            Some(line[start..end].to_string())
        };
        let verb = label("verb").unwrap_or_default();
        if matches!(verb.as_str(), "GET" | "LIST" | "WATCH" | "CONNECT") {
            continue;
        }
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(label("resource").unwrap_or_default())
            .or_default() += value;
    }
    Ok(out)
}

/// Per-process CPU seconds and RSS (KiB), with each process's kind.
fn sample(cluster: &Cluster) -> Vec<(Kind, u32, f64, u64)> {
    cluster
        .pids()
        .into_iter()
        .filter_map(|pid| {
            let name = process::component_name(pid as i32)?;
            let rss = process::memory_kib(pid as i32).map_or(0, |(rss, _)| rss);
            Some((kind_of(&name), pid, process::cpu_seconds(pid), rss))
        })
        .collect()
}

/// One row of the report.
struct Row {
    nodes: usize,
    cluster_start: Duration,
    das_start: Duration,
    /// Mean RSS in MiB by kind.
    rss: BTreeMap<Kind, f64>,
    /// Mean idle CPU in ms per minute by kind.
    idle_cpu: BTreeMap<Kind, f64>,
    /// Writes per minute per node, by resource.
    writes: BTreeMap<String, f64>,
}

async fn measure(nodes: usize, bins: &Binaries, idle: Duration) -> Result<Row> {
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&refs)).await?;
    let cluster_start = t0.elapsed();
    let gpus: Vec<(String, String)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), MODELS[i % MODELS.len()].to_string()))
        .collect();
    let r = async {
        let t1 = Instant::now();
        install::install(&mut cluster, &gpus, bins).await?;
        let das_start = t1.elapsed();
        tokio::time::sleep(SETTLE).await;
        let (before, writes0) = (sample(&cluster), writes_by_resource(&cluster).await?);
        let w0 = Instant::now();
        tokio::time::sleep(idle).await;
        let (after, writes1) = (sample(&cluster), writes_by_resource(&cluster).await?);
        let minutes = w0.elapsed().as_secs_f64() / 60.0;
        let mut rss: BTreeMap<Kind, Vec<f64>> = BTreeMap::new();
        let mut cpu: BTreeMap<Kind, Vec<f64>> = BTreeMap::new();
        for (kind, pid, cpu1, kib) in &after {
            let Some((_, _, cpu0, _)) = before.iter().find(|(_, p, _, _)| p == pid) else {
                continue;
            };
            rss.entry(*kind).or_default().push(*kib as f64 / 1024.0);
            cpu.entry(*kind)
                .or_default()
                .push((cpu1 - cpu0) * 1000.0 / minutes);
        }
        let mean = |m: BTreeMap<Kind, Vec<f64>>| {
            m.into_iter()
                .map(|(k, v)| (k, v.iter().sum::<f64>() / v.len() as f64))
                .collect()
        };
        let writes = writes1
            .iter()
            .map(|(res, n)| {
                let delta = n - writes0.get(res).copied().unwrap_or(0.0);
                (res.clone(), delta / minutes / nodes as f64)
            })
            .filter(|(_, v)| *v > 0.0)
            .collect();
        Ok::<_, anyhow::Error>(Row {
            nodes,
            cluster_start,
            das_start,
            rss: mean(rss),
            idle_cpu: mean(cpu),
            writes,
        })
    }
    .await;
    if r.is_err() {
        cluster.print_log_tails(20);
    }
    cluster.stop();
    r
}

fn node_counts() -> Result<Vec<usize>> {
    match std::env::var("DAS_SWEEP_NODES") {
        Ok(v) => v
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .context("DAS_SWEEP_NODES: comma-separated counts")
            })
            .collect(),
        Err(_) => Ok(DEFAULT_NODES.to_vec()),
    }
}

fn print(rows: &[Row], idle: Duration) {
    let get =
        |m: &BTreeMap<Kind, f64>, k: Kind| m.get(&k).map_or("-".into(), |v| format!("{v:.1}"));
    println!(
        "\nIdle window {} s after {} s of settling; CPU in ms per minute (1000 = 1.7 % of one core).\n",
        idle.as_secs(),
        SETTLE.as_secs()
    );
    println!(
        "| nodes | cluster start | DAS installed, slices published | RSS per hollow kubelet / per plugin / API server (MiB) | idle CPU per hollow kubelet / per plugin / controller / API server (ms/min) |"
    );
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.1} s | {:.1} s | {} / {} / {} | {} / {} / {} / {} |",
            r.nodes,
            r.cluster_start.as_secs_f64(),
            r.das_start.as_secs_f64(),
            get(&r.rss, Kind::Kubelet),
            get(&r.rss, Kind::Plugin),
            get(&r.rss, Kind::ApiServer),
            get(&r.idle_cpu, Kind::Kubelet),
            get(&r.idle_cpu, Kind::Plugin),
            get(&r.idle_cpu, Kind::Controller),
            get(&r.idle_cpu, Kind::ApiServer),
        );
    }
    let resources: std::collections::BTreeSet<&String> =
        rows.iter().flat_map(|r| r.writes.keys()).collect();
    println!("\nAPI writes per minute per idle node, by resource:\n");
    print!("| resource |");
    for r in rows {
        print!(" {} nodes |", r.nodes);
    }
    println!("\n|---|{}", "---|".repeat(rows.len()));
    for res in resources {
        print!("| {res} |");
        for r in rows {
            print!(" {:.2} |", r.writes.get(res).copied().unwrap_or(0.0));
        }
        println!();
    }
    print!("| **total** |");
    for r in rows {
        print!(" {:.2} |", r.writes.values().sum::<f64>());
    }
    println!();
}

#[tokio::main]
async fn main() -> Result<()> {
    let bins = Binaries::in_target_dir("release", false)?;
    let idle = Duration::from_secs(
        std::env::var("DAS_SWEEP_IDLE_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let mut rows = Vec::new();
    for n in node_counts()? {
        eprintln!("== {n} nodes");
        rows.push(measure(n, &bins, idle).await?);
        print(&rows, idle);
    }
    println!(
        "CPUs: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    Ok(())
}
