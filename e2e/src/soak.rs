//! The chaos soak: DAS installed from the chart on a 2-node local cluster (n0: 2 × emulated
//! A100-40GB, n1: 2 × emulated H100-80GB) runs a seeded stream of pod cycles — pods from
//! ResourceClaimTemplates (1–3 slices, mixed profiles), whole-GPU pods, legacy `nvidia.com/mig-*`
//! pods through the webhook, a ResourceClaim shared by two pods, two claims with shares of one
//! slice (docs/design.md §7, "Shared slices"), a Deployment scaled up and down
//! — while a chaos task SIGKILLs and restarts node plugins, the controller, the webhook and
//! hollow kubelets, force-deletes pods during their prepare, and injects emulated-GPU faults
//! (IN_USE on destroy, create failures, latency, a GPU lost and back, a MIG mode switch that
//! fails) through the plugins' control files.
//!
//! DAS serves whole GPUs with MIG mode following demand (chart `wholeGpus.enabled` and
//! `wholeGpus.switchMigMode`, docs/design.md §7): n1's H100s switch without a reset, so they are
//! published whole (`gpu-<i>`, DeviceClass `gpu.das.com`) and as every slice, and whole-GPU pods
//! and slice pods take turns on them, each prepare switching MIG mode as it needs; n0's A100s
//! (Ampere) keep MIG mode on and serve slices only.
//!
//! The run is split in phases; after each, chaos stops and the soak waits until the cluster
//! converges, then checks the invariants ([`check_invariants`]) against the emulated GPUs'
//! state, the plugins' checkpoints and CDI specs, and the API server. `make soak` runs ≥ 500
//! cycles (`das-soak`); `e2e/tests/soak.rs` runs a short one in `make e2e`. Figures go to
//! docs/reliability.md.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use kube::Client;
use serde_json::json;
use tokio::sync::Mutex;

use crate::chart;
use crate::cluster::{Cluster, ClusterConfig, NodeInfo};
use crate::das::write_control;
use crate::install::{self, Binaries};

mod chaos;
mod cycles;
mod invariants;
mod report;

use chaos::chaos;
use cycles::{cycle, setup_workloads};
pub use invariants::{check_invariants, converge, mig_mode_violations};
pub use report::SoakReport;

/// Nodes and their emulated GPUs.
pub const NODES: [(&str, &str); 2] = [("n0", "A100-SXM4-40GB:2"), ("n1", "H100-80GB:2")];

/// The node whose GPUs switch MIG mode (Hopper): whole-GPU pods run there, and MIG mode switch
/// faults are injected there.
pub const SWITCHING_NODE: &str = "n1";

/// The chart values of the soak: whole GPUs served, MIG mode following demand, the webhook
/// translating `nvidia.com/gpu`, the A100s' `1g.5gb` slices shared (as `make demo` installs it:
/// [`chart::WHOLE_GPUS_SWITCHING`] and [`chart::DEMO_SHARING`]), and carve before bind.
pub fn chart_values() -> Vec<&'static str> {
    chart::WHOLE_GPUS_SWITCHING
        .iter()
        .chain(chart::DEMO_SHARING)
        .chain(CARVE)
        .copied()
        .collect()
}

/// Carve before bind (docs/design.md §7): every slice is carved when allocated, before its pod
/// is bound, so the soak's kills and faults also hit carves and carved slices.
const CARVE: &[&str] = &["carveBeforeBind.enabled=true"];

/// How a soak runs.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// Seed of the workload and the chaos.
    pub seed: u64,
    /// Pod cycles to run.
    pub cycles: usize,
    /// Cycles in flight at once.
    pub concurrency: usize,
    /// Phases the cycles are split in (invariants are checked after each).
    pub phases: usize,
    /// Chaos actions (kills, faults) at random intervals in this range; none when `None`.
    pub chaos: Option<(Duration, Duration)>,
    /// The DAS binaries.
    pub binaries: Binaries,
    /// How long the cluster may take to converge after chaos stops.
    pub converge_limit: Duration,
}

/// The shared state of a run.
struct Run {
    client: Client,
    report: Mutex<SoakReport>,
    next: AtomicUsize,
    seed: u64,
    /// A MIG mode switch fault was injected in this phase (a GPU whose switch failed is switched
    /// again only once its plugin restarts).
    switch_faults: std::sync::atomic::AtomicBool,
}

/// Runs a soak: starts the cluster, installs DAS, runs the phases, checks the invariants.
///
/// # Errors
/// The cluster or DAS could not be started (a soak that runs reports violations instead).
pub async fn run(cfg: &SoakConfig) -> Result<SoakReport> {
    let t0 = Instant::now();
    let (mut cluster, nodes) = start(&cfg.binaries).await?;
    let client = cluster.client();
    let run = Arc::new(Run {
        client: client.clone(),
        report: Mutex::new(SoakReport::default()),
        next: AtomicUsize::new(0),
        seed: cfg.seed,
        switch_faults: std::sync::atomic::AtomicBool::new(false),
    });
    let per_phase = cfg.cycles.div_ceil(cfg.phases.max(1));
    for phase in 0..cfg.phases.max(1) {
        let until = ((phase + 1) * per_phase).min(cfg.cycles);
        let last_chaos = run_phase(&run, cfg, &mut cluster, &nodes, phase, until).await?;
        let converged = converge(&client, &nodes, cfg.converge_limit).await;
        let mut report = run.report.lock().await;
        report.phases += 1;
        match converged {
            Ok(()) => report.converge.push(last_chaos.elapsed()),
            Err(v) => {
                tracing::error!(phase, violations = ?v, "the cluster did not converge");
                report
                    .violations
                    .extend(v.into_iter().map(|v| format!("phase {phase}: {v}")));
            }
        }
    }
    let mut report = run.report.lock().await.clone();
    report.wall = t0.elapsed();
    cluster.check_alive()?;
    Ok(report)
}

/// The soak's cluster: [`NODES`], DAS installed from the chart with [`chart_values`] (plugins,
/// controller, webhook), the soak's ResourceClaimTemplates and Deployment (0 replicas).
///
/// # Errors
/// The cluster or DAS could not be started.
pub async fn start(binaries: &Binaries) -> Result<(Cluster, Vec<NodeInfo>)> {
    let names: Vec<&str> = NODES.iter().map(|(n, _)| *n).collect();
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&names)).await?;
    let gpus: Vec<(String, String)> = NODES
        .iter()
        .map(|(n, g)| (n.to_string(), g.to_string()))
        .collect();
    let rendered = chart::render_with(&chart_values())?;
    install::install_rendered(&mut cluster, &rendered, &gpus, binaries).await?;
    setup_workloads(&cluster.client()).await?;
    let nodes = names.iter().map(|n| cluster.node(n).clone()).collect();
    Ok((cluster, nodes))
}

/// Runs cycles until `until` with chaos alongside; returns when the last chaos action was.
async fn run_phase(
    run: &Arc<Run>,
    cfg: &SoakConfig,
    cluster: &mut Cluster,
    nodes: &[NodeInfo],
    phase: usize,
    until: usize,
) -> Result<Instant> {
    let workers = (0..cfg.concurrency.max(1)).map(|_| {
        let run = run.clone();
        async move {
            // Take the next cycle number only while it is in this phase (a worker that finds
            // the phase done must not use up the next phase's numbers).
            while let Ok(n) = run
                .next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < until).then_some(n + 1)
                })
            {
                if let Err(e) = cycle(&run, n).await {
                    tracing::warn!(cycle = n, error = %e, "cycle ended with an error");
                }
            }
        }
    });
    let all = futures::future::join_all(workers);
    let seed = cfg.seed ^ (phase as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let last = std::sync::Mutex::new(Instant::now());
    {
        let chaos = chaos(run, cfg, cluster, nodes, seed, &last);
        tokio::pin!(all, chaos);
        tokio::select! {
            _ = &mut all => {}
            r = &mut chaos => { r?; all.await; }
        }
    }
    // The chaos future is gone: put every fault back. A GPU whose MIG mode switch failed is
    // switched again (and serves both ways) only once its plugin restarts, and a switch fault
    // not yet used stays queued in the plugin: restart it (pods allocated a device the GPU no
    // longer served then prepare).
    for n in nodes {
        write_control(n, &json!({}))?;
    }
    let mut last = *last.lock().expect("last chaos");
    if run.switch_faults.swap(false, Ordering::SeqCst) {
        cluster.crash_and_restart(&format!("das-plugin-{SWITCHING_NODE}"))?;
        last = Instant::now();
    }
    Ok(last)
}

/// The DAS binaries of `profile` (`debug` or `release`) in the workspace's target dir.
pub fn binaries(profile: &str) -> Result<Binaries> {
    Binaries::in_target_dir(profile, true)
}

/// Where soak reports go by default.
pub fn default_report_path() -> PathBuf {
    crate::paths::workspace_root().join("docs/reliability.md")
}
