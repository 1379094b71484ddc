//! Polling for conditions in end-to-end tests: every check has a deadline and a message that
//! says what was awaited, so a failing test explains itself.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How long a test waits for one condition on the cluster (a pod to go, a slice to be
/// destroyed, a controller to lead…) unless it says otherwise.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout` with `what`.
/// Errors from `check` are retried (the API may be briefly unavailable) and the last one is
/// reported on timeout.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
