//! MIG mode follows demand (docs/design.md §7, "MIG mode follows demand"), end to end on the
//! local cluster: one node with two emulated H100s with MIG mode on, the plugin run with
//! `--whole-gpus --mig-mode-switching`, the chart's cluster objects rendered with whole GPUs on.
//!
//! Both GPUs are published whole and as every MIG placement. A slice pod takes GPU A; a whole-GPU
//! pod then gets GPU B, whose MIG mode the prepare switches off (seen in the emulated GPUs'
//! state); while it runs, a pod for a full-GPU slice (`7g.80gb`) cannot be placed (A holds a
//! slice, B is held whole). Once the whole-GPU pod is gone the full slice lands on B and its
//! prepare switches MIG mode back on. Then a switch that fails (`RESET_REQUIRED` injected
//! through the control file): the whole-GPU pod's prepare fails with the error in its events, a
//! Node event names the GPU, the GPU is published in its current mode only (no `gpu-<B>`), its
//! mode and pending mode are unchanged, and deleting the pod leaves no record, spec or instance.

use anyhow::{Context, Result, ensure};
use das_api::DEVICE_CLASS_WHOLE_GPU;
use das_api::claim_status::our_results;
use das_e2e::das::{self, pool_devices, wait_pool_complete, write_control};
use das_e2e::install;
use das_e2e::plugin::{live_slices, start_plugin_with};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    claim_of, create_class_template, create_pod, create_template, delete_pods, wait_node_event,
    wait_pod_event, wait_running, wait_unschedulable,
};
use das_e2e::{Cluster, ClusterConfig, chart};
use kube::Client;
use serde_json::{Value, json};

const NODE: &str = "n0";
/// Two H100s, MIG mode on: both switch without a reset.
const GPUS: &str = "H100-80GB:2";

#[tokio::test]
async fn mig_mode_follows_demand() {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    if let Err(e) = setup(&mut cluster).await {
        return cluster.check(Err(e));
    }
    cluster.check(scenarios(&cluster).await);
}

/// The chart's cluster objects with whole GPUs on, and the plugin with switching on.
async fn setup(cluster: &mut Cluster) -> Result<()> {
    let rendered = chart::render_with(chart::WHOLE_GPUS)?;
    install::apply_access(cluster, &rendered).await?;
    start_plugin_with(
        cluster,
        NODE,
        GPUS,
        &["--whole-gpus", "--mig-mode-switching"],
    )?;
    wait_pool_complete(&cluster.client(), NODE).await?;
    Ok(())
}

async fn scenarios(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create_class_template(&c, "whole", DEVICE_CLASS_WHOLE_GPU, 1).await?;
    create_template(&c, "small", "1g.10gb", 1).await?;
    create_template(&c, "full", "7g.80gb", 1).await?;

    both_gpus_are_published_both_ways(&c).await?;
    let (a, b) = a_whole_gpu_pod_switches_its_gpu_off(cluster).await?;
    the_next_full_slice_switches_it_back_on(cluster, b).await?;
    a_failed_switch_fails_the_prepare_and_withdraws_the_whole_gpu(cluster, a, b).await
}

/// Every GPU: `gpu-<i>` and its MIG placements.
async fn both_gpus_are_published_both_ways(c: &Client) -> Result<()> {
    let names = device_names(c).await?;
    for gpu in 0..2 {
        ensure!(
            names.contains(&format!("gpu-{gpu}"))
                && names.contains(&format!("gpu-{gpu}-mig-7g-80gb-0"))
                && names.contains(&format!("gpu-{gpu}-mig-1g-10gb-0")),
            "GPU {gpu} is not published both ways: {names:?}"
        );
    }
    Ok(())
}

/// A slice pod takes one GPU (A); a whole-GPU pod gets the other (B) and its MIG mode goes
/// off; a full-GPU slice then fits nowhere. Returns (A, B).
async fn a_whole_gpu_pod_switches_its_gpu_off(cluster: &Cluster) -> Result<(u32, u32)> {
    let c = cluster.client();
    create_pod(&c, "s1", "small", None).await?;
    wait_running(&c, "s1").await?;
    let a = gpu_of(&allocated(&c, "s1").await?)?;
    let b = 1 - a;
    create_pod(&c, "w1", "whole", None).await?;
    wait_running(&c, "w1").await?;
    ensure!(
        allocated(&c, "w1").await? == format!("gpu-{b}"),
        "w1 did not get GPU {b}"
    );
    ensure!(
        mig_mode(cluster, b)? == (false, false),
        "GPU {b}'s MIG mode is not off: {}",
        das::emulated_state(cluster.node(NODE))?
    );
    ensure!(
        mig_mode(cluster, a)? == (true, true),
        "GPU {a} left MIG mode"
    );
    let live = live_slices(cluster, NODE)?;
    ensure!(live.len() == 1, "MIG instances {live:?}, want s1's only");
    create_pod(&c, "f1", "full", None).await?;
    let why = wait_unschedulable(&c, "f1").await?;
    tracing::info!(%why, "f1 waits while GPU {a} holds a slice and GPU {b} is held whole");
    Ok((a, b))
}

/// With the whole-GPU pod gone the full slice lands on B; its prepare switches MIG mode on.
async fn the_next_full_slice_switches_it_back_on(cluster: &Cluster, b: u32) -> Result<()> {
    let c = cluster.client();
    delete_pods(&c, &["w1"]).await?;
    wait_running(&c, "f1").await?;
    ensure!(
        allocated(&c, "f1").await? == format!("gpu-{b}-mig-7g-80gb-0"),
        "f1 got {}",
        allocated(&c, "f1").await?
    );
    ensure!(
        mig_mode(cluster, b)? == (true, true),
        "GPU {b}'s MIG mode is not on"
    );
    delete_pods(&c, &["f1"]).await
}

/// `RESET_REQUIRED` injected for B's next switch: a whole-GPU pod (B is the only GPU free of
/// slices) fails to prepare with the switch error, the Node event names GPU B, `gpu-<B>` is
/// withdrawn while its slices stay published, B keeps MIG mode on with nothing pending, and
/// deleting the pod leaves nothing behind.
async fn a_failed_switch_fails_the_prepare_and_withdraws_the_whole_gpu(
    cluster: &Cluster,
    a: u32,
    b: u32,
) -> Result<()> {
    let c = cluster.client();
    write_control(
        cluster.node(NODE),
        &json!({"setMigModeFaults": [{"gpu": b, "count": 1, "kind": "ResetRequired"}]}),
    )?;
    create_pod(&c, "w2", "whole", None).await?;
    let event = wait_pod_event(&c, "w2", "FailedPrepareDynamicResources").await?;
    ensure!(
        event.contains(&format!("GPU {b} cannot be switched to MIG mode off"))
            && event.contains("reset required"),
        "w2's event does not give the switch error: {event}"
    );
    wait_node_event(&c, NODE, "MigModeSwitchFailed", &format!("GPU {b} (GPU-")).await?;
    wait::until("gpu-B withdrawn", TIMEOUT, || async {
        let names = device_names(&c).await?;
        Ok((!names.contains(&format!("gpu-{b}"))).then_some(names))
    })
    .await
    .and_then(|names| {
        ensure!(
            names.contains(&format!("gpu-{b}-mig-7g-80gb-0"))
                && names.contains(&format!("gpu-{a}")),
            "GPU {b}'s slices or GPU {a}'s whole device went too: {names:?}"
        );
        Ok(())
    })?;
    ensure!(
        mig_mode(cluster, b)? == (true, true),
        "GPU {b}'s mode changed or a change is left pending: {}",
        das::emulated_state(cluster.node(NODE))?
    );
    delete_pods(&c, &["w2", "s1"]).await?;
    wait::until("no MIG instance, record or spec left", TIMEOUT, || async {
        let live = live_slices(cluster, NODE)?;
        let specs = das::load_specs(&das::PluginDirs::of(cluster.node(NODE)).cdi)?;
        Ok((live.is_empty() && specs.is_empty()).then_some(()))
    })
    .await
}

/// The names of the devices `NODE` publishes.
async fn device_names(c: &Client) -> Result<Vec<String>> {
    Ok(pool_devices(c, NODE)
        .await?
        .into_iter()
        .map(|d| d.name)
        .collect())
}

/// The one device allocated to pod `pod`'s claim.
async fn allocated(c: &Client, pod: &str) -> Result<String> {
    let claim = claim_of(c, pod).await?;
    let devices: Vec<String> = our_results(&claim).map(|r| r.device.clone()).collect();
    ensure!(devices.len() == 1, "{pod} has devices {devices:?}");
    Ok(devices[0].clone())
}

/// The GPU index of device `gpu-<i>-…`.
fn gpu_of(device: &str) -> Result<u32> {
    device
        .strip_prefix("gpu-")
        .and_then(|r| r.split('-').next())
        .and_then(|i| i.parse().ok())
        .with_context(|| format!("no GPU index in {device}"))
}

/// GPU `gpu`'s MIG mode in the emulated state: (now, pending).
fn mig_mode(cluster: &Cluster, gpu: u32) -> Result<(bool, bool)> {
    let state = das::emulated_state(cluster.node(NODE))?;
    let g: &Value = state["gpus"]
        .as_array()
        .context("gpus")?
        .iter()
        .find(|g| g["index"] == gpu)
        .with_context(|| format!("no GPU {gpu} in {state}"))?;
    let now = g["migEnabled"].as_bool().unwrap_or(true);
    let pending = g["migPending"].as_bool().unwrap_or(now);
    Ok((now, pending))
}
