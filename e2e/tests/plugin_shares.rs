//! One slice, several claims (docs/design.md §7, "Shared slices"; KEP-5075 consumable
//! capacity), end to end through the real scheduler and kubelet on the default version, with
//! the emulated GPUs' stand-in MPS control daemon: two pods whose claims ask for shares of a
//! `1g.10gb` slice (class `1g.10gb.shared.mig.das.com`, which sets `sharing.strategy: MPS`) run
//! on one slice with one daemon, each container with the pipe directory and its own share's
//! limits, each claim's `status.devices` keyed by its shareID; a share beyond any slice's
//! capacity stays Pending with the scheduler's reason; an exclusive pod never lands on the
//! shared placement; a share whose config differs from the slice's fails its prepare with the
//! reason and leaves nothing; deleting one sharing pod keeps the slice and its daemon, deleting
//! the last destroys the slice and stops the daemon.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use das_driver::mps::stand_in::Record;
use das_e2e::Cluster;
use das_e2e::das::{apply_shared_device_classes, container_view};
use das_e2e::plugin::{cluster_with_configured_plugins, live_slices};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, create_claim_pod, create_pod, create_template, delete_pod, http_get,
    wait_pod_event_containing, wait_running, wait_unschedulable,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::{Value, json};

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";
const SHARED: &str = "1g.10gb.shared.mig.das.com";

#[tokio::test]
async fn shares_of_one_slice_run_under_its_one_mps_daemon_and_the_last_leaves_nothing() {
    let flags: &[&str] = &["--shared-profiles=1g.10gb"];
    let (mut cluster, ports) = cluster_with_configured_plugins(&[(NODE, GPUS, flags)]).await;
    let r = scenario(&mut cluster, ports[NODE]).await;
    cluster.check(r);
}

/// A share of [`SHARED`]: `shares` of the slice's 4.
fn share(shares: u32) -> Value {
    json!({"deviceClassName": SHARED, "capacity": {"requests": {"shares": shares.to_string()}}})
}

/// What one sharing pod's container got: its MIG UUID and environment.
struct Seen {
    mig: String,
    env: std::collections::BTreeMap<String, String>,
    pipe: PathBuf,
}

async fn seen(cluster: &Cluster, pod: &str) -> Result<Seen> {
    let p = wait_running(&cluster.client(), pod).await?;
    let uid = p.metadata.uid.context("pod uid")?;
    let view = container_view(cluster.node(NODE), &uid, "app")?;
    Ok(Seen {
        mig: view.mig_uuids().into_iter().next().context("no MIG UUID")?,
        pipe: PathBuf::from(
            view.mounts
                .get("/tmp/nvidia-mps")
                .context("no pipe mount")?,
        ),
        env: view.env,
    })
}

async fn scenario(cluster: &mut Cluster, metrics_port: u16) -> Result<()> {
    let c = cluster.client();
    apply_shared_device_classes(&c, &["1g.10gb"]).await?;

    // Two shares (1 and 2 of 4) of one slice.
    create_claim_pod(&c, "s1", share(1), None).await?;
    create_claim_pod(&c, "s2", share(2), None).await?;
    let (s1, s2) = (seen(cluster, "s1").await?, seen(cluster, "s2").await?);
    ensure!(
        s1.mig == s2.mig,
        "two slices for two shares: {} {}",
        s1.mig,
        s2.mig
    );
    ensure!(s1.pipe == s2.pipe, "two daemons for one slice");
    let slices = live_slices(cluster, NODE)?;
    ensure!(slices.len() == 1, "one slice expected: {slices:?}");
    for (s, percent) in [(&s1, "25"), (&s2, "50")] {
        let get = |k: &str| s.env.get(k).map(String::as_str);
        ensure!(
            get("CUDA_MPS_PIPE_DIRECTORY") == Some("/tmp/nvidia-mps")
                && get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some(percent)
                && get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == Some("0=2304M"),
            "a share's limits: {:?}",
            s.env
        );
    }
    // One stand-in daemon, pinned to the slice (the class sets no slice-wide limits).
    let root = s1.pipe.parent().context("pipe dir")?.to_path_buf();
    let record = Record::read(&root.join("log")).context("no stand-in record")?;
    ensure!(
        record.runs.len() == 1 && record.runs[0].visible_devices == s1.mig,
        "the slice's daemon: {record:?}"
    );
    let daemon = record.runs[0].pid;
    let metrics = http_get(metrics_port, "/metrics").await?.1;
    ensure!(
        metrics.contains("das_kubelet_plugin_mps_daemons 1"),
        "not one supervised daemon"
    );
    // Each claim's status entry is keyed by its share.
    for pod in ["s1", "s2"] {
        let rc = Api::<ResourceClaim>::namespaced(c.clone(), NS)
            .get(pod)
            .await?;
        let st = rc.status.context("status")?;
        let result = &st
            .allocation
            .context("allocation")?
            .devices
            .context("devices")?
            .results
            .context("results")?[0];
        let entry = st
            .devices
            .unwrap_or_default()
            .into_iter()
            .next()
            .context("no status.devices")?;
        ensure!(
            result.share_id.is_some()
                && entry.share_id == result.share_id
                && entry.device == result.device,
            "{pod}: status {entry:?} for result {result:?}"
        );
    }

    // A share larger than a slice fits nowhere: Pending, with the scheduler's reason.
    create_claim_pod(&c, "s3", share(5), None).await?;
    let why = wait_unschedulable(&c, "s3").await?;
    ensure!(why.contains("cannot allocate all claims"), "s3: {why}");

    // An exclusive slice never takes the shared placement.
    create_template(&c, "one", "1g.10gb", 1).await?;
    create_pod(&c, "e1", "one", None).await?;
    wait_running(&c, "e1").await?;
    let slices = live_slices(cluster, NODE)?;
    ensure!(
        slices.len() == 2 && slices.iter().filter(|s| s.3 == s1.mig).count() == 1,
        "the exclusive pod's slice: {slices:?}"
    );

    // A share asking for other MPS settings than the slice has is refused at prepare.
    let other = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 60}}});
    create_claim_pod(&c, "s4", share(1), Some(other)).await?;
    let msg = wait_pod_event_containing(&c, "s4", "FailedPrepareDynamicResources", "shared slice")
        .await?;
    ensure!(msg.contains("another device configuration"), "s4: {msg}");
    delete_pod(&c, "s4").await?;
    ensure!(
        live_slices(cluster, NODE)?.len() == 2,
        "the refused share left a slice"
    );

    // The first share leaves: slice and daemon stay for the other.
    delete_pod(&c, "s1").await?;
    ensure!(
        live_slices(cluster, NODE)?.iter().any(|s| s.3 == s1.mig) && running(daemon),
        "the slice or its daemon went with the first share"
    );
    // The last leaves: the daemon stops, its directories and the slice go.
    delete_pod(&c, "s2").await?;
    wait::until(
        "the shared slice and its daemon to be gone",
        TIMEOUT,
        || async {
            let slices = live_slices(cluster, NODE)?;
            let gone = !root.exists() && !running(daemon) && !slices.iter().any(|s| s.3 == s1.mig);
            Ok(gone.then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.contains(") Z") && !s.contains(") X"))
}
