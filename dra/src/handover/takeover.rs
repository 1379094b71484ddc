//! The new instance's side: [`take_over`] waits for the node, announcing the wait, and
//! [`check_then_take_over`] first runs the checks that can fail without touching the node's
//! shared state, so a broken instance never asks the active one to hand over.

use std::io;
use std::path::Path;
use std::time::Duration;

use super::lock::{Active, Waiting};

/// Why [`check_then_take_over`] did not make this instance the active one.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    /// The start-up checks failed: this instance cannot serve the node, and never asked for it.
    #[error("this instance cannot serve the node (an active instance keeps serving it)")]
    Check(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The start-up checks panicked (or their task was cancelled).
    #[error("the start-up checks failed")]
    CheckPanicked(#[source] tokio::task::JoinError),
    /// A lock file in the state dir cannot be created or locked.
    #[error("lock {}", dir.display())]
    Lock {
        /// The state dir.
        dir: std::path::PathBuf,
        /// The I/O error.
        source: io::Error,
    },
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
        "another plugin instance is active on this node (rolling update): waiting for it to hand over"
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
/// opening the devices, reading their inventory, finding the files the driver needs), and
/// [`take_over`] only once it succeeded. A failing `check` returns its error before any wait is
/// announced: the active instance never hears of this one and keeps serving. Cancel it by
/// dropping the future (a `check` in flight then runs on in its thread).
///
/// # Errors
/// [`TakeOverError::Check`] with `check`'s error (the pod then restarts, the node still served
/// by the active instance); [`TakeOverError::Lock`] when a lock file cannot be created or locked.
pub async fn check_then_take_over<T, E, F>(
    dir: &Path,
    poll: Duration,
    check: F,
) -> Result<(T, Active), TakeOverError>
where
    T: Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    let checked = tokio::task::spawn_blocking(check)
        .await
        .map_err(TakeOverError::CheckPanicked)?
        .map_err(|e| TakeOverError::Check(e.into()))?;
    let active = take_over(dir, poll)
        .await
        .map_err(|source| TakeOverError::Lock {
            dir: dir.to_path_buf(),
            source,
        })?;
    Ok((checked, active))
}
