//! `das-webhook`: the compatibility admission webhook (docs/design.md §8). Serves `POST /mutate-pods`,
//! `/validate-resource-claims`, `/mutate-resource-claims`, `/healthz`, `/readyz` and `/metrics` (with `--metrics-auth=tokenreview` only to callers the API
//! server authenticates and authorizes) over HTTPS; the certificate files are re-read when they
//! change. SIGTERM or SIGINT stops it.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use das_runtime::client::{self, KubeArgs, Timeouts};
use das_runtime::logging::LogArgs;
use das_runtime::metrics_auth::MetricsAuthArgs;
use das_runtime::process::{self, Shutdown};
use das_webhook::metrics::Metrics;
use das_webhook::profiles::Profiles;
use das_webhook::server::{self, App};
use das_webhook::start::Tls;
use das_webhook::templates::Templates;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "DAS webhook: legacy nvidia.com/mig-* (and, optionally, nvidia.com/gpu) pods -> ResourceClaims"
)]
struct Args {
    #[command(flatten)]
    kube: KubeArgs,
    /// HTTPS listen address.
    #[arg(long, env = "DAS_WEBHOOK_ADDRESS", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Serving certificate (PEM, chain first).
    #[arg(
        long,
        env = "DAS_WEBHOOK_TLS_CERT",
        default_value = "/etc/das-webhook/tls/tls.crt"
    )]
    tls_cert_file: PathBuf,
    /// Serving key (PEM).
    #[arg(
        long,
        env = "DAS_WEBHOOK_TLS_KEY",
        default_value = "/etc/das-webhook/tls/tls.key"
    )]
    tls_key_file: PathBuf,
    /// Lowest TLS version offered: `VersionTLS12` (TLS 1.2 and 1.3) or `VersionTLS13`, as
    /// OpenShift's `tlsSecurityProfile` names them (`1.2`, `1.3` too).
    #[arg(
        long,
        env = "DAS_WEBHOOK_TLS_MIN_VERSION",
        default_value = "VersionTLS12"
    )]
    tls_min_version: String,
    /// TLS cipher suites offered, comma-separated, IANA or OpenSSL names
    /// (`TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256` or `ECDHE-RSA-AES128-GCM-SHA256`); listed suites
    /// the TLS library lacks are not offered (logged). Empty: the library's defaults.
    #[arg(long, env = "DAS_WEBHOOK_TLS_CIPHER_SUITES", value_delimiter = ',')]
    tls_cipher_suites: Vec<String>,
    /// How often the certificate files are checked for changes, in seconds.
    #[arg(long, default_value_t = 10)]
    cert_reload_interval_seconds: u64,
    /// How long the list of offered profiles (DeviceClasses) is cached, in seconds.
    #[arg(long, default_value_t = 30)]
    profiles_ttl_seconds: u64,
    /// Also translate `nvidia.com/gpu: N` into a claim for N whole GPUs (DeviceClass
    /// gpu.das.com, template das-gpu-x<N>); off: such pods are left alone.
    #[arg(long, env = "DAS_WEBHOOK_TRANSLATE_WHOLE_GPUS")]
    translate_whole_gpus: bool,
    /// Let claims of different namespaces share a slice: claims for a shared class
    /// (`<profile>.shared.mig.das.com`) are admitted without the selector that keeps shared
    /// slices within their namespace (docs/design.md §8). Set it with the node plugins' flag of
    /// the same name (chart value `sharing.acrossNamespaces` sets both).
    #[arg(long, env = "DAS_WEBHOOK_SHARES_ACROSS_NAMESPACES")]
    shares_across_namespaces: bool,
    #[command(flatten)]
    metrics_auth: MetricsAuthArgs,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(code) = process::start("das-webhook", &args.log) {
        return code;
    }
    process::exit_status(run(args).await.map(|()| ExitCode::SUCCESS))
}

/// The webhook, in the order of its start-up phases ([`das_webhook::start`]): the TLS
/// configuration checked, then the API clients and the app, then the port bound, then served
/// until SIGTERM or SIGINT.
async fn run(args: Args) -> Result<()> {
    let mut shutdown = Shutdown::listen()?;
    let tls = Tls::load(
        &args.tls_cert_file,
        &args.tls_key_file,
        &args.tls_min_version,
        &args.tls_cipher_suites,
    )?;
    let every = Duration::from_secs(args.cert_reload_interval_seconds.max(1));
    tokio::spawn(tls.reload_every(every));
    let app = app(&args).await?;
    let bound = tls.bind(args.listen).await?;
    tracing::info!(address = %bound.local_addr()?, "das-webhook serving HTTPS");
    tokio::select! {
        never = bound.serve(app, server::Limits::default()) => match never {},
        _ = shutdown.wait() => Ok(()),
    }
}

/// The handlers' state: the API clients, the offered profiles, the watched templates, the
/// metrics and who may read them.
async fn app(args: &Args) -> Result<Arc<App>> {
    let clients = client::clients(&args.kube, Timeouts::default()).await?;
    Ok(Arc::new(App {
        profiles: Arc::new(
            Profiles::new(
                clients.calls.clone(),
                Duration::from_secs(args.profiles_ttl_seconds),
            )
            .translating_whole_gpus(args.translate_whole_gpus),
        ),
        templates: Templates::watch(&clients),
        metrics: Metrics::default(),
        metrics_access: args.metrics_auth.access(&clients.calls),
        shares_across_namespaces: args.shares_across_namespaces,
    }))
}
