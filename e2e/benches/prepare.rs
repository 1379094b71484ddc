//! Benchmark: NodePrepareResources latency over the plugin's real DRA socket, and plugin memory.
//!
//! A local cluster (real kube-apiserver) and `das-kubelet-plugin` with 8 emulated H100-80GB run;
//! the benchmark creates ResourceClaims and writes their allocation as the scheduler would, then
//! calls NodePrepareResources / NodeUnprepareResources itself over the unix socket, like the
//! kubelet. Each prepare therefore includes the claim GET, slice creation (emulated, on-disk
//! state), the checkpoint writes, the CDI spec write and the status.devices apply.
//!
//! Needs the plugin's release build (`cargo build --release -p das-driver --bin
//! das-kubelet-plugin`). Run: `cargo bench -p das-e2e --bench prepare` (prints a table; figures
//! go into docs/benchmarks.md by hand). With `DAS_BENCH_BASELINE_PLUGIN=<path>` another plugin
//! binary (an earlier build) runs on a second node, interleaved round by round, for ratios
//! measured in one run. Each case also reports the plugin's CPU time per prepare + unprepare
//! (`/proc/<pid>/stat`).
//!
//! With `DAS_BENCH_PEER_PLUGIN=<path>` the DRA example driver's kubelet plugin
//! (sigs.k8s.io/dra-example-driver v0.4.0, `make peer` builds it into
//! `.local/bin/dra-example-kubeletplugin`; `make bench-peer` runs this) serves the same hollow
//! kubelet beside DAS, with 8 GPUs of 7 partitions each (`--gpu-partitions 7`), and takes the same
//! rounds; the benchmark then prints the ratios peer / DAS. The peer publishes its device status
//! into the claim as DAS does (`--gpu-device-status`; `DAS_BENCH_PEER_DEVICE_STATUS=0` runs it with
//! its default, no status write), without its client's default rate limit (see [`spawn_plugin`]).
//! Both run at their shipped log level (DAS: `info`, the chart's).

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_e2e::binaries::DasBinary;
use das_e2e::das::{self, apply_device_classes};
use das_e2e::{Cluster, ClusterConfig, process, wait};
use das_proto::dra::v1::dra_plugin_client::DraPluginClient;
use das_proto::dra::v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

const GPUS: u32 = 8;
const SINGLE_ROUNDS: usize = 200;
const CONCURRENT_ROUNDS: usize = 50;
/// The DRA example driver's name for its `gpu` device profile (its `--driver-name` default).
const EXAMPLE_DRIVER: &str = "gpu.example.com";
/// Partitions per GPU of the example driver: 7, as many as an H100's `1g.10gb` slices.
const EXAMPLE_PARTITIONS: u32 = 7;

/// Which plugin a subject runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A `das-kubelet-plugin` build with 8 emulated H100-80GB.
    Das,
    /// The DRA example driver's `dra-example-kubeletplugin` with 8 GPUs of 7 partitions.
    Example,
}

impl Kind {
    fn driver(self) -> &'static str {
        match self {
            Kind::Das => das::DRIVER,
            Kind::Example => EXAMPLE_DRIVER,
        }
    }

    fn device_class(self) -> &'static str {
        match self {
            Kind::Das => "1g.10gb.mig.das.com",
            Kind::Example => EXAMPLE_DRIVER,
        }
    }

    /// Slot `slot` (0..7) of GPU `g`: DAS's `1g.10gb` at that memory slice, or the example
    /// driver's partition of that number.
    fn device(self, g: u32, slot: u32) -> String {
        match self {
            Kind::Das => format!("gpu-{g}-mig-1g-10gb-{slot}"),
            Kind::Example => format!("gpu-{g}-partition-{slot}"),
        }
    }
}

async fn connect(sock: PathBuf) -> Result<DraPluginClient<Channel>> {
    let ch = Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_| {
            let p = sock.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?))
            }
        }))
        .await?;
    Ok(DraPluginClient::new(ch))
}

/// Creates claim `name` allocated (by us, as the scheduler would) to `kind`'s device `device` on
/// `node` (whose pool both plugins name after the node).
async fn allocated_claim(
    client: &Client,
    kind: Kind,
    node: &str,
    name: &str,
    device: &str,
) -> Result<Claim> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let rc: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": kind.device_class()}}]}}
    }))?;
    let rc = api.create(&PostParams::default(), &rc).await?;
    let status = json!({"status": {"allocation": {
        "devices": {"results": [{"request": "mig", "driver": kind.driver(), "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    }}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("allocate {name}"))?;
    Ok(Claim {
        namespace: "default".into(),
        name: name.into(),
        uid: rc.metadata.uid.context("uid")?,
    })
}

async fn prepare(c: &mut DraPluginClient<Channel>, claims: Vec<Claim>) -> Result<Duration> {
    let t0 = Instant::now();
    let r = c
        .node_prepare_resources(NodePrepareResourcesRequest { claims })
        .await?
        .into_inner();
    let took = t0.elapsed();
    for (uid, e) in r.claims {
        anyhow::ensure!(e.error.is_empty(), "prepare {uid}: {}", e.error);
    }
    Ok(took)
}

async fn unprepare(c: &mut DraPluginClient<Channel>, claims: Vec<Claim>) -> Result<()> {
    let r = c
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims })
        .await?
        .into_inner();
    for (uid, e) in r.claims {
        anyhow::ensure!(e.error.is_empty(), "unprepare {uid}: {}", e.error);
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn rss_mib(pid: u32) -> (f64, f64) {
    let (rss, peak) = process::memory_kib(pid as i32).unwrap_or((0, 0));
    (rss as f64 / 1024.0, peak as f64 / 1024.0)
}

/// One plugin under test: its node, DRA client and process.
struct Subject {
    label: String,
    kind: Kind,
    node: &'static str,
    client: DraPluginClient<Channel>,
    pid: u32,
    one: Claim,
    eight: Vec<Claim>,
    single: Vec<Duration>,
    walls: Vec<Duration>,
    sequential: Vec<Duration>,
    /// CPU seconds the plugin spent in the 1-claim rounds' prepares and unprepares.
    prepare_cpu: f64,
    unprepare_cpu: f64,
    /// RSS in MiB after start, and with 50 prepared claims (set by [`Subject::memory_with_50`]).
    rss0: f64,
    rss50: f64,
}

/// Starts `binary` as a plugin of `kind` for `node` and returns its DRA socket.
fn spawn_plugin(
    cluster: &mut Cluster,
    kind: Kind,
    node: &'static str,
    binary: &std::path::Path,
) -> Result<PathBuf> {
    let n = cluster.node(node).clone();
    let kubeconfig = cluster.kubeconfig.clone();
    let args = match kind {
        Kind::Das => {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let mut args = das::plugin_args(&n, &format!("H100-80GB:{GPUS}"), &kubeconfig, port);
            // The level the chart installs (values.yaml `logging.level`), as the peer runs at its
            // default.
            for a in &mut args {
                if a.starts_with("--log-level=") {
                    *a = "--log-level=info".into();
                }
            }
            args
        }
        Kind::Example => {
            let mut args = vec![
                format!("--node-name={node}"),
                format!("--cdi-root={}", n.root_dir.join("example-cdi").display()),
                format!("--num-devices={GPUS}"),
                format!("--gpu-partitions={EXAMPLE_PARTITIONS}"),
                format!(
                    "--kubelet-registrar-directory-path={}",
                    n.registry_dir().display()
                ),
                format!(
                    "--kubelet-plugins-directory-path={}",
                    n.plugins_dir().display()
                ),
                format!("--kubeconfig={}", kubeconfig.display()),
                // Its client's default rate limit (5 QPS, burst 10) would be what is measured: a
                // prepare makes two API calls (the claim's GET, the status update), so the
                // shipped default holds it to about 2.5 prepares a second. DAS's client has no
                // client-side limit.
                "--kube-api-qps=1000".into(),
                "--kube-api-burst=1000".into(),
            ];
            if std::env::var("DAS_BENCH_PEER_DEVICE_STATUS").as_deref() != Ok("0") {
                args.push("--gpu-device-status".into());
            }
            args
        }
    };
    let name = match kind {
        Kind::Das => format!("das-plugin-{node}"),
        Kind::Example => format!("example-plugin-{node}"),
    };
    cluster.spawn_program(&name, binary, args)?;
    Ok(n.plugins_dir().join(kind.driver()).join("dra.sock"))
}

async fn start_subject(
    cluster: &mut Cluster,
    label: &str,
    kind: Kind,
    node: &'static str,
    binary: &std::path::Path,
) -> Result<Subject> {
    let sock = spawn_plugin(cluster, kind, node, binary)?;
    let pid = *cluster.pids().last().context("plugin pid")?;
    wait::until(
        "the plugin's DRA socket",
        Duration::from_secs(30),
        || async { Ok(sock.exists().then_some(())) },
    )
    .await?;
    let client = connect(sock).await?;
    let api = cluster.client();
    let prefix = format!("{}-{node}", kind.driver().replace('.', "-"));
    let one = allocated_claim(
        &api,
        kind,
        node,
        &format!("one-{prefix}"),
        &kind.device(0, 6),
    )
    .await?;
    let mut eight = Vec::new();
    for g in 0..GPUS {
        eight.push(
            allocated_claim(
                &api,
                kind,
                node,
                &format!("gpu{g}-{prefix}"),
                &kind.device(g, 6),
            )
            .await?,
        );
    }
    Ok(Subject {
        label: label.to_string(),
        kind,
        node,
        client,
        pid,
        one,
        eight,
        single: Vec::new(),
        walls: Vec::new(),
        sequential: Vec::new(),
        prepare_cpu: 0.0,
        unprepare_cpu: 0.0,
        rss0: rss_mib(pid).0,
        rss50: 0.0,
    })
}

impl Subject {
    async fn single_round(&mut self) -> Result<()> {
        let cpu0 = process::cpu_seconds(self.pid);
        self.single
            .push(prepare(&mut self.client, vec![self.one.clone()]).await?);
        // The status write runs right after the answer: let it finish so its CPU counts here.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let cpu1 = process::cpu_seconds(self.pid);
        unprepare(&mut self.client, vec![self.one.clone()]).await?;
        self.prepare_cpu += cpu1 - cpu0;
        self.unprepare_cpu += process::cpu_seconds(self.pid) - cpu1;
        Ok(())
    }

    async fn concurrent_round(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let calls = self.eight.iter().map(|cl| {
            let mut c = self.client.clone();
            let cl = cl.clone();
            async move { prepare(&mut c, vec![cl]).await }
        });
        for r in futures::future::join_all(calls).await {
            r?;
        }
        self.walls.push(t0.elapsed());
        unprepare(&mut self.client, self.eight.clone()).await
    }

    async fn sequential_round(&mut self) -> Result<()> {
        let t0 = Instant::now();
        for cl in &self.eight {
            prepare(&mut self.client, vec![cl.clone()]).await?;
        }
        self.sequential.push(t0.elapsed());
        unprepare(&mut self.client, self.eight.clone()).await
    }

    /// RSS with 50 prepared claims (7 slots per GPU until 50: DAS's `1g.10gb` at each memory
    /// slice, the example driver's partitions), then released again.
    async fn memory_with_50(&mut self, api: &Client) -> Result<String> {
        let mut held = Vec::new();
        let prefix = format!("{}-{}", self.kind.driver().replace('.', "-"), self.node);
        'outer: for g in 0..GPUS {
            for slot in 0..7 {
                if held.len() == 50 {
                    break 'outer;
                }
                let cl = allocated_claim(
                    api,
                    self.kind,
                    self.node,
                    &format!("mem-{prefix}-{g}-{slot}"),
                    &self.kind.device(g, slot),
                )
                .await?;
                prepare(&mut self.client, vec![cl.clone()]).await?;
                held.push(cl);
            }
        }
        let (rss50, peak) = rss_mib(self.pid);
        self.rss50 = rss50;
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        unprepare(&mut self.client, held).await?;
        Ok(format!(
            "{}: RSS {:.1} MiB after start, {rss50:.1} MiB with 50 prepared claims (peak {peak:.1} MiB; anonymous {:.1} MiB, file-backed {:.1} MiB, {:.0} threads)",
            self.label,
            self.rss0,
            field("RssAnon:") / 1024.0,
            field("RssFile:") / 1024.0,
            field("Threads:")
        ))
    }
}

fn row(case: &str, rounds: usize, v: &mut [Duration]) -> String {
    v.sort();
    format!(
        "| {case} | {rounds} | {} | {} | {} |",
        ms(percentile(v, 0.5)),
        ms(percentile(v, 0.99)),
        ms(*v.last().unwrap())
    )
}

/// Runs `round` for every subject, `rounds` times, alternating which goes first so drift on
/// this shared machine hits both alike.
macro_rules! interleave {
    ($subjects:expr, $rounds:expr, $round:ident) => {
        for r in 0..$rounds {
            let n = $subjects.len();
            for k in 0..n {
                $subjects[(r + k) % n].$round().await?;
            }
        }
    };
}

/// `a / b` at percentile `p`.
fn ratio(a: &[Duration], b: &[Duration], p: f64) -> f64 {
    percentile(a, p).as_secs_f64() / percentile(b, p).as_secs_f64()
}

/// One line of ratios `a / b` over every case (their samples sorted by [`row`]).
fn ratios(a: &Subject, b: &Subject) -> String {
    format!(
        "{} / {}: 1 claim p50 {:.2}, p99 {:.2}; 8 concurrent p50 {:.2}, p99 {:.2}; 8 sequential p50 {:.2}, p99 {:.2}; CPU per prepare {:.2}, per unprepare {:.2}; RSS after start {:.2}, with 50 claims {:.2}",
        a.label,
        b.label,
        ratio(&a.single, &b.single, 0.5),
        ratio(&a.single, &b.single, 0.99),
        ratio(&a.walls, &b.walls, 0.5),
        ratio(&a.walls, &b.walls, 0.99),
        ratio(&a.sequential, &b.sequential, 0.5),
        ratio(&a.sequential, &b.sequential, 0.99),
        a.prepare_cpu / b.prepare_cpu,
        a.unprepare_cpu / b.unprepare_cpu,
        a.rss0 / b.rss0,
        a.rss50 / b.rss50,
    )
}

/// The DeviceClass the example driver's claims name (its chart installs the same).
async fn apply_example_device_class(api: &Client) -> Result<()> {
    let classes: Api<DeviceClass> = Api::all(api.clone());
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": EXAMPLE_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{EXAMPLE_DRIVER}'")}}]}
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    // `DAS_BENCH_BASELINE_PLUGIN=<path of another das-kubelet-plugin>` runs it side by side on
    // a second node, interleaved round by round, and prints the ratios.
    let baseline = std::env::var_os("DAS_BENCH_BASELINE_PLUGIN").map(PathBuf::from);
    // `DAS_BENCH_PEER_PLUGIN=<path of dra-example-kubeletplugin>` runs the DRA example driver's
    // plugin on the same node as this build, interleaved the same way.
    let peer = std::env::var_os("DAS_BENCH_PEER_PLUGIN").map(PathBuf::from);
    let nodes: &[&str] = if baseline.is_some() {
        &["n0", "n1"]
    } else {
        &["n0"]
    };
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(nodes)).await?;
    let api = cluster.client();
    apply_device_classes(&api, &["1g.10gb"]).await?;
    let mut subjects = vec![
        start_subject(
            &mut cluster,
            "this build",
            Kind::Das,
            "n0",
            &DasBinary::Plugin.in_target_dir("release")?,
        )
        .await?,
    ];
    if let Some(b) = &baseline {
        subjects.push(start_subject(&mut cluster, "baseline", Kind::Das, "n1", b).await?);
    }
    if let Some(p) = &peer {
        apply_example_device_class(&api).await?;
        subjects.push(start_subject(&mut cluster, "example driver", Kind::Example, "n0", p).await?);
    }
    interleave!(subjects, SINGLE_ROUNDS, single_round);
    interleave!(subjects, CONCURRENT_ROUNDS, concurrent_round);
    interleave!(subjects, CONCURRENT_ROUNDS, sequential_round);
    let mut memory = Vec::new();
    for s in &mut subjects {
        memory.push(s.memory_with_50(&api).await?);
    }

    println!(
        "NodePrepareResources over the DRA socket, emulated H100-80GB ×{GPUS}, real kube-apiserver; CPUs: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    for s in &mut subjects {
        println!("\n{} ({}, {}):", s.label, s.kind.driver(), s.node);
        println!("| case | rounds | p50 | p99 | max |");
        println!("|---|---|---|---|---|");
        println!(
            "{}",
            row("1 claim (1 device)", SINGLE_ROUNDS, &mut s.single)
        );
        println!(
            "{}",
            row(
                "8 concurrent claims on 8 GPUs, wall time",
                CONCURRENT_ROUNDS,
                &mut s.walls
            )
        );
        println!(
            "{}",
            row(
                "8 claims on 8 GPUs one after another, wall time",
                CONCURRENT_ROUNDS,
                &mut s.sequential
            )
        );
        println!(
            "plugin CPU per 1-claim prepare (with its status write): {:.2} ms; per unprepare: {:.2} ms",
            s.prepare_cpu * 1000.0 / SINGLE_ROUNDS as f64,
            s.unprepare_cpu * 1000.0 / SINGLE_ROUNDS as f64
        );
    }
    println!();
    for other in &subjects[1..] {
        let line = match other.kind {
            // An earlier DAS build: this build / baseline, as before.
            Kind::Das => ratios(&subjects[0], other),
            // The peer: peer / DAS (above 1: DAS is faster or lighter).
            Kind::Example => ratios(other, &subjects[0]),
        };
        println!("{line}");
    }
    for m in memory {
        println!("{m}");
    }
    Ok(())
}
