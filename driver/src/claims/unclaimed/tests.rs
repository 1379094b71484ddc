//! Unit tests of [`super`] (`unclaimed.rs`): the preparer as the health monitor's source.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::blocking::BlockingCalls;
use crate::claims::testing::{MemoryApi, NODE};
use crate::gpu::{GpuBackend, GpuCalls, Placement};
use crate::health::monitor::INVENTORY_INTERVAL;
use crate::health::{HealthBook, HealthMonitor, HealthPolicy};
use crate::metrics::Metrics;
use crate::publish::desired::HealthFacts;

/// Issue 30 item 5: on real GPUs the unclaimed-instance check reads NVML's instance lists
/// once per `INSTANCE_REFRESH`, not at every check, and an instance made with `nvidia-smi`
/// is still withdrawn: one check after the next re-read.
#[tokio::test]
async fn on_nvml_the_unclaimed_check_reads_the_instances_once_per_refresh_period() {
    use crate::gpu::nvml::{FakeGpuSpec, FakeNvml, INSTANCE_REFRESH, NvmlBackend, NvmlOptions};
    let dir = tempfile::tempdir().unwrap();
    let (base, offset) = (
        std::time::Instant::now(),
        Arc::new(Mutex::new(Duration::ZERO)),
    );
    let now = offset.clone();
    let model = crate::gpu::find_model("A100-SXM4-40GB").unwrap().unwrap();
    let profiles = model.profiles.len() as u64;
    let nvml = Arc::new(
        NvmlBackend::new(
            FakeNvml::new(vec![FakeGpuSpec::mig(model, true)]),
            NvmlOptions {
                proc_root: "/nonexistent-proc".into(),
                enable_mig_mode: false,
                ..NvmlOptions::default()
            },
        )
        .unwrap()
        .with_clock(Arc::new(move || base + *now.lock().unwrap())),
    );
    let api = Arc::new(MemoryApi::default());
    let preparer = Arc::new(crate::claims::testing::preparer(
        dir.path(),
        nvml.clone(),
        api.clone(),
        BlockingCalls::Threads,
    ));
    let inventory = nvml.inventory().unwrap();
    let (tx, _facts) = tokio::sync::watch::channel(HealthFacts::default());
    let monitor = HealthMonitor::new(
        HealthBook::new(HealthPolicy::default(), inventory.iter().map(|g| g.index)),
        GpuCalls::new(nvml.clone(), BlockingCalls::Threads),
        NODE,
        &inventory,
        tx,
        api.clone(),
        Arc::new(Metrics::new()),
    )
    .with_unclaimed_instances(preparer, Vec::new());
    let reads = || nvml.api().call_counts()["nvmlDeviceGetGpuInstances"] / profiles;

    let mut withdrawn_at = None;
    for check in 0..14 {
        let t = INVENTORY_INTERVAL * check;
        if check == 1 {
            // An administrator makes a 1g.5gb at 0 with nvidia-smi.
            nvml.api()
                .admin_create(0, 19, Placement { start: 0, size: 1 });
        }
        if monitor.check_unclaimed().await {
            withdrawn_at.get_or_insert(t);
        }
        *offset.lock().unwrap() += INVENTORY_INTERVAL;
    }
    assert_eq!(
        withdrawn_at,
        Some(INSTANCE_REFRESH + INVENTORY_INTERVAL),
        "seen at the re-read, withdrawn at the check after"
    );
    assert_eq!(reads(), 2, "14 checks, NVML read at 0 s and 60 s");
    let reasons: Vec<String> = api
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|(r, _)| r.clone())
        .collect();
    assert_eq!(reasons, ["UnclaimedMigInstance"]);
}
