//! A rolling update with surge, as the chart's DaemonSet does it: a new plugin instance starts
//! on the node while the old one still serves. The new one waits until the old one hands over
//! (no two instances ever touch the state dir), then serves: new pods prepare while the old
//! instance is still running, and a slice the old instance prepared is released by the new one.

use anyhow::{Result, bail, ensure};
use das_e2e::das::{self, wait_pool_complete};
use das_e2e::install::DasBinary;
use das_e2e::plugin::{LiveSlice, PROFILES, live_slices};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    create_pod, create_template, delete_pod, free_port, http_get, wait_running,
};
use das_e2e::{Cluster, ClusterConfig};

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";

/// Starts a plugin instance of a DaemonSet pod with `pod_uid` (socket names carry it).
fn start_instance(cluster: &mut Cluster, name: &str, pod_uid: &str) -> Result<u16> {
    start_instance_with(cluster, name, pod_uid, GPUS)
}

fn start_instance_with(
    cluster: &mut Cluster,
    name: &str,
    pod_uid: &str,
    gpus: &str,
) -> Result<u16> {
    let n = cluster.node(NODE).clone();
    let port = free_port();
    let mut args = das::plugin_args(&n, gpus, &cluster.kubeconfig.clone(), port);
    args.push(format!("--pod-uid={pod_uid}"));
    cluster.spawn_program(name, &DasBinary::Plugin.debug()?, args)?;
    Ok(port)
}

async fn readyz(port: u16) -> u16 {
    http_get(port, "/readyz").await.map(|r| r.0).unwrap_or(0)
}

/// A one-node cluster without any plugin yet.
async fn one_node() -> Cluster {
    Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts")
}

/// The old instance (`plugin-old`, DaemonSet pod `pod_uid`) serving pod `a` with one 1g.10gb
/// slice: its metrics port and the node's live slices.
async fn old_instance_serving_a(
    cluster: &mut Cluster,
    pod_uid: &str,
) -> Result<(u16, Vec<LiveSlice>)> {
    let c = cluster.client();
    let port = start_instance(cluster, "plugin-old", pod_uid)?;
    das::apply_device_classes(&c, PROFILES).await?;
    wait_pool_complete(&c, NODE).await?;
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    create_pod(&c, "a", "one-1g", None).await?;
    wait_running(&c, "a").await?;
    let slices = live_slices(cluster, NODE)?;
    ensure!(slices.len() == 1, "{slices:?}");
    Ok((port, slices))
}

#[tokio::test]
async fn surge_rollout_hands_over_without_losing_a_slice() {
    let mut cluster = one_node().await;
    let r = scenario(&mut cluster).await;
    cluster.check(r);
}

async fn scenario(cluster: &mut Cluster) -> Result<()> {
    let c = cluster.client();
    let (old_port, a_slice) =
        old_instance_serving_a(cluster, "0ld00000-0000-4000-8000-000000000001").await?;

    // The new instance starts next to the old one and takes over.
    let new_port = start_instance(
        cluster,
        "plugin-new",
        "9e900000-0000-4000-8000-000000000002",
    )?;
    wait::until("the new instance to be ready", TIMEOUT, || async {
        Ok((readyz(new_port).await == 200).then_some(()))
    })
    .await?;
    let old_log = std::fs::read_to_string(cluster.log_of("plugin-old"))?;
    ensure!(
        old_log.contains("handing over") && old_log.contains("handed over"),
        "the old instance handed over explicitly"
    );
    let new_log = std::fs::read_to_string(cluster.log_of("plugin-new"))?;
    ensure!(
        new_log.contains("waiting for it to hand over") && new_log.contains("took over"),
        "the new instance waited for the old one"
    );
    ensure!(
        readyz(old_port).await == 503,
        "the old instance is no longer ready"
    );

    // The old instance still runs (its pod is not deleted yet): new pods prepare all the same.
    create_pod(&c, "b", "one-1g", None).await?;
    wait_running(&c, "b").await?;
    let both = live_slices(cluster, NODE)?;
    ensure!(both.len() == 2, "a's slice kept, b's created: {both:?}");
    ensure!(both.iter().any(|s| s.3 == a_slice[0].3), "{both:?}");

    // The DaemonSet deletes the old pod; the new instance releases what the old one prepared.
    cluster.stop_component("plugin-old", true)?;
    delete_pod(&c, "a").await?;
    wait::until(
        "a's slice to be destroyed by the new instance",
        TIMEOUT,
        || async {
            let live = live_slices(cluster, NODE)?;
            Ok((live.len() == 1 && live[0].3 != a_slice[0].3).then_some(()))
        },
    )
    .await?;
    create_pod(&c, "c", "one-1g", None).await?;
    wait_running(&c, "c").await?;
    ensure!(live_slices(cluster, NODE)?.len() == 2);
    Ok(())
}

#[tokio::test]
async fn a_failed_new_instance_does_not_leave_the_node_unserved() {
    let mut cluster = one_node().await;
    let r = failed_rollout(&mut cluster).await;
    cluster.check(r);
}

/// The new instance fails at start-up (here: a GPU model it does not know). It checks its GPUs
/// before it asks the old instance to hand over (issue 30), so it exits without ever asking, and
/// the old instance keeps serving the node: no restart, no gap.
async fn failed_rollout(cluster: &mut Cluster) -> Result<()> {
    let c = cluster.client();
    old_instance_serving_a(cluster, "0ld00000-0000-4000-8000-000000000003").await?;

    start_instance_with(
        cluster,
        "plugin-bad",
        "bad00000-0000-4000-8000-000000000004",
        "NoSuchGPU:1",
    )?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match cluster.check_alive() {
            Err(e) if e.to_string().contains("plugin-bad") => break,
            _ if tokio::time::Instant::now() > deadline => bail!("the new instance did not exit"),
            _ => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
    let bad = std::fs::read_to_string(cluster.log_of("plugin-bad"))?;
    ensure!(
        bad.contains("NoSuchGPU"),
        "the new instance failed on its GPUs: {bad}"
    );
    cluster.stop_component("plugin-bad", false)?;
    let old = std::fs::read_to_string(cluster.log_of("plugin-old"))?;
    ensure!(
        !old.contains("handing over"),
        "the old instance was asked to hand over by an instance that could not serve"
    );
    // The old instance still serves: a new pod gets its slice from it.
    create_pod(&c, "b", "one-1g", None).await?;
    wait_running(&c, "b").await?;
    ensure!(live_slices(cluster, NODE)?.len() == 2);
    delete_pod(&c, "a").await?;
    wait::until("a's slice to be released", TIMEOUT, || async {
        Ok((live_slices(cluster, NODE)?.len() == 1).then_some(()))
    })
    .await
}
