//! Benchmark: admission latency of `das-webhook` over HTTPS on loopback, at 100 requests/s, for a
//! legacy pod whose ResourceClaimTemplate already exists (the steady state: every pod of a
//! Deployment after the first).
//!
//! A local cluster (real kube-apiserver for the DeviceClass list and the template watch) and
//! `das-webhook` (release build, log level warn) run; the benchmark POSTs AdmissionReviews for a
//! pod with `nvidia.com/mig-1g.10gb: 1`, paced at one every 10 ms, and measures each round trip
//! client-side with `Instant`: (a) 1000 requests on one kept-alive TLS connection, as the API
//! server sends them; (b) 300 requests each on a new connection (TCP + TLS handshake included).
//! The webhook's own histogram (`das_webhook_admission_duration_seconds`) is printed too.
//!
//! Needs the webhook's release build (`cargo build --release -p das-webhook --bin das-webhook`).
//! Run: `cargo bench -p das-e2e --bench admission` (prints a table; figures go into
//! docs/benchmarks.md by hand).

#[path = "common/tls.rs"]
mod tls;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use das_e2e::binaries::DasBinary;
use das_e2e::das::apply_device_classes;
use das_e2e::pki::{Pki, Usage};
use das_e2e::{Cluster, ClusterConfig, process, wait};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const PACE: Duration = Duration::from_millis(10);
const KEEPALIVE_REQUESTS: usize = 1000;
const NEW_CONN_REQUESTS: usize = 300;

#[tokio::main]
async fn main() -> Result<()> {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&["n0"])).await?;
    let r = run(&mut cluster).await;
    if r.is_err() {
        cluster.print_log_tails(30);
    }
    cluster.stop();
    r
}

async fn run(cluster: &mut Cluster) -> Result<()> {
    apply_device_classes(&cluster.client(), &["1g.10gb", "2g.20gb"]).await?;
    let pki = Pki::create(&cluster.pki_dir.join("webhook"))?;
    let sans = vec!["127.0.0.1".to_string()];
    let serving = pki.issue("serving", "das-webhook", Usage::Server { sans })?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let args = vec![
        format!("--kubeconfig={}", cluster.kubeconfig.display()),
        format!("--listen=127.0.0.1:{port}"),
        format!("--tls-cert-file={}", serving.cert.display()),
        format!("--tls-key-file={}", serving.key.display()),
        "--log-level=warn".into(),
    ];
    let bin = DasBinary::Webhook.in_target_dir("release")?;
    cluster.spawn_program("das-webhook", &bin, args)?;
    let webhook = *cluster.pids().last().context("webhook pid")?;
    let tls = tls::connector(&pki.ca.cert)?;
    let body = Bytes::from(serde_json::to_vec(&review())?);
    wait::until("webhook up", Duration::from_secs(30), || async {
        Ok(connect(&tls, port).await.ok())
    })
    .await?;
    // Warm-up: creates the template, then lets the webhook's watch see it.
    let mut conn = connect(&tls, port).await?;
    post(&mut conn, &body).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..100 {
        post(&mut conn, &body).await?;
    }
    let cpu0 = process::cpu_seconds(webhook);
    let keepalive = kept_alive(&mut conn, &body).await?;
    let cpu1 = process::cpu_seconds(webhook);
    let fresh = new_connections(&tls, port, &body).await?;
    let cpu2 = process::cpu_seconds(webhook);
    let (_, metrics) = get_metrics(&mut conn).await?;
    println!("| what | p50 | p90 | p99 | max |\n|---|---|---|---|---|");
    row("kept-alive connection, 1000 req at 100/s", keepalive);
    row("new connection per request, 300 req at 100/s", fresh);
    // CPU time of the webhook process (user + system, /proc) per admission review.
    let per = |cpu: f64, n: usize| format!("{:.3} ms", cpu * 1000.0 / n as f64);
    println!(
        "\nwebhook CPU per admission: kept-alive {}, new connection (TLS handshake included) {}",
        per(cpu1 - cpu0, KEEPALIVE_REQUESTS),
        per(cpu2 - cpu1, NEW_CONN_REQUESTS)
    );
    println!("\nwebhook histogram:");
    for l in metrics
        .lines()
        .filter(|l| l.contains("admission_duration") || l.contains("requests_total"))
    {
        println!("  {l}");
    }
    Ok(())
}

/// A ticker that fires every [`PACE`]: 100 requests/s.
fn pacer() -> tokio::time::Interval {
    tokio::time::interval(PACE)
}

async fn kept_alive(conn: &mut Sender, body: &Bytes) -> Result<Vec<Duration>> {
    let mut tick = pacer();
    let mut out = Vec::with_capacity(KEEPALIVE_REQUESTS);
    for _ in 0..KEEPALIVE_REQUESTS {
        tick.tick().await;
        let t = Instant::now();
        post(conn, body).await?;
        out.push(t.elapsed());
    }
    Ok(out)
}

async fn new_connections(tls: &TlsConnector, port: u16, body: &Bytes) -> Result<Vec<Duration>> {
    let mut tick = pacer();
    let mut out = Vec::with_capacity(NEW_CONN_REQUESTS);
    for _ in 0..NEW_CONN_REQUESTS {
        tick.tick().await;
        let t = Instant::now();
        let mut c = connect(tls, port).await?;
        post(&mut c, body).await?;
        out.push(t.elapsed());
    }
    Ok(out)
}

fn row(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let q = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    println!(
        "| {what} | {} | {} | {} | {} |",
        ms(q(0.5)),
        ms(q(0.9)),
        ms(q(0.99)),
        ms(*v.last().expect("samples"))
    );
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A new TLS connection (HTTP/1.1, kept alive) to the webhook.
async fn connect(tls: &TlsConnector, port: u16) -> Result<Sender> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?;
    let stream: TlsStream<_> = tls.connect(name, tcp).await?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// POSTs one review and checks that the pod was patched.
async fn post(send: &mut Sender, body: &Bytes) -> Result<()> {
    let req = hyper::Request::post("/mutate-pods")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))?;
    // hyper's HTTP/1 sender takes the next request only once the connection task has finished
    // the previous one: wait for that, or the request fails with "connection was not ready".
    send.ready().await?;
    let resp = send.send_request(req).await?;
    ensure!(resp.status() == 200, "status {}", resp.status());
    let bytes = resp.into_body().collect().await?.to_bytes();
    let v: Value = serde_json::from_slice(&bytes)?;
    ensure!(
        v["response"]["allowed"] == true && v["response"]["patch"].is_string(),
        "{v}"
    );
    Ok(())
}

async fn get_metrics(send: &mut Sender) -> Result<(u16, String)> {
    let req = hyper::Request::get("/metrics")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))?;
    // hyper's HTTP/1 sender takes the next request only once the connection task has finished
    // the previous one: wait for that, or the request fails with "connection was not ready".
    send.ready().await?;
    let resp = send.send_request(req).await?;
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((
        code,
        String::from_utf8(bytes.to_vec()).context("metrics text")?,
    ))
}

/// An AdmissionReview (`admission.k8s.io/v1`) as the API server sends it for a legacy pod.
fn review() -> Value {
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gvr = json!({"group": "", "version": "v1", "resource": "pods"});
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "00000000-0000-0000-0000-000000000001",
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": "bench", "namespace": "default", "operation": "CREATE",
        "userInfo": {"username": "bench"}, "dryRun": false,
        "object": {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "bench", "namespace": "default", "labels": {"app": "bench"}},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "cpu": "100m", "memory": "64Mi"},
                    "requests": {"nvidia.com/mig-1g.10gb": "1", "cpu": "100m", "memory": "64Mi"}}}]}}
    }})
}
