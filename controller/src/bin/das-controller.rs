//! `das-controller`: mirrors every allocated DAS device into an AllocationClaim (DESIGN §6).
//!
//! With `--leader-elect` (the default) only the replica holding the Lease
//! `<namespace>/das-controller` reconciles; the others stand by. SIGTERM or SIGINT stops the
//! controller, releases the lease and exits 0; losing the lease exits 1 (a restart then stands by
//! as a candidate again, as client-go based controllers do).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use das_controller::lease::{Elector, LeaseConfig};
use das_controller::metrics::{self, Metrics};
use das_controller::reconcile;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "DAS cluster controller: ResourceClaims -> AllocationClaims"
)]
struct Args {
    /// Kubeconfig file; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "DAS_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    /// Run only while holding the leader Lease (needed with more than one replica).
    #[arg(long, env = "DAS_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = das_api::INSTALL_NAMESPACE)]
    leader_elect_namespace: String,
    /// This replica's identity in the Lease (default: hostname and process ID).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease duration in seconds; the leader renews every third of it.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Log output.
    #[arg(long, env = "DAS_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `das_controller=debug`.
    #[arg(long, env = "DAS_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(args: &Args) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log_level));
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn client(args: &Args) -> Result<Client> {
    let Some(path) = &args.kubeconfig else {
        return Client::try_default().await.context("Kubernetes client");
    };
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// Resolves on SIGTERM or SIGINT.
async fn signalled() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

fn identity(args: &Args) -> String {
    args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    init_logging(&args);
    let client = client(&args).await?;
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let server = tokio::spawn(metrics::serve(
        args.metrics_address,
        metrics.clone(),
        stopped(),
    ));
    tokio::spawn({
        let tx = stop_tx.clone();
        async move {
            signalled().await;
            let _ = tx.send(true);
        }
    });
    let id = identity(&args);
    let code = if args.leader_elect {
        run_elected(&args, client, metrics, id, stopped, stop_tx).await
    } else {
        metrics.leader.set(1);
        reconcile::run(client, metrics, id, stopped()).await;
        0
    };
    let _ = server.await;
    tracing::info!(code, "stopped");
    std::process::exit(code)
}

/// Waits for the lease, runs the controller while leading; returns the exit code.
async fn run_elected<F, Fut>(
    args: &Args,
    client: Client,
    metrics: Arc<Metrics>,
    id: String,
    stopped: F,
    stop_tx: watch::Sender<bool>,
) -> i32
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let duration = Duration::from_secs(args.lease_duration_seconds.max(3));
    let cfg = LeaseConfig::for_duration("das-controller", &id, duration);
    let api = kube::Api::namespaced(client.clone(), &args.leader_elect_namespace);
    let elector = Elector::new(api, cfg);
    // A standby is ready: it serves as soon as it leads.
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::select! {
        _ = elector.acquire() => {},
        _ = stopped() => return 0,
    }
    metrics
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    metrics.leader.set(1);
    let lost = tokio::select! {
        _ = reconcile::run(client, metrics.clone(), id, stopped()) => false,
        _ = elector.keep() => true,
    };
    metrics.leader.set(0);
    let _ = stop_tx.send(true);
    if lost {
        return 1;
    }
    elector.release().await;
    0
}
