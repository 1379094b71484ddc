//! `das-cluster up|down|status`: the local Kubernetes behind `make cluster-up` / `make cluster-down`.
//!
//! `up` starts etcd, the control plane, hollow DRA kubelets and a real-runtime node (kubelet +
//! containerd) in the background, writes
//! `.local/cluster/kubeconfig` and `.local/cluster/state.json`, and returns; `down` stops every
//! process recorded there and removes the cluster's files.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use das_e2e::cluster::{self, Cluster, ClusterConfig, ClusterState, NodeKind};
use das_e2e::install::{self, Binaries};
use das_e2e::process::{self, Lifetime};
use das_e2e::runtime;

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
        /// Nodes and their emulated GPUs, `node=MODEL:COUNT` comma-separated; or a node count
        /// `N`: nodes `n0`…`n<N-1>` with 2 GPUs each, A100-SXM4-40GB and H100-80GB alternating.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "n0=A100-SXM4-40GB:2,n1=H100-80GB:2,n2=L4:1"
        )]
        nodes: Vec<String>,
        /// A real-runtime node, `node=MODEL:COUNT`: the upstream kubelet with containerd and
        /// runc (`make containerd`; needs root), tainted `das.local/real-runtime` so only pods
        /// that tolerate it land there. Empty: none.
        #[arg(long, default_value = "r0=H100-80GB:1")]
        runtime_node: String,
        /// The node plugin binary; when given, DAS is installed from the Helm chart (its
        /// CRD, DeviceClasses, RBAC and policies) and each node with GPUs runs the plugin as the
        /// chart's DaemonSet would, under the plugin's service account.
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// The controller binary (with --plugin-bin): it mirrors every allocation into an
        /// AllocationClaim.
        #[arg(long, requires = "plugin_bin")]
        controller_bin: Option<PathBuf>,
        /// The webhook binary (with --plugin-bin): legacy `nvidia.com/mig-*` pods get
        /// ResourceClaims.
        #[arg(long, requires = "plugin_bin")]
        webhook_bin: Option<PathBuf>,
        /// Also start Kueue (`make kueue`) with the quota example of docs/examples/kueue/
        /// (`count`: slices per profile; `memory`: GPU memory), its queues for namespace
        /// team-a (docs/kueue.md).
        #[arg(long, requires = "plugin_bin", value_parser = das_e2e::kueue::EXAMPLES)]
        kueue: Option<String>,
        /// Serve whole GPUs beside MIG slices, with MIG mode following demand (docs/design.md
        /// §7): the chart values `wholeGpus.enabled`, `wholeGpus.switchMigMode` and
        /// `webhook.translateWholeGpus` set to true. What `make demo` runs.
        #[arg(long, requires = "plugin_bin")]
        whole_gpus: bool,
        /// A chart value, `KEY=VALUE` as `helm install --set` takes it (repeatable), on top of
        /// `ci/emulated-values.yaml`: for the chart rendered for the local processes and for
        /// `helm install` on the real-runtime node alike.
        #[arg(long = "set", value_name = "KEY=VALUE", requires = "plugin_bin", value_parser = chart_value)]
        set: Vec<String>,
    },
    /// Write the plain manifests rendered from the Helm chart (for users without Helm).
    Manifests {
        #[arg(long, default_value = das_e2e::chart::MANIFESTS)]
        out: PathBuf,
    },
    /// Stop the cluster and remove its files.
    Down,
    /// Say whether the cluster runs.
    Status,
    /// Build the DAS image as an OCI archive without a registry or a daemon (`make image`):
    /// the binaries of `--profile` on glibc and libgcc_s from this machine's Debian packages.
    Image {
        /// Image name with tag.
        #[arg(long)]
        name: String,
        /// Cargo profile of the binaries (`release`, `debug`).
        #[arg(long, default_value = "release")]
        profile: String,
        /// The `org.opencontainers.image.version` label.
        #[arg(long)]
        version: String,
        /// The archive to write.
        #[arg(long)]
        out: PathBuf,
    },
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
            runtime_node,
            plugin_bin,
            controller_bin,
            webhook_bin,
            kueue,
            whole_gpus,
            set,
        } => {
            let bins = plugin_bin.map(|plugin| Binaries {
                plugin,
                controller: controller_bin,
                webhook: webhook_bin,
            });
            let sets = chart_sets(whole_gpus, set);
            up(
                &state_dir,
                nodes,
                &runtime_node,
                bins,
                kueue.as_deref(),
                &sets,
            )
            .await
        }
        Cmd::Manifests { out } => {
            let out = cluster::workspace_root().join(out);
            std::fs::create_dir_all(out.parent().context("manifests path")?)?;
            std::fs::write(&out, das_e2e::chart::manifests()?)?;
            println!("wrote {}", out.display());
            Ok(())
        }
        Cmd::Down => down(&state_dir),
        Cmd::Status => status(&state_dir),
        Cmd::Image {
            name,
            profile,
            version,
            out,
        } => {
            let out = cluster::workspace_root().join(out);
            let opts = das_e2e::image::ImageOptions {
                name: name.clone(),
                profile,
                version,
                out,
            };
            let archive = das_e2e::image::build(&opts)?;
            let size = std::fs::metadata(&archive)?.len();
            println!(
                "built {name}: {} ({} MiB, OCI archive; load with `podman load -i` or `ctr images import`)",
                archive.display(),
                size >> 20
            );
            Ok(())
        }
    }
}

/// A `--set` value: `KEY=VALUE` with a key.
fn chart_value(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() => Ok(s.to_string()),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// The chart values `up` sets: [`das_e2e::chart::WHOLE_GPUS_SWITCHING`] with `--whole-gpus`,
/// then every `--set` (a later one wins in Helm).
fn chart_sets(whole_gpus: bool, set: Vec<String>) -> Vec<String> {
    let whole = whole_gpus.then_some(das_e2e::chart::WHOLE_GPUS_SWITCHING);
    whole
        .into_iter()
        .flatten()
        .map(|s| s.to_string())
        .chain(set)
        .collect()
}

/// `count` nodes `n0`, `n1`, … with 2 emulated GPUs each, A100-SXM4-40GB and H100-80GB nodes
/// alternating (the default pair, repeated): `make cluster-up NODES=8`.
fn numbered_nodes(count: usize) -> Vec<(String, Option<String>)> {
    const MODELS: [&str; 2] = ["A100-SXM4-40GB:2", "H100-80GB:2"];
    (0..count)
        .map(|i| (format!("n{i}"), Some(MODELS[i % 2].to_string())))
        .collect()
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
    runtime_spec: &str,
    bins: Option<Binaries>,
    kueue: Option<&str>,
    sets: &[String],
) -> Result<()> {
    let mut parsed: Vec<(String, Option<String>)> = match node_specs.as_slice() {
        [count] if count.parse::<usize>().is_ok() => numbered_nodes(count.parse()?),
        specs => specs.iter().map(|s| parse_node(s)).collect(),
    };
    let nodes: Vec<String> = parsed.iter().map(|(n, _)| n.clone()).collect();
    let runtime_node = (!runtime_spec.is_empty()).then(|| parse_node(runtime_spec));
    if runtime_node.is_some() {
        runtime::preflight().context(
            "the real-runtime node cannot start here; start the cluster without it: `make cluster-up RUNTIME_NODE=`",
        )?;
    }
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
    // With a real-runtime node, DAS is installed there as a user installs it (helm install;
    // its pods need a Service network), and the hollow nodes' plugins run beside it.
    let helm_on = runtime_node.clone().filter(|_| bins.is_some());
    if let Some(node) = runtime_node {
        cfg.runtime_nodes = vec![node.0.clone()];
        cfg.service_network = helm_on.is_some();
        if helm_on.is_none() {
            parsed.push(node);
        }
    }
    let t0 = std::time::Instant::now();
    let mut cluster = Cluster::start(cfg).await?;
    if let Some(bins) = bins
        && let Err(e) = start_das(&mut cluster, bins, &parsed, helm_on, sets).await
    {
        cluster.print_log_tails(30);
        return Err(e);
    }
    if let Some(example) = kueue {
        if let Err(e) = das_e2e::kueue::start_example(&mut cluster, example).await {
            cluster.print_log_tails(30);
            return Err(e);
        }
        println!(
            "Kueue {} runs with docs/examples/kueue/{example}-config.yaml; its LocalQueue team-a \
             admits the pods of namespace team-a labelled kueue.x-k8s.io/queue-name=team-a",
            das_e2e::kueue::KueueFiles::built()?.version
        );
    }
    detach(state_dir, cluster, t0.elapsed())
}

/// Leaves the started cluster running (`elapsed` after its start): its state and kubeconfig
/// in `state_dir`, and how to use and stop it printed.
fn detach(state_dir: &Path, cluster: Cluster, elapsed: std::time::Duration) -> Result<()> {
    let kubeconfig = state_dir.join("kubeconfig");
    std::fs::copy(&cluster.kubeconfig, &kubeconfig)?;
    let mut state = cluster.detach();
    state.kubeconfig = kubeconfig.clone();
    std::fs::write(state_file(state_dir), serde_json::to_vec_pretty(&state)?)?;

    let kubectl = cluster::k8s_binary().with_file_name("kubectl");
    let version = cluster::k8s_version(&cluster::k8s_binary())?;
    let all_nodes: Vec<String> = state
        .nodes
        .iter()
        .map(|n| match n.kind {
            NodeKind::Hollow => n.name.clone(),
            NodeKind::Runtime => format!("{} (containerd)", n.name),
        })
        .collect();
    println!(
        "Local Kubernetes {version} is up in {:.1}s with nodes: {}",
        elapsed.as_secs_f64(),
        all_nodes.join(", ")
    );
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  {} get nodes", kubectl.display());
    println!();
    // The logs at a fixed path beside the kubeconfig (the run dir may be a temporary one):
    // `make demo` reads the plugins' logs there.
    let logs = state_dir.join("logs");
    let _ = std::fs::remove_file(&logs);
    std::os::unix::fs::symlink(state.dir.join("logs"), &logs)?;
    println!("Component logs: {}", logs.display());
    println!("Stop it with:   make cluster-down");
    Ok(())
}

/// Installs DAS from the Helm chart and starts its components (see `das_e2e::install`): with a
/// real-runtime node `helm_on`, `helm install` there and the hollow nodes' plugins beside it
/// (`install::install_with_helm`), else every component as a local process. `sets` are chart
/// values (`KEY=VALUE`) on top of `ci/emulated-values.yaml`, for both.
async fn start_das(
    cluster: &mut Cluster,
    bins: Binaries,
    nodes: &[(String, Option<String>)],
    helm_on: Option<(String, Option<String>)>,
    sets: &[String],
) -> Result<()> {
    let canonical = |p: &Path| {
        p.canonicalize()
            .with_context(|| format!("binary {}", p.display()))
    };
    let bins = Binaries {
        plugin: canonical(&bins.plugin)?,
        controller: bins.controller.as_deref().map(canonical).transpose()?,
        webhook: bins.webhook.as_deref().map(canonical).transpose()?,
    };
    let gpus: Vec<(String, String)> = nodes
        .iter()
        .filter_map(|(n, g)| Some((n.clone(), g.clone()?)))
        .collect();
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    if let Some((node, models)) = helm_on {
        let runtime = (node.clone(), models.unwrap_or_default());
        install::install_with_helm(cluster, &runtime, &gpus, &bins.plugin, &sets).await?;
        println!(
            "DAS installed with helm install on {node} ({}): the DAS image's DaemonSet, das-controller and das-webhook run there as pods under containerd",
            runtime.1
        );
        println!(
            "hollow nodes' plugins (processes; hollow kubelets run no containers): {}",
            gpus.iter()
                .map(|(n, g)| format!("{n} ({g})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        print_sets(&sets);
        return Ok(());
    }
    let rendered = das_e2e::chart::render_with(&sets)?;
    install::install_rendered(cluster, &rendered, &gpus, &bins).await?;
    println!(
        "DAS installed from deploy/helm/das: node plugins on {}{}{}",
        gpus.iter()
            .map(|(n, g)| format!("{n} ({g})"))
            .collect::<Vec<_>>()
            .join(", "),
        if bins.controller.is_some() {
            ", das-controller"
        } else {
            ""
        },
        if bins.webhook.is_some() {
            ", das-webhook"
        } else {
            ""
        },
    );
    print_sets(&sets);
    Ok(())
}

fn print_sets(sets: &[&str]) {
    if !sets.is_empty() {
        println!(
            "chart values set on top of ci/emulated-values.yaml: {}",
            sets.join(" ")
        );
    }
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
    let _ = std::fs::remove_file(state_dir.join("logs"));
    std::fs::remove_file(state_file(state_dir))?;
    println!("cluster stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up_sets(args: &[&str]) -> Result<Vec<String>, clap::Error> {
        let cli = Cli::try_parse_from(
            ["das-cluster", "up", "--plugin-bin", "p"]
                .iter()
                .chain(args),
        )?;
        let Cmd::Up {
            whole_gpus, set, ..
        } = cli.cmd
        else {
            unreachable!("parsed `up`")
        };
        Ok(chart_sets(whole_gpus, set))
    }

    #[test]
    fn whole_gpus_and_sets_become_chart_values_in_order() {
        assert!(up_sets(&[]).unwrap().is_empty());
        let sets = up_sets(&[
            "--set",
            "a.b=1",
            "--whole-gpus",
            "--set",
            "wholeGpus.enabled=false",
        ])
        .unwrap();
        assert_eq!(
            sets,
            [
                "wholeGpus.enabled=true",
                "wholeGpus.switchMigMode=true",
                "webhook.translateWholeGpus=true",
                "a.b=1",
                "wholeGpus.enabled=false",
            ]
        );
    }

    #[test]
    fn a_set_needs_a_key_and_the_plugin() {
        assert!(up_sets(&["--set", "novalue"]).is_err());
        assert!(up_sets(&["--set", "=1"]).is_err());
        assert!(Cli::try_parse_from(["das-cluster", "up", "--whole-gpus"]).is_err());
        assert!(Cli::try_parse_from(["das-cluster", "up", "--set", "a=1"]).is_err());
    }
}
