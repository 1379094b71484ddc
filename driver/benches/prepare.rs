//! Benchmark: NodePrepareResources latency over the plugin's real DRA socket, and plugin memory.
//!
//! A local cluster (real kube-apiserver) and `das-kubelet-plugin` with 8 emulated H100-80GB run;
//! the benchmark creates ResourceClaims and writes their allocation as the scheduler would, then
//! calls NodePrepareResources / NodeUnprepareResources itself over the unix socket, like the
//! kubelet. Each prepare therefore includes the claim GET, slice creation (emulated, on-disk
//! state), checkpoint fsync, CDI spec write and the status.devices apply.
//!
//! Run: `cargo bench -p das-driver --bench prepare` (prints a table; figures go into
//! docs/benchmarks.md by hand).

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_e2e::das::{self, apply_device_classes};
use das_e2e::{Cluster, ClusterConfig, process, wait};
use das_proto::dra::v1::dra_plugin_client::DraPluginClient;
use das_proto::dra::v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "n0";
const GPUS: u32 = 8;
const SINGLE_ROUNDS: usize = 200;
const CONCURRENT_ROUNDS: usize = 50;

async fn connect(sock: PathBuf) -> Result<DraPluginClient<Channel>> {
    let ch = Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_| {
            let p = sock.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
            }
        }))
        .await?;
    Ok(DraPluginClient::new(ch))
}

/// Creates claim `name` allocated (by us, as the scheduler would) to `device` on this node.
async fn allocated_claim(client: &Client, name: &str, device: &str) -> Result<Claim> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let rc: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}]}}
    }))?;
    let rc = api.create(&PostParams::default(), &rc).await?;
    let status = json!({"status": {"allocation": {
        "devices": {"results": [{"request": "mig", "driver": das::DRIVER, "pool": NODE, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
    }}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("allocate {name}"))?;
    Ok(Claim {
        namespace: "default".into(),
        name: name.into(),
        uid: rc.metadata.uid.context("uid")?,
    })
}

async fn prepare(c: &mut DraPluginClient<Channel>, claims: Vec<Claim>) -> Result<Duration> {
    let t0 = Instant::now();
    let r = c
        .node_prepare_resources(NodePrepareResourcesRequest { claims })
        .await?
        .into_inner();
    let took = t0.elapsed();
    for (uid, e) in r.claims {
        anyhow::ensure!(e.error.is_empty(), "prepare {uid}: {}", e.error);
    }
    Ok(took)
}

async fn unprepare(c: &mut DraPluginClient<Channel>, claims: Vec<Claim>) -> Result<()> {
    let r = c
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims })
        .await?
        .into_inner();
    for (uid, e) in r.claims {
        anyhow::ensure!(e.error.is_empty(), "unprepare {uid}: {}", e.error);
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn rss_mib(pid: u32) -> (f64, f64) {
    let (rss, peak) = process::memory_kib(pid as i32).unwrap_or((0, 0));
    (rss as f64 / 1024.0, peak as f64 / 1024.0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE])).await?;
    let node = cluster.node(NODE).clone();
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let args = das::plugin_args(
        &node,
        &format!("H100-80GB:{GPUS}"),
        &cluster.kubeconfig.clone(),
        port,
    );
    cluster.spawn_program(
        "das-plugin",
        std::path::Path::new(env!("CARGO_BIN_EXE_das-kubelet-plugin")),
        args,
    )?;
    let client = cluster.client();
    apply_device_classes(&client, &["1g.10gb"]).await?;
    let sock = node.plugins_dir().join(das::DRIVER).join("dra.sock");
    wait::until(
        "the plugin's DRA socket",
        Duration::from_secs(30),
        || async { Ok(sock.exists().then_some(())) },
    )
    .await?;
    let mut c = connect(sock.clone()).await?;
    let pid = *cluster.pids().last().context("plugin pid")?;
    let (rss0, _) = rss_mib(pid);

    // One claim, prepared and unprepared in turn.
    let one = allocated_claim(&client, "bench-one", "gpu-0-mig-1g-10gb-6").await?;
    let mut single = Vec::new();
    for _ in 0..SINGLE_ROUNDS {
        single.push(prepare(&mut c, vec![one.clone()]).await?);
        unprepare(&mut c, vec![one.clone()]).await?;
    }
    single.sort();

    // 8 claims on 8 GPUs, sent as 8 concurrent calls (as 8 pods' kubelet calls would be).
    let mut eight = Vec::new();
    for g in 0..GPUS {
        eight.push(
            allocated_claim(
                &client,
                &format!("bench-gpu{g}"),
                &format!("gpu-{g}-mig-1g-10gb-6"),
            )
            .await?,
        );
    }
    let mut walls = Vec::new();
    for _ in 0..CONCURRENT_ROUNDS {
        let t0 = Instant::now();
        let calls = eight.iter().map(|cl| {
            let mut c = c.clone();
            let cl = cl.clone();
            async move { prepare(&mut c, vec![cl]).await }
        });
        for r in futures::future::join_all(calls).await {
            r?;
        }
        walls.push(t0.elapsed());
        unprepare(&mut c, eight.clone()).await?;
    }
    walls.sort();
    // The same 8 claims one after another, for comparison with the concurrent wall time.
    let mut sequential = Vec::new();
    for _ in 0..CONCURRENT_ROUNDS {
        let t0 = Instant::now();
        for cl in &eight {
            prepare(&mut c, vec![cl.clone()]).await?;
        }
        sequential.push(t0.elapsed());
        unprepare(&mut c, eight.clone()).await?;
    }
    sequential.sort();

    // Memory with 50 prepared slices: 7 × 1g.10gb per GPU, over 8 GPUs, until 50.
    let mut held = Vec::new();
    'outer: for g in 0..GPUS {
        for start in 0..7 {
            if held.len() == 50 {
                break 'outer;
            }
            let cl = allocated_claim(
                &client,
                &format!("bench-mem-{g}-{start}"),
                &format!("gpu-{g}-mig-1g-10gb-{start}"),
            )
            .await?;
            prepare(&mut c, vec![cl.clone()]).await?;
            held.push(cl);
        }
    }
    let (rss50, peak) = rss_mib(pid);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
                    / 1024.0
            })
            .unwrap_or(0.0)
    };
    let (anon, file, threads) = (
        field("RssAnon:"),
        field("RssFile:"),
        field("Threads:") * 1024.0,
    );
    unprepare(&mut c, held).await?;

    println!(
        "NodePrepareResources over the DRA socket, emulated H100-80GB ×{GPUS}, real kube-apiserver"
    );
    println!("| case | rounds | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    println!(
        "| 1 claim (1 slice) | {SINGLE_ROUNDS} | {} | {} | {} |",
        ms(percentile(&single, 0.5)),
        ms(percentile(&single, 0.99)),
        ms(*single.last().unwrap())
    );
    println!(
        "| 8 concurrent claims on 8 GPUs, wall time | {CONCURRENT_ROUNDS} | {} | {} | {} |",
        ms(percentile(&walls, 0.5)),
        ms(percentile(&walls, 0.99)),
        ms(*walls.last().unwrap())
    );
    println!(
        "| 8 claims on 8 GPUs one after another, wall time | {CONCURRENT_ROUNDS} | {} | {} | {} |",
        ms(percentile(&sequential, 0.5)),
        ms(percentile(&sequential, 0.99)),
        ms(*sequential.last().unwrap())
    );
    println!(
        "8-concurrent p50 / 1-claim p50 = {:.2}; 8-sequential p50 / 8-concurrent p50 = {:.2}; CPUs: {}",
        percentile(&walls, 0.5).as_secs_f64() / percentile(&single, 0.5).as_secs_f64(),
        percentile(&sequential, 0.5).as_secs_f64() / percentile(&walls, 0.5).as_secs_f64(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "plugin RSS: {rss0:.1} MiB after start, {rss50:.1} MiB with 50 prepared slices (peak {peak:.1} MiB; anonymous {anon:.1} MiB, file-backed {file:.1} MiB, {threads:.0} threads)"
    );
    Ok(())
}
