//! `das-cluster up|down|status`: the local Kubernetes behind `make cluster-up` / `make cluster-down`.
//!
//! `up` starts etcd, the control plane and hollow DRA kubelets in the background, writes
//! `.local/cluster/kubeconfig` and `.local/cluster/state.json`, and returns; `down` stops every
//! process recorded there and removes the cluster's files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use das_e2e::cluster::{self, Cluster, ClusterConfig, ClusterState, KUBERNETES_VERSION};
use das_e2e::process::{self, Lifetime};

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
        /// Node names, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "n0,n1")]
        nodes: Vec<String>,
    },
    /// Stop the cluster and remove its files.
    Down,
    /// Say whether the cluster runs.
    Status,
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
        Cmd::Up { nodes } => up(&state_dir, nodes).await,
        Cmd::Down => down(&state_dir),
        Cmd::Status => status(&state_dir),
    }
}

async fn up(state_dir: &Path, nodes: Vec<String>) -> Result<()> {
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
    let cluster = Cluster::start(cfg).await?;
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
