//! Unit tests of [`super`] (`layers/time_slicing/plan.rs`): which devices are time-sliced, and
//! what is refused.

use std::collections::BTreeMap;

use das_api::device_config::{MigDeviceConfig, TimeSliceInterval, decode};
use serde_json::json;

use super::*;
use crate::claims::plan::DeviceKind;
use crate::claims::testing::planned;

fn config(sharing: serde_json::Value) -> MigDeviceConfig {
    decode(&json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig", "sharing": sharing}))
        .unwrap()
}

#[test]
fn a_whole_gpu_gets_its_requests_time_slice_and_others_none() {
    let configs = BTreeMap::from([
        (
            "tick".to_string(),
            config(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})),
        ),
        (
            "plain".to_string(),
            config(json!({"strategy": "Exclusive"})),
        ),
    ]);
    let out = with_time_slice(
        vec![
            planned("gpu-1", "tick", DeviceKind::WholeGpu, false),
            planned("gpu-2", "plain", DeviceKind::WholeGpu, false),
            planned("gpu-0-mig-1g-10gb-6", "other", DeviceKind::Mig, false),
        ],
        &configs,
    )
    .unwrap();
    let slices: Vec<Option<TimeSliceInterval>> = out.iter().map(|p| p.time_slice).collect();
    assert_eq!(slices, [Some(TimeSliceInterval::Long), None, None]);
}

#[test]
fn time_slicing_a_mig_slice_or_a_share_is_refused_with_what_to_do() {
    let configs = BTreeMap::from([(
        "tick".to_string(),
        config(json!({"strategy": "TimeSlicing"})),
    )]);
    for (device, shared) in [
        ("gpu-0-mig-1g-10gb-6", false),
        ("gpu-0-mig-1g-10gb-6-shared", true),
    ] {
        let e = with_time_slice(
            vec![planned(device, "tick", DeviceKind::Mig, shared)],
            &configs,
        )
        .unwrap_err();
        assert_eq!(e.metric_label(), "invalid_config");
        let text = e.to_string();
        assert!(
            text.contains(&format!("device {device} is a MIG slice"))
                && text
                    .contains("TimeSlicing applies to whole GPUs only (DeviceClass gpu.das.com)")
                && text.contains("use sharing.strategy MPS"),
            "{text}"
        );
    }
}
