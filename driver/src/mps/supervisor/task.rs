//! The supervision of one daemon (a task per daemon; [`super::MpsDaemons`] starts and stops
//! them): starting it ([`launch`]: directories, shm tmpfs, process, control socket,
//! configuration), watching it, starting it again with backoff when it exits, stopping it
//! ([`shut_down`]), and its metrics while it runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use super::super::MpsLimits;
use super::super::commands::Namespace;
use super::super::control;
use super::super::daemon::{self, ControlBinary, DaemonProcess, DaemonSpec, MpsError};
use super::super::host::HostClient;
use super::super::launch;
use super::super::launch::Launch;
use super::super::layout::MpsDirs;
use super::super::shm;
use crate::metrics::Metrics;

/// How often a supervised daemon's shm usage is read for the metrics.
const SHM_REFRESH: Duration = Duration::from_secs(15);

/// The namespaces of one daemon, by name (protocol 3; kept but unused with protocol 2).
pub(super) type Namespaces = Arc<Mutex<BTreeMap<String, MpsLimits>>>;

/// The namespaces as a list, for one configuration of the daemon.
pub(super) fn snapshot(ns: &Namespaces) -> Vec<Namespace> {
    ns.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(name, limits)| Namespace {
            name: name.clone(),
            limits: limits.clone(),
        })
        .collect()
}

/// The namespaces, locked (a poisoned lock is taken as it is: the map is never left half-made).
pub(super) fn lock_ns(ns: &Namespaces) -> std::sync::MutexGuard<'_, BTreeMap<String, MpsLimits>> {
    ns.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an MPS device cannot be served when the plugin has no control binary.
pub const NO_BINARY: &str = "MPS is not available on this node: the plugin found no nvidia-cuda-mps-control among the driver files (--driver-root, chart kubeletPlugin.driverRoot) and was given no --mps-control-binary";

/// How long a supervisor waits before starting an exited daemon again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait, and the wait after a run that lasted `max` or longer.
    pub first: Duration,
    /// The longest wait (the waits double up to it).
    pub max: Duration,
}

impl Backoff {
    /// 1 s doubling to 30 s: a daemon that crashes at once is tried twice a minute, not in a
    /// loop.
    pub(crate) const DEFAULT: Backoff = Backoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };
}

/// A daemon process the supervisor watches: its child, or a process it did not start as its
/// child (adopted after a restart, or started through the MPS host), watched by the pid and
/// start time its pid file names (so a reused pid is never taken for it).
pub(super) enum Proc {
    Child(Child),
    Adopted(DaemonProcess),
}

impl Proc {
    pub(super) fn pid(&self) -> Option<u32> {
        match self {
            Proc::Child(c) => c.id(),
            Proc::Adopted(p) => Some(p.pid),
        }
    }

    /// How the process exited, if it has: its status, or that its pid is gone.
    fn exit(&mut self) -> Option<String> {
        match self {
            Proc::Child(c) => c.try_wait().ok().flatten().map(|s| s.to_string()),
            Proc::Adopted(p) => (!p.alive()).then(|| format!("pid {} is gone", p.pid)),
        }
    }

    /// Waits until the process has exited.
    pub(super) async fn exited(&mut self) {
        match self {
            Proc::Child(c) => {
                let _ = c.wait().await;
            }
            Proc::Adopted(p) => {
                while p.alive() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// Kills the process's group (the daemon and its MPS server) and waits for the daemon (an
    /// adopted one until it is gone, at most 2 s).
    pub(super) async fn kill(&mut self) {
        match self {
            Proc::Child(c) => daemon::kill_child(c).await,
            Proc::Adopted(p) => {
                p.kill();
                let _ = tokio::time::timeout(Duration::from_secs(2), self.exited()).await;
            }
        }
    }

    /// After the daemon exited on its own: kills what is left of its group (an MPS server it
    /// started and that outlived it would keep the MIG instance in use and the next daemon from
    /// serving it).
    fn kill_leftovers(&self, pgid: Option<u32>) {
        if let Some(pgid) = pgid {
            daemon::kill_group(pgid);
        }
    }
}

/// Counts the daemon as up in the metrics while it lives; dropped (the daemon exited, was
/// stopped, or its supervision ended) it no longer does.
pub(super) struct Up(Arc<Metrics>);

impl Up {
    pub(super) fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.mps_daemon_up(true);
        Self(metrics.clone())
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        self.0.mps_daemon_up(false);
    }
}

/// What a supervision task needs.
#[derive(Clone)]
pub(super) struct Ctx {
    /// `None`: MPS is not available on this node (see [`NO_BINARY`]).
    pub(super) binary: Option<ControlBinary>,
    /// The MPS host that starts the daemons (`--mps-host-socket`); `None`: the plugin starts
    /// them as its own children.
    pub(super) host: Option<HostClient>,
    pub(super) backoff: Backoff,
    pub(super) metrics: Arc<Metrics>,
}

/// Sets the shm gauges of `spec`'s daemon from its shm directory's file system (a plain
/// directory reports the state dir's file system: what its clients could fill).
pub(super) fn report_shm(metrics: &Metrics, spec: &DaemonSpec) {
    if let Some((size, used)) = shm::usage(&spec.dirs.shm) {
        metrics.set_mps_shm(&spec.id, size, used);
    }
}

/// Starts the daemon of `spec`, waits for its control socket and configures it (limits; with
/// protocol 3 its server and `namespaces`). Its directories are made if missing, with the shm
/// tmpfs mounted before the daemon starts, and kept as they are otherwise: running containers
/// have the pipe and shm directories bind-mounted, and a directory made anew would not be the
/// one they see.
///
/// # Errors
/// Any step failed; the process is killed, and the directories removed (the tmpfs unmounted)
/// if this call made them (a first start's; never those of a daemon started again).
pub(super) async fn launch(
    ctx: &Ctx,
    spec: &DaemonSpec,
    namespaces: &[Namespace],
) -> Result<Proc, MpsError> {
    let binary = ctx
        .binary
        .as_ref()
        .ok_or_else(|| MpsError(NO_BINARY.to_string()))?;
    let fresh = !spec.dirs.root.exists();
    let clean_up = || {
        if fresh {
            let _ = daemon::remove_dirs(&spec.dirs);
        }
    };
    daemon::make_dirs(&spec.dirs)
        .and_then(|()| daemon::prepare_shm(spec, fresh))
        .inspect_err(|_| clean_up())?;
    let mut proc = match &ctx.host {
        Some(host) => host
            .spawn(&Launch::new(binary, spec))
            .await
            .map(Proc::Adopted),
        None => launch::spawn(binary, spec).await.map(Proc::Child),
    }
    .inspect_err(|_| clean_up())?;
    let ready = async {
        daemon::wait_ready(spec, || proc.exit(), daemon::READY_TIMEOUT).await?;
        control::configure(binary, spec, namespaces).await
    }
    .await;
    match ready {
        Ok(()) => Ok(proc),
        Err(e) => {
            proc.kill().await;
            clean_up();
            Err(e)
        }
    }
}

/// Asks the daemon to quit, kills it (its group) if it has not exited after
/// [`daemon::QUIT_GRACE`], or at once if `quit` could not be sent (nothing would make it exit in
/// the meantime).
pub(super) async fn shut_down(binary: Option<&ControlBinary>, dirs: &MpsDirs, proc: &mut Proc) {
    let asked = match binary {
        Some(b) => control::quit(b, dirs).await,
        None => Err(MpsError(NO_BINARY.to_string())),
    };
    let exited = match &asked {
        Ok(()) => tokio::time::timeout(daemon::QUIT_GRACE, proc.exited())
            .await
            .is_ok(),
        Err(_) => false,
    };
    if !exited {
        tracing::warn!(pid = ?proc.pid(), dirs = %dirs.root.display(), quit = ?asked.err(),
            "the MPS control daemon did not quit: killing it");
        proc.kill().await;
    }
}

/// The supervision of one daemon until `stop`: see the module docs.
pub(super) async fn supervise(
    ctx: Ctx,
    spec: DaemonSpec,
    namespaces: Namespaces,
    mut proc: Option<Proc>,
    mut up: Option<Up>,
    stop: CancellationToken,
) {
    let mut delay = ctx.backoff.first;
    let mut since = Instant::now();
    let mut shm_tick = tokio::time::interval(SHM_REFRESH);
    loop {
        if let Some(p) = proc.as_mut() {
            let up = up.take().unwrap_or_else(|| Up::new(&ctx.metrics));
            let pgid = p.pid();
            let cancelled = {
                let exited = p.exited();
                tokio::pin!(exited);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break true,
                        _ = &mut exited => break false,
                        _ = shm_tick.tick() => report_shm(&ctx.metrics, &spec),
                    }
                }
            };
            if cancelled {
                shut_down(ctx.binary.as_ref(), &spec.dirs, p).await;
                return;
            }
            drop(up);
            p.kill_leftovers(pgid);
            tracing::warn!(daemon = %spec.id, owner = %spec.owner, log = %daemon::log_tail(&spec.dirs),
                "the MPS control daemon exited: starting it again");
            delay = if since.elapsed() >= ctx.backoff.max {
                ctx.backoff.first
            } else {
                delay
            };
            proc = None;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        let all = snapshot(&namespaces);
        let launched = tokio::select! {
            _ = stop.cancelled() => return,
            r = launch(&ctx, &spec, &all) => r,
        };
        match launched {
            Ok(p) => {
                ctx.metrics.mps_daemon_restarted(true);
                tracing::info!(daemon = %spec.id, owner = %spec.owner, "MPS control daemon started again with its limits");
                proc = Some(p);
                since = Instant::now();
            }
            Err(e) => {
                ctx.metrics.mps_daemon_restarted(false);
                tracing::error!(daemon = %spec.id, owner = %spec.owner, error = %e, retry_s = delay.as_secs_f64(),
                    "starting the MPS control daemon again failed");
            }
        }
        delay = (delay * 2).min(ctx.backoff.max);
    }
}
