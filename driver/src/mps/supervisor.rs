//! [`MpsDaemons`]: the MPS control daemons the plugin runs, one per MPS slice. A prepare starts
//! one ([`MpsDaemons::start`]: the daemon runs, has made its control socket and has its limits
//! before the prepare answers); a task per daemon then supervises it: a daemon that exits is
//! started again after a backoff (doubling from [`Backoff::first`] to [`Backoff::max`], back to
//! the first once a run lasted [`Backoff::max`]) and its limits are applied again. Start-up
//! brings back the daemons of the checkpoint's MPS devices ([`MpsDaemons::bring_back`]: a
//! daemon whose pid file names a live process that is still the one started is adopted, and
//! watched by its pid and start time; any other is started). The release of the claim stops it
//! ([`MpsDaemons::stop`]: `quit`, then a kill of its process group, the daemon and its MPS
//! server, after [`daemon::QUIT_GRACE`], or at once if `quit` could not be sent) and removes its
//! directories. A handover lets go of them all ([`MpsDaemons::let_go`]).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::MpsLimits;
use super::daemon::{self, ControlBinary, DaemonProcess, DaemonSpec, MpsError};
use super::layout::{self, MPS_DIR, MpsDirs};
use crate::metrics::Metrics;

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
    pub const DEFAULT: Backoff = Backoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };
}

/// A daemon process the supervisor watches: its child, or, adopted after a restart, the process
/// its pid file names (pid and start time, so a reused pid is never taken for it).
enum Proc {
    Child(Child),
    Adopted(DaemonProcess),
}

impl Proc {
    fn pid(&self) -> Option<u32> {
        match self {
            Proc::Child(c) => c.id(),
            Proc::Adopted(p) => Some(p.pid),
        }
    }

    /// Waits until the process has exited.
    async fn exited(&mut self) {
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
    async fn kill(&mut self) {
        match self {
            Proc::Child(c) => daemon::kill_child(c).await,
            Proc::Adopted(p) => {
                p.kill();
                let _ = tokio::time::timeout(Duration::from_secs(2), self.exited()).await;
            }
        }
    }

    /// After the daemon exited on its own: kills what is left of its group (an MPS server it
    /// started and that outlived it would keep the slice in use and the next daemon from
    /// serving it).
    fn kill_leftovers(&self, pgid: Option<u32>) {
        if let Some(pgid) = pgid {
            daemon::kill_group(pgid);
        }
    }
}

/// Counts the daemon as up in the metrics while it lives; dropped (the daemon exited, was
/// stopped, or its supervision ended) it no longer does.
struct Up(Arc<Metrics>);

impl Up {
    fn new(metrics: &Arc<Metrics>) -> Self {
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
struct Ctx {
    /// `None`: MPS is not available on this node (see [`NO_BINARY`]).
    binary: Option<ControlBinary>,
    backoff: Backoff,
    metrics: Arc<Metrics>,
}

/// A supervised daemon.
struct Supervised {
    spec: DaemonSpec,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The daemons the plugin runs; see the module docs.
pub struct MpsDaemons {
    ctx: Ctx,
    state_dir: PathBuf,
    running: Mutex<HashMap<String, Supervised>>,
}

impl MpsDaemons {
    /// Daemons run with `binary` (`None`: MPS is not available, every start fails with
    /// [`NO_BINARY`]), their directories under `<state_dir>/mps/`.
    pub fn new(binary: Option<ControlBinary>, state_dir: &Path, metrics: Arc<Metrics>) -> Self {
        Self {
            ctx: Ctx {
                binary,
                backoff: Backoff::DEFAULT,
                metrics,
            },
            state_dir: state_dir.to_path_buf(),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// The same, restarting exited daemons after `backoff`.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.ctx.backoff = backoff;
        self
    }

    /// The control binary, if MPS is available.
    pub fn binary(&self) -> Option<&ControlBinary> {
        self.ctx.binary.as_ref()
    }

    /// The daemon of `device` of claim `claim_uid` serving slice `mig_uuid` with `limits`.
    pub fn spec(
        &self,
        claim: &str,
        claim_uid: &str,
        device: &str,
        mig_uuid: &str,
        limits: &MpsLimits,
    ) -> DaemonSpec {
        let id = layout::daemon_id(claim_uid, device);
        DaemonSpec {
            dirs: MpsDirs::new(&self.state_dir, &id),
            id,
            mig_uuid: mig_uuid.to_string(),
            limits: limits.clone(),
            owner: format!("{claim} device {device}"),
        }
    }

    /// The directories of the daemon of `device` of claim `claim_uid`.
    pub fn dirs(&self, claim_uid: &str, device: &str) -> MpsDirs {
        MpsDirs::new(&self.state_dir, &layout::daemon_id(claim_uid, device))
    }

    /// Starts the daemon of `spec` and supervises it; returns once it runs with its limits. A
    /// daemon already supervised with the same spec is kept, even while it is down and waits
    /// for its next start (backoff): a retried prepare then succeeds, and the supervisor goes on
    /// starting it (`das_kubelet_plugin_mps_daemons_up` tells). One supervised with another spec
    /// is stopped first. A daemon no supervisor holds but its pid file names (a prepare that
    /// failed after starting it, retried) is adopted if it takes its limits, else killed, so no
    /// daemon runs untracked beside the new one.
    ///
    /// # Errors
    /// It could not be started or configured: its process is gone, and so are its directories
    /// if this start made them.
    pub async fn start(&self, spec: DaemonSpec) -> Result<(), MpsError> {
        if self.keep_running(&spec).await {
            return Ok(());
        }
        if let Some(p) = self.adopt(&spec).await {
            self.supervise(spec, Some(p));
            return Ok(());
        }
        let proc = launch(&self.ctx, &spec).await?;
        tracing::info!(daemon = %spec.id, owner = %spec.owner, mig = %spec.mig_uuid, pipe = %spec.dirs.pipe.display(), "MPS control daemon started");
        self.supervise(spec, Some(proc));
        Ok(())
    }

    /// At start-up: supervises the daemon of a checkpointed MPS device again. Adopts the live
    /// daemon its pid file names if it is still the one started (its limits applied again),
    /// else starts one. A daemon that cannot be started now is supervised all the same: its
    /// supervisor keeps trying with backoff. Returns whether a daemon was running already
    /// (adopted, or supervised by this plugin).
    ///
    /// # Errors
    /// The daemon could not be started now (it is retried).
    pub async fn bring_back(&self, spec: DaemonSpec) -> Result<bool, MpsError> {
        if self.keep_running(&spec).await {
            return Ok(true);
        }
        if let Some(p) = self.adopt(&spec).await {
            self.supervise(spec, Some(p));
            return Ok(true);
        }
        match launch(&self.ctx, &spec).await {
            Ok(proc) => {
                self.supervise(spec, Some(proc));
                Ok(false)
            }
            Err(e) => {
                self.supervise(spec, None);
                Err(e)
            }
        }
    }

    /// The live daemon `spec`'s pid file names, if there is one that is still the one started
    /// and takes `spec`'s limits; one that does not take them is killed (its group with it).
    async fn adopt(&self, spec: &DaemonSpec) -> Option<Proc> {
        let (p, binary) = (daemon::live_process(&spec.dirs)?, self.ctx.binary.as_ref());
        let applied = match binary {
            Some(b) => daemon::apply_limits(b, spec).await,
            None => Err(MpsError(NO_BINARY.to_string())),
        };
        match applied {
            Ok(()) => {
                tracing::info!(daemon = %spec.id, owner = %spec.owner, pid = p.pid, "adopted a running MPS control daemon");
                Some(Proc::Adopted(p))
            }
            Err(e) => {
                tracing::warn!(daemon = %spec.id, pid = p.pid, error = %e, "a running MPS control daemon does not take its limits: starting a new one");
                Proc::Adopted(p).kill().await;
                None
            }
        }
    }

    /// Lets go of every daemon without stopping it: their supervision ends (no daemon is
    /// started again by this instance), their processes run on for the instance that takes the
    /// node over to adopt. The plugin calls it when it hands the node over, before it releases
    /// `plugin.lock` (an instance that went on supervising would start daemons in a state dir
    /// that is no longer its own).
    pub async fn let_go(&self) {
        let released: Vec<Supervised> = self.lock().drain().map(|(_, s)| s).collect();
        for s in &released {
            s.task.abort();
        }
        // Returns once the tasks are gone (their gauges with them): an aborted task ends at its
        // next await, never in the middle of a step.
        for s in released {
            let _ = s.task.await;
        }
        self.update_gauge();
    }

    /// Stops the daemon of `dirs` (supervised, or only on disk: a process its pid file names
    /// that is still the one started is stopped too) and removes its directories. Idempotent.
    ///
    /// # Errors
    /// The directories could not be removed.
    pub async fn stop(&self, dirs: &MpsDirs) -> Result<(), MpsError> {
        let id = dirs
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = self.lock().remove(&id);
        if let Some(s) = entry {
            s.stop.cancel();
            let _ = s.task.await;
        }
        self.update_gauge();
        // Not supervised (only on disk), or stopped while a restart was starting it: whatever
        // its pid file still names, if ours, goes too.
        if let Some(p) = daemon::live_process(dirs) {
            shut_down(self.ctx.binary.as_ref(), dirs, &mut Proc::Adopted(p)).await;
        }
        daemon::remove_dirs(dirs)
    }

    /// Stops every daemon whose directory is under `<state dir>/mps/` but not in `keep` (left
    /// by a plugin that stopped between starting a daemon and recording it, or by a record lost
    /// since); start-up calls it after bringing back the recorded ones.
    pub async fn stop_unrecorded(&self, keep: &BTreeSet<String>) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.state_dir.join(MPS_DIR)) else {
            return Vec::new();
        };
        let mut stopped = Vec::new();
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            // Only directories are daemons' (a file someone left there is none of ours).
            if keep.contains(&id) || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dirs = MpsDirs::new(&self.state_dir, &id);
            match self.stop(&dirs).await {
                Ok(()) => stopped.push(id),
                Err(e) => {
                    tracing::warn!(daemon = %id, error = %e, "removing an unrecorded MPS daemon's directory failed")
                }
            }
        }
        stopped
    }

    /// How many daemons are supervised (running, or being started again).
    pub fn supervised(&self) -> usize {
        self.lock().len()
    }

    /// Whether MPS can be served (a control binary is known).
    pub fn available(&self) -> bool {
        self.ctx.binary.is_some()
    }

    /// Whether daemon `id` is supervised.
    pub fn is_supervised(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The pid of daemon `id`'s process now, if it runs (from its pid file).
    pub fn pid(&self, dirs: &MpsDirs) -> Option<u32> {
        daemon::live_pid(dirs)
    }

    /// Whether `spec`'s daemon is supervised with that very spec (keep it); one supervised with
    /// another spec is stopped (its directories stay for the new one).
    async fn keep_running(&self, spec: &DaemonSpec) -> bool {
        let old = {
            let mut running = self.lock();
            match running.get(&spec.id) {
                Some(s) if s.spec == *spec && !s.task.is_finished() => return true,
                Some(_) => running.remove(&spec.id),
                None => None,
            }
        };
        if let Some(s) = old {
            s.stop.cancel();
            let _ = s.task.await;
        }
        false
    }

    fn supervise(&self, spec: DaemonSpec, proc: Option<Proc>) {
        let stop = CancellationToken::new();
        // Counted up now, not once the task first runs: the daemon runs when a start returns.
        let up = proc.as_ref().map(|_| Up::new(&self.ctx.metrics));
        let task = tokio::spawn(supervise(
            self.ctx.clone(),
            spec.clone(),
            proc,
            up,
            stop.clone(),
        ));
        self.lock()
            .insert(spec.id.clone(), Supervised { spec, stop, task });
        self.update_gauge();
    }

    fn update_gauge(&self) {
        let n = self.supervised();
        self.ctx.metrics.set_mps_daemons(n);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Supervised>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Dropping the daemons lets go of them without stopping them, as a plugin that exits does: the
/// supervision tasks end, the processes run on, and the next plugin adopts them
/// ([`MpsDaemons::bring_back`]).
impl Drop for MpsDaemons {
    fn drop(&mut self) {
        for s in self.lock().values() {
            s.task.abort();
        }
    }
}

/// Starts the daemon of `spec`, waits for its control socket and applies its limits. Its
/// directories are made if missing and kept as they are otherwise: running containers have the
/// pipe and shm directories bind-mounted, and a directory made anew would not be the one they
/// see.
///
/// # Errors
/// Any step failed; the process is killed, and the directories removed if this call made them
/// (a first start's; never those of a daemon started again).
async fn launch(ctx: &Ctx, spec: &DaemonSpec) -> Result<Proc, MpsError> {
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
    let mut child = daemon::spawn(binary, spec)
        .await
        .inspect_err(|_| clean_up())?;
    let ready = async {
        daemon::wait_ready(spec, Some(&mut child), daemon::READY_TIMEOUT).await?;
        daemon::apply_limits(binary, spec).await
    }
    .await;
    match ready {
        Ok(()) => Ok(Proc::Child(child)),
        Err(e) => {
            daemon::kill_child(&mut child).await;
            clean_up();
            Err(e)
        }
    }
}

/// Asks the daemon to quit, kills it (its group) if it has not exited after
/// [`daemon::QUIT_GRACE`], or at once if `quit` could not be sent (nothing would make it exit in
/// the meantime).
async fn shut_down(binary: Option<&ControlBinary>, dirs: &MpsDirs, proc: &mut Proc) {
    let asked = match binary {
        Some(b) => daemon::quit(b, dirs).await,
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
async fn supervise(
    ctx: Ctx,
    spec: DaemonSpec,
    mut proc: Option<Proc>,
    mut up: Option<Up>,
    stop: CancellationToken,
) {
    let mut delay = ctx.backoff.first;
    let mut since = Instant::now();
    loop {
        if let Some(p) = proc.as_mut() {
            let up = up.take().unwrap_or_else(|| Up::new(&ctx.metrics));
            let pgid = p.pid();
            tokio::select! {
                _ = stop.cancelled() => {
                    shut_down(ctx.binary.as_ref(), &spec.dirs, p).await;
                    return;
                }
                _ = p.exited() => {}
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
        let launched = tokio::select! {
            _ = stop.cancelled() => return,
            r = launch(&ctx, &spec) => r,
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
