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
//! Waits are bounded: [`Gate::close_within`] gives calls in flight a limit, after which the
//! instance exits instead of handing over (the kernel frees the locks and the new instance
//! recovers from the checkpoint, as after a crash).

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

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
}
