//! Unit tests of the whole-GPU kind's decisions ([`super::plan`]): a device named like a whole
//! GPU that the node does not publish is refused as such, and a whole GPU is prepared only on
//! its GPU, with the UUID it was published with and MIG mode off.

use std::collections::{BTreeMap, HashMap};

use das_api::DRIVER_NAME;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use super::plan::is_whole_gpu_name;
use crate::claims::checkpoint::{Checkpoint, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::whole_gpu_unavailable;
use crate::claims::plan::{DeviceKind, record, resolve_allocation, same_devices};
use crate::claims::testing::planned_on;
use crate::gpu::GpuInfo;

fn holding(uid: &str, devices: Vec<RecordedDevice>) -> Checkpoint {
    let mut cp = Checkpoint::new("boot");
    cp.set_completed(uid, "ns", uid, devices, BTreeMap::new());
    cp
}

/// A device named like a whole GPU that this node does not publish gets the whole-GPU error,
/// with what to do; a record of the same name but another kind is another allocation.
#[test]
fn an_unpublished_whole_gpu_is_refused_as_such() {
    let devices: HashMap<_, _> = [("gpu-0".to_string(), planned_on(0, None, "gpu").at)].into();
    let rc = |device: &str| -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER_NAME, "pool": "n0", "device": device}
            ]}}}
        }))
        .unwrap()
    };
    let claim = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "uid-1".into(),
    };
    let p = resolve_allocation(&claim, Some(&rc("gpu-0")), "n0", &devices, 4).unwrap();
    assert_eq!(p, [planned_on(0, None, "gpu")]);
    let e = resolve_allocation(&claim, Some(&rc("gpu-1")), "n0", &devices, 4).unwrap_err();
    assert_eq!(e.metric_label(), "whole_gpu_unavailable");
    assert!(e.to_string().contains("--whole-gpus"), "{e}");
    for name in ["gpu-", "gpu-1x", "gpu-1-mig-1g-5gb-0"] {
        assert!(!is_whole_gpu_name(name), "{name}");
    }
    let mut other_kind = record(&p[0]);
    other_kind.kind = DeviceKind::Mig;
    let mut r = holding("uid-1", vec![other_kind])
        .claims
        .remove("uid-1")
        .unwrap();
    assert!(!same_devices(&r, &p));
    r.devices[0].kind = DeviceKind::WholeGpu;
    assert!(same_devices(&r, &p));
}

/// Before a whole GPU is prepared: its GPU answers, with the UUID it was published with, and
/// MIG mode off; each refusal says what is wrong and what to do.
#[test]
fn a_whole_gpu_is_prepared_only_on_its_gpu_with_mig_mode_off() {
    let gpu = |uuid: &str, mig_enabled: bool| GpuInfo {
        uuid: uuid.into(),
        mig_enabled,
        ..GpuInfo::for_tests(0, "A100-SXM4-40GB")
    };
    let p = planned_on(0, None, "gpu");
    assert_eq!(whole_gpu_unavailable(&p, &[gpu("GPU-0", false)]), None);
    let why = |inventory: &[GpuInfo]| whole_gpu_unavailable(&p, inventory).unwrap();
    assert!(why(&[]).contains("not in this node's inventory"));
    assert!(why(&[gpu("GPU-9", false)]).contains("now has UUID GPU-9"));
    let on = why(&[gpu("GPU-0", true)]);
    assert!(
        on.contains("MIG mode on") && on.contains("nvidia-smi -i 0 -mig 0"),
        "{on}"
    );
}
