//! Kube clients for the DAS binaries: from `--kubeconfig` (or in-cluster / `$KUBECONFIG`), with
//! timeouts so no API call can hang a component: connect and write timeouts on every call, and a
//! read timeout on request/response calls but not on watches (a quiet watch is not a hung one;
//! kube's watcher has an idle timeout of its own).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

/// The `--kubeconfig` flag.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// Kubeconfig file; default: the in-cluster configuration, or `$KUBECONFIG`.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Timeouts of API calls.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Establishing a connection.
    pub connect: Duration,
    /// Waiting for a response (request/response calls only).
    pub read: Duration,
    /// Sending a request.
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            read: Duration::from_secs(20),
            write: Duration::from_secs(20),
        }
    }
}

/// Two clients: for calls (every timeout) and for watches (no read timeout).
#[derive(Clone)]
pub struct Clients {
    /// Request/response calls.
    pub calls: kube::Client,
    /// Watches.
    pub watches: kube::Client,
}

/// The configuration `args` point at.
///
/// # Errors
/// The kubeconfig cannot be read, or there is neither a kubeconfig nor an in-cluster
/// configuration.
pub async fn config(args: &KubeArgs) -> Result<kube::Config> {
    Ok(match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster configuration and no kubeconfig (--kubeconfig, $KUBECONFIG)")?,
    })
}

/// The clients of `args` with `timeouts`.
///
/// # Errors
/// As [`config`], or a client cannot be built from it.
pub async fn clients(args: &KubeArgs, timeouts: Timeouts) -> Result<Clients> {
    let base = config(args).await?;
    let mut calls = base.clone();
    calls.connect_timeout = Some(timeouts.connect);
    calls.read_timeout = Some(timeouts.read);
    calls.write_timeout = Some(timeouts.write);
    calls.reset_reader_on_write = true;
    let mut watches = base;
    watches.connect_timeout = Some(timeouts.connect);
    watches.write_timeout = Some(timeouts.write);
    Ok(Clients {
        calls: kube::Client::try_from(calls)?,
        watches: kube::Client::try_from(watches)?,
    })
}
