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
//!   a full refresh), then its RSS and peak RSS.
//!
//! The binaries come from the target dir: the debug builds (`DAS_BENCH_PROFILE=release` takes
//! the release builds). Run: `make bench-scale` (builds them and the plugin, whose
//! `--print-resource-slices` gives the slices; then `cargo bench --profile dev -p das-e2e --bench
//! slice_scale`). Prints a table; figures go into docs/benchmarks.md by hand.
//! `DAS_BENCH_NODES=250,1000` sets the sizes (ascending; each adds nodes to the last).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use das_e2e::das::{
    self, apply_device_classes, bench_node_counts, devices_in, printed_resource_slices,
};
use das_e2e::install::DasBinary;
use das_e2e::pki::{Pki, Usage};
use das_e2e::workload::{free_port, http_get};
use das_e2e::{Cluster, ClusterConfig, process, wait};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;

const GPUS: &str = "H100-80GB:8";
const TEMPLATE_NODE: &str = "das-bench-template-node";
/// Slice creations in flight at once.
const CREATE_CONCURRENCY: usize = 8;
const READY_TIMEOUT: Duration = Duration::from_secs(600);

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
    let tls = connector(&pki.ca.cert)?;

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
    }
    Ok(())
}

/// (RSS, peak RSS) in MiB.
fn mib(pid: u32) -> (f64, f64) {
    let (rss, peak) = process::memory_kib(pid as i32).unwrap_or((0, 0));
    (rss as f64 / 1024.0, peak as f64 / 1024.0)
}

fn connector(ca: &std::path::Path) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(cfg)))
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
