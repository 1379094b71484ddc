//! Unit tests of [`super`] (`calls.rs`).

use std::time::Duration;

use super::*;
use crate::gpu::EmulatedBackend;

fn calls(dir: &std::path::Path, gpus: &str) -> GpuCalls {
    let emu = EmulatedBackend::open(gpus, "n0", &dir.join("emu")).unwrap();
    GpuCalls::new(Arc::new(emu), BlockingCalls::Threads)
}

#[tokio::test]
async fn one_lock_per_gpu_shared_by_clones() {
    let dir = tempfile::tempdir().unwrap();
    let a = calls(dir.path(), "A100-SXM4-40GB:2");
    assert_eq!(a.gpu_indices(), [0, 1]);
    let b = a.clone();
    let held = a.lock(0).await;
    // A clone waits for GPU 0's lock; GPU 1 is not held up.
    assert!(b.gpu_lock_for(0).try_lock().is_err());
    assert!(b.gpu_lock_for(1).try_lock().is_ok());
    let waiting = tokio::spawn(async move { b.call_locked(0, |g| g.instances_on(0)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "the call waits for the GPU's lock");
    drop(held);
    assert_eq!(waiting.await.unwrap().unwrap(), Vec::new());
    // An index the backend does not manage gets a lock of its own.
    assert!(a.gpu_lock_for(7).try_lock().is_ok());
}

#[tokio::test]
async fn calls_answer_what_the_backend_answers() {
    let dir = tempfile::tempdir().unwrap();
    let c = calls(dir.path(), "A100-SXM4-40GB:1");
    let made = c
        .call(0, |g| g.create_instance(0, "1g.5gb", 6))
        .await
        .unwrap();
    assert_eq!(c.instances_on(0).await.unwrap(), [made]);
    let e = c.call(3, |g| g.instances_on(3)).await.unwrap_err();
    assert_eq!(e.target().gpu, 3, "{e}");
    assert_eq!(c.run(|g| g.gpu_indices()).await.unwrap(), [0]);
}

#[tokio::test]
async fn a_failed_executor_names_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let c = calls(dir.path(), "A100-SXM4-40GB:1");
    let e = c
        .call(0, |_| -> Result<(), BackendError> { panic!("injected") })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, BackendError::Other { target, reason }
            if target.gpu == 0 && reason.starts_with("blocking task failed")),
        "{e}"
    );
}
