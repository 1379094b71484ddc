//! MPS daemons outlive a `helm upgrade` of the node plugin (docs/design.md §7, "MPS on a
//! slice", "Who runs the daemons"): DAS installed with `helm install` on a real-runtime node
//! (containerd, runc, a Service network; [`das_e2e::real_install`]) with `mps.host.enabled`,
//! so the DaemonSet `das-mps-host` runs the MPS control daemons (the emulated GPUs' stand-in).
//! A pod of an MPS claim runs; `helm upgrade` to a new image tag rolls the plugin's pod (surge
//! and handover) but not the host's (`OnDelete`). The daemon is the same process before and
//! after (pid and start time of its pid file, a child of the host's process), its record shows
//! one run (it was never started again), the pod keeps its container, and the new plugin's log
//! says it adopted the daemon. Deleting the pod then stops the daemon through the new plugin.
//!
//! Needs root, runc, iptables and `make containerd`; one such cluster per machine at a time.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use das_driver::mps::stand_in::Record;
use das_e2e::chart::NAMESPACE;
use das_e2e::das::{self, PluginDirs};
use das_e2e::real_install::{self, IMAGE_REPO, container_ids, das_pods, image_of};
use das_e2e::runtime_pods::{create, probe, wait_ready};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_config_template, delete_pod};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;

const NODE: &str = "r0";
const GPUS: &str = "H100-80GB:1";

#[tokio::test]
async fn a_helm_upgrade_of_the_plugin_keeps_the_mps_daemon_of_a_running_pod() {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.runtime_nodes = vec![NODE.into()];
    config.service_network = true;
    let cluster = Cluster::start(config).await.expect("cluster starts");
    let result = async {
        real_install::import_image(&cluster, &["e2e-1", "e2e-2"])?;
        real_install::install_with(&cluster, NODE, GPUS, "e2e-1", &["mps.host.enabled=true"])?;
        scenario(&cluster).await
    }
    .await;
    cluster.check(result);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let host = wait::until("the MPS host pod running", TIMEOUT, || async {
        let pods = das_pods(&c, "das-mps-host").await?;
        Ok(pods
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")))
    })
    .await?;
    das::wait_pool_complete(&c, NODE).await?;
    let mps = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 30}}});
    // The webhook validates the template; its Service may refuse the first calls while its
    // endpoints travel to kube-proxy (nothing is stored then): retried until it answers.
    wait::until("the template, through the webhook", TIMEOUT, || async {
        match create_config_template(&c, "mps", das_api::DRIVER_NAME, mps.clone()).await {
            Ok(()) => Ok(Some(())),
            Err(e) if format!("{e:#}").contains("failed calling webhook") => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await?;
    create(
        &c,
        NODE,
        "mps",
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mps"}],
            "containers": [probe("app", &["gpu"])],
        }),
    )
    .await?;
    let before = wait_ready(&c, "mps").await?;

    let mps_dir = PluginDirs::of(cluster.node(NODE)).state.join("mps");
    let daemon = one_daemon(&mps_dir)?;
    let (pid, start) = pid_file(&daemon)?;
    let host_pid = parent(pid).context("the daemon's parent")?;
    let host_cmd = cmdline(host_pid);
    ensure!(
        host_cmd.contains("mps-host"),
        "the daemon {pid} is a child of {host_pid} ({host_cmd:?}), not of the MPS host"
    );

    let plugin_before = das_pods(&c, "das-kubelet-plugin").await?;
    real_install::upgrade(cluster, "e2e-2")?;
    let plugin_after = das_pods(&c, "das-kubelet-plugin").await?;
    ensure!(
        plugin_after.len() == 1 && plugin_after[0].metadata.name != plugin_before[0].metadata.name,
        "the plugin pod was not replaced"
    );
    ensure!(
        image_of(&plugin_after[0]) == format!("{IMAGE_REPO}:e2e-2"),
        "new plugin pod runs {}",
        image_of(&plugin_after[0])
    );
    let hosts = das_pods(&c, "das-mps-host").await?;
    ensure!(
        hosts.len() == 1 && hosts[0].metadata.uid == host.metadata.uid,
        "the MPS host pod was replaced (OnDelete)"
    );
    // The new plugin has adopted it by now: it is Ready only after bringing daemons back.
    let plugin_log = das_e2e::chart::kubectl(
        &cluster.kubeconfig,
        &[
            "logs",
            "-n",
            NAMESPACE,
            plugin_after[0].metadata.name.as_deref().unwrap_or_default(),
        ],
        None,
    )?;
    ensure!(
        plugin_log.contains("adopted a running MPS control daemon"),
        "the new plugin did not adopt the daemon:\n{plugin_log}"
    );
    ensure!(
        pid_file(&daemon)? == (pid, start) && running(pid),
        "the daemon {pid} did not outlive the upgrade (pid file now {:?})",
        pid_file(&daemon).ok()
    );
    let runs = Record::read(&daemon.join("log"))
        .context("the stand-in's record")?
        .runs;
    ensure!(runs.len() == 1, "the daemon was started again: {runs:?}");
    let after = Api::<Pod>::namespaced(c.clone(), NS).get("mps").await?;
    ensure!(
        container_ids(&after) == container_ids(&before)
            && after.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
        "the MPS pod's container changed or stopped across the upgrade"
    );
    eprintln!(
        "MPS daemon pid {pid} (start {start}, host pid {host_pid}) kept across helm upgrade e2e-1 -> e2e-2"
    );

    // The new plugin stops it with its claim.
    delete_pod(&c, "mps").await?;
    wait::until(
        "the daemon stopped and its directory gone",
        TIMEOUT,
        || async { Ok((!daemon.exists() && !running(pid)).then_some(())) },
    )
    .await
}

/// The one daemon directory under `mps_dir` (the host's socket is a file beside them).
fn one_daemon(mps_dir: &Path) -> Result<PathBuf> {
    let dirs: Vec<PathBuf> = std::fs::read_dir(mps_dir)
        .with_context(|| format!("read {}", mps_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    ensure!(dirs.len() == 1, "daemon directories: {dirs:?}");
    Ok(dirs[0].clone())
}

/// `<pid> <start time>` of the daemon's pid file, as the plugin reads it.
fn pid_file(daemon: &Path) -> Result<(u32, u64)> {
    let p = das_driver::mps::daemon::recorded_process(&daemon.join("daemon.pid"))
        .context("the daemon's pid file")?;
    Ok((p.pid, p.start))
}

/// Field 4 of `/proc/<pid>/stat`.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Whether `pid` runs (exists and is no zombie).
fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
    state.is_some_and(|s| !s.starts_with('Z') && !s.starts_with('X'))
}
