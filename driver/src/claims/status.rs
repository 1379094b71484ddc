//! Writes a prepared claim's `status.devices` (for users and the AllocationClaim controller)
//! after the kubelet has its answer, retrying with backoff until the write lands, the claim is
//! gone or replaced, or the claim is unprepared. One writer per claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::ClaimApi;
use super::handler::ClaimRef;
use super::spans::claim_span;
use crate::claims::checkpoint::RecordedDevice;
use crate::metrics::Metrics;

/// First pause after a failed write; doubled after each failure up to [`MAX_RETRY_DELAY`].
pub(crate) const FIRST_RETRY_DELAY: Duration = Duration::from_millis(250);
/// Longest pause between two writes of one claim's status.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

struct Writer {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The running status writers, by claim UID.
#[derive(Default)]
pub(crate) struct StatusWriters {
    writers: Mutex<HashMap<String, Writer>>,
}

impl StatusWriters {
    /// Starts writing `claim`'s status for `devices`, replacing a writer the claim already has.
    pub fn start(
        &self,
        api: Arc<dyn ClaimApi>,
        claim: ClaimRef,
        devices: Vec<RecordedDevice>,
        metrics: Arc<Metrics>,
    ) {
        let stop = CancellationToken::new();
        let uid = claim.uid.clone();
        let span = claim_span!("status", &claim);
        let writes = write_until_done(api, claim, devices, metrics, stop.clone());
        let task = tokio::spawn(writes.instrument(span));
        let mut writers = self.writers.lock().expect("status writers");
        writers.retain(|_, w| !w.task.is_finished());
        if let Some(old) = writers.insert(uid, Writer { stop, task }) {
            old.stop.cancel();
        }
    }

    /// Stops the claim's writer, if any, and waits until it has ended (so an unprepare never
    /// races a status write of the same claim): a write in progress finishes, no new one starts.
    pub async fn stop(&self, uid: &str) {
        let writer = self.writers.lock().expect("status writers").remove(uid);
        if let Some(w) = writer {
            w.stop.cancel();
            let _ = w.task.await;
        }
    }

    /// Writers still running (retrying).
    #[cfg(test)]
    pub fn running(&self) -> usize {
        let writers = self.writers.lock().expect("status writers");
        writers.values().filter(|w| !w.task.is_finished()).count()
    }
}

impl Drop for StatusWriters {
    /// The preparer is gone (a restart, or a test dropping it): its writers stop with it.
    fn drop(&mut self) {
        if let Ok(writers) = self.writers.get_mut() {
            for w in writers.values() {
                w.stop.cancel();
                w.task.abort();
            }
        }
    }
}

async fn write_until_done(
    api: Arc<dyn ClaimApi>,
    claim: ClaimRef,
    devices: Vec<RecordedDevice>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut delay = FIRST_RETRY_DELAY;
    loop {
        // An attempt that started runs to its end (bounded by the API timeouts): cancelling it
        // would tear down the pooled connection mid-request and make the next call set up a
        // new one. `stop` only prevents further attempts.
        if stop.is_cancelled() {
            return;
        }
        match api.write_status(&claim, &devices).await {
            Ok(()) => return,
            Err(e) if e.permanent => {
                // Gone, replaced or deallocated: the status no longer belongs anywhere.
                tracing::info!(error = %e, "not writing the device status of a claim that changed");
                return;
            }
            Err(e) => {
                metrics.status_write_failed();
                tracing::warn!(error = %e, retry_in = ?delay,
                    "writing the claim's device status failed; retrying");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}
