//! MPS on a slice (docs/design.md §7, "MPS on a slice"), end to end through the real scheduler
//! and kubelet, with the emulated GPUs' stand-in MPS control daemon: a pod whose claim template
//! asks for `sharing: {strategy: MPS}` with limits runs; its container's CDI edits carry
//! `CUDA_MPS_PIPE_DIRECTORY` and mount the slice's pipe and shm directories; the stand-in, under
//! the plugin's state dir, was pinned to the slice's MIG UUID and got both limits; the plugin
//! counts one supervised daemon. A crashed and restarted plugin adopts the running daemon and
//! applies its limits again; a killed daemon is started again with its limits. A pinned memory
//! limit above the slice fails the prepare with the valid range and leaves no slice. Deleting
//! the pod stops the daemon and removes its directories with the slice.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use das_driver::mps::stand_in::Record;
use das_e2e::Cluster;
use das_e2e::das::container_view;
use das_e2e::plugin::{cluster_with_plugins, live_slices, plugin_name, start_plugin};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    create_config_template, create_pod, delete_pod, http_get, wait_pod_event_containing,
    wait_running,
};
use serde_json::{Value, json};

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";

#[tokio::test]
async fn an_mps_slice_gets_its_daemon_limits_and_mounts_and_leaves_nothing() {
    let (mut cluster, ports) = cluster_with_plugins(&[(NODE, GPUS)]).await;
    let r = scenario(&mut cluster, ports[NODE]).await;
    cluster.check(r);
}

fn mps(limit: &str) -> Value {
    json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 30, "pinnedDeviceMemoryLimit": limit}}})
}

async fn scenario(cluster: &mut Cluster, metrics_port: u16) -> Result<()> {
    let c = cluster.client();
    create_config_template(&c, "mps", "mig.das.com", mps("2Gi")).await?;
    create_config_template(&c, "too-big", "mig.das.com", mps("20Gi")).await?;

    // A limit above the slice's memory: refused at prepare, with the valid range; no slice.
    create_pod(&c, "too-big", "too-big", None).await?;
    let msg = wait_pod_event_containing(
        &c,
        "too-big",
        "FailedPrepareDynamicResources",
        "device configuration for mig.das.com",
    )
    .await?;
    ensure!(
        msg.contains("sharing.mps.pinnedDeviceMemoryLimit is 20480Mi, more than the")
            && msg.contains("of a 1g.10gb slice; valid: 1Mi to"),
        "too-big's event does not give the limit's range: {msg}"
    );
    ensure!(
        live_slices(cluster, NODE)?.is_empty(),
        "a slice was made for a claim whose MPS limit does not fit"
    );
    delete_pod(&c, "too-big").await?;

    create_pod(&c, "mps", "mps", None).await?;
    let pod = wait_running(&c, "mps").await?;
    let uid = pod.metadata.uid.clone().context("pod uid")?;
    let view = container_view(cluster.node(NODE), &uid, "app")?;
    let mig = view.mig_uuids().into_iter().next().context("no MIG UUID")?;
    ensure!(
        view.env.get("CUDA_MPS_PIPE_DIRECTORY").map(String::as_str) == Some("/tmp/nvidia-mps"),
        "the container lacks CUDA_MPS_PIPE_DIRECTORY: {:?}",
        view.env
    );
    let pipe = PathBuf::from(
        view.mounts
            .get("/tmp/nvidia-mps")
            .context("no pipe mount")?,
    );
    let shm = PathBuf::from(view.mounts.get("/dev/shm").context("no shm mount")?);
    let root = pipe.parent().context("pipe dir")?.to_path_buf();
    let state = cluster.node(NODE).root_dir.join("das").join("mps");
    ensure!(
        root.parent() == Some(state.as_path()) && shm == root.join("shm") && shm.is_dir(),
        "the daemon's directories are not under the plugin's state dir: pipe {}, shm {}",
        pipe.display(),
        shm.display()
    );
    // The stand-in was pinned to the slice and got both limits before the pod ran.
    let record = Record::read(&root.join("log")).context("no stand-in record")?;
    let run = record.runs.first().context("the stand-in never ran")?;
    ensure!(
        run.visible_devices == mig
            && run.commands
                == [
                    "set_default_active_thread_percentage 30".to_string(),
                    "set_default_device_pinned_mem_limit 0 2048M".to_string(),
                ],
        "the stand-in's record: {record:?} (slice {mig})"
    );
    let metrics = http_get(metrics_port, "/metrics").await?.1;
    ensure!(
        metrics.contains("das_kubelet_plugin_mps_daemons 1"),
        "no supervised daemon in the metrics"
    );
    let limits = run.commands.clone();

    // The plugin crashes and comes back: it adopts the running daemon (same process, its
    // limits applied again) instead of starting another.
    cluster.stop_component(&plugin_name(NODE), false)?;
    let metrics_port = start_plugin(cluster, NODE, GPUS)?;
    let log = root.join("log");
    let adopted = wait::until(
        "the restarted plugin to adopt the daemon",
        TIMEOUT,
        || async {
            let r = Record::read(&log).unwrap_or_default();
            Ok((r.runs.len() == 1 && r.runs[0].commands.len() == 2 * limits.len()).then_some(r))
        },
    )
    .await?;
    ensure!(
        adopted.runs[0].pid == run.pid && adopted.runs[0].commands[limits.len()..] == limits[..],
        "not adopted with its limits: {adopted:?}"
    );
    wait::until("the adopted daemon in the metrics", TIMEOUT, || async {
        let m = http_get(metrics_port, "/metrics").await?.1;
        Ok(m.contains("das_kubelet_plugin_mps_daemons 1").then_some(()))
    })
    .await?;

    // The daemon dies: its supervisor starts another, pinned to the slice, with the limits.
    kill(run.pid)?;
    let again = wait::until("the daemon started again", TIMEOUT, || async {
        let r = Record::read(&log).unwrap_or_default();
        Ok(r.runs.get(1).filter(|n| n.commands == limits).cloned())
    })
    .await?;
    ensure!(
        again.visible_devices == mig && again.pid != run.pid && running(again.pid),
        "the new daemon: {again:?}"
    );
    // The supervisor counts the restart after the new daemon took its limits, which the
    // record shows first: wait for the count as for the rest.
    wait::until("the restart counted, the daemon up", TIMEOUT, || async {
        let m = http_get(metrics_port, "/metrics").await?.1;
        let counted = m.contains(r#"das_kubelet_plugin_mps_daemon_restarts_total{result="ok"} 1"#)
            && m.contains("das_kubelet_plugin_mps_daemons_up 1");
        Ok(counted.then_some(()))
    })
    .await?;

    // The pod's end stops the daemon and removes its directories with the slice.
    let pid = again.pid;
    delete_pod(&c, "mps").await?;
    wait::until(
        "the MPS daemon and its slice to be gone",
        TIMEOUT,
        || async {
            let gone = !root.exists() && !running(pid) && live_slices(cluster, NODE)?.is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// SIGKILL to `pid`, as a crash of the daemon would end it.
fn kill(pid: u32) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -9 {pid}: {status}");
    Ok(())
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
        .is_ok_and(|s| !s.contains(") Z") && !s.contains(") X"))
}
