//! Unit tests of [`super`] (`layers/mps/plan.rs`): which devices get MPS, with which limits, and what
//! is refused.

use std::collections::BTreeMap;

use das_api::device_config::{MigDeviceConfig, decode};
use serde_json::json;

use super::*;
use crate::claims::plan::DeviceKind;

fn planned(device: &str, request: &str, kind: DeviceKind) -> Planned {
    crate::claims::testing::planned(device, request, kind, false)
}

fn config(sharing: serde_json::Value) -> MigDeviceConfig {
    decode(&json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig", "sharing": sharing}))
        .unwrap()
}

fn mps() -> MigDeviceConfig {
    config(
        json!({"strategy": "MPS", "mps": {"activeThreadPercentage": 50, "pinnedDeviceMemoryLimit": "2Gi"}}),
    )
}

#[test]
fn an_mps_request_gets_its_limits_and_the_others_stay_exclusive() {
    let configs = BTreeMap::from([
        ("shared".to_string(), mps()),
        (
            "alone".to_string(),
            config(json!({"strategy": "Exclusive"})),
        ),
    ]);
    let got = with_mps(
        vec![
            planned("gpu-0-mig-1g-10gb-6", "shared", DeviceKind::Mig),
            planned("gpu-0-mig-1g-10gb-4", "alone", DeviceKind::Mig),
            planned("gpu-0-mig-1g-10gb-2", "unconfigured", DeviceKind::Mig),
        ],
        &configs,
    )
    .unwrap();
    assert_eq!(
        got[0].mps,
        Some(MpsLimits {
            active_thread_percentage: Some(50),
            pinned_device_memory_limit_mib: Some(2048),
        })
    );
    assert_eq!((&got[1].mps, &got[2].mps), (&None, &None));
    // MPS without `mps`: a daemon without limits.
    let bare = BTreeMap::from([("r".to_string(), config(json!({"strategy": "MPS"})))]);
    let got = with_mps(vec![planned("d", "r", DeviceKind::Mig)], &bare).unwrap();
    assert_eq!(got[0].mps, Some(MpsLimits::default()));
}

#[test]
fn mps_on_a_whole_gpu_or_on_two_devices_of_a_claim_is_refused_with_what_to_do() {
    let configs = BTreeMap::from([("r".to_string(), mps())]);
    let e = with_mps(vec![planned("gpu-1", "r", DeviceKind::WholeGpu)], &configs).unwrap_err();
    assert_eq!(e.metric_label(), "invalid_config");
    assert!(
        e.to_string()
            .contains("device gpu-1 is a whole GPU held alone, and DAS serves MPS on MIG slices and on shares of a GPU; to share the GPU by memory ask for DeviceClass gpu.shared.mig.das.com"),
        "{e}"
    );
    let two = vec![
        planned("gpu-0-mig-1g-10gb-6", "r", DeviceKind::Mig),
        planned("gpu-0-mig-1g-10gb-4", "r", DeviceKind::Mig),
    ];
    let e = with_mps(two, &configs).unwrap_err();
    assert!(
        e.to_string().contains(
            "2 devices have sharing.strategy MPS (gpu-0-mig-1g-10gb-6, gpu-0-mig-1g-10gb-4)"
        ),
        "{e}"
    );
}

#[test]
fn a_pinned_limit_must_fit_the_slice() {
    let configs = BTreeMap::from([("r".to_string(), mps())]);
    let p = with_mps(
        vec![planned("gpu-0-mig-1g-10gb-6", "r", DeviceKind::Mig)],
        &configs,
    )
    .unwrap();
    assert!(check_limits(&p, |_| Some(9984)).is_ok());
    assert!(
        check_limits(&p, |_| None).is_ok(),
        "unknown profile: nothing to check"
    );
    let e = check_limits(&p, |_| Some(1024)).unwrap_err();
    assert!(
        e.to_string().contains("request \"r\", device gpu-0-mig-1g-10gb-6: sharing.mps.pinnedDeviceMemoryLimit is 2048Mi, more than the 1024Mi of a 1g.10gb slice; valid: 1Mi to 1024Mi"),
        "{e}"
    );
}
