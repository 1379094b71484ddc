//! [`GpuCalls`]: how the plugin calls its GPU backend. The backend's methods block (NVML calls
//! take up to seconds), so they run where [`BlockingCalls`] says (tokio's blocking pool, or
//! inline in tests); and the calls that change one GPU's MIG layout, or must see it unchanged,
//! run one at a time under that GPU's lock, while different GPUs are never held up by each
//! other (docs/architecture.md, "Concurrency and slice identity", rule 1).
//!
//! One handle per plugin, cloned to every part that calls the backend (the request path, the
//! health monitor): clones share the backend, the executor and the locks.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{BackendError, GpuBackend, MigInstance, Target};
use crate::blocking::{BlockingCalls, BlockingError};

/// The GPU backend, where its blocking calls run, and one lock per GPU; cheap to clone (clones
/// share all three).
#[derive(Clone)]
pub struct GpuCalls {
    backend: Arc<dyn GpuBackend>,
    blocking: BlockingCalls,
    /// One lock per GPU the backend manages, by index: fixed at construction, as the backend's
    /// GPU indices are ([`GpuBackend::gpu_indices`]).
    locks: Arc<BTreeMap<u32, Arc<Mutex<()>>>>,
}

impl std::fmt::Debug for GpuCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCalls")
            .field("gpus", &self.gpu_indices())
            .field("blocking", &self.blocking)
            .finish_non_exhaustive()
    }
}

impl GpuCalls {
    /// Calls to `backend`, run as `blocking` says, with a lock for each of the backend's GPUs.
    pub fn new(backend: Arc<dyn GpuBackend>, blocking: BlockingCalls) -> Self {
        let locks = backend
            .gpu_indices()
            .into_iter()
            .map(|i| (i, Arc::default()))
            .collect();
        Self {
            backend,
            blocking,
            locks: Arc::new(locks),
        }
    }

    /// The backend itself, for the calls that do not block ([`GpuBackend::gpu_indices`]) and
    /// those a caller runs on a thread of its own.
    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    /// Where the blocking calls run.
    pub fn blocking(&self) -> &BlockingCalls {
        &self.blocking
    }

    /// Indices of the GPUs the backend manages, ascending (fixed at start, whether they answer
    /// or not).
    pub fn gpu_indices(&self) -> Vec<u32> {
        self.locks.keys().copied().collect()
    }

    /// The lock of GPU `gpu`: a fresh, unshared one for an index the backend does not manage (a
    /// call on it fails in the backend anyway).
    pub(crate) fn gpu_lock_for(&self, gpu: u32) -> Arc<Mutex<()>> {
        self.locks.get(&gpu).cloned().unwrap_or_default()
    }

    /// Waits for and takes GPU `gpu`'s lock (waiters get it in arrival order), held until the
    /// guard is dropped: for a sequence of calls that must see the GPU's layout unchanged.
    pub async fn lock(&self, gpu: u32) -> OwnedMutexGuard<()> {
        self.gpu_lock_for(gpu).lock_owned().await
    }

    /// Runs `f` on the backend where blocking calls run, and returns what it returns.
    ///
    /// # Errors
    /// [`BlockingError`]: the executor failed (the blocking pool's task panicked or was
    /// cancelled).
    pub async fn run<T, F>(&self, f: F) -> Result<T, BlockingError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn GpuBackend) -> T + Send + 'static,
    {
        let backend = self.backend.clone();
        self.blocking.run(move || f(backend.as_ref())).await
    }

    /// Runs the backend call `f` about GPU `gpu` where blocking calls run, without its lock.
    ///
    /// # Errors
    /// What the backend answered; a failed executor becomes [`BackendError::Other`] naming GPU
    /// `gpu`.
    pub async fn call<T, F>(&self, gpu: u32, f: F) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn GpuBackend) -> Result<T, BackendError> + Send + 'static,
    {
        match self.run(f).await {
            Ok(r) => r,
            Err(e) => Err(BackendError::Other {
                target: Target::gpu(gpu),
                reason: e.to_string(),
            }),
        }
    }

    /// [`Self::call`] under GPU `gpu`'s lock, taken before and released after the call.
    ///
    /// # Errors
    /// As [`Self::call`].
    pub async fn call_locked<T, F>(&self, gpu: u32, f: F) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn GpuBackend) -> Result<T, BackendError> + Send + 'static,
    {
        let _held = self.lock(gpu).await;
        self.call(gpu, f).await
    }

    /// The MIG instances on GPU `gpu`, read from the GPU now ([`GpuBackend::instances_on`]),
    /// without its lock.
    ///
    /// # Errors
    /// As [`Self::call`].
    pub async fn instances_on(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.call(gpu, move |b| b.instances_on(gpu)).await
    }
}

#[cfg(test)]
mod tests;
