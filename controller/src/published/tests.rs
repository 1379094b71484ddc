use super::*;
use crate::mirror::desired_allocation_claims;
use das_api::health_taints;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Resource;
use serde_json::{Value, json};

const NOW: &str = "2026-01-01T00:00:00Z";

/// A device as das-kubelet-plugin publishes it (`--print-resource-slices`, H100-80GB): every
/// attribute, capacity and counter consumption of docs/design.md §3.
fn full_device(gpu: u32, profile: &str, start: i64, size: i64) -> Value {
    let label = profile.replace(['.', '+'], "-");
    let mut counters = json!({"memory": {"value": format!("{}Mi", 9984 * size)}});
    for s in start..start + size {
        counters[format!("memory-slice-{s}")] = json!({"value": "1"});
    }
    json!({
        "name": format!("gpu-{gpu}-mig-{label}-{start}"),
        "attributes": {
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "gpuIndex": {"int": gpu},
            "parentUUID": {"string": format!("GPU-{gpu:08x}-284e-d009-31e6-4707a0e9f7ce")},
            "placementSize": {"int": size},
            "placementStart": {"int": start},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "profile": {"string": profile},
            "type": {"string": "mig"}},
        "capacity": {
            "copyEngines": {"value": "1"}, "decoders": {"value": "1"}, "encoders": {"value": "0"},
            "jpegEngines": {"value": "1"}, "memory": {"value": format!("{}Mi", 9984 * size)},
            "multiprocessors": {"value": "16"}, "ofaEngines": {"value": "0"}},
        "consumesCounters": [{"counterSet": format!("gpu-{gpu}-counter-set"), "counters": counters}]
    })
}

/// A full DAS slice of pool `n0` with the given devices, with the metadata the API server adds.
fn full_slice(driver: &str, devices: Vec<Value>) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "00001-mig.das.com-n0", "uid": "slice-uid", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"a": "b"}, "annotations": {"big": "x".repeat(1000)},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n0", "uid": "node-uid",
                "controller": true}],
            "managedFields": [{"manager": "das-kubelet-plugin", "operation": "Apply",
                "apiVersion": "resource.k8s.io/v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:devices": {}}}}]},
        "spec": {"driver": driver, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 7, "resourceSliceCount": 3},
            "devices": devices}
    })
}

/// Devices of two GPUs, one with DAS and foreign taints, one device with its attributes under
/// qualified names, and one that lacks `parentUUID`.
fn mixed_devices() -> Vec<Value> {
    let mut d = Vec::new();
    for gpu in 0..2 {
        for start in 0..7 {
            d.push(full_device(gpu, "1g.10gb", start, 1));
        }
        d.push(full_device(gpu, "3g.40gb", 0, 4));
        d.push(full_device(gpu, "1g.10gb+me", 3, 1));
    }
    for dev in d
        .iter_mut()
        .filter(|d| d["attributes"]["gpuIndex"]["int"] == 1)
    {
        dev["taints"] = json!([
            {"key": "example.com/other", "value": "x", "effect": "NoSchedule"},
            {"key": health_taints::XID, "value": "79", "effect": "NoExecute",
                "timeAdded": "2026-01-01T00:00:00Z"}]);
    }
    let mut qualified = full_device(0, "2g.20gb", 2, 2);
    let attrs = qualified["attributes"].as_object_mut().unwrap();
    let plain = std::mem::take(attrs);
    for (k, v) in plain {
        attrs.insert(format!("{DRIVER_NAME}/{k}"), v);
    }
    d.push(qualified);
    let mut incomplete = full_device(0, "2g.20gb", 4, 2);
    incomplete["attributes"]
        .as_object_mut()
        .unwrap()
        .remove("parentUUID");
    d.push(incomplete);
    d
}

fn kept(v: &Value) -> PublishedSlice {
    serde_json::from_value(v.clone()).expect("decodes as a PublishedSlice")
}

fn full(v: &Value) -> ResourceSlice {
    serde_json::from_value(v.clone()).expect("decodes as a ResourceSlice")
}

#[test]
fn the_kept_slice_holds_exactly_what_the_mirror_reads() {
    let v = full_slice(DRIVER_NAME, mixed_devices());
    let s = kept(&v);
    assert_eq!(
        s.metadata,
        ObjectMeta {
            name: Some("00001-mig.das.com-n0".into()),
            uid: Some("slice-uid".into()),
            resource_version: Some("42".into()),
            ..ObjectMeta::default()
        },
        "only the fields the store keys on: no labels, annotations, owners, managed fields"
    );
    assert_eq!(s.pool, "n0");
    assert_eq!(
        s.devices.len(),
        2 * 9 + 1,
        "the device without parentUUID is left out"
    );
    let d = &s.devices[0];
    assert_eq!(
        (&*d.name, &*d.profile, &*d.gpu_uuid, d.placement),
        (
            "gpu-0-mig-1g-10gb-0",
            "1g.10gb",
            "GPU-00000000-284e-d009-31e6-4707a0e9f7ce",
            MigPlacement { start: 0, size: 1 }
        )
    );
    assert_eq!(*d.health, DeviceHealth::Healthy);
    let q = s.devices.last().unwrap();
    assert_eq!(
        (&*q.name, &*q.profile, q.placement),
        (
            "gpu-0-mig-2g-20gb-2",
            "2g.20gb",
            MigPlacement { start: 2, size: 2 }
        ),
        "attributes under qualified names are read as the mirror reads them"
    );
    let sick = s
        .devices
        .iter()
        .find(|d| d.name.starts_with("gpu-1-"))
        .unwrap();
    assert_eq!(
        *sick.health,
        DeviceHealth::Unhealthy {
            reason: "XID".into(),
            message: "the GPU of this device is unhealthy: mig.das.com/xid=79:NoExecute".into(),
        },
        "only DAS taints count"
    );
    // Equal strings and healths are shared, not copied per device.
    let gpu0: Vec<_> = s
        .devices
        .iter()
        .filter(|d| d.name.starts_with("gpu-0-"))
        .collect();
    assert!(
        gpu0.windows(2)
            .all(|w| Arc::ptr_eq(&w[0].gpu_uuid, &w[1].gpu_uuid))
    );
    assert!(Arc::ptr_eq(&s.devices[0].profile, &s.devices[1].profile));
    assert!(Arc::ptr_eq(&s.devices[0].health, &s.devices[1].health));
    assert_eq!(
        s.devices.capacity(),
        s.devices.len(),
        "no spare capacity kept"
    );
}

#[test]
fn decoding_the_json_and_trimming_a_decoded_slice_agree() {
    let v = full_slice(DRIVER_NAME, mixed_devices());
    assert_eq!(kept(&v), PublishedSlice::from(&full(&v)));
    let other = full_slice("gpu.example.com", mixed_devices());
    assert_eq!(kept(&other), PublishedSlice::from(&full(&other)));
    assert!(
        kept(&other).devices.is_empty(),
        "another driver's devices are never indexed"
    );
    assert_eq!(kept(&other).pool, "n0");
}

#[test]
fn the_mirror_is_the_same_from_kept_and_full_slices() {
    let v = full_slice(DRIVER_NAME, mixed_devices());
    let from_full = DeviceIndex::from_slices([&full(&v)]);
    let from_kept = device_index([&kept(&v)]);
    assert_eq!(from_full.len(), from_kept.len());
    let names: Vec<String> = mixed_devices()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .chain(["gpu-9-mig-1g-10gb-0".to_string()]) // not published at all
        .collect();
    for name in &names {
        assert_eq!(
            from_full.get("n0", name),
            from_kept.get("n0", name),
            "{name}"
        );
    }
    // Every device in one claim, as staged, created and inUse.
    let results: Vec<_> = names
        .iter()
        .map(|d| json!({"request": "mig", "driver": DRIVER_NAME, "pool": "n0", "device": d}))
        .collect();
    let ready = json!([{"driver": DRIVER_NAME, "pool": "n0", "device": names[0],
        "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
            "message": "", "lastTransitionTime": NOW}],
        "data": {"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
            "placement": {"start": 0, "size": 1}}}]);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
            "devices": ready}
    }))
    .unwrap();
    for node in [None, Some("n0")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
            "spec": {"containers": [], "nodeName": node}
        }))
        .unwrap();
        let a = desired_allocation_claims(&claim, std::slice::from_ref(&pod), &from_full, NOW);
        let b = desired_allocation_claims(&claim, std::slice::from_ref(&pod), &from_kept, NOW);
        assert_eq!(a.claims, b.claims);
        assert_eq!(a.unmirrored, b.unmirrored);
        assert_eq!(
            a.claims.len(),
            names.len() - 2,
            "all but the two without facts"
        );
    }
}

#[test]
fn it_is_listed_and_watched_as_resource_slices() {
    assert_eq!(
        PublishedSlice::url_path(&(), None),
        ResourceSlice::url_path(&(), None)
    );
    assert_eq!(
        PublishedSlice::api_version(&()),
        ResourceSlice::api_version(&())
    );
    assert_eq!(PublishedSlice::kind(&()), ResourceSlice::kind(&()));
    // A list page and a watch event decode (kube-runtime's watcher reads both).
    let v = full_slice(DRIVER_NAME, mixed_devices());
    let page: kube::core::ObjectList<PublishedSlice> = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "43", "continue": "next"}, "items": [v.clone(), v.clone()]
    }))
    .unwrap();
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.metadata.continue_.as_deref(), Some("next"));
    let ev: kube::core::WatchEvent<PublishedSlice> =
        serde_json::from_value(json!({"type": "MODIFIED", "object": v})).unwrap();
    assert!(matches!(ev, kube::core::WatchEvent::Modified(s) if s.devices.len() == 19));
}

/// A whole GPU as das-kubelet-plugin publishes it with `--whole-gpus` (docs/design.md §3): no
/// profile or placement attributes; it consumes every counter of its GPU's counter set.
fn full_whole_gpu(gpu: u32) -> Value {
    let mut counters = json!({"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}});
    for s in 0..8 {
        counters[format!("memory-slice-{s}")] = json!({"value": "1"});
    }
    json!({
        "name": format!("gpu-{gpu}"),
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": format!("GPU-{gpu:08x}-284e-d009-31e6-4707a0e9f7ce")},
            "gpuIndex": {"int": gpu},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "Hopper"}},
        "capacity": {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
        "consumesCounters": [{"counterSet": format!("gpu-{gpu}-counter-set"), "counters": counters}]
    })
}

#[test]
fn a_whole_gpu_is_kept_with_profile_gpu_over_the_memory_slices_it_consumes() {
    let mut dropped = full_whole_gpu(3);
    dropped.as_object_mut().unwrap().remove("consumesCounters");
    let v = full_slice(
        DRIVER_NAME,
        vec![full_device(0, "1g.10gb", 0, 1), full_whole_gpu(2), dropped],
    );
    let s = kept(&v);
    assert_eq!(s, PublishedSlice::from(&full(&v)));
    let names: Vec<&str> = s.devices.iter().map(|d| &*d.name).collect();
    assert_eq!(
        names,
        ["gpu-0-mig-1g-10gb-0", "gpu-2"],
        "a whole GPU whose counters were dropped has no known placement"
    );
    let g = &s.devices[1];
    assert_eq!(
        (&*g.profile, &*g.gpu_uuid, g.placement),
        (
            das_api::WHOLE_GPU_PROFILE,
            "GPU-00000002-284e-d009-31e6-4707a0e9f7ce",
            MigPlacement { start: 0, size: 8 }
        )
    );
    let full_index = DeviceIndex::from_slices([&full(&v)]);
    assert_eq!(
        full_index.get("n0", "gpu-2"),
        device_index([&s]).get("n0", "gpu-2")
    );
    assert_eq!(full_index.get("n0", "gpu-3"), None);
}
