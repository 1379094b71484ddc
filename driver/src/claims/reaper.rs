//! The reaper: retries, with backoff, the destroys that an unprepare or a roll-back could not
//! finish (records in state `Releasing`), so no instance is forgotten while it exists. Each failed
//! attempt counts in `das_kubelet_plugin_reaper_attempts_total{result="failure"}` and posts a
//! Warning event `SliceDestroyFailed` on the ResourceClaim.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handler::ClaimRef;
use super::{EventTarget, PrepareError, Preparer};
use crate::claims::checkpoint::PrepareState;

/// Pause before the first retry of a claim's destroys; doubled after each failure.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// Longest pause between two attempts for one claim.
pub const MAX_DELAY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
struct Backoff {
    next: Instant,
    delay: Duration,
}

/// When each releasing claim is due for its next attempt.
#[derive(Debug, Default)]
pub struct ReaperState {
    due: Mutex<BTreeMap<String, Backoff>>,
    wake: Notify,
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

    fn failed(&self, uid: &str) -> Duration {
        let mut due = self.due.lock().expect("reaper");
        let b = due.entry(uid.to_string()).or_insert(Backoff {
            next: Instant::now(),
            delay: FIRST_DELAY,
        });
        b.delay = (b.delay * 2).min(MAX_DELAY);
        b.next = Instant::now() + b.delay;
        b.delay
    }

    fn is_due(&self, uid: &str, now: Instant) -> bool {
        self.due
            .lock()
            .expect("reaper")
            .get(uid)
            .is_none_or(|b| b.next <= now)
    }

    /// The earliest next attempt.
    fn next_due(&self) -> Option<Instant> {
        self.due
            .lock()
            .expect("reaper")
            .values()
            .map(|b| b.next)
            .min()
    }
}

/// What one pass of the reaper did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReapReport {
    /// Claims whose instances are now all gone (records dropped).
    pub finished: Vec<String>,
    /// Claims with instances still left.
    pub failed: Vec<String>,
    /// Claims skipped because a call for them was running.
    pub busy: Vec<String>,
}

impl Preparer {
    /// One pass: for every `Releasing` record that is due (a record found after a restart is
    /// due at once) and not busy with a call, try its destroys again.
    pub async fn reap_due(&self) -> ReapReport {
        let now = Instant::now();
        let releasing: Vec<(ClaimRef, Vec<_>)> = self.checkpoint.read(|cp| {
            cp.claims
                .iter()
                .filter(|(_, r)| r.state == PrepareState::Releasing)
                .map(|(uid, r)| {
                    let claim = ClaimRef {
                        namespace: r.namespace.clone(),
                        name: r.name.clone(),
                        uid: uid.clone(),
                    };
                    (claim, r.devices.clone())
                })
                .collect()
        });
        let mut report = ReapReport::default();
        for (claim, _) in releasing {
            if !self.reaper.is_due(&claim.uid, now) {
                continue;
            }
            let Some(_held) = self.claim_locks.try_lock(&claim.uid) else {
                report.busy.push(claim.uid);
                continue;
            };
            // Read again under the lock: a call may have finished it meanwhile.
            let Some(record) = self
                .record_of(&claim.uid)
                .filter(|r| r.state == PrepareState::Releasing)
            else {
                continue;
            };
            match self.release(&claim, record.devices).await {
                Ok(()) => {
                    self.metrics.reaper_attempt(true);
                    tracing::info!(claim = %claim, "reaper: the claim's remaining slices are destroyed");
                    report.finished.push(claim.uid);
                }
                Err(e) => {
                    self.metrics.reaper_attempt(false);
                    let retry = self.reaper.failed(&claim.uid);
                    tracing::warn!(claim = %claim, error = %e, retry_in = ?retry, "reaper: destroying the claim's slices failed again");
                    self.warn(
                        EventTarget::Claim(claim.clone()),
                        "SliceDestroyFailed",
                        note(&e, retry),
                    )
                    .await;
                    report.failed.push(claim.uid);
                }
            }
        }
        report
    }

    /// Runs [`Self::reap_due`] whenever an attempt is due, and the orphan rule's checks
    /// ([`Self::check_orphans`]) whenever a suspect is due, until `stop`.
    pub async fn run_reaper(self: Arc<Self>, stop: CancellationToken) {
        loop {
            self.reap_due().await;
            self.check_orphans().await;
            let next = [self.reaper.next_due(), self.orphans.next_due()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or_else(|| Instant::now() + MAX_DELAY);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.reaper.wake.notified() => {}
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }
}

fn note(e: &PrepareError, retry: Duration) -> String {
    format!("{e}; next attempt in {}s", retry.as_secs())
}
