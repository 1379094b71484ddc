//! The reaper: retries, with backoff, the destroys that an unprepare or a roll-back could not
//! finish (records in state `Releasing`), so no instance is forgotten while it exists. Each failed
//! attempt counts in `das_kubelet_plugin_reaper_attempts_total{result="failure"}` and posts a
//! Warning event `SliceDestroyFailed` on the ResourceClaim.
//!
//! This module keeps the schedule ([`ReaperState`]: when each claim is due, with backoff) and
//! what a pass answers ([`ReapReport`]); the passes are the preparer's
//! ([`super::Preparer::reap_due`], [`super::Preparer::run_reaper`], in
//! [`super::preparer::reaper`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Pause before the first retry of a claim's destroys; doubled after each failure.
pub(crate) const FIRST_DELAY: Duration = Duration::from_secs(1);
/// Longest pause between two attempts for one claim.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
struct Backoff {
    next: Instant,
    delay: Duration,
}

/// When each releasing claim is due for its next attempt.
#[derive(Debug, Default)]
pub(crate) struct ReaperState {
    due: Mutex<BTreeMap<String, Backoff>>,
    /// Woken when a claim is scheduled, so a sleeping reaper looks at once.
    pub(crate) wake: Notify,
}

impl ReaperState {
    /// Schedules claim `uid` for an attempt after [`FIRST_DELAY`] (kept if already scheduled).
    pub fn schedule(&self, uid: &str) {
        self.due
            .lock()
            .expect("reaper")
            .entry(uid.to_string())
            .or_insert(Backoff {
                next: Instant::now() + FIRST_DELAY,
                delay: FIRST_DELAY,
            });
        self.wake.notify_one();
    }

    /// Forgets claim `uid` (its record is gone).
    pub fn done(&self, uid: &str) {
        self.due.lock().expect("reaper").remove(uid);
    }

    /// Notes a failed attempt for claim `uid`: doubles its pause (up to [`MAX_DELAY`]) and
    /// returns it.
    pub(crate) fn failed(&self, uid: &str) -> Duration {
        let mut due = self.due.lock().expect("reaper");
        let b = due.entry(uid.to_string()).or_insert(Backoff {
            next: Instant::now(),
            delay: FIRST_DELAY,
        });
        b.delay = (b.delay * 2).min(MAX_DELAY);
        b.next = Instant::now() + b.delay;
        b.delay
    }

    /// Whether claim `uid` is due at `now` (a claim not scheduled, found after a restart, is).
    pub(crate) fn is_due(&self, uid: &str, now: Instant) -> bool {
        self.due
            .lock()
            .expect("reaper")
            .get(uid)
            .is_none_or(|b| b.next <= now)
    }

    /// The earliest next attempt.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.due
            .lock()
            .expect("reaper")
            .values()
            .map(|b| b.next)
            .min()
    }
}

/// How often the reaper's loop looks again at claims whose MPS daemons wait for their GPU.
pub(crate) const MPS_RETRY: Duration = Duration::from_secs(5);

/// Claims kept at start-up whose MPS daemons could not be brought back because a GPU of theirs
/// did not answer: the reaper's loop tries again every [`MPS_RETRY`] until the GPU answers
/// (then the daemons start, or the claim's instances are gone and its next prepare repairs it).
#[derive(Debug, Default)]
pub(crate) struct PendingDaemons {
    uids: Mutex<std::collections::BTreeSet<String>>,
}

impl PendingDaemons {
    /// Notes claim `uid`.
    pub fn add(&self, uid: &str) {
        self.uids
            .lock()
            .expect("pending daemons")
            .insert(uid.to_string());
    }

    /// Forgets claim `uid` (its daemons run, or there is nothing to run).
    pub fn done(&self, uid: &str) {
        self.uids.lock().expect("pending daemons").remove(uid);
    }

    /// The claims noted, in UID order.
    pub fn all(&self) -> Vec<String> {
        self.uids
            .lock()
            .expect("pending daemons")
            .iter()
            .cloned()
            .collect()
    }
}

/// What one pass of the reaper did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ReapReport {
    /// Claims whose instances are now all gone (records dropped).
    pub finished: Vec<String>,
    /// Claims with instances still left.
    pub failed: Vec<String>,
    /// Claims skipped because a call for them was running.
    pub busy: Vec<String>,
}
