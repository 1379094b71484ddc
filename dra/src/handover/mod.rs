//! One active plugin instance per node, and the handover between two of them during a rolling
//! update with surge.
//!
//! In a surge rollout the new plugin pod starts while the old one still serves the kubelet.
//! Both would share the state dir: whatever the driver records there (its checkpoint, say) and,
//! through the devices, what it made on them. The new pod's start-up would undo work the old pod
//! is still doing, and each would overwrite the other's records. So only the *active* instance,
//! the holder of an exclusive lock on `<state dir>/plugin.lock`, touches that state.
//!
//! Handover: the new instance takes a shared lock on `<state dir>/handover.wait` (announcing
//! that it waits), then blocks on `plugin.lock`. The active instance polls `handover.wait`;
//! when someone holds a lock on it, it stops taking new prepares and unprepares ([`Gate`]),
//! lets the ones in flight finish (a driver records each before it answers), stops its
//! background tasks ([`Background`]: publishing and the like), and releases `plugin.lock`. The
//! new instance then loads the state, reconciles, publishes and registers; the kubelet (≥ 1.33)
//! talks to the newest registered plugin. Calls that reach the old instance in between fail
//! with [`GateError::HandedOver`] and the kubelet retries them.
//!
//! The locks are `flock(2)` locks (std's `File::lock`): the kernel drops them when a process
//! dies, so a crashed instance never blocks the node and a crashed waiter leaves no request.
//! Anyone who can open a lock file can hold a lock on it, so the state dir is made `0700` and
//! the lock files `0600` ([`restrict_state_dir`]; the plugin runs as root): no other local user
//! can stop the plugin from serving or make it hand over.
//!
//! Waits are bounded: [`Gate::close_within`] gives calls in flight a limit ([`DRAIN_LIMIT`]),
//! after which the instance exits instead of handing over (the kernel frees the locks and the new
//! instance recovers from the driver's records, as after a crash); [`Background::stop_within`]
//! gives the background tasks [`STOP_LIMIT`], then aborts them, so a device call that never
//! returns cannot keep `plugin.lock` held.
//!
//! A new instance first does what can fail without touching the node's shared state (opening
//! the devices, reading their inventory, finding the files it needs: [`check_then_take_over`]),
//! and only then asks for the node: a bad image or a broken device stack fails while the active
//! instance keeps serving.
//!
//! Wiring, in the order an instance runs (see the crate's docs for the whole plugin):
//! [`restrict_state_dir`] → [`check_then_take_over`] (an [`Active`]) → start-up and background
//! tasks ([`Background::spawn`]) → serve a [`Gated`] driver behind a [`Gate`] →
//! [`hand_over_when_asked`] until it returns [`Ended`].
//!
//! Files:
//! - `handover/lock.rs`: the lock files and their modes ([`Active`], [`Waiting`],
//!   [`restrict_state_dir`]);
//! - `handover/takeover.rs`: the new instance's side ([`take_over`], [`check_then_take_over`]);
//! - `handover/gate.rs`: draining the kubelet's calls ([`Gate`], [`Gated`], [`GateError`]);
//! - `handover/background.rs`: stopping the background tasks ([`Background`]);
//! - this file: the limits and the active instance's side ([`hand_over_when_asked`]).

mod background;
mod gate;
mod lock;
mod takeover;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use das_runtime::probes::Probe;
use tokio_util::sync::CancellationToken;

pub use background::Background;
pub use gate::{Gate, GateError, Gated};
pub use lock::{
    Active, LOCK_FILE, LOCK_FILE_MODE, STATE_DIR_MODE, WAIT_FILE, Waiting, restrict_state_dir,
};
pub use takeover::{TakeOverError, check_then_take_over, take_over};

/// How often a waiting instance tries the lock, and the active one looks for a waiter.
pub const POLL: Duration = Duration::from_millis(250);
/// How long calls in flight may take to finish once the instance stops taking new ones (a
/// driver bounds every API call by its timeouts; a device call is bounded by the device's own
/// stack). Past it the instance exits ([`Ended::Stuck`]).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// How long the background tasks (a ResourceSlice publisher, a health monitor, ...) may take,
/// all together, to stop once asked ([`Background::stop_within`]); a task still running then
/// is aborted. A device call may have no timeout and, on a wedged device, never return; a task
/// waiting for it would otherwise keep the instance from releasing `plugin.lock`, so that a
/// rolling update never finishes. Healthy tasks stop within a second if they watch their stop
/// token between calls; 10 s also lets an API write in flight end.
pub const STOP_LIMIT: Duration = Duration::from_secs(10);
/// The longest an active instance takes from SIGTERM (or a waiter's request) to releasing the
/// node: [`DRAIN_LIMIT`] for the calls in flight, then [`STOP_LIMIT`] for the background tasks.
/// The plugin pod's `terminationGracePeriodSeconds` must exceed it, with room for the gRPC
/// servers to stop, or the kubelet kills the plugin in the middle of a drain.
pub const SHUTDOWN_LIMIT: Duration =
    Duration::from_secs(DRAIN_LIMIT.as_secs() + STOP_LIMIT.as_secs());

/// The waits of [`hand_over_when_asked`]: [`Limits::PLUGIN`] in a plugin, shorter ones in
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
    /// A plugin's limits: [`POLL`], [`DRAIN_LIMIT`], [`STOP_LIMIT`].
    pub const PLUGIN: Limits = Limits {
        poll: POLL,
        drain: DRAIN_LIMIT,
        stop: STOP_LIMIT,
    };
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
/// surge), or on `stop` (shutdown), stop taking prepares (`gate`), let the ones in flight finish
/// (at most `limits.drain`), stop the background tasks (at most `limits.stop`, then they are
/// aborted), and release the node (`active`). `probe` turns not ready when a handover starts.
/// After a handover, watch that the node stays served. Every wait before the release is
/// bounded, so it returns [`Ended::Stuck`] within `limits.drain + limits.stop` of the request at
/// worst.
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
        tracing::info!("a newer plugin instance waits on this node: handing over");
        probe.set_ready(false);
    }
    if !gate.close_within(limits.drain).await {
        tracing::error!(limit = ?limits.drain, "calls in flight did not finish");
        // Bounded too: the process exits next, whatever the tasks do.
        background.stop_within(limits.stop).await;
        return Ended::Stuck;
    }
    // A task aborted here can no longer write the node's state (only a blocking device call it
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
