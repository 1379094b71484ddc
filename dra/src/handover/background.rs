//! The active instance's background tasks (a ResourceSlice publisher, a health monitor, ...),
//! stopped within a bound before the node is handed over ([`Background::stop_within`]).

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The tasks that touch the node's state besides the kubelet's calls (a ResourceSlice
/// publisher, a health monitor, a reaper of what failed to go, ...), each with the token that
/// stops it. All end, or are aborted, before the node is handed over.
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
    /// together ([`STOP_LIMIT`](super::STOP_LIMIT) in a plugin). A task still running then is
    /// aborted: it never runs again, though a blocking call it started (a device call on the
    /// blocking pool) runs on in its thread until the call returns, its result dropped. Logs each task that ended badly or
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
                        "a background task did not stop in time (a blocking call that does not return?): aborted"
                    );
                    aborted.push(name);
                }
            }
        }
        aborted
    }
}
