//! MPS devices on the request path (docs/design.md §7, "MPS on a slice"): what a prepare
//! refuses before it creates anything. The daemons' life with a control binary is
//! `driver/tests/mps_daemon.rs`, `mps_supervision.rs`, `mps_preparer.rs` (the preparer with the
//! stand-in) and `e2e/tests/plugin_mps.rs` (they need the plugin's binary).

use std::sync::Arc;

use serde_json::json;

use super::testing::{MemoryApi, UID_A, inline, preparer};
use crate::gpu::{EmulatedBackend, GpuBackend};

fn mps(limit: &str) -> serde_json::Value {
    json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": limit}}})
}

#[tokio::test]
async fn an_mps_claim_is_refused_before_anything_is_created_when_it_cannot_be_served() {
    let dir = tempfile::tempdir().unwrap();
    let emu =
        Arc::new(EmulatedBackend::open("H100-80GB:1", "n0", &dir.path().join("emu")).unwrap());
    let api = Arc::new(MemoryApi::default());
    // The test preparer has no control binary: MPS is not available.
    let p = preparer(dir.path(), emu.clone(), api.clone(), inline());
    let one = [("gpu", "gpu-0-mig-1g-10gb-6")];
    let cases = [
        (
            mps("2Gi"),
            &one[..],
            "mps_daemon",
            "MPS is not available on this node",
        ),
        (
            mps("20Gi"),
            &one[..],
            "invalid_config",
            "sharing.mps.pinnedDeviceMemoryLimit is 20480Mi, more than the 9984Mi of a 1g.10gb slice",
        ),
        (
            mps("2Gi"),
            &[
                ("gpu", "gpu-0-mig-1g-10gb-6"),
                ("gpu", "gpu-0-mig-1g-10gb-4"),
            ][..],
            "invalid_config",
            "2 devices have sharing.strategy MPS",
        ),
    ];
    for (config, devices, label, text) in cases {
        let claim = api.allocate("ns", "c", UID_A, devices);
        api.configure(&claim, config);
        let e = p.prepare_claim(&claim).await.unwrap_err();
        assert_eq!(e.metric_label(), label, "{e}");
        assert!(e.to_string().contains(text), "{e}");
        assert!(emu.instances_on(0).unwrap().is_empty(), "{e}: a slice made");
        assert!(p.record_of(UID_A).is_none(), "{e}: a record left");
    }
}
