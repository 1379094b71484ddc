//! Benchmark: how fast a shared slice's namespace reaches the scheduler, and what a refused
//! carve costs its pod (docs/design.md §7, "Shares are a tenant's own"), on the local cluster
//! with DAS installed from the chart (`sharing.profiles={1g.10gb}`, das-webhook's claim hook,
//! emulated H100 80GB, stand-in MPS daemon; [`das_e2e::tenants::install_sharing`]).
//!
//! 1. Without carve before bind, [`ROUNDS`] times: a pod with one share in one of two
//!    namespaces in turn; how long after the claim's creation the node publishes
//!    `shareNamespace` on its device (the ResourceSlices read every [`POLL`]), that moment
//!    against the prepare's `readyTime` in the claim's `status.devices` (negative: published
//!    before the prepare answered), and, after the pod is deleted, how long until the
//!    attribute is gone.
//! 2. With carve before bind, [`RACES`] times: two namespaces' shares allocated one free device
//!    while the plugin is frozen ([`das_e2e::tenants::carve_race`]); how long after it resumes
//!    both pods run (one carve refused, its claim allocated again elsewhere) and when the
//!    refused claim was allocated again.
//!
//! Needs the debug builds of the DAS binaries (`cargo build -p das-driver --bin
//! das-kubelet-plugin -p das-controller --bin das-controller -p das-webhook --bin das-webhook`).
//! Run: `cargo bench -p das-e2e --bench share_namespace` (figures go into docs/benchmarks.md by
//! hand).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_e2e::tenants::{
    SHARED_1G_10GB, TENANTS, allocated_in, carve_race, create_share_pod, delete_pods_in,
    install_sharing, wait_running_in, wait_share_namespace,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::{Timestamp, Unit};
use kube::{Api, Client};

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";
const ROUNDS: usize = 15;
const RACES: usize = 5;
/// How often the ResourceSlices are read: the figures' resolution (with a list's own time).
const POLL: &str = "20 ms";

fn main() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run())
}

async fn run() -> Result<()> {
    let published = publication().await?;
    let races = races().await?;
    println!(
        "shareNamespace on the local cluster (emulated H100 80GB, debug builds, ResourceSlices read every {POLL})"
    );
    println!("| what | rounds | p50 | p90 | max |");
    println!("|---|---|---|---|---|");
    let rows: [(&str, &[f64]); 5] = [
        ("claim created -> attribute published", &published[0]),
        (
            "prepare's readyTime -> attribute published (negative: before)",
            &published[1],
        ),
        ("pod deleted -> attribute gone", &published[2]),
        ("carve race: plugin resumed -> both pods running", &races[0]),
        (
            "carve race: plugin resumed -> refused claim allocated again",
            &races[1],
        ),
    ];
    for (what, values) in rows {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
        println!(
            "| {what} | {} | {:.2} s | {:.2} s | {:.2} s |",
            v.len(),
            q(0.5),
            q(0.9),
            v[v.len() - 1]
        );
    }
    Ok(())
}

/// Part 1: [creation → published, readyTime → published, deleted → gone], in seconds.
async fn publication() -> Result<[Vec<f64>; 3]> {
    let (cluster, ready) = install_sharing(NODE, GPUS, &[]).await;
    ready?;
    let c = cluster.client();
    let mut out: [Vec<f64>; 3] = Default::default();
    for round in 0..ROUNDS {
        let ns = TENANTS[round % 2];
        let name = format!("p{round}");
        let t0 = Instant::now();
        create_share_pod(&c, ns, &name, SHARED_1G_10GB, None).await?;
        let device = allocated_in(&c, ns, &name).await?.device;
        wait_share_namespace(&c, NODE, &device, Some(ns)).await?;
        out[0].push(t0.elapsed().as_secs_f64());
        let at = Timestamp::now();
        wait_running_in(&c, ns, &name).await?;
        let ready = ready_time(&c, ns, &name).await?;
        out[1].push((at - ready).total(Unit::Second)?);
        let t1 = Instant::now();
        delete_pods_in(&c, ns, &[name.as_str()]).await?;
        wait_share_namespace(&c, NODE, &device, None).await?;
        out[2].push(t1.elapsed().as_secs_f64());
    }
    Ok(out)
}

/// The `readyTime` the plugin wrote into claim `<ns>/<name>`'s `status.devices`.
async fn ready_time(c: &Client, ns: &str, name: &str) -> Result<Timestamp> {
    let rc = Api::<ResourceClaim>::namespaced(c.clone(), ns)
        .get(name)
        .await?;
    let data = rc
        .status
        .and_then(|s| s.devices)
        .and_then(|d| d.into_iter().next())
        .and_then(|d| d.data)
        .context("no status.devices data")?
        .0;
    data["readyTime"]
        .as_str()
        .context("no readyTime")?
        .parse()
        .context("readyTime")
}

/// Part 2: [resumed → both running, resumed → allocated again], in seconds.
async fn races() -> Result<[Vec<f64>; 2]> {
    let (cluster, ready) = install_sharing(NODE, GPUS, &["carveBeforeBind.enabled=true"]).await;
    ready?;
    let c = cluster.client();
    let mut out: [Vec<f64>; 2] = Default::default();
    for round in 0..RACES {
        let names = [format!("a{round}"), format!("b{round}")];
        let race = carve_race(
            &cluster,
            [names[0].as_str(), names[1].as_str()],
            Duration::from_secs(120),
        )
        .await?;
        anyhow::ensure!(
            race.devices[0] != race.devices[1],
            "round {round}: {race:?}"
        );
        out[0].push(race.took.as_secs_f64());
        if let Some(s) = race.allocated_again_after {
            out[1].push(s);
        }
        for ((ns, name), device) in TENANTS.iter().zip(&names).zip(&race.devices) {
            delete_pods_in(&c, ns, &[name.as_str()]).await?;
            wait_share_namespace(&c, NODE, device, None).await?;
        }
    }
    Ok(out)
}
