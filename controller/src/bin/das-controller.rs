//! `das-controller`: mirrors every allocated DAS device into an AllocationClaim (docs/design.md §6).
//!
//! With `--leader-elect` (the default) only the replica holding the Lease
//! `<namespace>/das-controller` reconciles; the others stand by. SIGTERM or SIGINT stops the
//! controller, releases the lease and exits 0; losing the lease exits 1 (a restart then stands by
//! as a candidate again, as client-go based controllers do).
//!
//! Start-up, each phase making what the next requires: [`elect`] → [`Role`] → [`serve`]
//! (`controller::watch` → `controller::context` → `controller::run`, which marks the
//! controller ready once its caches are synced) → [`Ended`] → the exit code.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use das_controller::controller::{self, Ended};
use das_controller::lease::{Elector, LeaseConfig, Role};
use das_controller::metrics::Metrics;
use das_runtime::client::{self, Clients, KubeArgs, Timeouts};
use das_runtime::logging::LogArgs;
use das_runtime::metrics_auth::MetricsAuthArgs;
use das_runtime::probes;
use das_runtime::process::{self, Shutdown};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "DAS cluster controller: ResourceClaims -> AllocationClaims"
)]
struct Args {
    #[command(flatten)]
    kube: KubeArgs,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "DAS_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    #[command(flatten)]
    metrics_auth: MetricsAuthArgs,
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
    /// How many ResourceClaims are reconciled at once (0: no limit). Each reconcile holds at
    /// most one API request in flight.
    #[arg(long, env = "DAS_CONCURRENT_RECONCILES", default_value_t = controller::DEFAULT_CONCURRENT_RECONCILES)]
    concurrent_reconciles: u16,
    #[command(flatten)]
    log: LogArgs,
}

fn identity(args: &Args) -> String {
    args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(code) = process::start("das-controller", &args.log) {
        return code;
    }
    process::exit_status(run(args).await.map(ExitCode::from))
}

/// Runs until stopped or the lease is lost; returns the exit code.
async fn run(args: Args) -> Result<u8> {
    let mut shutdown = Shutdown::listen()?;
    let clients = client::clients(&args.kube, Timeouts::default()).await?;
    let metrics = Arc::new(Metrics::new());
    // A panic (a poisoned lock) turns /healthz red: the kubelet restarts us (issue 30).
    probes::fail_liveness_on_panic(metrics.probe.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let server = tokio::spawn(probes::serve(
        args.metrics_address,
        metrics.probe.clone(),
        args.metrics_auth.access(&clients.calls),
        stopped(),
    ));
    tokio::spawn({
        let tx = stop_tx.clone();
        async move {
            shutdown.wait().await;
            let _ = tx.send(true);
        }
    });
    let id = identity(&args);
    let code = match elect(&args, &clients, &metrics, &id, stopped()).await {
        Some(role) => serve(&args, role, clients, metrics, id, stopped()).await,
        None => 0,
    };
    // Stops the metrics server too when the controller ended by itself (the lease was lost).
    let _ = stop_tx.send(true);
    server
        .await
        .context("the metrics server task")?
        .context("the metrics server")?;
    tracing::info!(code, "stopped");
    Ok(code)
}

/// The role this replica runs the controller by: [`Role::Single`] without `--leader-elect`;
/// else, once it holds the lease, [`Role::Leading`] (ready as a standby meanwhile). `None`:
/// `stopped` resolved while standing by.
async fn elect(
    args: &Args,
    clients: &Clients,
    metrics: &Arc<Metrics>,
    id: &str,
    stopped: impl std::future::Future<Output = ()>,
) -> Option<Role> {
    if !args.leader_elect {
        metrics.leader.set(1);
        return Some(Role::Single);
    }
    let duration = Duration::from_secs(args.lease_duration_seconds.max(3));
    let cfg = LeaseConfig::for_duration("das-controller", id, duration);
    let api = kube::Api::namespaced(clients.calls.clone(), &args.leader_elect_namespace);
    let elector = Elector::new(api, cfg).counting_errors({
        let metrics = metrics.clone();
        move |cause| metrics.lease_error(cause)
    });
    // A standby is ready: it serves as soon as it leads.
    metrics.probe.set_ready(true);
    let leadership = tokio::select! {
        l = elector.acquire() => l,
        _ = stopped => return None,
    };
    // Not ready again until the caches are synced.
    metrics.probe.set_ready(false);
    metrics.leader.set(1);
    Some(Role::Leading(leadership))
}

/// Runs the controller by `role` until `stopped` or the role is lost; returns the exit code:
/// 0 after a stop (a leader releases the lease first), 1 when the lease was lost.
async fn serve(
    args: &Args,
    role: Role,
    clients: Clients,
    metrics: Arc<Metrics>,
    id: String,
    stopped: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> u8 {
    let watching = controller::watch(&role, clients.watches);
    let ctx = controller::context(&watching, clients.calls, metrics.clone(), id);
    let ended = controller::run(watching, ctx, &role, args.concurrent_reconciles, stopped).await;
    if let Role::Leading(_) = role {
        metrics.leader.set(0);
    }
    match ended {
        Ended::Lost => 1,
        Ended::Stopped => {
            role.release().await;
            0
        }
    }
}
