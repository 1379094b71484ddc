//! Benchmark: the force-delete race. A pod holding a whole GPU (`7g.80gb`) is force-deleted and a
//! new pod for the same GPU is created at once: the scheduler allocates the same placement to
//! the new pod's claim before the kubelet has unprepared the old one. Measures the new pod's
//! create → Running time, for this build and (with `DAS_BENCH_BASELINE_PLUGIN=<path>`) an
//! earlier plugin binary on a second node, round by round alternately.
//!
//! Needs the plugin's release build (`cargo build --release -p das-driver --bin
//! das-kubelet-plugin`). Run: `cargo bench -p das-e2e --bench force_delete`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_e2e::binaries::DasBinary;
use das_e2e::das::{self, apply_device_classes};
use das_e2e::workload::{NS, create_template, free_port, wait_running};
use das_e2e::{Cluster, ClusterConfig, wait};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const ROUNDS: usize = 10;

fn pod(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "whole"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "mig"}]}}],
            "terminationGracePeriodSeconds": 30
        }
    }))?)
}

async fn gone(api: &Api<Pod>, name: &str) -> Result<()> {
    wait::until(
        &format!("pod {name} gone"),
        Duration::from_secs(90),
        || async { Ok(api.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

/// One round on `node`: returns the new pod's create → Running time.
async fn round(client: &Client, node: &str, r: usize) -> Result<Duration> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let old = format!("old-{node}-{r}");
    let new = format!("new-{node}-{r}");
    api.create(&PostParams::default(), &pod(&old, node)?)
        .await?;
    wait_running(client, &old).await?;
    api.delete(&old, &DeleteParams::default().grace_period(0))
        .await?;
    let t0 = Instant::now();
    api.create(&PostParams::default(), &pod(&new, node)?)
        .await?;
    wait_running(client, &new).await?;
    let took = t0.elapsed();
    api.delete(&new, &DeleteParams::default().grace_period(0))
        .await?;
    gone(&api, &new).await?;
    gone(&api, &old).await?;
    // Let the kubelet unprepare the new pod's claim before the next round reuses the GPU.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(took)
}

fn summary(label: &str, v: &mut [Duration]) -> String {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize].as_secs_f64();
    format!(
        "| {label} | {} | {:.2} s | {:.2} s | {:.2} s |",
        v.len(),
        p(0.5),
        p(0.9),
        v.last().map_or(0.0, Duration::as_secs_f64)
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let baseline = std::env::var_os("DAS_BENCH_BASELINE_PLUGIN").map(std::path::PathBuf::from);
    let this = DasBinary::Plugin.in_target_dir("release")?;
    let mut subjects = vec![("this build", "n0", this)];
    if let Some(b) = baseline {
        subjects.push(("baseline", "n1", b));
    }
    let nodes: Vec<&str> = subjects.iter().map(|s| s.1).collect();
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&nodes)).await?;
    for (_, node, bin) in &subjects {
        let info = cluster.node(node).clone();
        let args = das::plugin_args(
            &info,
            "H100-80GB:1",
            &cluster.kubeconfig.clone(),
            free_port(),
        );
        cluster.spawn_program(&format!("das-plugin-{node}"), bin, args)?;
    }
    let client = cluster.client();
    apply_device_classes(&client, &["7g.80gb"]).await?;
    das_e2e::das::wait_nodes_published(&client, &nodes).await?;
    create_template(&client, "whole", "7g.80gb", 1).await?;
    let mut delays: Vec<Vec<Duration>> = vec![Vec::new(); subjects.len()];
    for r in 0..ROUNDS {
        for k in 0..subjects.len() {
            let i = (r + k) % subjects.len();
            let took = round(&client, subjects[i].1, r)
                .await
                .with_context(|| format!("round {r} on {}", subjects[i].1))?;
            delays[i].push(took);
        }
    }
    println!(
        "new pod create → Running after a force delete of the GPU's previous pod (7g.80gb, 1 × H100-80GB per node)"
    );
    println!("| plugin | rounds | p50 | p90 | max |");
    println!("|---|---|---|---|---|");
    for (i, (label, _, _)) in subjects.iter().enumerate() {
        println!("{}", summary(label, &mut delays[i]));
    }
    Ok(())
}
