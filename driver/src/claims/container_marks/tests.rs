//! Unit tests of [`super`] (`container_marks.rs`): a claim's marks from its record and CDI spec,
//! and which runtime specs carry them.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::claims::cdi::{ContainerEdits, Device, DeviceNode, mig_uuid_env_key};
use crate::claims::checkpoint::{Checkpoint, DeviceKind, RecordedDevice};

const UID: &str = "0a1b2c3d-0000-4000-8000-000000000001";

fn device(name: &str, kind: DeviceKind) -> RecordedDevice {
    RecordedDevice {
        time_slice: None,
        acquired: false,
        kind,
        request: "gpu".into(),
        pool: "node-a".into(),
        device: name.into(),
        gpu_index: 0,
        gpu_uuid: "GPU-0".into(),
        profile: "1g.10gb".into(),
        placement_start: 0,
        placement_size: 1,
        instance: None,
        mps: None,
        share: None,
    }
}

fn node(path: &str) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        host_path: None,
        node_type: Some("c".into()),
        major: None,
        minor: None,
        file_mode: None,
        permissions: None,
        uid: None,
        gid: None,
    }
}

fn spec(devices: Vec<(&str, Vec<&str>)>) -> Spec {
    Spec {
        cdi_version: "0.5.0".into(),
        kind: "das.com/mig".into(),
        annotations: BTreeMap::new(),
        devices: devices
            .into_iter()
            .map(|(name, nodes)| Device {
                name: format!("{UID}-{name}"),
                annotations: BTreeMap::new(),
                container_edits: ContainerEdits {
                    device_nodes: nodes.into_iter().map(node).collect(),
                    ..Default::default()
                },
            })
            .collect(),
        container_edits: None,
    }
}

fn record(devices: Vec<RecordedDevice>) -> ClaimRecord {
    let mut cp = Checkpoint::new("boot");
    cp.set_completed(UID, "ns", "c", devices, BTreeMap::new());
    cp.get(UID).unwrap().clone()
}

/// A MIG device's capability nodes mark the claim, its parent GPU node does not (every MIG instance of
/// the GPU shares it); a whole GPU's node does. The variables mark it whatever the spec.
#[test]
fn marks_are_the_claims_variables_and_its_own_device_nodes() {
    let r = record(vec![
        device("gpu-0-mig-1g-10gb-3", DeviceKind::Mig),
        device("gpu-1", DeviceKind::WholeGpu),
    ]);
    let s = spec(vec![
        (
            "gpu-0-mig-1g-10gb-3",
            vec![
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22",
            ],
        ),
        ("gpu-1", vec!["/dev/nvidia1"]),
        ("not-ours", vec!["/dev/nvidia-caps/nvidia-cap99"]),
    ]);
    let m = claim_marks(UID, &r, Some(&s));
    assert_eq!(
        m.device_paths,
        [
            "/dev/nvidia-caps/nvidia-cap21",
            "/dev/nvidia-caps/nvidia-cap22",
            "/dev/nvidia1"
        ]
    );
    let escaped = UID.replace('-', "_");
    assert_eq!(
        m.env_prefixes,
        [
            format!("DAS_MIG_UUID_{escaped}_"),
            format!("DAS_GPU_UUID_{escaped}_")
        ]
    );
    // The variable the CDI spec really sets starts with the prefix.
    assert!(mig_uuid_env_key(UID, "gpu", 0).starts_with(&m.env_prefixes[0]));
    // Without a spec (a guard whose instances are gone) only the variables mark it.
    assert!(claim_marks(UID, &r, None).device_paths.is_empty());
}

/// A runtime spec carries a mark through its environment or a device node; a privileged
/// container's nodes say nothing (it has every node of the host), its environment does.
#[test]
fn a_runtime_spec_carries_a_mark_by_variable_or_device_node() {
    let r = record(vec![device("gpu-0-mig-1g-10gb-3", DeviceKind::Mig)]);
    let s = spec(vec![(
        "gpu-0-mig-1g-10gb-3",
        vec!["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21"],
    )]);
    let m = claim_marks(UID, &r, Some(&s));
    let var = format!("{}=MIG-1", mig_uuid_env_key(UID, "gpu", 0));
    let by_env = json!({"process": {"env": ["PATH=/bin", var]}});
    assert!(
        spec_mark(&by_env, &m)
            .unwrap()
            .starts_with("its CDI variable DAS_MIG_UUID_")
    );
    let by_node = json!({"process": {"env": []}, "linux": {"devices": [
        {"path": "/dev/nvidia0"}, {"path": "/dev/nvidia-caps/nvidia-cap21"}]}});
    assert_eq!(
        spec_mark(&by_node, &m).as_deref(),
        Some("device node /dev/nvidia-caps/nvidia-cap21")
    );
    let parent_only = json!({"linux": {"devices": [{"path": "/dev/nvidia0"}]}});
    assert_eq!(spec_mark(&parent_only, &m), None);
    let other_claim = json!({"process": {"env": [
        format!("{}=MIG-2", mig_uuid_env_key("0a1b2c3d-0000-4000-8000-000000000002", "gpu", 0))]}});
    assert_eq!(spec_mark(&other_claim, &m), None);
    let privileged = json!({"linux": {
        "devices": [{"path": "/dev/nvidia-caps/nvidia-cap21"}],
        "resources": {"devices": [{"allow": false, "access": "rwm"}, {"allow": true, "access": "rwm"}]}}});
    assert_eq!(spec_mark(&privileged, &m), None);
    let privileged_with_var = json!({"process": {"env": [var]}, "linux": {
        "resources": {"devices": [{"allow": true, "access": "rwm"}]}}});
    assert!(spec_mark(&privileged_with_var, &m).is_some());
    // A device rule for one node is no privilege.
    let one_rule = json!({"linux": {
        "devices": [{"path": "/dev/nvidia-caps/nvidia-cap21"}],
        "resources": {"devices": [{"allow": true, "type": "c", "major": 509, "minor": 21, "access": "rw"}]}}});
    assert!(spec_mark(&one_rule, &m).is_some());
}
