//! The chaos soak: DAS installed from the chart on a 2-node local cluster (n0: 2 × emulated
//! A100-40GB, n1: 2 × emulated H100-80GB) runs a seeded stream of pod cycles — pods from
//! ResourceClaimTemplates (1–3 slices, mixed profiles), legacy `nvidia.com/mig-*` pods through
//! the webhook, a ResourceClaim shared by two pods, a Deployment scaled up and down — while a
//! chaos task SIGKILLs and restarts node plugins, the controller, the webhook and hollow
//! kubelets, force-deletes pods during their prepare, and injects emulated-GPU faults (IN_USE on
//! destroy, create failures, latency, a GPU lost and back) through the plugins' control files.
//!
//! The run is split in phases; after each, chaos stops and the soak waits until the cluster
//! converges, then checks the invariants ([`check_invariants`]) against the emulated GPUs'
//! state, the plugins' checkpoints and CDI specs, and the API server. `make soak` runs ≥ 500
//! cycles (`das-soak`); `e2e/tests/soak.rs` runs a short one in `make e2e`. Figures go to
//! docs/reliability.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_api::allocation::AllocationClaim;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::cluster::{Cluster, ClusterConfig, NodeInfo};
use crate::das::{PluginDirs, emulated_state, load_specs, write_control};
use crate::install::{self, Binaries};
use crate::workload::NS;

/// Nodes and their emulated GPUs.
pub const NODES: [(&str, &str); 2] = [("n0", "A100-SXM4-40GB:2"), ("n1", "H100-80GB:2")];

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

/// What a soak did and found.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// Pod cycles run, by kind.
    pub cycles: BTreeMap<&'static str, usize>,
    /// Kills (SIGKILL and restart), by component.
    pub kills: BTreeMap<String, usize>,
    /// Emulated-GPU faults injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Force deletes of a pod right after its creation (during its prepare).
    pub force_deletes_during_prepare: usize,
    /// Creates the API server refused (the webhook was down: `failurePolicy: Fail`).
    pub refused_creates: usize,
    /// Pods that stayed Pending (no capacity) and were deleted.
    pub unschedulable: usize,
    /// Invariant violations found after the cluster converged (must be empty).
    pub violations: Vec<String>,
    /// Phases run, each ending in an invariant check.
    pub phases: usize,
    /// Time from the last chaos action of each phase to the invariants holding.
    pub converge: Vec<Duration>,
    /// Pod create → Running, under churn.
    pub create_to_running: Vec<Duration>,
    /// Wall time of the whole run.
    pub wall: Duration,
}

impl SoakReport {
    /// Total pod cycles.
    pub fn total_cycles(&self) -> usize {
        self.cycles.values().sum()
    }

    /// The report as Markdown.
    pub fn markdown(&self, cfg: &SoakConfig) -> String {
        let pct = |v: &[Duration], q: f64| {
            let mut v = v.to_vec();
            v.sort();
            v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
                .map_or(0.0, Duration::as_secs_f64)
        };
        let list = |m: &BTreeMap<String, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let faults: BTreeMap<String, usize> = self
            .faults
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let cycles: BTreeMap<String, usize> = self
            .cycles
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let mut out = String::new();
        out.push_str(&format!(
            "| seed | {} |\n|---|---|\n| pod cycles | {} ({}) |\n| concurrency | {} |\n",
            cfg.seed,
            self.total_cycles(),
            list(&cycles),
            cfg.concurrency
        ));
        out.push_str(&format!(
            "| kills (SIGKILL + restart) | {} ({}) |\n",
            self.kills.values().sum::<usize>(),
            list(&self.kills)
        ));
        out.push_str(&format!(
            "| faults injected | {} ({}) |\n",
            self.faults.values().sum::<usize>(),
            list(&faults)
        ));
        out.push_str(&format!(
            "| force deletes during prepare | {} |\n| creates refused (webhook down) | {} |\n| pods left Pending (no capacity) and deleted | {} |\n",
            self.force_deletes_during_prepare, self.refused_creates, self.unschedulable
        ));
        out.push_str(&format!(
            "| invariant checks | {} phases |\n| **invariant violations** | **{}** |\n",
            self.phases,
            self.violations.len()
        ));
        out.push_str(&format!(
            "| converge after the last chaos action (p50 / max) | {:.1} s / {:.1} s |\n",
            pct(&self.converge, 0.5),
            pct(&self.converge, 1.0)
        ));
        out.push_str(&format!(
            "| pod create → Running under churn (p50 / p99, {} pods) | {:.2} s / {:.2} s |\n",
            self.create_to_running.len(),
            pct(&self.create_to_running, 0.5),
            pct(&self.create_to_running, 0.99)
        ));
        out.push_str(&format!(
            "| wall time | {:.0} s |\n",
            self.wall.as_secs_f64()
        ));
        out
    }
}

/// A template's requests: (request name, profile, count).
type Requests = &'static [(&'static str, &'static str, u32)];

/// ResourceClaimTemplates the pods use: (name, requests).
const TEMPLATES: &[(&str, Requests)] = &[
    ("soak-1g10", &[("mig", "1g.10gb", 1)]),
    ("soak-two-1g10", &[("mig", "1g.10gb", 2)]),
    (
        "soak-a100-mixed",
        &[("small", "1g.5gb", 1), ("big", "2g.10gb", 1)],
    ),
    (
        "soak-h100-mixed",
        &[("small", "1g.20gb", 1), ("big", "3g.40gb", 1)],
    ),
    ("soak-h100-7g", &[("mig", "7g.80gb", 1)]),
    (
        "soak-a100-three",
        &[("a", "1g.5gb", 1), ("b", "1g.10gb", 1), ("c", "1g.5gb", 1)],
    ),
];

/// Legacy pods' requests: (resource, count).
const LEGACY: &[&[(&str, u32)]] = &[
    &[("nvidia.com/mig-1g.10gb", 1)],
    &[("nvidia.com/mig-1g.5gb", 2)],
    &[("nvidia.com/mig-1g.10gb", 1), ("nvidia.com/mig-2g.20gb", 1)],
];

/// The shared state of a run.
struct Run {
    client: Client,
    report: Mutex<SoakReport>,
    next: AtomicUsize,
    seed: u64,
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

/// The soak's cluster: [`NODES`], DAS installed from the chart (plugins, controller, webhook),
/// the soak's ResourceClaimTemplates and Deployment (0 replicas).
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
    install::install(&mut cluster, &gpus, binaries).await?;
    setup_workloads(&cluster.client()).await?;
    let nodes = names.iter().map(|n| cluster.node(n).clone()).collect();
    Ok((cluster, nodes))
}

async fn setup_workloads(client: &Client) -> Result<()> {
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    for (name, requests) in TEMPLATES {
        let requests: Vec<Value> = requests
            .iter()
            .map(|(r, profile, count)| {
                json!({"name": r, "exactly": {
                    "deviceClassName": das_api::profile_device_class(profile),
                    "allocationMode": "ExactCount", "count": count}})
            })
            .collect();
        let t: ResourceClaimTemplate = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}}
        }))?;
        api.create(&PostParams::default(), &t).await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "soak-dep"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "soak-dep"}},
            "template": {"metadata": {"labels": {"app": "soak-dep"}}, "spec": {
                "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "soak-1g10"}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}],
                "terminationGracePeriodSeconds": 0}}}
    }))?;
    deployments.create(&PostParams::default(), &d).await?;
    Ok(())
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
    // The chaos future is gone: put every fault back.
    for n in nodes {
        write_control(n, &json!({}))?;
    }
    Ok(*last.lock().expect("last chaos"))
}

/// The chaos task: one action every interval, until the phase's cycles end (dropped then).
async fn chaos(
    run: &Arc<Run>,
    cfg: &SoakConfig,
    cluster: &mut Cluster,
    nodes: &[NodeInfo],
    seed: u64,
    last: &std::sync::Mutex<Instant>,
) -> Result<()> {
    let Some((lo, hi)) = cfg.chaos else {
        std::future::pending::<()>().await;
        return Ok(());
    };
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        let wait = rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let node = &nodes[rng.random_range(0..nodes.len())];
        let action = rng.random_range(0..10);
        let what: String = match action {
            0 | 1 => {
                let name = format!("das-plugin-{}", node.name);
                cluster.crash_and_restart(&name)?;
                name
            }
            2 => {
                cluster.crash_and_restart("das-controller")?;
                "das-controller".into()
            }
            3 => {
                cluster.crash_and_restart("das-webhook")?;
                "das-webhook".into()
            }
            4 => {
                let name = format!("kubelet-{}", node.name);
                cluster.crash_and_restart(&name)?;
                name
            }
            _ => {
                let gpu = rng.random_range(0..2);
                let (kind, control): (&'static str, Value) = match action {
                    5 => (
                        "IN_USE on destroy",
                        json!({"destroyFaults": [{"gpu": gpu, "count": rng.random_range(1..6), "kind": "InUse"}]}),
                    ),
                    6 => (
                        "create failure",
                        json!({"createFaults": [{"gpu": gpu, "count": 1, "kind": "Other"}]}),
                    ),
                    7 => (
                        "destroy failure",
                        json!({"destroyFaults": [{"gpu": gpu, "count": 1, "kind": "Other"}]}),
                    ),
                    8 => (
                        "latency",
                        json!({"latencyMs": {"create": 1500, "destroy": 500}}),
                    ),
                    _ => ("GPU lost and back", json!({"lostGpus": [gpu]})),
                };
                write_control(node, &control)?;
                *run.report.lock().await.faults.entry(kind).or_default() += 1;
                if matches!(action, 8 | 9) {
                    // Latency and a lost GPU last a few seconds, then the GPU is back.
                    tokio::time::sleep(Duration::from_secs(rng.random_range(2..6))).await;
                    write_control(node, &json!({}))?;
                }
                *last.lock().expect("last chaos") = Instant::now();
                continue;
            }
        };
        tracing::info!(component = %what, "soak: SIGKILL and restart");
        *run.report.lock().await.kills.entry(what).or_default() += 1;
        *last.lock().expect("last chaos") = Instant::now();
    }
}

/// One pod cycle, its kind and behaviour drawn from the cycle's own seed.
async fn cycle(run: &Run, n: usize) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(run.seed.wrapping_add(n as u64 * 7919));
    let kind = match rng.random_range(0..100) {
        0..55 => "template pod",
        55..80 => "legacy pod",
        80..90 => "shared claim (2 pods)",
        _ => "deployment scale",
    };
    *run.report.lock().await.cycles.entry(kind).or_default() += 1;
    let name = format!("soak-{n}");
    match kind {
        "template pod" => {
            let (template, _) = TEMPLATES[rng.random_range(0..TEMPLATES.len())];
            let spec = json!({
                "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}],
            });
            pod_cycle(run, &name, spec, &mut rng).await
        }
        "legacy pod" => {
            let limits: serde_json::Map<String, Value> = LEGACY[rng.random_range(0..LEGACY.len())]
                .iter()
                .map(|(r, c)| (r.to_string(), json!(c.to_string())))
                .collect();
            let spec = json!({"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": limits}}]});
            pod_cycle(run, &name, spec, &mut rng).await
        }
        "shared claim (2 pods)" => shared_claim(run, &name).await,
        _ => {
            let replicas = rng.random_range(0..4);
            let api: Api<Deployment> = Api::namespaced(run.client.clone(), NS);
            api.patch(
                "soak-dep",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..3000))).await;
            Ok(())
        }
    }
}

/// Creates pod `name` with `spec` (retrying while the webhook is down), waits until it runs (or
/// stays Pending), holds it a little, and deletes it; 10 % are force-deleted right after
/// creation, during their prepare, and 30 % of the others with grace period 0.
async fn pod_cycle(run: &Run, name: &str, mut spec: Value, rng: &mut StdRng) -> Result<()> {
    spec["terminationGracePeriodSeconds"] = json!(if rng.random_bool(0.3) { 0 } else { 1 });
    let pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )?;
    let api: Api<Pod> = Api::namespaced(run.client.clone(), NS);
    let t0 = Instant::now();
    let mut tries = 0;
    loop {
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => break,
            Err(e) if tries < 30 => {
                tries += 1;
                tracing::debug!(pod = name, error = %e, "create refused; retrying");
                run.report.lock().await.refused_creates += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if rng.random_bool(0.1) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        run.report.lock().await.force_deletes_during_prepare += 1;
        return delete_pod(&api, name, true).await;
    }
    match wait_running_or_pending(&api, name, Duration::from_secs(60)).await? {
        Outcome::Running => {
            run.report.lock().await.create_to_running.push(t0.elapsed());
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..2000))).await;
        }
        Outcome::Unschedulable => run.report.lock().await.unschedulable += 1,
        Outcome::Stuck => tracing::warn!(pod = name, "not running after 60 s; deleting it"),
    }
    delete_pod(&api, name, rng.random_bool(0.3)).await
}

/// A ResourceClaim used by two pods: both run (on one node), then go, then the claim.
async fn shared_claim(run: &Run, name: &str) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(run.client.clone(), NS);
    let rc: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": das_api::profile_device_class("1g.10gb")}}]}}
    }))?;
    claims.create(&PostParams::default(), &rc).await?;
    let api: Api<Pod> = Api::namespaced(run.client.clone(), NS);
    let pods = [format!("{name}-a"), format!("{name}-b")];
    let t0 = Instant::now();
    for p in &pods {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": p},
            "spec": {"resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}],
                "terminationGracePeriodSeconds": 0}
        }))?;
        api.create(&PostParams::default(), &pod).await?;
    }
    for p in &pods {
        if let Outcome::Running = wait_running_or_pending(&api, p, Duration::from_secs(60)).await? {
            run.report.lock().await.create_to_running.push(t0.elapsed());
        }
    }
    for p in &pods {
        delete_pod(&api, p, false).await?;
    }
    claims.delete(name, &DeleteParams::default()).await?;
    Ok(())
}

enum Outcome {
    Running,
    Unschedulable,
    Stuck,
}

async fn wait_running_or_pending(api: &Api<Pod>, name: &str, limit: Duration) -> Result<Outcome> {
    let t0 = Instant::now();
    loop {
        if let Some(p) = api.get_opt(name).await? {
            let status = p.status.unwrap_or_default();
            if status.phase.as_deref() == Some("Running") {
                return Ok(Outcome::Running);
            }
            let unschedulable = status.conditions.iter().flatten().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
            if unschedulable && t0.elapsed() > Duration::from_secs(5) {
                return Ok(Outcome::Unschedulable);
            }
        }
        if t0.elapsed() > limit {
            return Ok(Outcome::Stuck);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn delete_pod(api: &Api<Pod>, name: &str, force: bool) -> Result<()> {
    let dp = if force {
        DeleteParams::default().grace_period(0)
    } else {
        DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    // Wait for it to be gone, so the cycle ends with its claim released (bounded).
    let t0 = Instant::now();
    while api.get_opt(name).await?.is_some() && t0.elapsed() < Duration::from_secs(90) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Polls [`check_invariants`] until they hold or `limit` passes; the violations of the last
/// check on failure.
pub async fn converge(
    client: &Client,
    nodes: &[NodeInfo],
    limit: Duration,
) -> Result<(), Vec<String>> {
    let t0 = Instant::now();
    loop {
        let v = match check_invariants(client, nodes).await {
            Ok(v) => v,
            Err(e) => vec![format!("checking failed: {e:#}")],
        };
        if v.is_empty() {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(v);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A published device: node, GPU index, placement start and size.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Placed {
    node: String,
    gpu: i64,
    start: i64,
    size: i64,
}

fn int_attr(d: &k8s_openapi::api::resource::v1::Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

/// Every published device of our driver: (node, device name) → where it is.
async fn published(client: &Client) -> Result<BTreeMap<(String, String), Placed>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.driver={}", das_api::DRIVER_NAME));
    let mut out = BTreeMap::new();
    for s in api.list(&lp).await?.items {
        let node = s.spec.node_name.clone().unwrap_or_default();
        for d in s.spec.devices.iter().flatten() {
            let (Some(gpu), Some(start), Some(size)) = (
                int_attr(d, "gpuIndex"),
                int_attr(d, "placementStart"),
                int_attr(d, "placementSize"),
            ) else {
                continue;
            };
            out.insert(
                (node.clone(), d.name.clone()),
                Placed {
                    node: node.clone(),
                    gpu,
                    start,
                    size,
                },
            );
        }
    }
    Ok(out)
}

/// The invariants of a converged cluster (empty when they all hold):
/// 1. no live slice without an allocated claim (a DAS-created slice whose placement no
///    allocated claim on that node holds);
/// 2. no allocated claim reserved by a running pod without its slice;
/// 3. no overlapping slices on a GPU;
/// 4. no AllocationClaim without its claim and device allocated;
/// 5. every pod Running, or Pending with the scheduler's reason (none stuck after scheduling);
/// 6. no CDI spec of a claim that is gone or not allocated on that node;
/// 7. plugin checkpoints consistent: no half-done or releasing record, every prepared device's
///    slice live.
pub async fn check_invariants(client: &Client, nodes: &[NodeInfo]) -> Result<Vec<String>> {
    let mut v = Vec::new();
    let devices = published(client).await?;
    let claims: Vec<ResourceClaim> = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let allocs: Vec<AllocationClaim> = Api::<AllocationClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    // Allocated devices of our driver: (node, device) → claim UID.
    let mut allocated: BTreeMap<(String, String), String> = BTreeMap::new();
    for c in &claims {
        let uid = c.metadata.uid.clone().unwrap_or_default();
        for r in das_api::claim_status::our_results(c) {
            allocated.insert((r.pool.clone(), r.device.clone()), uid.clone());
        }
    }
    let running: BTreeSet<String> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    for node in nodes {
        let state = emulated_state(node)?;
        let mut live: Vec<(Placed, String, bool)> = Vec::new();
        for g in state["gpus"].as_array().into_iter().flatten() {
            let gpu = g["index"].as_i64().unwrap_or_default();
            for i in g["instances"].as_array().into_iter().flatten() {
                let start = i["start"].as_i64().unwrap_or_default();
                let profile = i["profile"].as_str().unwrap_or_default();
                // The device of that placement, as the plugin names and publishes it.
                let device = format!("gpu-{gpu}-mig-{}-{start}", profile.replace(['.', '+'], "-"));
                let dev = devices.get_key_value(&(node.name.clone(), device));
                let Some(((_, name), placed)) = dev else {
                    v.push(format!(
                        "{}: slice {profile} at {start} on GPU {gpu} is no published device",
                        node.name
                    ));
                    continue;
                };
                let mig = i["migUuid"].as_str().unwrap_or_default().to_string();
                let ours = i["createdByDas"].as_bool().unwrap_or(true);
                if ours && !allocated.contains_key(&(node.name.clone(), name.clone())) {
                    v.push(format!(
                        "1: {}: live slice {mig} ({name}) without an allocated claim",
                        node.name
                    ));
                }
                live.push((placed.clone(), mig, ours));
            }
        }
        // 3.
        for (i, (a, ma, _)) in live.iter().enumerate() {
            for (b, mb, _) in &live[i + 1..] {
                if a.gpu == b.gpu && a.start < b.start + b.size && b.start < a.start + a.size {
                    v.push(format!(
                        "3: {}: slices {ma} and {mb} overlap on GPU {}",
                        node.name, a.gpu
                    ));
                }
            }
        }
        // 2.
        for c in &claims {
            let reserved_running = c
                .status
                .as_ref()
                .and_then(|s| s.reserved_for.as_ref())
                .into_iter()
                .flatten()
                .any(|r| running.contains(&r.uid));
            if !reserved_running {
                continue;
            }
            for ((n, d), uid) in &allocated {
                if n != &node.name || Some(uid) != c.metadata.uid.as_ref() {
                    continue;
                }
                let Some(p) = devices.get(&(n.clone(), d.clone())) else {
                    continue;
                };
                if !live
                    .iter()
                    .any(|(l, _, _)| l.gpu == p.gpu && l.start == p.start)
                {
                    v.push(format!(
                        "2: {}: claim {} runs without its slice {d}",
                        node.name,
                        c.metadata.name.clone().unwrap_or_default()
                    ));
                }
            }
        }
        // 6.
        let dirs = PluginDirs::of(node);
        let on_node: BTreeSet<&String> = allocated
            .iter()
            .filter(|((n, _), _)| n == &node.name)
            .map(|(_, uid)| uid)
            .collect();
        for spec in load_specs(&dirs.cdi)? {
            let name = spec["devices"][0]["name"].as_str().unwrap_or_default();
            let uid: String = name.chars().take(36).collect();
            if !on_node.contains(&uid) {
                v.push(format!(
                    "6: {}: CDI spec of claim {uid}, which is not allocated here",
                    node.name
                ));
            }
        }
        // 7.
        let cp: Value = match std::fs::read(dirs.state.join("checkpoint.json")) {
            Ok(b) => serde_json::from_slice(&b).context("checkpoint")?,
            Err(_) => json!({"claims": {}}),
        };
        let migs: BTreeSet<&str> = live.iter().map(|(_, m, _)| m.as_str()).collect();
        for (uid, r) in cp["claims"].as_object().into_iter().flatten() {
            match r["state"].as_str() {
                Some("PrepareCompleted") => {
                    for d in r["devices"].as_array().into_iter().flatten() {
                        // Version 2 records the instance; version 1 had the fields flat.
                        let m = d["instance"]["migUUID"]
                            .as_str()
                            .or_else(|| d["migUUID"].as_str())
                            .unwrap_or_default();
                        if !migs.contains(m) {
                            v.push(format!(
                                "7: {}: claim {uid} records {m}, which is not live",
                                node.name
                            ));
                        }
                    }
                }
                other => v.push(format!(
                    "7: {}: claim {uid} is {other:?} with nothing in flight",
                    node.name
                )),
            }
        }
    }
    // 4.
    for a in &allocs {
        let r = &a.spec.resource_claim_ref;
        let ok = allocated
            .get(&(a.spec.pool.clone(), a.spec.device.clone()))
            .is_some_and(|uid| uid == &r.uid);
        if !ok {
            v.push(format!(
                "4: AllocationClaim {} without a live allocation of {}",
                a.metadata.name.clone().unwrap_or_default(),
                a.spec.device
            ));
        }
    }
    // 5.
    for p in &pods {
        if p.metadata.deletion_timestamp.is_some() || p.metadata.namespace.as_deref() != Some(NS) {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let status = p.status.clone().unwrap_or_default();
        let phase = status.phase.as_deref().unwrap_or("");
        if phase == "Running" {
            continue;
        }
        let stated = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.message.is_some());
        if !stated {
            v.push(format!(
                "5: pod {name} is {phase:?} without a scheduler reason"
            ));
        }
    }
    Ok(v)
}

/// The DAS binaries of `profile` (`debug` or `release`) in the workspace's target dir.
pub fn binaries(profile: &str) -> Result<Binaries> {
    Binaries::in_target_dir(profile, true)
}

/// Where soak reports go by default.
pub fn default_report_path() -> PathBuf {
    crate::cluster::workspace_root().join("docs/reliability.md")
}
