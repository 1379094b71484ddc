//! Where blocking work (GPU backend calls, checkpoint writes) runs: on tokio's blocking thread
//! pool in the plugin, or inline on the calling task in tests that need the same interleaving
//! every run.

use std::sync::Arc;

/// A blocking call that did not return: its task on the blocking pool panicked or was
/// cancelled (the runtime shutting down). Says `blocking task failed: <tokio's reason>`.
#[derive(Debug, thiserror::Error)]
#[error("blocking task failed: {0}")]
pub struct BlockingError(#[from] pub tokio::task::JoinError);

/// How blocking calls are run; see [`BlockingCalls::run`].
#[derive(Clone)]
pub enum BlockingCalls {
    /// On tokio's blocking thread pool (`spawn_blocking`): what the plugin does.
    Threads,
    /// On the calling task, with as many `yield_now`s before and after as the function returns
    /// each time: other tasks run in between, in an order that depends only on the function.
    /// Tests use a seeded random function to drive adversarial but reproducible interleavings.
    Inline(Arc<dyn Fn() -> u32 + Send + Sync>),
}

impl std::fmt::Debug for BlockingCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockingCalls::Threads => f.write_str("Threads"),
            BlockingCalls::Inline(_) => f.write_str("Inline"),
        }
    }
}

impl BlockingCalls {
    /// Runs `f` and returns its result.
    ///
    /// # Errors
    /// [`BlockingError`]: the pool's task panicked or was cancelled.
    pub async fn run<T, F>(&self, f: F) -> Result<T, BlockingError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        match self {
            BlockingCalls::Threads => tokio::task::spawn_blocking(f).await.map_err(BlockingError),
            BlockingCalls::Inline(_) => Ok(self.run_brief(f).await),
        }
    }

    /// Runs `f`, which blocks only briefly, on the calling task: a small file written without
    /// fsync (the checkpoint, tens of microseconds), where handing it to the blocking pool
    /// costs more than the work (a thread wake-up and two context switches; `perf` put 16 % of
    /// the plugin's CPU in context switches, docs/benchmarks.md). In tests (`Inline`) it
    /// yields around `f` as [`Self::run`] does, so interleavings stay as adversarial.
    pub(crate) async fn run_brief<T, F>(&self, f: F) -> T
    where
        F: FnOnce() -> T,
    {
        match self {
            BlockingCalls::Threads => f(),
            BlockingCalls::Inline(yields) => {
                for _ in 0..yields() {
                    tokio::task::yield_now().await;
                }
                let r = f();
                for _ in 0..yields() {
                    tokio::task::yield_now().await;
                }
                r
            }
        }
    }
}
