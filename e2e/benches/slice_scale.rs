//! Benchmark: memory of `das-controller` and `das-webhook` on a cluster that publishes many DAS
//! devices (issue 30 item 7).
//!
//! A local control plane without kubelets (etcd, kube-apiserver, scheduler,
//! controller-manager). For each size, API-only nodes get the ResourceSlices das-kubelet-plugin
//! publishes for 8 emulated H100-80GB each (200 devices in 4 device slices and a counter slice;
//! `das_e2e::das::printed_resource_slices`, renamed per node; no Node objects, no owner).
//! Then, one at a time and from a fresh start:
//! - `das-controller` (no leader election): the time until `/readyz` (every cache has its first
//!   complete list), then its RSS and peak RSS (`VmRSS`, `VmHWM`) 2 s later;
//! - `das-webhook` (`--profiles-ttl-seconds=1`): the time of its first `/readyz` (lists the
//!   DeviceClasses and every DAS ResourceSlice), then 5 more `/readyz` a second apart (each one
//!   a full refresh), then its RSS and peak RSS;
//! - legacy-pod admission: a second `das-webhook` with the chart's TTL
//!   (`--profiles-ttl-seconds=30`), registered as the chart's MutatingWebhookConfiguration (by
//!   URL on loopback, with its CA). `DAS_BENCH_PODS` (default 100) pods asking
//!   `nvidia.com/mig-1g.10gb: 1` are created one after another in `default` and the API server's
//!   create call is timed end to end (the webhook's review happens inside it), in three series:
//!   with the cache fresh (right after `/readyz`), right after the TTL (the answer is stale:
//!   served at once while one refresh runs in the background), and past twice the TTL after that
//!   refresh (the first pod waits for a full refresh). The pods never run (no kubelets); they are
//!   deleted after each series;
//! - `kubectl das gpus` and `kubectl das free` (`target/<profile>/kubectl-das`, or the binaries
//!   `DAS_BENCH_KUBECTL_DAS` names, comma-separated), 3 runs each with `KUBECONFIG` of the
//!   cluster and nothing else of DAS running: wall time and peak RSS (`/usr/bin/time -f %M`, or
//!   the child's `VmHWM` read while it runs where GNU time is not installed).
//!
//! The binaries come from the target dir: the debug builds (`DAS_BENCH_PROFILE=release` takes
//! the release builds). Run: `make bench-scale` (builds them and the plugin, whose
//! `--print-resource-slices` gives the slices; then `cargo bench --profile dev -p das-e2e --bench
//! slice_scale`). Prints three tables; figures go into docs/benchmarks.md by hand.
//! `DAS_BENCH_NODES=250,1000` sets the sizes (ascending; each adds nodes to the last).

#[path = "common/tls.rs"]
mod tls;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use das_e2e::das::{
    self, apply_device_classes, bench_node_counts, devices_in, printed_resource_slices,
};
use das_e2e::install::DasBinary;
use das_e2e::pki::{Pki, Usage};
use das_e2e::workload::{NS, delete_pods, free_port, http_get};
use das_e2e::{Cluster, ClusterConfig, process, wait};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::Client;
use kube::api::PostParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

const GPUS: &str = "H100-80GB:8";
const TEMPLATE_NODE: &str = "das-bench-template-node";
/// Slice creations in flight at once.
const CREATE_CONCURRENCY: usize = 8;
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// The webhook's `--profiles-ttl-seconds` in the admission series: the chart's (and the
/// binary's) default.
const TTL: Duration = Duration::from_secs(30);
/// Runs of each `kubectl das` command per binary.
const CLI_RUNS: usize = 3;

#[tokio::main]
async fn main() -> Result<()> {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[])).await?;
    let r = run(&mut cluster).await;
    if r.is_err() {
        cluster.print_log_tails(30);
    }
    cluster.stop();
    r
}

/// The debug build of `b`, or the release build with `DAS_BENCH_PROFILE=release`.
fn binary(b: DasBinary) -> Result<(PathBuf, String)> {
    let profile = std::env::var("DAS_BENCH_PROFILE").unwrap_or_else(|_| "debug".into());
    Ok((b.in_target_dir(&profile)?, profile))
}

async fn run(cluster: &mut Cluster) -> Result<()> {
    let sizes = bench_node_counts("250,1000")?;
    let client = cluster.client();
    das::install_allocation_claim_crd(&client).await?;
    apply_device_classes(&client, &["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]).await?;
    let template: Vec<String> = printed_resource_slices(GPUS, TEMPLATE_NODE)?
        .into_iter()
        .map(|mut s| {
            // What the plugin sends: a name, no server-set fields, no owner (no Node objects).
            let name = s["metadata"]["name"].clone();
            s["metadata"] = serde_json::json!({ "name": name });
            serde_json::to_string(&s)
        })
        .collect::<Result<_, _>>()?;
    let per_node_devices = devices_in(&template)?;
    let (controller, controller_profile) = binary(DasBinary::Controller)?;
    let (webhook, webhook_profile) = binary(DasBinary::Webhook)?;
    println!(
        "controller: {controller_profile} build, webhook: {webhook_profile} build; one node: {GPUS}, {} slices, {per_node_devices} devices",
        template.len()
    );
    let pki = Pki::create(&cluster.pki_dir.join("webhook"))?;
    let serving = pki.issue(
        "serving",
        "das-webhook",
        Usage::Server {
            sans: vec!["127.0.0.1".into()],
        },
    )?;
    let tls = tls::connector(&pki.ca.cert)?;
    let pods: usize = std::env::var("DAS_BENCH_PODS")
        .unwrap_or_else(|_| "100".into())
        .parse()
        .context("DAS_BENCH_PODS")?;
    // The admission webhook listens on one port at every size, so that the
    // MutatingWebhookConfiguration is registered once.
    let hook_port = free_port();
    let mut registered = false;
    let kubectl_das: Vec<PathBuf> = match std::env::var("DAS_BENCH_KUBECTL_DAS") {
        Ok(list) => list
            .split(',')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect(),
        Err(_) => vec![kubectl_das_binary()?],
    };
    let mut admission_rows = Vec::new();
    let mut cli_rows = Vec::new();

    println!();
    println!(
        "| nodes | devices | slices created in | controller ready in | controller RSS / peak | webhook first refresh | webhook RSS / peak after 6 refreshes |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut nodes_made = 0;
    for nodes in sizes {
        let t = Instant::now();
        let bodies: Vec<ResourceSlice> = (nodes_made..nodes)
            .flat_map(|i| {
                let node = format!("node-{i:04}");
                template
                    .iter()
                    .map(move |t| serde_json::from_str(&t.replace(TEMPLATE_NODE, &node)))
            })
            .collect::<Result<_, _>>()?;
        futures::stream::iter(bodies.into_iter().map(|s| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &s).await.map(|_| ()) }
        }))
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .context("create ResourceSlices")?;
        nodes_made = nodes;
        let created = t.elapsed();

        // The controller, from a fresh start.
        let port = free_port();
        let name = format!("das-controller-{nodes}");
        cluster.spawn_program(
            &name,
            &controller,
            das::controller_args(&cluster.kubeconfig, port),
        )?;
        let pid = *cluster.pids().last().context("controller pid")?;
        let t = Instant::now();
        wait::until("the controller's caches", READY_TIMEOUT, || async {
            let ready = http_get(port, "/readyz")
                .await
                .is_ok_and(|(code, _)| code == 200);
            Ok(ready.then_some(()))
        })
        .await?;
        let controller_ready = t.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let controller_mem = mib(pid);
        cluster.stop_component(&name, true)?;

        // The webhook, from a fresh start.
        let port = free_port();
        let name = format!("das-webhook-{nodes}");
        cluster.spawn_program(
            &name,
            &webhook,
            vec![
                format!("--kubeconfig={}", cluster.kubeconfig.display()),
                format!("--listen=127.0.0.1:{port}"),
                format!("--tls-cert-file={}", serving.cert.display()),
                format!("--tls-key-file={}", serving.key.display()),
                "--profiles-ttl-seconds=1".into(),
                "--log-level=warn".into(),
            ],
        )?;
        let pid = *cluster.pids().last().context("webhook pid")?;
        wait::until("the webhook listens", Duration::from_secs(60), || async {
            Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ()))
        })
        .await?;
        let t = Instant::now();
        let code = https_get(&tls, port, "/readyz").await?;
        let first_refresh = t.elapsed();
        ensure!(code == 200, "webhook /readyz: {code}");
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let code = https_get(&tls, port, "/readyz").await?;
            ensure!(code == 200, "webhook /readyz: {code}");
        }
        let webhook_mem = mib(pid);
        cluster.stop_component(&name, true)?;

        println!(
            "| {nodes} | {} | {:.0} s | {:.1} s | {:.1} / {:.1} MiB | {:.1} s | {:.1} / {:.1} MiB |",
            nodes * per_node_devices,
            created.as_secs_f64(),
            controller_ready.as_secs_f64(),
            controller_mem.0,
            controller_mem.1,
            first_refresh.as_secs_f64(),
            webhook_mem.0,
            webhook_mem.1,
        );

        // Legacy-pod admission, through the API server, with the chart's TTL.
        let name = format!("das-webhook-admission-{nodes}");
        cluster.spawn_program(
            &name,
            &webhook,
            vec![
                format!("--kubeconfig={}", cluster.kubeconfig.display()),
                format!("--listen=127.0.0.1:{hook_port}"),
                format!("--tls-cert-file={}", serving.cert.display()),
                format!("--tls-key-file={}", serving.key.display()),
                format!("--profiles-ttl-seconds={}", TTL.as_secs()),
                "--log-level=warn".into(),
            ],
        )?;
        let pid = *cluster.pids().last().context("webhook pid")?;
        let rows = admission(
            &client,
            &tls,
            hook_port,
            pid,
            &pki.ca.cert,
            &mut registered,
            pods,
        )
        .await
        .with_context(|| format!("admission at {nodes} nodes"))?;
        let (_, hook_peak) = mib(pid);
        cluster.stop_component(&name, true)?;
        for r in rows {
            println!("admission: {nodes} nodes: {}", r.cells());
            admission_rows.push((nodes, r, hook_peak));
        }

        // `kubectl das`, with nothing of DAS running.
        for bin in &kubectl_das {
            for cmd in ["gpus", "free"] {
                let r = cli(bin, cmd, &cluster.kubeconfig, &cluster.dir).await?;
                println!("kubectl das: {nodes} nodes: {}", r.cells());
                cli_rows.push((nodes, r));
            }
        }
    }

    println!();
    println!(
        "Legacy-pod admission ({pods} pods a series, one after another; `--profiles-ttl-seconds={}`; nearest-rank percentiles):",
        TTL.as_secs()
    );
    println!();
    println!(
        "| nodes | cache | admitted | create p50 / p99 / max | first pod | webhook peak RSS |"
    );
    println!("|---:|---|---:|---|---:|---:|");
    for (nodes, r, peak) in &admission_rows {
        println!("| {nodes} | {} | {peak:.1} MiB |", r.cells());
    }
    println!();
    println!("`kubectl das` ({CLI_RUNS} runs each, `KUBECONFIG` of the cluster):");
    println!();
    println!(
        "| nodes | binary | command | wall time per run | peak RSS (most of the runs) | output lines |"
    );
    println!("|---:|---|---|---|---:|---:|");
    for (nodes, r) in &cli_rows {
        println!("| {nodes} | {} |", r.cells());
    }
    Ok(())
}

/// `target/<profile>/kubectl-das` (`DAS_BENCH_PROFILE`, default `debug`).
fn kubectl_das_binary() -> Result<PathBuf> {
    let profile = std::env::var("DAS_BENCH_PROFILE").unwrap_or_else(|_| "debug".into());
    let path = das_e2e::install::target_dir()
        .join(&profile)
        .join("kubectl-das");
    ensure!(
        path.exists(),
        "{} is missing: build it with `cargo build -p kubectl-das{}`",
        path.display(),
        if profile == "release" {
            " --release"
        } else {
            ""
        }
    );
    Ok(path)
}

/// One series of legacy-pod creations.
struct Series {
    cache: String,
    /// Create call times of the pods admitted, in order.
    times: Vec<Duration>,
    /// The first create call's time, admitted or not.
    first: Option<Duration>,
    /// Creations refused or failed (the error of the first).
    failed: Vec<String>,
}

impl Series {
    fn cells(&self) -> String {
        let mut sorted: Vec<f64> = self.times.iter().map(Duration::as_secs_f64).collect();
        sorted.sort_by(f64::total_cmp);
        let ms = |s: f64| format!("{:.0} ms", s * 1000.0);
        let admitted = format!(
            "{} of {}",
            self.times.len(),
            self.times.len() + self.failed.len()
        );
        let failed = self
            .failed
            .first()
            .map(|e| format!(" (failed: {e})"))
            .unwrap_or_default();
        let first = self.first.map_or("–".into(), |f| ms(f.as_secs_f64()));
        if sorted.is_empty() {
            return format!("{} | {admitted}{failed} | – | {first}", self.cache);
        }
        format!(
            "{} | {admitted}{failed} | {} / {} / {} | {}",
            self.cache,
            ms(quantile(&sorted, 0.5)),
            ms(quantile(&sorted, 0.99)),
            ms(*sorted.last().expect("not empty")),
            first,
        )
    }
}

/// The `q`-quantile of `sorted` (ascending, not empty), nearest rank: the smallest value with at
/// least `q` of the values at or below it (p99 of 100 values is the 99th).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The three admission series on the webhook `pid` listening on `port` (just started with
/// [`TTL`]); registers the chart's MutatingWebhookConfiguration the first time.
async fn admission(
    client: &Client,
    tls: &TlsConnector,
    port: u16,
    pid: u32,
    ca: &Path,
    registered: &mut bool,
    pods: usize,
) -> Result<Vec<Series>> {
    wait::until("the webhook listens", Duration::from_secs(60), || async {
        Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ()))
    })
    .await?;
    // The first answer: DeviceClasses and every DAS ResourceSlice. Its age counts from here.
    let code = https_get(tls, port, "/readyz").await?;
    let fresh_at = Instant::now();
    ensure!(code == 200, "webhook /readyz: {code}");
    if !*registered {
        let rendered = das_e2e::install::render()?;
        let cfg = das_e2e::install::webhook_configuration(&rendered, port, ca)?;
        let cfg: MutatingWebhookConfiguration = serde_json::from_value(cfg)?;
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &cfg)
            .await
            .context("register the webhook")?;
        *registered = true;
    }
    // The API server picks the configuration up from an informer, and the first real pod
    // creates the namespace's ResourceClaimTemplate: one pod, not timed.
    wait::until("a legacy pod translated", READY_TIMEOUT, || async {
        let p = legacy_pod("das-bench-warm-up");
        let api: Api<Pod> = Api::namespaced(client.clone(), NS);
        let Ok(out) = api.create(&PostParams::default(), &p).await else {
            return Ok(None);
        };
        let translated = out.spec.and_then(|s| s.resource_claims).is_some();
        delete_pods(client, &["das-bench-warm-up"]).await?;
        Ok(translated.then_some(()))
    })
    .await?;
    // What a series meant to measure and did not (it ran past its window) is said in its row.
    let late = |cache: &str, within: Duration| {
        if fresh_at.elapsed() < within {
            cache.to_string()
        } else {
            format!(
                "{cache} (ran until {:.0?} after the answer)",
                fresh_at.elapsed()
            )
        }
    };
    let mut series = Vec::new();
    let fresh = create_series(client, "fresh", "", pods).await?;
    series.push(Series {
        cache: late("fresh (within the TTL)", TTL),
        ..fresh
    });
    // Past the TTL: the first pod starts a background refresh, every pod gets the stale answer
    // at once until that refresh is in.
    tokio::time::sleep_until((fresh_at + TTL + Duration::from_secs(1)).into()).await;
    let stale = create_series(client, "stale", "", pods).await?;
    series.push(Series {
        cache: late(
            "stale (just past the TTL, refreshed in the background)",
            TTL * 2,
        ),
        ..stale
    });
    // Past twice the TTL after that refresh (it ends when the webhook's CPU goes quiet): the
    // first pod waits for a whole refresh.
    let refreshed_at = quiet(pid).await;
    tokio::time::sleep_until((refreshed_at + TTL * 2 + Duration::from_secs(1)).into()).await;
    series.push(
        create_series(
            client,
            "expired",
            "expired (past 2×TTL: the first pod waits)",
            pods,
        )
        .await?,
    );
    Ok(series)
}

/// When the process `pid` has used under 20 ms of CPU in a second (at most 5 minutes from now).
async fn quiet(pid: u32) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = process::cpu_seconds(pid);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = process::cpu_seconds(pid);
        if now - last < 0.02 || Instant::now() > deadline {
            return Instant::now();
        }
        last = now;
    }
}

/// A pod with one container asking for `nvidia.com/mig-1g.10gb: 1`, as a legacy workload does.
fn legacy_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "cpu": "100m"}}}],
            "terminationGracePeriodSeconds": 0}
    }))
    .expect("a Pod")
}

/// Creates `n` legacy pods one after another, timing each create call; then deletes them.
async fn create_series(client: &Client, prefix: &str, cache: &str, n: usize) -> Result<Series> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut s = Series {
        cache: cache.to_string(),
        times: Vec::new(),
        first: None,
        failed: Vec::new(),
    };
    let mut made = Vec::new();
    for i in 0..n {
        let name = format!("das-bench-{prefix}-{i:03}");
        let pod = legacy_pod(&name);
        let t = Instant::now();
        let r = api.create(&PostParams::default(), &pod).await;
        let took = t.elapsed();
        s.first.get_or_insert(took);
        match r {
            Ok(p) => {
                ensure!(
                    p.spec.and_then(|s| s.resource_claims).is_some(),
                    "pod {name} was admitted untranslated"
                );
                s.times.push(took);
                made.push(name);
            }
            Err(e) => s.failed.push(format!("{e} after {took:.1?}")),
        }
    }
    let names: Vec<&str> = made.iter().map(String::as_str).collect();
    delete_pods(client, &names).await?;
    Ok(s)
}

/// `CLI_RUNS` runs of one `kubectl das` command.
struct CliRuns {
    binary: String,
    command: &'static str,
    wall: Vec<Duration>,
    peak_kib: u64,
    lines: usize,
}

impl CliRuns {
    fn cells(&self) -> String {
        let wall: Vec<String> = self
            .wall
            .iter()
            .map(|w| format!("{:.1} s", w.as_secs_f64()))
            .collect();
        format!(
            "{} | {} | {} | {:.0} MiB | {}",
            self.binary,
            self.command,
            wall.join(", "),
            self.peak_kib as f64 / 1024.0,
            self.lines
        )
    }
}

/// Runs `bin <command> --color=never` [`CLI_RUNS`] times with `KUBECONFIG=kubeconfig`, output
/// to a file under `dir`; each must succeed.
async fn cli(bin: &Path, command: &'static str, kubeconfig: &Path, dir: &Path) -> Result<CliRuns> {
    let mut runs = CliRuns {
        binary: bin.display().to_string(),
        command,
        wall: Vec::new(),
        peak_kib: 0,
        lines: 0,
    };
    for i in 0..CLI_RUNS {
        let out = dir.join(format!("kubectl-das-{command}-{i}.out"));
        let err = dir.join(format!("kubectl-das-{command}-{i}.err"));
        let (bin, kc, o, e) = (
            bin.to_owned(),
            kubeconfig.to_owned(),
            out.clone(),
            err.clone(),
        );
        let (wall, peak, status) = tokio::task::spawn_blocking(move || {
            run_with_rusage(&bin, &[command, "--color=never"], &kc, &o, &e)
        })
        .await??;
        ensure!(
            status == 0,
            "kubectl-das {command} exited with {status}: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
        runs.wall.push(wall);
        runs.peak_kib = runs.peak_kib.max(peak);
        runs.lines = std::fs::read_to_string(&out)?.lines().count();
    }
    Ok(runs)
}

/// `time` of GNU, which reports its child's peak RSS (`%M`).
const GNU_TIME: &str = "/usr/bin/time";

/// Runs `bin args` with `KUBECONFIG`, stdout to `out` and stderr to `err`: (wall time, peak RSS
/// in KiB, exit code).
///
/// The peak comes from `/usr/bin/time -f %M` where it is installed, else from the child's
/// `VmHWM`, read every 5 ms while it runs (it only grows; the last reading before the exit
/// counts). Not from this process's own `wait4`: Linux starts a child's `ru_maxrss` at the peak
/// of the memory it was forked with, this benchmark's own (hundreds of MiB holding the slices),
/// whereas `time` forks from a small process.
fn run_with_rusage(
    bin: &Path,
    args: &[&str],
    kubeconfig: &Path,
    out: &Path,
    err: &Path,
) -> Result<(Duration, u64, i32)> {
    let rss_file = out.with_extension("maxrss");
    let gnu_time = Path::new(GNU_TIME).exists();
    let mut cmd = if gnu_time {
        let mut c = std::process::Command::new(GNU_TIME);
        c.arg("-f").arg("%M").arg("-o").arg(&rss_file).arg(bin);
        c
    } else {
        std::process::Command::new(bin)
    };
    let t = Instant::now();
    let mut child = cmd
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(out)?)
        .stderr(std::fs::File::create(err)?)
        .spawn()
        .with_context(|| format!("run {}", bin.display()))?;
    let mut hwm_kib = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if !gnu_time && let Some((_, peak)) = process::memory_kib(child.id() as i32) {
            hwm_kib = hwm_kib.max(peak);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let wall = t.elapsed();
    if gnu_time {
        let text = std::fs::read_to_string(&rss_file)?;
        hwm_kib = text
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("{GNU_TIME} wrote {text:?}"))?;
    }
    Ok((wall, hwm_kib, status.code().unwrap_or(-1)))
}

/// (RSS, peak RSS) in MiB.
fn mib(pid: u32) -> (f64, f64) {
    let (rss, peak) = process::memory_kib(pid as i32).unwrap_or((0, 0));
    (rss as f64 / 1024.0, peak as f64 / 1024.0)
}

/// The status code of `GET path` on the webhook (HTTPS, one connection, closed after).
async fn https_get(tls: &TlsConnector, port: u16, path: &str) -> Result<u16> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?;
    let mut s = tls.connect(name, tcp).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    // A server that closes without TLS close_notify ends the read with an error after the data.
    let _ = s.read_to_end(&mut buf).await;
    let head = String::from_utf8_lossy(&buf);
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("webhook answered {head:?}"))
}
