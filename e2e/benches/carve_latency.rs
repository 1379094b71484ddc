//! Benchmark: pod create → Running with and without carve before bind (docs/design.md §7,
//! "Carve before bind"; issue 34), on one local cluster: node n0's plugin creates each slice in
//! NodePrepareResources (the default), node n1's carves it when the scheduler allocates it
//! (`--carve-before-bind`: devices published with binding conditions; the scheduler waits in
//! PreBind until the plugin sets `mig.das.com/SliceReady`). Each round creates one pod pinned to
//! each node in turn (a `1g.10gb` slice from a ResourceClaimTemplate), waits until it runs and
//! deletes it, so the two cases share the machine's load; the table gives p50, p90 and max.
//!
//! Needs the debug builds of the DAS binaries (`cargo build -p das-driver --bin
//! das-kubelet-plugin`). Run: `cargo bench -p das-e2e --bench carve_latency` (figures go into
//! docs/benchmarks.md and docs/operations.md by hand).

use std::time::{Duration, Instant};

use anyhow::Result;
use das_e2e::plugin::cluster_with_configured_plugins;
use das_e2e::workload::{NS, create_pod, create_template, delete_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

const ROUNDS: usize = 15;
/// How often the pod's phase is read: the figures' resolution.
const POLL: Duration = Duration::from_millis(20);

/// How long after `t0` pod `name` is first seen Running (read every [`POLL`]).
async fn running_after(pods: &Api<Pod>, name: &str, t0: Instant) -> Result<Duration> {
    loop {
        let p = pods.get(name).await?;
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            return Ok(t0.elapsed());
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(120),
            "pod {name} never ran"
        );
        tokio::time::sleep(POLL).await;
    }
}

fn main() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run())
}

async fn run() -> Result<()> {
    let carve: &[&str] = &["--carve-before-bind"];
    let (cluster, _) = cluster_with_configured_plugins(&[
        ("n0", "H100-80GB:1", &[]),
        ("n1", "H100-80GB:1", carve),
    ])
    .await;
    let c = cluster.client();
    create_template(&c, "one", "1g.10gb", 1).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for (i, node) in ["n0", "n1"].into_iter().enumerate() {
            let name = format!("p-{node}-{round}");
            let t0 = Instant::now();
            create_pod(&c, &name, "one", Some(node)).await?;
            times[i].push(running_after(&pods, &name, t0).await?);
            delete_pod(&c, &name).await?;
        }
    }
    println!(
        "pod create -> Running, {ROUNDS} pods per case, interleaved (local cluster, emulated H100, debug builds, phase read every {} ms)",
        POLL.as_millis()
    );
    println!("| case | p50 | p90 | max |");
    println!("|---|---|---|---|");
    for (i, case) in ["slice created at prepare (default)", "carve before bind"]
        .iter()
        .enumerate()
    {
        let t = &mut times[i];
        t.sort();
        let q = |f: f64| t[((t.len() - 1) as f64 * f).round() as usize].as_secs_f64();
        println!(
            "| {case} | {:.2} s | {:.2} s | {:.2} s |",
            q(0.5),
            q(0.9),
            t[t.len() - 1].as_secs_f64()
        );
    }
    Ok(())
}
