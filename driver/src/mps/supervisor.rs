//! [`MpsDaemons`]: the MPS control daemons the plugin runs, one per MPS MIG instance. A prepare starts
//! one ([`MpsDaemons::start`]: the daemon runs, has made its control socket and has its limits
//! before the prepare answers); a task per daemon then supervises it: a daemon that exits is
//! started again after a backoff (doubling from [`Backoff::first`] to [`Backoff::max`], back to
//! the first once a run lasted [`Backoff::max`]) and its limits are applied again. Start-up
//! brings back the daemons of the checkpoint's MPS devices ([`MpsDaemons::bring_back`]: a
//! daemon whose pid file names a live process that is still the one started is adopted, and
//! watched by its pid and start time; any other is started). The release of the claim stops it
//! ([`MpsDaemons::stop`]: `quit`, then a kill of its process group, the daemon and its MPS
//! server, after [`daemon::QUIT_GRACE`], or at once if `quit` could not be sent) and removes its
//! directories. A handover lets go of them all ([`MpsDaemons::let_go`]). With the MPS host
//! ([`MpsDaemons::with_host`], [`super::host`]) every start goes through the host, and the
//! daemon is watched by its pid and start time as an adopted one is: it is no child of the
//! plugin, so nothing the plugin does by exiting ends it.
//!
//! With protocol 3 each daemon also has its namespaces (one per claim or share of its MIG instance,
//! [`Namespace`]): [`MpsDaemons::start`] adds one, [`MpsDaemons::leave`] deletes one, and every
//! start, restart or adoption of the daemon creates them all again. Every daemon's shm tmpfs is
//! reported in `das_kubelet_plugin_mps_shm_size_bytes` and `_used_bytes` while it is supervised.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::MpsLimits;
use super::commands::{Namespace, Protocol};
use super::control;
use super::daemon::{self, ControlBinary, DaemonSpec, MpsError};
use super::host::HostClient;
use super::layout::{self, MPS_DIR, MpsDirs};
use crate::metrics::Metrics;

mod task;

pub use super::settings::{MpsSettings, PipeMount};
pub use task::{Backoff, NO_BINARY};
use task::{
    Ctx, Namespaces, Proc, Up, launch, lock_ns, report_shm, shut_down, snapshot, supervise,
};

/// A supervised daemon.
struct Supervised {
    spec: DaemonSpec,
    namespaces: Namespaces,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The daemons the plugin runs; see the module docs.
pub struct MpsDaemons {
    ctx: Ctx,
    settings: MpsSettings,
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
                host: None,
                backoff: Backoff::DEFAULT,
                metrics,
            },
            settings: MpsSettings::default(),
            state_dir: state_dir.to_path_buf(),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// The same, restarting exited daemons after `backoff` (for tests: the plugin keeps the
    /// default).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.ctx.backoff = backoff;
        self
    }

    /// The same, starting the daemons through the MPS host listening on `socket`
    /// (`--mps-host-socket`, [`super::host`]) instead of as the plugin's children, so that they
    /// outlive the plugin's container; `None`: as its children. Either way they are supervised,
    /// stopped and adopted by this plugin; the host's are watched by their pid, as adopted ones
    /// are, which needs the plugin and the host in one PID namespace (the chart's `hostPID`).
    pub fn with_host(mut self, socket: Option<PathBuf>) -> Self {
        self.ctx.host = socket.map(HostClient::new);
        self
    }

    /// The MPS host the daemons are started through, if any.
    pub fn host(&self) -> Option<&HostClient> {
        self.ctx.host.as_ref()
    }

    /// The same, with the node-wide `settings` (protocol, shm, pipe mount).
    pub fn with_settings(mut self, settings: MpsSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The node-wide settings.
    pub fn settings(&self) -> MpsSettings {
        self.settings
    }

    /// The control binary, if MPS is available.
    pub fn binary(&self) -> Option<&ControlBinary> {
        self.ctx.binary.as_ref()
    }

    /// The daemon of `device` of claim `claim_uid` serving the device of UUID `device_uuid` (a MIG
    /// instance's MIG UUID, a shared whole GPU's UUID) with `limits`.
    pub fn spec(
        &self,
        claim: &str,
        claim_uid: &str,
        device: &str,
        device_uuid: &str,
        limits: &MpsLimits,
    ) -> DaemonSpec {
        let id = layout::daemon_id(claim_uid, device);
        DaemonSpec {
            dirs: MpsDirs::new(&self.state_dir, &id),
            id,
            device_uuid: device_uuid.to_string(),
            limits: limits.clone(),
            owner: format!("{claim} device {device}"),
            protocol: self.settings.protocol,
            shm: self.settings.shm,
        }
    }

    /// The directories of the daemon of `device` of claim `claim_uid`.
    pub fn dirs(&self, claim_uid: &str, device: &str) -> MpsDirs {
        MpsDirs::new(&self.state_dir, &layout::daemon_id(claim_uid, device))
    }

    /// Starts the daemon of `spec` with `namespace` (protocol 3: the claim's or share's) and
    /// supervises it; returns once it runs with its limits. A daemon already supervised with the
    /// same spec is kept, even while it is down and waits for its next start (backoff): a
    /// retried prepare then succeeds, and the supervisor goes on starting it
    /// (`das_kubelet_plugin_mps_daemons_up` tells); a namespace new to it is created now if it
    /// runs, else at its next start. One supervised with another spec is stopped first. A daemon
    /// no supervisor holds but its pid file names (a prepare that failed after starting it,
    /// retried) is adopted if it takes its configuration, else killed, so no daemon runs
    /// untracked beside the new one.
    ///
    /// # Errors
    /// It could not be started or configured (its process is gone, and so are its directories
    /// if this start made them), or the namespace could not be created on a running daemon.
    pub async fn start(
        &self,
        spec: DaemonSpec,
        namespace: Option<Namespace>,
    ) -> Result<(), MpsError> {
        let namespaces = match self.keep_running(&spec).await {
            Kept::Running(namespaces) => {
                return match namespace {
                    Some(ns) => self.join(&spec, &namespaces, ns).await,
                    None => Ok(()),
                };
            }
            Kept::Replaced(namespaces) => namespaces,
            Kept::None => Namespaces::default(),
        };
        if let Some(ns) = namespace {
            lock_ns(&namespaces).insert(ns.name, ns.limits);
        }
        let all = snapshot(&namespaces);
        if let Some(p) = self.adopt(&spec, &all).await {
            self.supervise(spec, namespaces, Some(p));
            return Ok(());
        }
        let proc = launch(&self.ctx, &spec, &all).await?;
        tracing::info!(daemon = %spec.id, owner = %spec.owner, device_uuid = %spec.device_uuid, pipe = %spec.dirs.pipe.display(),
            protocol = ?spec.protocol, shm_bytes = ?spec.shm.size_bytes(), "MPS control daemon started");
        self.supervise(spec, namespaces, Some(proc));
        Ok(())
    }

    /// A namespace joins a supervised daemon: recorded (every later start creates it), and
    /// created now on a running protocol-3 daemon unless it has it with these limits.
    async fn join(
        &self,
        spec: &DaemonSpec,
        namespaces: &Namespaces,
        ns: Namespace,
    ) -> Result<(), MpsError> {
        let known = lock_ns(namespaces).get(&ns.name) == Some(&ns.limits);
        if known || spec.protocol == Protocol::V2 {
            lock_ns(namespaces).insert(ns.name, ns.limits);
            return Ok(());
        }
        if daemon::live_process(&spec.dirs).is_some()
            && let Some(bin) = self.ctx.binary.as_ref()
        {
            control::ensure_namespace(bin, &spec.dirs, &ns).await?;
        }
        lock_ns(namespaces).insert(ns.name, ns.limits);
        Ok(())
    }

    /// Namespace `name` leaves the daemon of `dirs` (a share that left a MIG instance other shares
    /// keep): forgotten, and deleted from a running protocol-3 daemon. A failure is only logged:
    /// the share's containers have stopped, and the namespace goes with the daemon.
    pub async fn leave(&self, dirs: &MpsDirs, name: &str) {
        let id = dir_id(dirs);
        let held = {
            let running = self.lock();
            running
                .get(&id)
                .map(|s| (s.spec.protocol, s.namespaces.clone()))
        };
        let Some((protocol, namespaces)) = held else {
            return;
        };
        let had = lock_ns(&namespaces).remove(name).is_some();
        if !had || protocol == Protocol::V2 || daemon::live_process(dirs).is_none() {
            return;
        }
        if let Some(bin) = self.ctx.binary.as_ref()
            && let Err(e) = control::delete_namespace(bin, dirs, name).await
        {
            tracing::warn!(daemon = %id, namespace = name, error = %e, "deleting the MPS namespace of a share that left failed; it goes with the daemon");
        }
    }

    /// At start-up: supervises the daemon of a checkpointed MPS device again. Adopts the live
    /// daemon its pid file names if it is still the one started (its limits applied again),
    /// else starts one. A daemon that cannot be started now is supervised all the same: its
    /// supervisor keeps trying with backoff. Returns whether a daemon was running already
    /// (adopted, or supervised by this plugin).
    ///
    /// # Errors
    /// The daemon could not be started now (it is retried).
    pub async fn bring_back(
        &self,
        spec: DaemonSpec,
        namespaces: Vec<Namespace>,
    ) -> Result<bool, MpsError> {
        let held = match self.keep_running(&spec).await {
            Kept::Running(_) => return Ok(true),
            Kept::Replaced(held) => held,
            Kept::None => Namespaces::default(),
        };
        lock_ns(&held).extend(namespaces.into_iter().map(|n| (n.name, n.limits)));
        let all = snapshot(&held);
        if let Some(p) = self.adopt(&spec, &all).await {
            self.supervise(spec, held, Some(p));
            return Ok(true);
        }
        match launch(&self.ctx, &spec, &all).await {
            Ok(proc) => {
                self.supervise(spec, held, Some(proc));
                Ok(false)
            }
            Err(e) => {
                self.supervise(spec, held, None);
                Err(e)
            }
        }
    }

    /// The live daemon `spec`'s pid file names, if there is one that is still the one started
    /// and takes `spec`'s configuration (limits, and with protocol 3 its server and
    /// `namespaces`); one that does not take it is killed (its group with it).
    async fn adopt(&self, spec: &DaemonSpec, namespaces: &[Namespace]) -> Option<Proc> {
        let (p, binary) = (daemon::live_process(&spec.dirs)?, self.ctx.binary.as_ref());
        let applied = match binary {
            Some(b) => control::configure(b, spec, namespaces).await,
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
            self.ctx.metrics.forget_mps_shm(&s.spec.id);
        }
        self.update_gauge();
    }

    /// Stops the daemon of `dirs` (supervised, or only on disk: a process its pid file names
    /// that is still the one started is stopped too) and removes its directories. Idempotent.
    ///
    /// # Errors
    /// The directories could not be removed.
    pub async fn stop(&self, dirs: &MpsDirs) -> Result<(), MpsError> {
        let id = dir_id(dirs);
        let entry = self.lock().remove(&id);
        if let Some(s) = entry {
            s.stop.cancel();
            let _ = s.task.await;
        }
        self.ctx.metrics.forget_mps_shm(&id);
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

    /// Whether daemon `id` is supervised (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn is_supervised(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The pid of daemon `id`'s process now, if it runs (from its pid file).
    pub fn pid(&self, dirs: &MpsDirs) -> Option<u32> {
        daemon::live_pid(dirs)
    }

    /// Whether `spec`'s daemon is supervised with that very spec (keep it, with its
    /// namespaces); one supervised with another spec is stopped (its directories stay for the
    /// new one, and its namespaces are handed on).
    async fn keep_running(&self, spec: &DaemonSpec) -> Kept {
        let old = {
            let mut running = self.lock();
            match running.get(&spec.id) {
                Some(s) if s.spec == *spec && !s.task.is_finished() => {
                    return Kept::Running(s.namespaces.clone());
                }
                Some(_) => running.remove(&spec.id),
                None => None,
            }
        };
        match old {
            Some(s) => {
                s.stop.cancel();
                let _ = s.task.await;
                Kept::Replaced(s.namespaces)
            }
            None => Kept::None,
        }
    }

    fn supervise(&self, spec: DaemonSpec, namespaces: Namespaces, proc: Option<Proc>) {
        let stop = CancellationToken::new();
        // Counted up now, not once the task first runs: the daemon runs when a start returns.
        let up = proc.as_ref().map(|_| Up::new(&self.ctx.metrics));
        report_shm(&self.ctx.metrics, &spec);
        let task = tokio::spawn(supervise(
            self.ctx.clone(),
            spec.clone(),
            namespaces.clone(),
            proc,
            up,
            stop.clone(),
        ));
        self.lock().insert(
            spec.id.clone(),
            Supervised {
                spec,
                namespaces,
                stop,
                task,
            },
        );
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

/// What [`MpsDaemons::keep_running`] found.
enum Kept {
    /// Supervised with the same spec: keep it (its namespaces).
    Running(Namespaces),
    /// Supervised with another spec, now stopped: its namespaces.
    Replaced(Namespaces),
    /// Not supervised.
    None,
}

/// The id of the daemon of `dirs` (its directory's name).
fn dir_id(dirs: &MpsDirs) -> String {
    dirs.root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
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
