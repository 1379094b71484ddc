//! MPS on a slice on a real-runtime node (docs/design.md §7, "MPS on a slice"): the upstream
//! kubelet with containerd and runc ([`das_e2e::runtime`]), DAS from the chart with
//! `mps.shmOnEmulatedGpus` and `mps.shmSize=16Mi`, the emulated GPUs' stand-in MPS daemon. What
//! the container reports (the probe, e2e/containerd/probe, through `kubectl logs`) is what runc
//! gave it from DAS's CDI spec: its `/dev/shm` is a tmpfs of the configured size that it cannot
//! write past (`ENOSPC`), its pipe directory is read-only (creating or removing anything there
//! fails `EROFS`, though the container runs as root), and it still reaches its slice's daemon,
//! which answers with the claim's limit. Deleting the pod stops the daemon and unmounts the tmpfs.
//!
//! Needs root, runc and `make containerd`; one real-runtime test at a time
//! (`flock /tmp/das-runtime-node.lock`).

use anyhow::{Context, Result, ensure};
use das_driver::mps::shm;
use das_driver::mps::stand_in::Record;
use das_e2e::das::{self, PluginDirs};
use das_e2e::install::{self, Binaries, Installed};
use das_e2e::plugin::live_slices;
use das_e2e::runtime_pods::{check_container, create, probe, wait_ready};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_config_template, delete_pod, http_get};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use serde_json::json;
use std::path::{Path, PathBuf};

const NODE: &str = "r0";
const GPUS: &str = "H100-80GB:1";
/// `mps.shmSize`.
const SHM_BYTES: u64 = 16 << 20;

#[tokio::test]
async fn an_mps_container_gets_a_bounded_shm_a_read_only_pipe_and_still_its_daemon() {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.runtime_nodes = vec![NODE.into()];
    let mut cluster = Cluster::start(config).await.expect("cluster starts");
    let setup = async {
        // No webhook: the pod asks for its claim through DRA.
        let bins = Binaries::in_target_dir("debug", false)?;
        let rendered =
            das_e2e::chart::render_with(&["mps.shmOnEmulatedGpus=true", "mps.shmSize=16Mi"])?;
        let installed = install::install_rendered(
            &mut cluster,
            &rendered,
            &[(NODE.into(), GPUS.into())],
            &bins,
        )
        .await?;
        das::wait_pool_complete(&cluster.client(), NODE).await?;
        let mps = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 30}}});
        create_config_template(&cluster.client(), "mps", das_api::DRIVER_NAME, mps).await?;
        Ok::<Installed, anyhow::Error>(installed)
    };
    let installed = match setup.await {
        Ok(i) => i,
        Err(e) => return cluster.check(Err(e)),
    };
    cluster.check(scenario(&cluster, &installed).await);
}

async fn scenario(cluster: &Cluster, installed: &Installed) -> Result<()> {
    let c = cluster.client();
    let mut app = probe("app", &["gpu"]);
    // The probe fills /dev/shm only when asked: a demo's 8Gi tmpfs is not written.
    app["env"] = json!([{"name": "DAS_PROBE_FILL_SHM", "value": "1"}]);
    create(
        &c,
        NODE,
        "mps",
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mps"}],
            "containers": [app],
        }),
    )
    .await?;
    let pod = wait_ready(&c, "mps").await?;
    // Running is not reported: the probe writes /dev/shm full before its last line.
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    wait::until("the probe's report", TIMEOUT, || async {
        let log = pods.logs("mps", &LogParams::default()).await?;
        Ok(log.contains("das-probe: ready").then_some(()))
    })
    .await?;
    let view = check_container(cluster, NODE, &pod, "app", 1).await?;
    let fact = |k: &str| view.mps.get(k).cloned().unwrap_or_default();
    eprintln!("the container's MPS facts: {:?}", view.mps);

    // /dev/shm: the daemon's tmpfs, of the configured size; a write past it fails.
    ensure!(
        fact("shm") == format!("fs=tmpfs size={SHM_BYTES}"),
        "/dev/shm in the container: {:?}",
        fact("shm")
    );
    let fill = fact("shm-fill");
    let wrote: u64 = fill
        .strip_prefix("wrote=")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("shm-fill {fill:?}"))?;
    ensure!(
        fill.ends_with("err=ENOSPC") && wrote <= SHM_BYTES,
        "writing past /dev/shm's size: {fill:?}"
    );
    // The pipe directory: read-only, nothing created or removed, the daemon still reached.
    ensure!(fact("pipe") == "mount=ro", "pipe mount: {:?}", fact("pipe"));
    ensure!(
        fact("pipe-create") == "err=EROFS",
        "creating a file in the pipe directory: {:?}",
        fact("pipe-create")
    );
    ensure!(
        fact("pipe-remove-control") == "err=EROFS",
        "removing the control socket: {:?}",
        fact("pipe-remove-control")
    );
    ensure!(
        fact("connect") == "answer=30.0",
        "the container's question to its daemon: {:?}",
        fact("connect")
    );

    // On the node: one daemon, its tmpfs, its socket untouched; it got the container's question.
    let mps_dir = PluginDirs::of(cluster.node(NODE)).state.join("mps");
    let daemon = one_daemon(&mps_dir)?;
    ensure!(
        tmpfs_below(&mps_dir) == vec![daemon.join("shm")],
        "tmpfs mounts under {}: {:?}",
        mps_dir.display(),
        tmpfs_below(&mps_dir)
    );
    ensure!(daemon.join("pipe/control").exists(), "the control socket");
    let record = Record::read(&daemon.join("log")).context("the stand-in's record")?;
    let commands = &record.runs.last().context("a run")?.commands;
    ensure!(
        commands
            .iter()
            .any(|c| c == "get_default_active_thread_percentage"),
        "the daemon never heard from the container: {commands:?}"
    );
    // The tmpfs is reported.
    let port = installed.plugin_metrics[NODE];
    let id = daemon.file_name().unwrap_or_default().to_string_lossy();
    let (_, metrics) = http_get(port, "/metrics").await?;
    let size = format!("das_kubelet_plugin_mps_shm_size_bytes{{daemon=\"{id}\"}} {SHM_BYTES}");
    ensure!(metrics.contains(&size), "no {size} in the metrics");

    // Deleting the pod stops the daemon, unmounts its tmpfs and destroys the slice.
    delete_pod(&c, "mps").await?;
    wait::until("the daemon's directory and slice gone", TIMEOUT, || async {
        let gone = !daemon.exists() && live_slices(cluster, NODE)?.is_empty();
        Ok(gone.then_some(()))
    })
    .await?;
    ensure!(
        tmpfs_below(&mps_dir).is_empty(),
        "tmpfs left: {:?}",
        tmpfs_below(&mps_dir)
    );
    Ok(())
}

/// The one daemon directory under `mps_dir`.
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

/// The tmpfs mount points below `dir` in this (the host's) mount table.
fn tmpfs_below(dir: &Path) -> Vec<PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    shm::parse_mountinfo(&text)
        .into_iter()
        .filter(|e| e.fs_type == "tmpfs" && e.mount_point.starts_with(&dir))
        .map(|e| e.mount_point)
        .collect()
}
