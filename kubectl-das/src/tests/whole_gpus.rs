//! Whole GPUs (docs/design.md §7, "Whole GPUs") in the inventory, the picture and the free
//! counts: a device `gpu-<index>` with `type: gpu`, no placement attributes, consuming every
//! counter of its GPU's counter set. The slices are written by hand here, in the shape of
//! docs/design.md §3, rather than taken from das-driver's slice builder as in the parent module.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

use super::{claim, free_of, plain, slices};
use crate::free::free_profiles;
use crate::inventory::Inventory;
use crate::picture::{Options, pictures, render_text};

/// Node `node` with `gpus` H100s whose MIG mode is off, as the plugin publishes them with
/// `--whole-gpus`: one counter slice (8 memory slices per GPU) and one slice of whole GPUs.
/// Without `counters`, the API server dropped the counters (no `DRAPartitionableDevices`).
fn whole_gpu_slices(node: &str, gpus: u32, counters: bool) -> Vec<ResourceSlice> {
    let gpu_counters = || {
        let mut c = json!({"memory": {"value": "80Gi"}});
        for s in 0..8 {
            c[format!("memory-slice-{s}")] = json!({"value": "1"});
        }
        c
    };
    let sets: Vec<Value> = (0..gpus)
        .map(|g| json!({"name": format!("gpu-{g}-counter-set"), "counters": gpu_counters()}))
        .collect();
    let devices: Vec<Value> = (0..gpus)
        .map(|g| {
            let mut d = json!({"name": format!("gpu-{g}"), "attributes": {
                "type": {"string": "gpu"}, "gpuIndex": {"int": g},
                "uuid": {"string": format!("GPU-whole-{g}")},
                "productName": {"string": "NVIDIA H100 80GB HBM3"}}});
            if counters {
                d["consumesCounters"] = json!([{"counterSet": format!("gpu-{g}-counter-set"),
                    "counters": gpu_counters()}]);
            }
            d
        })
        .collect();
    let slice = |name: &str, spec: Value| -> ResourceSlice {
        let mut spec = spec;
        spec["driver"] = json!(das_api::DRIVER_NAME);
        spec["nodeName"] = json!(node);
        spec["pool"] = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
        serde_json::from_value(
            json!({"metadata": {"name": format!("{name}-{node}")}, "spec": spec}),
        )
        .unwrap()
    };
    let mut out = vec![slice("00000-mig.das.com", json!({"devices": devices}))];
    if counters {
        out.push(slice("00001-mig.das.com", json!({"sharedCounters": sets})));
    }
    out
}

/// `claim` for whole GPUs: the plugin's data has profile `gpu`, every memory slice, no MIG UUID.
fn whole_gpu_claim(
    ns: &str,
    name: &str,
    pod: Option<&str>,
    devices: &[(&str, &str)],
) -> ResourceClaim {
    let mut c = claim(ns, name, pod, devices, true);
    for d in c.status.as_mut().unwrap().devices.iter_mut().flatten() {
        d.data.as_mut().unwrap().0 = json!({"migUUID": "", "gpuUUID": "GPU-whole-1",
            "profile": "gpu", "placement": {"start": 0, "size": 8}});
    }
    c
}

#[test]
fn a_whole_gpu_held_by_one_pod_is_its_whole_row() {
    let mut all = slices("n0", "H100-80GB:1");
    all.extend(whole_gpu_slices("n1", 2, true));
    let claims = [
        claim(
            "a",
            "c1",
            Some("small"),
            &[("n0", "gpu-0-mig-1g-10gb-0")],
            true,
        ),
        whole_gpu_claim("a", "c2", Some("big"), &[("n1", "gpu-1")]),
    ];
    let inv = Inventory::new(&all, &claims).unwrap();
    let gpus: Vec<(&str, u32, u32, &str)> = inv
        .gpus
        .iter()
        .map(|g| (g.node.as_str(), g.index, g.memory_slices, g.uuid.as_str()))
        .collect();
    assert_eq!(
        gpus[1..],
        [("n1", 0, 8, "GPU-whole-0"), ("n1", 1, 8, "GPU-whole-1")]
    );
    let held = &inv.held[1];
    assert_eq!(
        (
            held.profile.as_str(),
            held.start,
            held.size,
            held.mig_uuid.as_deref()
        ),
        ("gpu", 0, 8, None)
    );
    let pics = pictures(&inv, None);
    assert_eq!(pics[2].free_memory_slices, 0);
    assert_eq!(pics[1].free_memory_slices, 8);
    let text = render_text(&pics, &plain(Options::default()));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].ends_with("[A . . . . . . .]"), "{text}");
    assert!(
        lines[2].starts_with("n1") && lines[2].ends_with("[. . . . . . . .]"),
        "{text}"
    );
    assert!(
        lines[3].starts_with("n1") && lines[3].ends_with("[B B B B B B B B]"),
        "{text}"
    );
    let legend: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("B "))
        .copied()
        .collect();
    assert_eq!(legend.len(), 1, "one legend row for the whole GPU: {text}");
    assert!(
        legend[0].contains("big")
            && legend[0].contains(" gpu ")
            && legend[0].contains("(whole GPU)"),
        "{text}"
    );
}

#[test]
fn free_lists_whole_gpus_as_profile_gpu() {
    let all = whole_gpu_slices("n1", 2, true);
    let inv = Inventory::new(&all, &[]).unwrap();
    let rows = free_profiles(&inv);
    let gpu = free_of(&rows, "n1", "gpu");
    assert_eq!(
        (gpu.count, gpu.size, gpu.per_gpu.clone()),
        (2, 8, [(0, 1), (1, 1)].into())
    );
    assert_eq!(rows.len(), 1, "no MIG profile on MIG-off GPUs: {rows:#?}");
    let claims = [whole_gpu_claim("a", "c", Some("p"), &[("n1", "gpu-1")])];
    let inv = Inventory::new(&all, &claims).unwrap();
    let gpu = free_of(&free_profiles(&inv), "n1", "gpu").clone();
    assert_eq!((gpu.count, gpu.per_gpu), (1, [(0, 1), (1, 0)].into()));
    let text = crate::free_text(&free_profiles(&inv), false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("n1") && l.contains(" gpu ")),
        "{text}"
    );
}

#[test]
fn a_whole_gpu_without_published_counters_still_lists() {
    // Counters dropped by the API server: the GPU's memory slices are unknown, so the row is
    // empty, but the whole GPU and its holder are still listed.
    let all = whole_gpu_slices("n1", 1, false);
    let claims = [whole_gpu_claim("a", "c", Some("p"), &[("n1", "gpu-0")])];
    let inv = Inventory::new(&all, &claims).unwrap();
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.held.len(), 1);
    assert_eq!(inv.held[0].profile, "gpu");
}

/// A mixed node as das-driver publishes it (`L4:1,H100-80GB:1` with `--whole-gpus`): the L4 has
/// no MIG, so its counter set has one memory slice and its row one cell, free or held whole;
/// `free` counts it as profile `gpu` beside the H100's profiles.
#[test]
fn a_gpu_without_mig_is_one_cell_held_whole() {
    let all = slices("n0", "L4:1,H100-80GB:1");
    let inv = Inventory::new(&all, &[]).unwrap();
    let gpus: Vec<(u32, u32, &str)> = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.memory_slices, g.product.as_str()))
        .collect();
    assert_eq!(gpus, [(0, 1, "NVIDIA L4"), (1, 8, "NVIDIA H100 80GB HBM3")]);
    assert!(inv.gpus[0].uuid.starts_with("GPU-"), "{:?}", inv.gpus[0]);
    let l4 = inv
        .device("n0", "gpu-0")
        .expect("the L4 is published whole");
    assert_eq!((l4.profile.as_str(), l4.start, l4.size), ("gpu", 0, 1));
    // Free: one whole GPU, and every H100 profile.
    let rows = free_profiles(&inv);
    let gpu = free_of(&rows, "n0", "gpu");
    assert_eq!(
        (gpu.count, gpu.size, gpu.per_gpu.clone()),
        (1, 1, [(0, 1)].into())
    );
    assert_eq!(free_of(&rows, "n0", "1g.10gb").count, 7);
    let text = render_text(&pictures(&inv, None), &plain(Options::default()));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[1].contains("NVIDIA L4") && lines[1].ends_with("[.]"),
        "{text}"
    );

    // An L4 pod holds it whole (the plugin's status data: profile gpu, placement {0, 1}) and a
    // slice pod a 1g.10gb of the H100.
    let mut whole = whole_gpu_claim("a", "w", Some("l4-pod"), &[("n0", "gpu-0")]);
    for d in whole.status.as_mut().unwrap().devices.iter_mut().flatten() {
        d.data.as_mut().unwrap().0["placement"] = json!({"start": 0, "size": 1});
    }
    let slice = claim(
        "a",
        "s",
        Some("slice-pod"),
        &[("n0", "gpu-1-mig-1g-10gb-6")],
        true,
    );
    let inv = Inventory::new(&all, &[whole, slice]).unwrap();
    let pics = pictures(&inv, None);
    assert_eq!(
        (pics[0].free_memory_slices, pics[1].free_memory_slices),
        (0, 7)
    );
    let text = render_text(&pics, &plain(Options::default()));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].ends_with("[A]"), "{text}");
    assert!(lines[2].ends_with("[. . . . . . B .]"), "{text}");
    let legend: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("A "))
        .copied()
        .collect();
    assert!(
        legend.len() == 1
            && legend[0].contains("l4-pod")
            && legend[0].contains(" gpu ")
            && legend[0].contains("(whole GPU)"),
        "{text}"
    );
    assert_eq!(free_of(&free_profiles(&inv), "n0", "gpu").count, 0);
}
