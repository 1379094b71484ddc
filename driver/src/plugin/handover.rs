//! One active node plugin per node, and the handover between two of them during a rolling
//! update with surge.
//!
//! In a surge rollout the new plugin pod starts while the old one still serves the kubelet.
//! Both would share the state dir: the checkpoint, the emulated GPUs' state, and (through the
//! GPUs) the MIG instances. The new pod's start-up reconciliation would roll back a prepare the old
//! pod is still doing, and each would overwrite the other's checkpoint. So only the *active*
//! instance, the holder of an exclusive lock on `<state dir>/plugin.lock`, touches that state.
//!
//! Handover: the new instance takes a shared lock on `<state dir>/handover.wait` (announcing
//! that it waits), then blocks on `plugin.lock`. The active instance polls `handover.wait`;
//! when someone holds a lock on it, it stops taking new prepares and unprepares ([`Gate`]),
//! lets the ones in flight finish (each has its checkpoint on disk before it answers), stops
//! publishing, and releases `plugin.lock`. The new instance then loads the state, reconciles,
//! publishes and registers; the kubelet (≥ 1.33) talks to the newest registered plugin. Calls
//! that reach the old instance in between fail with a message and the kubelet retries them.
//!
//! The locks are `flock(2)` locks (std's `File::lock`): the kernel drops them when a process
//! dies, so a crashed instance never blocks the node and a crashed waiter leaves no request.
//! Anyone who can open a lock file can hold a lock on it, so the state dir is made `0700` and
//! the lock files `0600` (the plugin runs as root): no other local user can stop the plugin
//! from serving or make it hand over.
//!
//! Waits are bounded: [`Gate::close_within`] gives calls in flight a limit ([`DRAIN_LIMIT`]),
//! after which the instance exits instead of handing over (the kernel frees the locks and the new
//! instance recovers from the checkpoint, as after a crash); [`Background::stop_within`] gives
//! the publisher, the reaper and the health monitor [`STOP_LIMIT`], then aborts them, so a GPU
//! call that never returns cannot keep `plugin.lock` held.
//!
//! A new instance first does what can fail without touching the node's shared state (opening the
//! GPU backend, reading the inventory, finding the driver's files: [`check_then_take_over`]),
//! and only then asks for the node: a bad image or a broken driver fails while the active
//! instance keeps serving.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use das_runtime::probes::Probe;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::claims::PrepareError;
use crate::claims::{ClaimHandler, ClaimRef, PreparedDevice};

/// The lock the active instance holds, in the state dir.
pub const LOCK_FILE: &str = "plugin.lock";
/// The file a waiting instance holds a shared lock on, in the state dir.
pub const WAIT_FILE: &str = "handover.wait";

/// Mode of the state dir: only its owner (root) may enter it.
pub const STATE_DIR_MODE: u32 = 0o700;
/// Mode of the lock files.
pub const LOCK_FILE_MODE: u32 = 0o600;

/// How often a waiting instance tries the lock, and the active one looks for a waiter.
pub const POLL: Duration = Duration::from_millis(250);
/// How long calls in flight may take to finish once the instance stops taking new ones (every
/// API call is bounded by its timeouts, a GPU call by the driver). Past it the instance exits
/// ([`Ended::Stuck`]).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// How long the background tasks (ResourceSlice publisher, reaper, health monitor) may take, all
/// together, to stop once asked ([`Background::stop_within`]); a task still running then is
/// aborted. NVML calls have no timeout: on a wedged GPU one may never return, and a task waiting
/// for it would otherwise keep the instance from releasing `plugin.lock`, so that a rolling
/// update never finishes. Healthy tasks stop within a second (they watch their stop token
/// between calls; the monitor's event wait is 1 s); 10 s also lets an API write in flight end.
pub const STOP_LIMIT: Duration = Duration::from_secs(10);
/// The longest an active instance takes from SIGTERM (or a waiter's request) to releasing the
/// node: [`DRAIN_LIMIT`] for the calls in flight, then [`STOP_LIMIT`] for the background tasks.
/// The chart's `terminationGracePeriodSeconds` (deploy/helm/das/templates/kubeletplugin-daemonset.yaml)
/// must exceed it, with room for the gRPC servers to stop, or the kubelet kills the plugin in
/// the middle of a drain.
pub const SHUTDOWN_LIMIT: Duration =
    Duration::from_secs(DRAIN_LIMIT.as_secs() + STOP_LIMIT.as_secs());

/// The waits of [`hand_over_when_asked`]: [`Limits::PLUGIN`] in the plugin, shorter ones in
/// tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// [`POLL`].
    pub poll: Duration,
    /// [`DRAIN_LIMIT`].
    pub drain: Duration,
    /// [`STOP_LIMIT`].
    pub stop: Duration,
}

impl Limits {
    /// The plugin's limits.
    pub const PLUGIN: Limits = Limits {
        poll: POLL,
        drain: DRAIN_LIMIT,
        stop: STOP_LIMIT,
    };
}

/// Makes `dir` (created if missing) enterable only by its owner.
///
/// # Errors
/// The directory cannot be created or its mode set.
pub fn restrict_state_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(STATE_DIR_MODE))
}

fn open(dir: &Path, name: &str) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(LOCK_FILE_MODE)
        .open(dir.join(name))?;
    // A file left by an older version may have a wider mode.
    file.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE))?;
    Ok(file)
}

/// This process is the node's active plugin while this value lives.
#[derive(Debug)]
pub struct Active {
    _lock: File,
    dir: PathBuf,
}

impl Active {
    /// Takes `<dir>/plugin.lock` if it is free (`Ok(None)` when another instance holds it).
    ///
    /// # Errors
    /// The lock file cannot be created or locked.
    pub fn try_acquire(dir: &Path) -> io::Result<Option<Self>> {
        let lock = open(dir, LOCK_FILE)?;
        match lock.try_lock() {
            Ok(()) => Ok(Some(Self {
                _lock: lock,
                dir: dir.to_path_buf(),
            })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// The state dir this instance holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether another instance waits to take over (holds a lock on `handover.wait`).
    pub fn handover_requested(&self) -> bool {
        let Ok(wait) = File::open(self.dir.join(WAIT_FILE)) else {
            return false;
        };
        match wait.try_lock() {
            Ok(()) => {
                let _ = wait.unlock();
                false
            }
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Error(_)) => false,
        }
    }
}

/// A waiting instance's announcement (a shared lock on `<dir>/handover.wait`), held while it
/// waits for `plugin.lock`.
#[derive(Debug)]
pub struct Waiting {
    _wait: File,
}

impl Waiting {
    /// Announces that this instance waits to take over.
    ///
    /// # Errors
    /// The wait file cannot be created or locked.
    pub fn announce(dir: &Path) -> io::Result<Self> {
        let wait = open(dir, WAIT_FILE)?;
        wait.lock_shared()?;
        Ok(Self { _wait: wait })
    }
}

/// Becomes the node's active plugin: at once if no instance is active, else after announcing
/// the wait and polling `plugin.lock` every `poll` until the active instance hands over (or
/// dies). Cancel it by dropping the future.
///
/// # Errors
/// A lock file cannot be created or locked.
pub async fn take_over(dir: &Path, poll: Duration) -> io::Result<Active> {
    if let Some(active) = Active::try_acquire(dir)? {
        return Ok(active);
    }
    tracing::info!(
        state_dir = %dir.display(),
        "another DAS plugin instance is active on this node (rolling update): waiting for it to hand over"
    );
    let _waiting = Waiting::announce(dir)?;
    loop {
        tokio::time::sleep(poll).await;
        if let Some(active) = Active::try_acquire(dir)? {
            tracing::info!("took over from the previous plugin instance");
            return Ok(active);
        }
    }
}

/// Start-up in the order that keeps a broken instance from stopping a healthy one: `check` first,
/// on the blocking pool (everything that can fail without touching the node's shared state:
/// opening the GPU backend, reading the inventory, finding the driver's files), and
/// [`take_over`] only once it succeeded. A failing `check` returns its error before any wait is
/// announced: the active instance never hears of this one and keeps serving. Cancel it by
/// dropping the future (a `check` in flight then runs on in its thread).
///
/// # Errors
/// `check`'s error (the pod then restarts, the node still served by the active instance); or a
/// lock file cannot be created or locked.
pub async fn check_then_take_over<T, F>(
    dir: &Path,
    poll: Duration,
    check: F,
) -> anyhow::Result<(T, Active)>
where
    T: Send + 'static,
    F: FnOnce() -> anyhow::Result<T> + Send + 'static,
{
    let checked = tokio::task::spawn_blocking(check)
        .await
        .context("the start-up checks failed")?
        .context("this instance cannot serve the node (an active instance keeps serving it)")?;
    let active = take_over(dir, poll)
        .await
        .with_context(|| format!("lock {}", dir.display()))?;
    Ok((checked, active))
}

/// The tasks that touch the node's state besides the kubelet's calls (the ResourceSlice
/// publisher, the reaper, the health monitor), each with the token that stops it. All end, or are
/// aborted, before the node is handed over.
#[derive(Debug, Default)]
pub struct Background {
    tasks: Vec<BackgroundTask>,
}

#[derive(Debug)]
struct BackgroundTask {
    name: &'static str,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Background {
    /// Spawns `work`, which should return soon after `stop` is cancelled; `name` says which task
    /// it is in the log.
    pub fn spawn<F>(&mut self, name: &'static str, stop: CancellationToken, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.push(BackgroundTask {
            name,
            stop,
            task: tokio::spawn(work),
        });
    }

    /// Cancels every task's token, then waits for the tasks, at most `limit` for all of them
    /// together ([`STOP_LIMIT`] in the plugin). A task still running then is aborted: it never
    /// runs again, though a blocking call it started (a GPU call on the blocking pool) runs on in
    /// its thread until the call returns, its result dropped. Logs each task that ended badly or
    /// had to be aborted; returns the names of the latter (empty when all stopped).
    pub async fn stop_within(self, limit: Duration) -> Vec<&'static str> {
        for t in &self.tasks {
            t.stop.cancel();
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut aborted = Vec::new();
        for BackgroundTask { name, mut task, .. } in self.tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(task = name, error = %e, "a background task ended badly")
                }
                Err(_) => {
                    task.abort();
                    tracing::error!(
                        task = name,
                        ?limit,
                        "a background task did not stop in time (a GPU call that does not return?): aborted"
                    );
                    aborted.push(name);
                }
            }
        }
        aborted
    }
}

/// How [`hand_over_when_asked`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Shutdown (SIGTERM).
    Stopped,
    /// Calls in flight did not finish within [`DRAIN_LIMIT`]: the node is not handed over
    /// cleanly; the process must exit.
    Stuck,
    /// This instance handed over, then the node's lock came free again with nobody waiting for
    /// it: the instance that took over is gone (it failed at start-up, or was deleted in a
    /// rollback). This one must start over to serve the node (its view of the state is stale).
    NodeUnserved,
}

/// While this instance is active: when a newer instance waits to take over (rolling update with
/// surge), or on `stop` (shutdown), stop taking prepares, let the ones in flight finish (their
/// checkpoints are on disk before they answer; at most `limits.drain`), stop the background
/// tasks (at most `limits.stop`, then they are aborted), and release the node. After a handover,
/// watch that the node stays served. Every wait before the release is bounded, so it returns
/// [`Ended::Stuck`] within `limits.drain + limits.stop` of the request at worst.
pub async fn hand_over_when_asked(
    active: Active,
    gate: Arc<Gate>,
    background: Background,
    probe: Arc<Probe>,
    stop: CancellationToken,
    limits: Limits,
) -> Ended {
    let mut tick = tokio::time::interval(limits.poll);
    let handover = loop {
        tokio::select! {
            _ = stop.cancelled() => break false,
            _ = tick.tick() => if active.handover_requested() { break true },
        }
    };
    if handover {
        tracing::info!("a newer DAS plugin instance waits on this node: handing over");
        probe.set_ready(false);
    }
    if !gate.close_within(limits.drain).await {
        tracing::error!(limit = ?limits.drain, "calls in flight did not finish");
        // Bounded too: the process exits next, whatever the tasks do.
        background.stop_within(limits.stop).await;
        return Ended::Stuck;
    }
    // A task aborted here can no longer write the checkpoint or the slices (only a GPU call it
    // had started may still return, unseen): the node is handed over as usual.
    background.stop_within(limits.stop).await;
    let dir = active.dir().to_path_buf();
    drop(active);
    if !handover {
        return Ended::Stopped;
    }
    tracing::info!(
        "handed over: this instance no longer prepares, unprepares or publishes; it exits on SIGTERM"
    );
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            _ = tick.tick() => {}
        }
        // Free with a waiter still announced: the new instance has not polled yet.
        if let Ok(Some(lock)) = Active::try_acquire(&dir)
            && !lock.handover_requested()
        {
            tracing::error!("the plugin instance that took over this node is gone");
            return Ended::NodeUnserved;
        }
    }
}

/// Lets prepares and unprepares through until [`Gate::close`]; `close` waits for the ones in
/// flight.
#[derive(Debug, Default)]
pub struct Gate {
    closed: AtomicBool,
    in_flight: Arc<RwLock<()>>,
}

impl Gate {
    /// A pass for one call, or `None` once the gate is closed. The pass is owned, so the work it
    /// covers can run in a task of its own (see [`Gated`]).
    pub async fn enter(&self) -> Option<OwnedRwLockReadGuard<()>> {
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        let pass = self.in_flight.clone().read_owned().await;
        // Closed while we waited behind `close`: the state is no longer ours.
        (!self.closed.load(Ordering::SeqCst)).then_some(pass)
    }

    /// Refuses new calls and returns once every call in flight has finished.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(self.in_flight.write().await);
    }

    /// [`Self::close`], waiting at most `limit`; `false` when calls were still running then
    /// (the gate stays closed).
    pub async fn close_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.close()).await.is_ok()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// A [`ClaimHandler`] behind a [`Gate`]: once the gate is closed every claim gets
/// [`PrepareError::HandedOver`].
pub struct Gated {
    pub inner: Arc<dyn ClaimHandler>,
    pub gate: Arc<Gate>,
}

fn refuse<T>(claims: &[ClaimRef]) -> HashMap<String, Result<T, PrepareError>> {
    claims
        .iter()
        .map(|c| (c.uid.clone(), Err(PrepareError::HandedOver)))
        .collect()
}

impl Gated {
    /// Runs `work` in a task of its own that holds the gate's pass: when the kubelet cancels the
    /// call (a timeout), tonic drops our future, but the work (GPU calls, checkpoint writes)
    /// still finishes before the gate can close and the node be handed over.
    async fn run<T, F>(
        &self,
        claims: &[ClaimRef],
        work: F,
    ) -> HashMap<String, Result<T, PrepareError>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = HashMap<String, Result<T, PrepareError>>> + Send + 'static,
    {
        let Some(pass) = self.gate.enter().await else {
            return refuse(claims);
        };
        let task = tokio::spawn(async move {
            let _pass = pass;
            work.await
        });
        match task.await {
            Ok(results) => results,
            Err(e) => claims
                .iter()
                .map(|c| {
                    (
                        c.uid.clone(),
                        Err(PrepareError::Internal(format!("the call failed: {e}"))),
                    )
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl ClaimHandler for Gated {
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
        let inner = self.inner.clone();
        let ids = claims.clone();
        self.run(&ids, async move { inner.prepare(claims).await })
            .await
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), PrepareError>> {
        let inner = self.inner.clone();
        let ids = claims.clone();
        self.run(&ids, async move { inner.unprepare(claims).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("das-handover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn a_second_instance_waits_and_the_active_one_sees_it() {
        let d = dir("wait");
        let active = Active::try_acquire(&d).unwrap().expect("free lock");
        assert!(Active::try_acquire(&d).unwrap().is_none(), "one active");
        assert!(!active.handover_requested(), "nobody waits yet");

        let d2 = d.clone();
        let waiter =
            tokio::spawn(async move { take_over(&d2, Duration::from_millis(5)).await.unwrap() });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !active.handover_requested() {
            assert!(std::time::Instant::now() < deadline, "waiter not seen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "the waiter waits while we are active"
        );
        drop(active);
        let new = waiter.await.unwrap();
        assert!(!new.handover_requested(), "the waiter's request is gone");
    }

    #[test]
    fn a_stale_wait_file_is_no_request() {
        let d = dir("stale");
        std::fs::write(d.join(WAIT_FILE), b"").unwrap();
        let active = Active::try_acquire(&d).unwrap().unwrap();
        assert!(!active.handover_requested());
    }

    #[test]
    fn a_dead_instance_leaves_the_lock_free() {
        let d = dir("dead");
        drop(Active::try_acquire(&d).unwrap().unwrap());
        assert!(Active::try_acquire(&d).unwrap().is_some());
    }

    #[tokio::test]
    async fn close_waits_for_calls_in_flight_and_refuses_new_ones() {
        let gate = Arc::new(Gate::default());
        let pass = gate.enter().await.expect("open");
        let g = gate.clone();
        let closing = tokio::spawn(async move { g.close().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!closing.is_finished(), "close waits for the call in flight");
        assert!(gate.enter().await.is_none(), "no new calls once closing");
        drop(pass);
        closing.await.unwrap();
        assert!(gate.is_closed());
    }

    /// A handler whose prepare takes `delay`.
    struct Slow(Duration);
    #[tonic::async_trait]
    impl ClaimHandler for Slow {
        async fn prepare(
            &self,
            claims: Vec<ClaimRef>,
        ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
            tokio::time::sleep(self.0).await;
            claims.into_iter().map(|c| (c.uid, Ok(vec![]))).collect()
        }
        async fn unprepare(
            &self,
            claims: Vec<ClaimRef>,
        ) -> HashMap<String, Result<(), PrepareError>> {
            claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
        }
    }

    #[tokio::test]
    async fn a_cancelled_call_still_holds_the_gate_until_its_work_ends() {
        let gated = Arc::new(Gated {
            inner: Arc::new(Slow(Duration::from_millis(200))),
            gate: Arc::default(),
        });
        let claim = ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
        };
        let g = gated.clone();
        let call = tokio::spawn(async move { g.prepare(vec![claim]).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        call.abort(); // the kubelet gave up
        let t0 = std::time::Instant::now();
        gated.gate.close().await;
        assert!(
            t0.elapsed() >= Duration::from_millis(100),
            "close waited for the abandoned prepare's work ({:?})",
            t0.elapsed()
        );
    }

    struct Ok1;
    #[tonic::async_trait]
    impl ClaimHandler for Ok1 {
        async fn prepare(
            &self,
            claims: Vec<ClaimRef>,
        ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
            claims.into_iter().map(|c| (c.uid, Ok(vec![]))).collect()
        }
        async fn unprepare(
            &self,
            claims: Vec<ClaimRef>,
        ) -> HashMap<String, Result<(), PrepareError>> {
            claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
        }
    }

    #[tokio::test]
    async fn a_closed_gate_answers_every_claim_with_the_handover() {
        let gated = Gated {
            inner: Arc::new(Ok1),
            gate: Arc::default(),
        };
        let claim = ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
        };
        assert!(gated.prepare(vec![claim.clone()]).await["u1"].is_ok());
        gated.gate.close().await;
        let err = gated.unprepare(vec![claim]).await["u1"]
            .clone()
            .unwrap_err();
        assert!(matches!(err, PrepareError::HandedOver), "{err}");
        assert!(err.to_string().contains("handed over"), "{err}");
    }

    /// Issue 11 finding 8: the lock files (and the state dir) are closed to other users, so no
    /// local process but root can hold a lock on them.
    #[test]
    fn lock_files_are_0600_in_a_0700_state_dir() {
        let d = dir("modes");
        std::fs::write(d.join(WAIT_FILE), b"").unwrap();
        std::fs::set_permissions(d.join(WAIT_FILE), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        restrict_state_dir(&d).unwrap();
        let _active = Active::try_acquire(&d).unwrap().unwrap();
        let _waiting = Waiting::announce(&d).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&d.join(LOCK_FILE)), 0o600);
        assert_eq!(
            mode(&d.join(WAIT_FILE)),
            0o600,
            "an older, wider file is narrowed"
        );
    }

    #[tokio::test]
    async fn closing_is_bounded_when_a_call_hangs() {
        let gate = Gate::default();
        let _stuck = gate.enter().await.unwrap();
        assert!(!gate.close_within(Duration::from_millis(50)).await);
        assert!(gate.is_closed(), "no new calls either way");
    }

    /// Issue 30 item 4: a task that never ends (one waiting for a GPU call on a wedged GPU) is
    /// aborted at the limit, and stop returns then; the tasks that stopped are not reported.
    #[tokio::test(start_paused = true)]
    async fn a_background_task_that_never_ends_is_aborted_at_the_limit() {
        let mut background = Background::default();
        let publisher_stop = CancellationToken::new();
        let s = publisher_stop.clone();
        background.spawn(
            "publisher",
            publisher_stop,
            async move { s.cancelled().await },
        );
        let (alive, aborted) = tokio::sync::oneshot::channel::<()>();
        background.spawn("health monitor", CancellationToken::new(), async move {
            let _alive = alive;
            std::future::pending::<()>().await
        });
        let limit = Duration::from_secs(10);
        let t0 = tokio::time::Instant::now();
        let late = tokio::time::timeout(limit * 2, background.stop_within(limit))
            .await
            .expect("stop returns at its limit");
        assert_eq!(late, vec!["health monitor"]);
        assert_eq!(t0.elapsed(), limit, "it waited the limit, no more");
        assert!(aborted.await.is_err(), "the task was aborted (dropped)");
    }

    #[tokio::test(start_paused = true)]
    async fn background_tasks_that_stop_are_not_waited_for_longer() {
        let mut background = Background::default();
        for name in ["publisher", "reaper", "health monitor"] {
            let stop = CancellationToken::new();
            let s = stop.clone();
            background.spawn(name, stop, async move { s.cancelled().await });
        }
        let t0 = tokio::time::Instant::now();
        assert!(background.stop_within(STOP_LIMIT).await.is_empty());
        assert!(t0.elapsed() < Duration::from_millis(1));
    }

    const TEST_LIMITS: Limits = Limits {
        poll: Duration::from_millis(250),
        drain: Duration::from_secs(60),
        stop: Duration::from_secs(10),
    };

    /// Issue 30 item 4: an active instance whose health monitor hangs still hands the node over
    /// (after the stop limit) instead of holding `plugin.lock` forever.
    #[tokio::test(start_paused = true)]
    async fn a_hung_background_task_does_not_keep_the_node_from_the_new_instance() {
        let d = dir("hung-background");
        let active = Active::try_acquire(&d).unwrap().unwrap();
        let mut background = Background::default();
        background.spawn(
            "health monitor",
            CancellationToken::new(),
            std::future::pending(),
        );
        let stop = CancellationToken::new();
        let probe = Arc::new(Probe::default());
        probe.set_ready(true);
        let old = tokio::spawn(hand_over_when_asked(
            active,
            Arc::default(),
            background,
            probe.clone(),
            stop.clone(),
            TEST_LIMITS,
        ));
        let bound = TEST_LIMITS.poll * 3 + TEST_LIMITS.stop;
        let new = tokio::time::timeout(bound, take_over(&d, TEST_LIMITS.poll))
            .await
            .expect("handed over within the stop limit")
            .unwrap();
        assert!(!probe.is_ready());
        assert!(!old.is_finished(), "the old instance watches the node");
        stop.cancel();
        assert_eq!(old.await.unwrap(), Ended::Stopped);
        drop(new);
    }

    /// Issue 30 item 4: calls that hang and a background task that hangs: the instance still
    /// ends (to exit) within the drain and stop limits.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_instance_ends_within_the_drain_and_stop_limits() {
        let d = dir("stuck");
        let active = Active::try_acquire(&d).unwrap().unwrap();
        let gate = Arc::new(Gate::default());
        let _call = gate.enter().await.unwrap();
        let mut background = Background::default();
        background.spawn("reaper", CancellationToken::new(), std::future::pending());
        let stop = CancellationToken::new();
        stop.cancel(); // SIGTERM
        let t0 = tokio::time::Instant::now();
        let ended = tokio::time::timeout(
            TEST_LIMITS.drain + TEST_LIMITS.stop + Duration::from_secs(1),
            hand_over_when_asked(active, gate, background, Arc::default(), stop, TEST_LIMITS),
        )
        .await
        .expect("bounded");
        assert_eq!(ended, Ended::Stuck);
        assert_eq!(t0.elapsed(), TEST_LIMITS.drain + TEST_LIMITS.stop);
    }

    /// Issue 30 item 4: a new instance whose GPU backend cannot be opened fails before it asks
    /// the active instance to hand over, so the active one keeps serving.
    #[tokio::test]
    async fn a_failing_start_up_check_never_asks_for_the_node() {
        let d = dir("check-fails");
        let active = Arc::new(Active::try_acquire(&d).unwrap().unwrap());
        let seen = active.clone();
        let started = tokio::time::timeout(
            Duration::from_secs(5),
            check_then_take_over(
                &d,
                Duration::from_millis(5),
                move || -> anyhow::Result<()> {
                    assert!(!seen.handover_requested(), "checked before asking");
                    anyhow::bail!("initialise NVML (libnvidia-ml.so.1): driver not loaded")
                },
            ),
        )
        .await
        .expect("a failed check returns at once, without waiting for the node");
        let err = format!("{:#}", started.unwrap_err());
        assert!(err.contains("initialise NVML"), "{err}");
        assert!(
            !active.handover_requested(),
            "the active instance was never asked"
        );
    }

    #[tokio::test]
    async fn a_passing_start_up_check_comes_before_the_wait() {
        let d = dir("check-passes");
        let active = Arc::new(Active::try_acquire(&d).unwrap().unwrap());
        let seen = active.clone();
        let d2 = d.clone();
        let starting = tokio::spawn(async move {
            check_then_take_over(&d2, Duration::from_millis(5), move || {
                Ok(seen.handover_requested())
            })
            .await
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !active.handover_requested() {
            assert!(std::time::Instant::now() < deadline, "waiter not seen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(active);
        let (asked_while_checking, _new) = tokio::time::timeout(Duration::from_secs(5), starting)
            .await
            .expect("took over")
            .unwrap()
            .unwrap();
        assert!(!asked_while_checking, "no wait announced while checking");
    }
}
