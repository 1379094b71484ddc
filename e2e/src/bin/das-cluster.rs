//! `das-cluster up|down|status`: the local Kubernetes behind `make cluster-up` / `make cluster-down`.
//!
//! `up` starts etcd, the control plane and hollow DRA kubelets in the background, writes
//! `.local/cluster/kubeconfig` and `.local/cluster/state.json`, and returns; `down` stops every
//! process recorded there and removes the cluster's files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use das_e2e::cluster::{self, Cluster, ClusterConfig, ClusterState, KUBERNETES_VERSION};
use das_e2e::das;
use das_e2e::process::{self, Lifetime};
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Local Kubernetes (real control plane, hollow DRA kubelets) for DAS")]
struct Cli {
    /// Where the cluster's kubeconfig and state go.
    #[arg(long, default_value = ".local/cluster", global = true)]
    state_dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the cluster in the background.
    Up {
        /// Nodes and their emulated GPUs, `node=MODEL:COUNT` comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "n0=A100-SXM4-40GB:2,n1=H100-80GB:2"
        )]
        nodes: Vec<String>,
        /// The node plugin binary; when given, each node runs it with its emulated GPUs and the
        /// DeviceClasses of the published profiles are created.
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// The controller binary; when given, the AllocationClaim CRD is installed and the
        /// controller mirrors every allocation into an AllocationClaim.
        #[arg(long)]
        controller_bin: Option<PathBuf>,
    },
    /// Stop the cluster and remove its files.
    Down,
    /// Say whether the cluster runs.
    Status,
    /// Print which pods hold which MIG slices where (for `make demo`).
    Report,
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

fn load_state(dir: &Path) -> Result<Option<ClusterState>> {
    let f = state_file(dir);
    if !f.exists() {
        return Ok(None);
    }
    let data = std::fs::read(&f)?;
    let state = serde_json::from_slice(&data).with_context(|| {
        format!(
            "{} is not a DAS cluster state file; remove it to start over",
            f.display()
        )
    })?;
    Ok(Some(state))
}

fn running(state: &ClusterState) -> usize {
    state
        .pids
        .iter()
        .filter(|p| process::alive(**p as i32))
        .count()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.state_dir)?;
    let state_dir = cli.state_dir.canonicalize()?;
    match cli.cmd {
        Cmd::Up {
            nodes,
            plugin_bin,
            controller_bin,
        } => up(&state_dir, nodes, plugin_bin, controller_bin).await,
        Cmd::Down => down(&state_dir),
        Cmd::Status => status(&state_dir),
        Cmd::Report => {
            let state = load_state(&state_dir)?.context("no cluster: run `make cluster-up`")?;
            let client = das_e2e::kubeconfig::client(&state.kubeconfig).await?;
            print!("{}", das::report(&client).await?);
            Ok(())
        }
    }
}

/// `node=MODEL:COUNT` → (node, gpus); a bare `node` has no GPUs.
fn parse_node(spec: &str) -> (String, Option<String>) {
    match spec.split_once('=') {
        Some((n, g)) => (n.to_string(), Some(g.to_string())),
        None => (spec.to_string(), None),
    }
}

async fn up(
    state_dir: &Path,
    node_specs: Vec<String>,
    plugin_bin: Option<PathBuf>,
    controller_bin: Option<PathBuf>,
) -> Result<()> {
    let parsed: Vec<(String, Option<String>)> = node_specs.iter().map(|s| parse_node(s)).collect();
    let nodes: Vec<String> = parsed.iter().map(|(n, _)| n.clone()).collect();
    if let Some(s) = load_state(state_dir)? {
        if running(&s) > 0 {
            bail!(
                "a cluster is already running (KUBECONFIG={}); run `make cluster-down` first",
                s.kubeconfig.display()
            );
        }
        down(state_dir)?;
    }
    // Kubelet sockets live below the run dir: keep it short enough for 108-byte socket paths.
    let run_dir = state_dir.join("run");
    let dir = if run_dir.as_os_str().len() <= 48 {
        run_dir
    } else {
        std::env::temp_dir().join(format!("das-cluster-{}", std::process::id()))
    };
    let mut cfg = ClusterConfig::with_nodes(&nodes.iter().map(String::as_str).collect::<Vec<_>>());
    cfg.dir = Some(dir);
    cfg.lifetime = Lifetime::Detached;
    let t0 = std::time::Instant::now();
    let mut cluster = Cluster::start(cfg).await?;
    if let Some(bin) = &plugin_bin
        && let Err(e) = start_das(&mut cluster, bin, &parsed).await
    {
        cluster.print_log_tails(30);
        return Err(e);
    }
    if let Some(bin) = &controller_bin
        && let Err(e) = start_controller(&mut cluster, bin).await
    {
        cluster.print_log_tails(30);
        return Err(e);
    }
    let elapsed = t0.elapsed();
    let kubeconfig = state_dir.join("kubeconfig");
    std::fs::copy(&cluster.kubeconfig, &kubeconfig)?;
    let mut state = cluster.detach();
    state.kubeconfig = kubeconfig.clone();
    std::fs::write(state_file(state_dir), serde_json::to_vec_pretty(&state)?)?;

    let kubectl = cluster::workspace_root().join(".local/bin/kubectl");
    println!(
        "Local Kubernetes {KUBERNETES_VERSION} is up in {:.1}s with nodes: {}",
        elapsed.as_secs_f64(),
        nodes.join(", ")
    );
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  {} get nodes", kubectl.display());
    println!();
    println!("Component logs: {}", state.dir.join("logs").display());
    println!("Stop it with:   make cluster-down");
    Ok(())
}

/// Starts the DAS node plugin on every node with GPUs and waits for their ResourceSlices, then
/// creates the DeviceClasses (as the Helm chart does).
async fn start_das(
    cluster: &mut Cluster,
    bin: &Path,
    nodes: &[(String, Option<String>)],
) -> Result<()> {
    let bin = bin
        .canonicalize()
        .with_context(|| format!("plugin binary {}", bin.display()))?;
    let kubeconfig = cluster.kubeconfig.clone();
    for (name, gpus) in nodes {
        let Some(gpus) = gpus else { continue };
        let node = cluster.node(name).clone();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        cluster.spawn_program(
            &format!("das-plugin-{name}"),
            &bin,
            das::plugin_args(&node, gpus, &kubeconfig, port),
        )?;
    }
    let client = cluster.client();
    let with_gpus = nodes.iter().filter(|(_, g)| g.is_some()).count();
    let profiles = das_e2e::wait::until(
        "every node plugin to publish its ResourceSlices",
        Duration::from_secs(60),
        || async {
            let api: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> =
                kube::Api::all(client.clone());
            let lp =
                kube::api::ListParams::default().fields(&format!("spec.driver={}", das::DRIVER));
            let slices = api.list(&lp).await?.items;
            let mut pools: Vec<&str> = slices.iter().map(|s| s.spec.pool.name.as_str()).collect();
            pools.sort();
            pools.dedup();
            if pools.len() < with_gpus {
                return Ok(None);
            }
            Ok(Some(das::published_profiles(&client).await?))
        },
    )
    .await?;
    let refs: Vec<&str> = profiles.iter().map(String::as_str).collect();
    das::apply_device_classes(&client, &refs).await?;
    println!(
        "DAS node plugins run on {} node(s); DeviceClasses for {} profiles: {}",
        with_gpus,
        refs.len(),
        refs.join(", ")
    );
    Ok(())
}

/// Installs the AllocationClaim CRD and starts the controller.
async fn start_controller(cluster: &mut Cluster, bin: &Path) -> Result<()> {
    let bin = bin
        .canonicalize()
        .with_context(|| format!("controller binary {}", bin.display()))?;
    das::install_allocation_claim_crd(&cluster.client()).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let args = das::controller_args(&cluster.kubeconfig.clone(), port);
    cluster.spawn_program("das-controller", &bin, args)?;
    println!("das-controller runs: kubectl get allocationclaims -A");
    Ok(())
}

fn status(state_dir: &Path) -> Result<()> {
    let Some(state) = load_state(state_dir)? else {
        println!("no cluster");
        return Ok(());
    };
    println!(
        "{} of {} cluster processes running; KUBECONFIG={}",
        running(&state),
        state.pids.len(),
        state.kubeconfig.display()
    );
    println!(
        "{:<26} {:>8} {:>12} {:>12}",
        "component", "pid", "RSS MiB", "peak MiB"
    );
    let (mut total, mut total_peak) = (0, 0);
    for pid in &state.pids {
        let pid = *pid as i32;
        let name = process::component_name(pid).unwrap_or_else(|| "(exited)".into());
        let (rss, peak) = process::memory_kib(pid).unwrap_or((0, 0));
        total += rss;
        total_peak += peak;
        println!(
            "{name:<26} {pid:>8} {:>12.1} {:>12.1}",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }
    println!(
        "{:<26} {:>8} {:>12.1} {:>12.1}",
        "total",
        "",
        total as f64 / 1024.0,
        total_peak as f64 / 1024.0
    );
    Ok(())
}

fn down(state_dir: &Path) -> Result<()> {
    let Some(state) = load_state(state_dir)? else {
        println!("no cluster to stop");
        return Ok(());
    };
    cluster::stop_detached(&state);
    let left = running(&state);
    if left > 0 {
        bail!(
            "{left} cluster processes are still running: {:?}",
            state.pids
        );
    }
    let _ = std::fs::remove_dir_all(&state.dir);
    let _ = std::fs::remove_file(state_dir.join("kubeconfig"));
    std::fs::remove_file(state_file(state_dir))?;
    println!("cluster stopped");
    Ok(())
}
