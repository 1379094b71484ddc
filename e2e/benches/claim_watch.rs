//! Benchmark: what it costs every node plugin to learn of the allocations on its node, at
//! cluster scale (issue 34 item 2, "who carves": carve-before-bind needs the plugin to see a
//! claim allocated to its node before the kubelet calls it). Two ways, one watch per node each:
//!
//! - `alloc-by-node`: a watch of AllocationClaims with the field selector
//!   `spec.nodename=<node>` (the CRD's `selectableFields`; das-controller creates one per
//!   allocated device). The API server filters: each event goes to one watcher.
//! - `claims-all`: a watch of every ResourceClaim (a ResourceClaim has no field selector for its
//!   allocation's node): every event goes to every watcher, which filters for itself.
//!
//! A local control plane without kubelets. `DAS_BENCH_WATCHERS` watchers (default 1000, one per
//! simulated node, all in this process on one HTTP client) are opened and settle; then
//! `DAS_BENCH_OBJECTS` objects (default 300) spread round-robin over the nodes are created,
//! updated once (an annotation) and deleted, 16 writes in flight. Reported per way: API server
//! CPU time per write (user + system from `/proc/<pid>/stat`), the API server's RSS after the
//! watchers opened and at the end, events and bytes delivered, this process's CPU time (the
//! writes, the same for both ways, and the watchers' decoding: what the node plugins would
//! spend, summed), and the delay from a
//! write's answer to its event at the watcher of its node (p50, p99). Every watcher must get
//! exactly the events of its node (`alloc-by-node`) or all of them (`claims-all`), else the run
//! fails. Run: `make bench-claim-watch`; figures go into docs/benchmarks.md by hand.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::AllocationClaim;
use das_e2e::das::install_allocation_claim_crd;
use das_e2e::{Cluster, ClusterConfig, wait};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Mutex;

const NS: &str = "default";
const IN_FLIGHT: usize = 16;
const WATCHERS_PER_CLIENT: usize = 100;

#[tokio::main]
async fn main() -> Result<()> {
    let watchers = env_usize("DAS_BENCH_WATCHERS", 1000)?;
    let objects = env_usize("DAS_BENCH_OBJECTS", 300)?;
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[])).await?;
    let client = cluster.client();
    install_allocation_claim_crd(&client).await?;
    // One client (so one HTTP/2 connection) per 100 watchers: the API server allows a few
    // hundred streams per connection, and every node plugin has a connection of its own anyway.
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let clients: Vec<Client> = (0..watchers.div_ceil(WATCHERS_PER_CLIENT))
        .map(|_| Client::try_from(config.clone()))
        .collect::<Result<_, _>>()?;
    let apiserver = apiserver_pid(&cluster)?;
    println!(
        "{watchers} watchers, {objects} objects (create, update, delete each: {} writes)\n",
        objects * 3
    );
    println!(
        "| way | API server CPU ms / write | API server RSS MiB (watching → end) | events delivered | MiB delivered | bench CPU s (writes + watchers) | write → event p50 / p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for way in [Way::AllocByNode, Way::ClaimsAll] {
        let r = run(&client, &clients, apiserver, way, watchers, objects).await?;
        println!(
            "| {} | {:.2} | {} → {} | {} | {:.1} | {:.2} | {:.1} / {:.1} |",
            way.name(),
            r.apiserver_cpu.as_secs_f64() * 1000.0 / (objects * 3) as f64,
            r.rss_watching >> 20,
            r.rss_end >> 20,
            r.events,
            r.bytes as f64 / f64::from(1 << 20),
            r.self_cpu.as_secs_f64(),
            r.p50.as_secs_f64() * 1000.0,
            r.p99.as_secs_f64() * 1000.0,
        );
    }
    cluster.stop();
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    AllocByNode,
    ClaimsAll,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::AllocByNode => "alloc-by-node",
            Way::ClaimsAll => "claims-all",
        }
    }
}

struct Figures {
    apiserver_cpu: Duration,
    rss_watching: u64,
    rss_end: u64,
    events: u64,
    bytes: u64,
    self_cpu: Duration,
    p50: Duration,
    p99: Duration,
}

/// What the watchers saw: per watcher, the events and when each object's were received.
struct Seen {
    /// Watches whose headers the API server has answered.
    open: AtomicU64,
    events: AtomicU64,
    /// Events of the watchers' own nodes, and their bytes.
    own_events: AtomicU64,
    own_bytes: AtomicU64,
    /// (watcher, object name, event kind) → when it arrived, for the watcher's own node.
    arrivals: Mutex<HashMap<(usize, String, &'static str), Instant>>,
    /// Events per watcher.
    per_watcher: Vec<AtomicU64>,
}

async fn run(
    client: &Client,
    clients: &[Client],
    apiserver: u32,
    way: Way,
    watchers: usize,
    objects: usize,
) -> Result<Figures> {
    let seen = Arc::new(Seen {
        open: AtomicU64::new(0),
        events: AtomicU64::new(0),
        own_events: AtomicU64::new(0),
        own_bytes: AtomicU64::new(0),
        arrivals: Mutex::new(HashMap::new()),
        per_watcher: (0..watchers).map(|_| AtomicU64::new(0)).collect(),
    });
    let mut tasks = Vec::new();
    for w in 0..watchers {
        let seen = seen.clone();
        let client = clients[w / WATCHERS_PER_CLIENT].clone();
        tasks.push(tokio::spawn(async move {
            match way {
                Way::AllocByNode => {
                    let api: Api<AllocationClaim> = Api::namespaced(client, NS);
                    let wp = watch_params().fields(&format!("spec.nodename={}", node(w)));
                    watch(api, wp, (w, watchers), seen).await
                }
                Way::ClaimsAll => {
                    let api: Api<ResourceClaim> = Api::all(client);
                    watch(api, watch_params(), (w, watchers), seen).await
                }
            }
        }));
    }
    // Every watch open (the API server has answered its headers) before the first write: a
    // watch opened later would miss the events before it.
    wait::until("every watch open", Duration::from_secs(600), || async {
        if let Some(t) = tasks.iter().find(|t| t.is_finished()) {
            bail!("a watcher ended before the writes: {:?}", t);
        }
        Ok((seen.open.load(Ordering::Relaxed) >= watchers as u64).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_watching = rss(apiserver)?;
    let (cpu0, self0) = (cpu(apiserver)?, self_cpu()?);
    let answered = write_all(client, way, watchers, objects).await?;
    let expected_per_watcher = |w: usize| match way {
        Way::AllocByNode => (0..objects).filter(|o| o % watchers == w).count() as u64 * 3,
        Way::ClaimsAll => objects as u64 * 3,
    };
    let total: u64 = (0..watchers).map(expected_per_watcher).sum();
    wait::until(
        "every event delivered",
        Duration::from_secs(600),
        || async { Ok((seen.events.load(Ordering::Relaxed) >= total).then_some(())) },
    )
    .await?;
    let (cpu1, self1) = (cpu(apiserver)?, self_cpu()?);
    let rss_end = rss(apiserver)?;
    for t in &tasks {
        t.abort();
    }
    for w in 0..watchers {
        let got = seen.per_watcher[w].load(Ordering::Relaxed);
        ensure!(
            got == expected_per_watcher(w),
            "{}: watcher {w} got {got} events, expected {}",
            way.name(),
            expected_per_watcher(w)
        );
    }
    let arrivals = seen.arrivals.lock().await;
    let mut delays: Vec<Duration> = answered
        .iter()
        .filter_map(|((o, kind), at)| {
            let arrived = arrivals.get(&(o % watchers, object_name(*o), *kind))?;
            Some(arrived.saturating_duration_since(*at))
        })
        .collect();
    ensure!(
        delays.len() == answered.len(),
        "{}: {} of {} writes never reached their node's watcher",
        way.name(),
        answered.len() - delays.len(),
        answered.len()
    );
    delays.sort();
    let pct = |p: f64| delays[((delays.len() - 1) as f64 * p) as usize];
    Ok(Figures {
        apiserver_cpu: cpu1.saturating_sub(cpu0),
        rss_watching,
        rss_end,
        events: seen.events.load(Ordering::Relaxed),
        // Bytes of the events of the own nodes, scaled to every event delivered.
        bytes: seen.own_bytes.load(Ordering::Relaxed) * seen.events.load(Ordering::Relaxed)
            / seen.own_events.load(Ordering::Relaxed).max(1),
        self_cpu: self1.saturating_sub(self0),
        p50: pct(0.5),
        p99: pct(0.99),
    })
}

/// Watcher `w` of `watchers`: counts every event until aborted, and times those of its own
/// node's objects.
async fn watch<K>(
    api: Api<K>,
    wp: WatchParams,
    (w, watchers): (usize, usize),
    seen: Arc<Seen>,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + serde::Serialize,
{
    let mut events = api.watch(&wp, "0").await?.boxed();
    seen.open.fetch_add(1, Ordering::Relaxed);
    while let Some(ev) = events.try_next().await? {
        let now = Instant::now();
        let (kind, obj) = match ev {
            WatchEvent::Added(o) => ("create", o),
            WatchEvent::Modified(o) => ("update", o),
            WatchEvent::Deleted(o) => ("delete", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => bail!("watcher {w}: {e:?}"),
        };
        let name = obj.meta().name.clone().unwrap_or_default();
        seen.events.fetch_add(1, Ordering::Relaxed);
        seen.per_watcher[w].fetch_add(1, Ordering::Relaxed);
        let own = name
            .strip_prefix("bench-")
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|o| o % watchers == w);
        if own {
            // Its size on the wire, re-encoded (the client decoded it); only for the own node's
            // events, which are a sample of all (every watcher gets the same objects).
            let bytes = serde_json::to_vec(&obj)?.len() as u64;
            seen.own_events.fetch_add(1, Ordering::Relaxed);
            seen.own_bytes.fetch_add(bytes, Ordering::Relaxed);
            seen.arrivals.lock().await.insert((w, name, kind), now);
        }
    }
    Ok(())
}

/// Creates, updates and deletes `objects` objects of `way`'s kind, [`IN_FLIGHT`] at a time;
/// returns when each write was answered, by (object, kind of write).
async fn write_all(
    client: &Client,
    way: Way,
    watchers: usize,
    objects: usize,
) -> Result<HashMap<(usize, &'static str), Instant>> {
    let mut answered = HashMap::new();
    for kind in ["create", "update", "delete"] {
        let done: Vec<(usize, Instant)> = stream::iter(0..objects)
            .map(|o| {
                let client = client.clone();
                async move {
                    write(&client, way, kind, o, &node(o % watchers)).await?;
                    Ok::<_, anyhow::Error>((o, Instant::now()))
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_collect()
            .await?;
        answered.extend(done.into_iter().map(|(o, at)| ((o, kind), at)));
    }
    Ok(answered)
}

async fn write(client: &Client, way: Way, kind: &str, o: usize, node: &str) -> Result<()> {
    let name = object_name(o);
    match way {
        Way::AllocByNode => {
            let api: Api<AllocationClaim> = Api::namespaced(client.clone(), NS);
            apply(&api, kind, &name, || allocation_claim(&name, node)).await
        }
        Way::ClaimsAll => {
            let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
            apply(&api, kind, &name, || resource_claim(&name)).await
        }
    }
}

async fn apply<K>(api: &Api<K>, kind: &str, name: &str, object: impl Fn() -> Value) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + serde::Serialize,
{
    match kind {
        "create" => {
            api.create(&PostParams::default(), &serde_json::from_value(object())?)
                .await?;
        }
        "update" => {
            let patch = json!({"metadata": {"annotations": {"bench.das.com/updated": "1"}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        _ => {
            api.delete(name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

/// An AllocationClaim as das-controller writes it for one `1g.10gb` on `node`.
fn allocation_claim(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "inference.redhat.com/v1alpha1", "kind": "AllocationClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "profile": "1g.10gb", "gpuUUID": "GPU-00000000-0000-0000-0000-000000000000",
            "migPlacement": {"start": 3, "size": 1}, "nodename": node,
            "podRef": {"kind": "Pod", "name": format!("pod-{name}"), "namespace": NS, "uid": "00000000-0000-4000-8000-000000000001"},
            "resourceClaimRef": {"name": name, "uid": "00000000-0000-4000-8000-000000000002"},
            "request": "mig", "pool": node, "device": "gpu-0-mig-1g-10gb-3"
        }
    })
}

/// A ResourceClaim for one `1g.10gb` (its allocation, written by the scheduler, would add to
/// every event; left out, which favours this way).
fn resource_claim(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}]}}
    })
}

/// Watches stay open for the whole run (the longest kube allows; a run takes well under it).
fn watch_params() -> WatchParams {
    WatchParams::default().timeout(290)
}

fn node(i: usize) -> String {
    format!("node-{i:04}")
}

fn object_name(o: usize) -> String {
    format!("bench-{o:05}")
}

fn env_usize(name: &str, default: usize) -> Result<usize> {
    std::env::var(name).map_or(Ok(default), |v| v.parse().context(name.to_string()))
}

fn apiserver_pid(cluster: &Cluster) -> Result<u32> {
    cluster
        .component_names()
        .iter()
        .zip(cluster.pids())
        .find(|(n, _)| n.contains("apiserver"))
        .map(|(_, pid)| pid)
        .context("no kube-apiserver among the cluster's components")
}

/// User + system CPU time of process `pid` (`/proc/<pid>/stat` fields 14 and 15).
fn cpu(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("/proc stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

fn self_cpu() -> Result<Duration> {
    cpu(std::process::id())
}

/// Resident set of process `pid`, in bytes (`VmRSS`).
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("VmRSS")?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()?;
    Ok(kb << 10)
}
