//! Benchmark: how fast the controller mirrors a device's readiness into its AllocationClaim, and
//! the controller's memory, for 200 pods created in a burst.
//!
//! A local cluster (real kube-apiserver, scheduler, controller-manager, 2 hollow DRA kubelets),
//! `das-kubelet-plugin` on each node with 16 emulated H100-80GB (7 × 1g.10gb each: 224 slices,
//! ≤ 110 pods per node) and `das-controller` (release builds, leader election on, log level info)
//! run; the benchmark creates 200 pods with a 1 × 1g.10gb claim template as fast as the API server
//! takes them. Two client-side watches record, with local `Instant`s (condition timestamps have
//! second precision), the first moment each device has `Ready=True` in its ResourceClaim's
//! `status.devices` (written by the node plugin) and the first moment its AllocationClaim shows
//! state `inUse`; devices are matched by claim UID, pool and device name.
//!
//! Needs the release builds of the plugin and the controller:
//! `cargo build --release -p das-driver --bin das-kubelet-plugin -p das-controller --bin
//! das-controller`.
//!
//! Run: `cargo bench -p das-e2e --bench inuse_latency` (prints a table; figures go into
//! docs/benchmarks.md by hand). `DAS_BENCH_CONTROLLER=<path>` runs another controller build.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_api::allocation::{AllocationClaim, AllocationState};
use das_e2e::binaries::DasBinary;
use das_e2e::das::{self, apply_device_classes};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_pod, create_template, free_port, http_get};
use das_e2e::{Cluster, ClusterConfig, process};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};

const NODES: [&str; 2] = ["n0", "n1"];
const GPUS_PER_NODE: u32 = 16;
const PODS: usize = 200;
/// Pod creations in flight at once.
const CREATE_CONCURRENCY: usize = 32;
const BURST_TIMEOUT: Duration = Duration::from_secs(600);

/// A device of a claim: (claim UID, pool, device).
type Key = (String, String, String);
type Seen = Arc<Mutex<HashMap<Key, Instant>>>;

/// This build's controller (the release build), or `DAS_BENCH_CONTROLLER` (another build, e.g.
/// of an earlier commit, to compare in the same conditions).
fn controller_binary() -> Result<std::path::PathBuf> {
    match std::env::var_os("DAS_BENCH_CONTROLLER") {
        Some(path) => Ok(path.into()),
        None => DasBinary::Controller.in_target_dir("release"),
    }
}

/// Records the first `Instant` each key of an object appears, for every event of `api`; sets
/// `synced` once the initial list is through.
fn record<K, F>(
    api: Api<K>,
    seen: Seen,
    synced: Arc<Mutex<bool>>,
    keys: F,
) -> tokio::task::AbortHandle
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&K) -> Vec<Key> + Send + 'static,
{
    let task = tokio::spawn(async move {
        let mut s = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = s.next().await {
            let now = Instant::now();
            match ev {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => {
                    let mut m = seen.lock().unwrap();
                    for k in keys(&o) {
                        m.entry(k).or_insert(now);
                    }
                }
                Ok(Event::InitDone) => *synced.lock().unwrap() = true,
                Ok(_) => {}
                Err(e) => eprintln!("watch error: {e}"),
            }
        }
    });
    task.abort_handle()
}

/// Devices of `c` with `Ready=True` in `status.devices`.
fn ready_devices(c: &ResourceClaim) -> Vec<Key> {
    let uid = c.uid().unwrap_or_default();
    c.status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .into_iter()
        .flatten()
        .filter(|d| d.driver == das::DRIVER)
        .filter(|d| {
            d.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .map(|d| (uid.clone(), d.pool.clone(), d.device.clone()))
        .collect()
}

/// The device of `a` if it is `inUse`.
fn in_use(a: &AllocationClaim) -> Vec<Key> {
    let s = &a.spec;
    a.status
        .as_ref()
        .filter(|st| st.state == AllocationState::InUse)
        .map(|_| {
            (
                s.resource_claim_ref.uid.clone(),
                s.pool.clone(),
                s.device.clone(),
            )
        })
        .into_iter()
        .collect()
}

/// A running pod, keyed by name.
fn running(p: &Pod) -> Vec<Key> {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Running") {
        vec![(p.name_any(), String::new(), String::new())]
    } else {
        vec![]
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn mib(pid: u32) -> (f64, f64) {
    let (rss, peak) = process::memory_kib(pid as i32).unwrap_or((0, 0));
    (rss as f64 / 1024.0, peak as f64 / 1024.0)
}

fn len(s: &Seen) -> usize {
    s.lock().unwrap().len()
}

async fn run(cluster: &mut Cluster) -> Result<()> {
    // The release build, as the controller's.
    let plugin = DasBinary::Plugin.in_target_dir("release")?;
    let kubeconfig = cluster.kubeconfig.clone();
    for n in NODES {
        let node = cluster.node(n).clone();
        let args = das::plugin_args(
            &node,
            &format!("H100-80GB:{GPUS_PER_NODE}"),
            &kubeconfig,
            free_port(),
        );
        cluster.spawn_program(&format!("das-plugin-{n}"), &plugin, args)?;
    }
    let client = cluster.client();
    apply_device_classes(&client, &["1g.10gb"]).await?;
    das::install_allocation_claim_crd(&client).await?;
    das::wait_nodes_published(&client, &NODES).await?;

    let port = free_port();
    cluster.spawn_program(
        "das-controller",
        &controller_binary()?,
        vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--metrics-address=127.0.0.1:{port}"),
            format!("--leader-elect-namespace={NS}"),
            "--identity=das-controller".into(),
            "--log-level=info".into(),
        ],
    )?;
    let controller = *cluster.pids().last().context("controller pid")?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NS);
    wait::until("the controller leads and is ready", TIMEOUT, || async {
        let leader = leases
            .get_opt("das-controller")
            .await?
            .and_then(|l| l.spec?.holder_identity);
        let ready = http_get(port, "/readyz")
            .await
            .is_ok_and(|(code, _)| code == 200);
        Ok((leader.as_deref() == Some("das-controller") && ready).then_some(()))
    })
    .await?;

    create_template(&client, "one", "1g.10gb", 1).await?;

    let (ready, inuse, run_at): (Seen, Seen, Seen) = Default::default();
    let synced: Vec<Arc<Mutex<bool>>> = (0..3).map(|_| Default::default()).collect();
    let watches = [
        record(
            Api::<ResourceClaim>::namespaced(client.clone(), NS),
            ready.clone(),
            synced[0].clone(),
            ready_devices,
        ),
        record(
            Api::<AllocationClaim>::namespaced(client.clone(), NS),
            inuse.clone(),
            synced[1].clone(),
            in_use,
        ),
        record(
            Api::<Pod>::namespaced(client.clone(), NS),
            run_at.clone(),
            synced[2].clone(),
            running,
        ),
    ];
    wait::until("the watches", TIMEOUT, || async {
        Ok(synced.iter().all(|s| *s.lock().unwrap()).then_some(()))
    })
    .await?;
    let (rss_idle, _) = mib(controller);
    let (_, metrics0) = http_get(port, "/metrics").await.unwrap_or_default();
    let cpu0 = process::cpu_seconds(controller);

    // The burst.
    let t0 = Instant::now();
    let create = |i: usize| {
        let client = client.clone();
        async move { create_pod(&client, &format!("bench-{i:03}"), "one", None).await }
    };
    futures::stream::iter((0..PODS).map(create))
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let created = t0.elapsed();
    wait::until(
        &format!("{PODS} pods Running and {PODS} AllocationClaims inUse"),
        BURST_TIMEOUT,
        || async {
            let done = len(&run_at) >= PODS && len(&inuse) >= PODS && len(&ready) >= PODS;
            Ok(done.then_some(()))
        },
    )
    .await
    .with_context(|| {
        format!(
            "running {}, ready {}, inUse {}",
            len(&run_at),
            len(&ready),
            len(&inuse)
        )
    })?;
    // Let the controller settle (no more work queued) before reading its memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, peak) = mib(controller);
    let cpu = process::cpu_seconds(controller) - cpu0;
    for w in watches {
        w.abort();
    }

    let ready = ready.lock().unwrap().clone();
    let inuse = inuse.lock().unwrap().clone();
    let last = |m: &HashMap<Key, Instant>| {
        m.values()
            .map(|t| t.duration_since(t0))
            .max()
            .unwrap_or_default()
    };
    let all_running = last(&run_at.lock().unwrap());
    let all_in_use = last(&inuse);
    let mut lat: Vec<f64> = Vec::new();
    let mut unmatched = 0;
    for (k, t_in_use) in &inuse {
        match ready.get(k) {
            // Signed: the two watches are separate streams, so in principle the AllocationClaim
            // event could be seen first.
            Some(t_ready) => lat.push(if t_in_use >= t_ready {
                t_in_use.duration_since(*t_ready).as_secs_f64()
            } else {
                -t_ready.duration_since(*t_in_use).as_secs_f64()
            }),
            None => unmatched += 1,
        }
    }
    anyhow::ensure!(!lat.is_empty(), "no device matched");
    lat.sort_by(|a, b| a.total_cmp(b));
    let ms = |s: f64| format!("{:.0} ms", s * 1000.0);
    let (_, metrics) = http_get(port, "/metrics").await.unwrap_or_default();
    let total = |m: &str, name: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum()
    };
    let during = |name: &str| total(&metrics, name) - total(&metrics0, name);
    let reconciles = during("das_controller_reconciles_total");
    let writes = during("das_controller_writes_total");
    // Per label value, e.g. `result="error"` or `op="status"`: where the counts come from.
    let by_label = |name: &str, label: &str| -> String {
        let values = ["ok", "error", "apply", "status", "delete"];
        values
            .iter()
            .map(|v| (v, during(&format!("{name}{{{label}=\"{v}\"}}"))))
            .filter(|(_, n)| *n > 0.0)
            .map(|(v, n)| format!("{v} {n:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };

    println!(
        "{PODS} pods (1 × 1g.10gb each) created in a burst; 2 nodes × {GPUS_PER_NODE} emulated H100-80GB; real kube-apiserver"
    );
    println!("| what | figure |");
    println!("|---|---|");
    println!(
        "| device Ready=True → AllocationClaim inUse, p50 / p99 / max ({} devices) | {} / {} / {} |",
        lat.len(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(*lat.last().unwrap())
    );
    println!(
        "| {PODS} pods created / all Running / all AllocationClaims inUse (from the first create) | {:.1} s / {:.1} s / {:.1} s |",
        created.as_secs_f64(),
        all_running.as_secs_f64(),
        all_in_use.as_secs_f64()
    );
    println!(
        "| controller RSS idle / after the burst (VmRSS), peak (VmHWM) | {rss_idle:.1} MiB / {rss:.1} MiB, peak {peak:.1} MiB |"
    );
    println!(
        "| devices over 500 ms / over 1 s | {} / {} |",
        lat.iter().filter(|s| **s > 0.5).count(),
        lat.iter().filter(|s| **s > 1.0).count()
    );
    let per_claim = |x: f64| x / PODS as f64;
    println!(
        "| controller reconciles during the burst (das_controller_reconciles_total), per claim | {reconciles:.0} ({}), {:.2} |",
        by_label("das_controller_reconciles_total", "result"),
        per_claim(reconciles)
    );
    println!(
        "| AllocationClaim writes during the burst (das_controller_writes_total), per claim | {writes:.0} ({}), {:.2} |",
        by_label("das_controller_writes_total", "op"),
        per_claim(writes)
    );
    println!(
        "| controller CPU during the burst (user + system, /proc), per mirrored claim | {:.2} s, {:.2} ms |",
        cpu,
        per_claim(cpu) * 1000.0
    );
    // The controller's own view: from the plugin's readyTime (milliseconds, the plugin's
    // clock) to the controller's inUse write, as histogram buckets.
    let lag: Vec<(String, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with("das_controller_in_use_lag_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?.to_string();
            Some((le, l.split_whitespace().last()?.parse().ok()?))
        })
        .collect();
    if let Some((_, total)) = lag.last() {
        let at = |q: f64| {
            lag.iter()
                .find(|(_, n)| *n >= q * total)
                .map_or("-".to_string(), |(le, _)| format!("≤ {le} s"))
        };
        println!(
            "| controller's lag readyTime → inUse write (das_controller_in_use_lag_seconds), p50 / p99 bucket | {} / {} |",
            at(0.5),
            at(0.99)
        );
    }
    if unmatched > 0 {
        println!("inUse without an observed Ready=True: {unmatched}");
    }
    println!(
        "CPUs: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&NODES)).await?;
    let r = run(&mut cluster).await;
    if r.is_err() {
        cluster.print_log_tails(30);
    }
    r
}
