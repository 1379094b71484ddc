//! Unit tests of the inventory, the picture and the free-placement simulation, on the
//! ResourceSlices das-driver's slice builder publishes for emulated GPUs (not hand-written ones).

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
    DeviceTaint, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use das_driver::gpu::emulated::emulated_inventory;
use das_driver::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};

use crate::free::{FreeProfile, free_profiles};
use crate::inventory::Inventory;
use crate::picture::{Options, pictures, render_text};

mod shares;
mod whole_gpus;

/// The slices das-kubelet-plugin publishes on `node` for `gpus` (`H100-80GB:2`).
fn slices(node: &str, gpus: &str) -> Vec<ResourceSlice> {
    let inv = emulated_inventory(gpus, node).expect("emulated GPUs");
    desired_resource_slices(node, &inv, ResourceSliceLayout::SeparateCounterSlices)
        .expect("slices")
        .into_iter()
        .map(|s| s.slice)
        .collect()
}

/// A claim `ns/name` allocated `devices` (pool, device) of our driver, reserved for `pod`, and
/// carved (MIG UUID in its device status) when `carved`.
fn claim(
    ns: &str,
    name: &str,
    pod: Option<&str>,
    devices: &[(&str, &str)],
    carved: bool,
) -> ResourceClaim {
    let results = devices
        .iter()
        .map(|(pool, device)| DeviceRequestAllocationResult {
            driver: das_api::DRIVER_NAME.into(),
            pool: pool.to_string(),
            device: device.to_string(),
            request: "mig".into(),
            ..Default::default()
        })
        .collect();
    let statuses = devices
        .iter()
        .map(|(pool, device)| AllocatedDeviceStatus {
            driver: das_api::DRIVER_NAME.into(),
            pool: pool.to_string(),
            device: device.to_string(),
            data: Some(RawExtension(serde_json::json!({
                "migUUID": format!("MIG-{device}"), "gpuUUID": "GPU-x", "profile": "p",
                "placement": {"start": 0, "size": 1}
            }))),
            ..Default::default()
        })
        .collect();
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            reserved_for: pod.map(|p| {
                vec![ResourceClaimConsumerReference {
                    resource: "pods".into(),
                    name: p.into(),
                    uid: format!("uid-{p}"),
                    ..Default::default()
                }]
            }),
            devices: carved.then_some(statuses),
        }),
        ..Default::default()
    }
}

fn free_of<'a>(rows: &'a [FreeProfile], node: &str, profile: &str) -> &'a FreeProfile {
    rows.iter()
        .find(|f| f.node == node && f.profile == profile)
        .unwrap_or_else(|| panic!("{node} {profile} in {rows:#?}"))
}

fn plain(opts: Options) -> Options {
    Options {
        color: false,
        ..opts
    }
}

#[test]
fn the_inventory_has_every_gpu_with_its_memory_slices_and_product() {
    let mut all = slices("n0", "H100-80GB:2");
    all.extend(slices("n1", "A30-24GB:1"));
    let inv = Inventory::new(&all, &[]).unwrap();
    let gpus: Vec<(&str, u32, u32)> = inv
        .gpus
        .iter()
        .map(|g| (g.node.as_str(), g.index, g.memory_slices))
        .collect();
    assert_eq!(gpus, [("n0", 0, 8), ("n0", 1, 8), ("n1", 0, 4)]);
    assert!(inv.gpus[0].product.contains("H100"), "{:?}", inv.gpus[0]);
    assert!(inv.gpus[0].uuid.starts_with("GPU-"), "{:?}", inv.gpus[0]);
    assert_eq!(inv.nodes(), ["n0", "n1"]);
}

#[test]
fn the_picture_letters_each_pod_on_its_memory_slices_with_a_legend() {
    let all = slices("n0", "H100-80GB:2");
    let claims = [
        claim(
            "team-a",
            "c1",
            Some("train"),
            &[("n0", "gpu-0-mig-3g-40gb-4")],
            true,
        ),
        claim(
            "team-b",
            "c2",
            Some("infer"),
            &[("n0", "gpu-0-mig-1g-10gb-0"), ("n0", "gpu-1-mig-2g-20gb-2")],
            true,
        ),
        claim(
            "team-b",
            "c3",
            None,
            &[("n0", "gpu-1-mig-1g-10gb-6")],
            false,
        ),
    ];
    let inv = Inventory::new(&all, &claims).unwrap();
    let text = render_text(&pictures(&inv, None), &plain(Options::default()));
    let lines: Vec<&str> = text.lines().collect();
    // Symbols in order of first appearance: infer (gpu-0 slice 0), train, then the claim
    // without a pod.
    assert!(lines[1].starts_with("n0     gpu-0"), "{text}");
    assert!(lines[1].ends_with("[A . . . B B B B]"), "{text}");
    assert!(lines[2].ends_with("[. . A A . . C .]"), "{text}");
    let legend = |sym: &str| -> Vec<&str> {
        lines
            .iter()
            .filter(|l| l.starts_with(&format!("{sym} ")))
            .copied()
            .collect()
    };
    assert_eq!(legend("A").len(), 2, "{text}");
    assert!(legend("A")[0].contains("team-b") && legend("A")[0].contains("infer"));
    assert!(legend("A")[0].contains("MIG-gpu-0-mig-1g-10gb-0"), "{text}");
    assert!(
        legend("B")[0].contains("3g.40gb") && legend("B")[0].contains("MIG-gpu-0-mig-3g-40gb-4")
    );
    assert!(
        legend("C")[0].contains("(claim c3)") && legend("C")[0].contains("(not carved yet)"),
        "{text}"
    );
}

#[test]
fn a_slice_shared_by_several_pods_names_them_all_under_one_symbol() {
    let all = slices("n0", "H100-80GB:1");
    let mut shared = claim(
        "default",
        "mps",
        Some("mps-a"),
        &[("n0", "gpu-0-mig-1g-10gb-2")],
        true,
    );
    // Two pods name the claim (its slice shared under MPS).
    let status = shared.status.as_mut().unwrap();
    let mut second = status.reserved_for.as_ref().unwrap()[0].clone();
    second.name = "mps-b".into();
    status.reserved_for.as_mut().unwrap().push(second);
    let inv = Inventory::new(&all, &[shared]).unwrap();
    let text = render_text(&pictures(&inv, None), &plain(Options::default()));
    assert!(text.contains("[. . A . . . . .]"), "{text}");
    let legend: Vec<&str> = text.lines().filter(|l| l.starts_with("A ")).collect();
    assert_eq!(legend.len(), 1, "{text}");
    assert!(legend[0].contains("mps-a, mps-b"), "{text}");
}

#[test]
fn a_namespace_shows_only_its_slices_and_hashes_the_others() {
    let all = slices("n0", "H100-80GB:1");
    let claims = [
        claim(
            "team-a",
            "c1",
            Some("train"),
            &[("n0", "gpu-0-mig-3g-40gb-4")],
            true,
        ),
        claim(
            "team-b",
            "c2",
            Some("infer"),
            &[("n0", "gpu-0-mig-1g-10gb-0")],
            true,
        ),
    ];
    let inv = Inventory::new(&all, &claims).unwrap();
    let opts = plain(Options {
        namespace: Some("team-a".into()),
        ..Default::default()
    });
    let text = render_text(&pictures(&inv, None), &opts);
    assert!(text.contains("[# . . . A A A A]"), "{text}");
    assert!(
        text.contains("# = held by a claim of another namespace"),
        "{text}"
    );
    assert!(!text.contains("infer"), "{text}");
}

#[test]
fn colour_only_when_asked_and_the_picture_stays_the_same_text() {
    let all = slices("n0", "H100-80GB:1");
    let claims = [claim(
        "a",
        "c",
        Some("p"),
        &[("n0", "gpu-0-mig-1g-10gb-0")],
        true,
    )];
    let inv = Inventory::new(&all, &claims).unwrap();
    let pics = pictures(&inv, None);
    let plain_text = render_text(&pics, &plain(Options::default()));
    assert!(!plain_text.contains('\u{1b}'), "{plain_text:?}");
    let colored = render_text(
        &pics,
        &Options {
            color: true,
            ..Default::default()
        },
    );
    assert!(colored.contains('\u{1b}'), "{colored:?}");
}

/// Issue 30 item 8: names come from the API server; an escape sequence or a line break in one
/// neither reaches the terminal nor adds a row.
#[test]
fn names_from_the_api_are_printed_escaped_one_line_per_row() {
    let all = slices("n0", "H100-80GB:1");
    let evil = "p\x1b[31m\nn0     gpu-9   FORGED";
    let claims = [claim(
        "ns\r",
        "c",
        Some(evil),
        &[("n0", "gpu-0-mig-1g-10gb-0")],
        true,
    )];
    let inv = Inventory::new(&all, &claims).unwrap();
    let pics = pictures(&inv, None);
    for color in [false, true] {
        let text = render_text(
            &pics,
            &Options {
                color,
                ..Default::default()
            },
        );
        // Header and GPU row, a blank line, legend header and its one row.
        assert_eq!(text.lines().count(), 5, "{text}");
        assert!(!text.contains('\r'), "{text:?}");
        let legend = text.lines().last().unwrap();
        assert!(
            legend.contains(r"ns\r") && legend.contains(r"p\u{1b}[31m\nn0     gpu-9   FORGED"),
            "{text:?}"
        );
        assert!(!text.contains("\x1b[31m\n"), "{text:?}");
    }
}

#[test]
fn no_held_slices_says_so() {
    let inv = Inventory::new(&slices("n0", "A30-24GB:1"), &[]).unwrap();
    let text = render_text(&pictures(&inv, None), &plain(Options::default()));
    assert!(text.contains("[. . . .]"), "{text}");
    assert!(text.ends_with("No slices are held.\n"), "{text}");
}

#[test]
fn free_counts_on_empty_gpus_match_the_offline_optimum_for_every_model() {
    use das_driver::gpu::catalog::builtin_models;
    use das_driver::publish::placement::GpuView;
    use das_driver::publish::placement::optimum::Optimum;
    for model in builtin_models().unwrap() {
        let spec = format!("{}:1", model.name);
        let inv = Inventory::new(&slices("n0", &spec), &[]).unwrap();
        let rows = free_profiles(&inv);
        let optimum = Optimum::new(&GpuView::of_models(&[model.as_ref()]));
        for p in &model.profiles {
            let free = free_of(&rows, "n0", &p.name).count as usize;
            let most = (0..=model.memory_slices as usize)
                .rev()
                .find(|n| optimum.feasible(&vec![p.name.as_str(); *n]))
                .unwrap();
            assert_eq!(free, most, "{} {}", model.name, p.name);
        }
    }
}

#[test]
fn free_counts_follow_the_live_occupancy() {
    let all = slices("n0", "H100-80GB:2");
    let inv = Inventory::new(&all, &[]).unwrap();
    let empty = free_profiles(&inv);
    assert_eq!(free_of(&empty, "n0", "1g.10gb").count, 14);
    assert_eq!(free_of(&empty, "n0", "7g.80gb").count, 2);

    // A 1g.10gb at memory slice 0 of gpu-0 and a 3g.40gb at 4 of gpu-1.
    let claims = [claim(
        "a",
        "c",
        Some("p"),
        &[("n0", "gpu-0-mig-1g-10gb-0"), ("n0", "gpu-1-mig-3g-40gb-4")],
        true,
    )];
    let inv = Inventory::new(&all, &claims).unwrap();
    let rows = free_profiles(&inv);
    let seven = free_of(&rows, "n0", "7g.80gb");
    assert_eq!(
        (seven.count, seven.per_gpu.clone()),
        (0, [(0, 0), (1, 0)].into())
    );
    let three = free_of(&rows, "n0", "3g.40gb");
    assert_eq!(three.per_gpu, [(0, 1), (1, 1)].into());
    let one = free_of(&rows, "n0", "1g.10gb");
    // gpu-0: 6 of 7 left; gpu-1: slices 0–3 (the 3g holds 4–7).
    assert_eq!(one.per_gpu, [(0, 6), (1, 4)].into());
}

#[test]
fn tainted_devices_and_old_generations_do_not_count() {
    let mut all = slices("n0", "H100-80GB:1");
    for s in &mut all {
        for d in s.spec.devices.iter_mut().flatten() {
            d.taints = Some(vec![DeviceTaint {
                key: das_api::health_taints::GPU_LOST.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]);
        }
    }
    // A stale generation of another shape must be ignored.
    let mut stale = slices("n0", "A30-24GB:1");
    for (i, s) in stale.iter_mut().enumerate() {
        s.spec.pool.generation -= 1;
        s.metadata.name = Some(format!("stale-{i}"));
    }
    all.extend(stale);
    let inv = Inventory::new(&all, &[]).unwrap();
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.gpus[0].memory_slices, 8);
    assert!(free_profiles(&inv).iter().all(|f| f.count == 0));
}

#[test]
fn the_cli_takes_kubectl_style_flags_in_any_position() {
    use clap::Parser;
    let cli = crate::Cli::try_parse_from([
        "kubectl-das",
        "gpus",
        "--node",
        "n0",
        "-n",
        "team-a",
        "-o",
        "wide",
        "--context",
        "kind",
    ])
    .unwrap();
    assert!(matches!(cli.command, crate::Command::Gpus { node: Some(ref n) } if n == "n0"));
    assert_eq!(cli.namespace.as_deref(), Some("team-a"));
    assert_eq!(cli.output, Some(crate::Output::Wide));
    assert_eq!(cli.context.as_deref(), Some("kind"));
    let err = crate::Cli::try_parse_from(["kubectl-das", "claims", "-o", "xml"]).unwrap_err();
    assert!(err.to_string().contains("wide, json, yaml"), "{err}");
}

/// Free counts on many nodes, some with held slices: each node's rows are those of the node
/// on its own (the simulation of one node reads only that node's devices and counters).
#[test]
fn free_counts_of_each_node_are_those_of_the_node_alone() {
    let nodes: Vec<String> = (0..12).map(|i| format!("node-{i:02}")).collect();
    let claims_of = |node: &str, i: usize| -> Vec<ResourceClaim> {
        match i % 3 {
            0 => vec![],
            1 => vec![claim(
                "a",
                &format!("c-{node}"),
                Some("p"),
                &[(node, "gpu-0-mig-1g-10gb-0"), (node, "gpu-1-mig-3g-40gb-4")],
                true,
            )],
            _ => vec![claim(
                "b",
                &format!("d-{node}"),
                None,
                &[(node, "gpu-1-mig-7g-80gb-0")],
                false,
            )],
        }
    };
    let mut all = Vec::new();
    let mut claims = Vec::new();
    let mut alone = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let s = slices(node, "H100-80GB:2");
        let c = claims_of(node, i);
        alone.extend(free_profiles(&Inventory::new(&s, &c).unwrap()));
        all.extend(s);
        claims.extend(c);
    }
    // Slices and claims of the cluster in an order unlike the nodes'.
    all.reverse();
    claims.reverse();
    let rows = free_profiles(&Inventory::new(&all, &claims).unwrap());
    assert_eq!(rows, alone);
    assert_eq!(free_of(&rows, "node-01", "7g.80gb").count, 0);
    assert_eq!(free_of(&rows, "node-02", "7g.80gb").count, 1);
    assert_eq!(free_of(&rows, "node-03", "7g.80gb").count, 2);
}

/// An API server stand-in: ResourceSlices `limit` at a time from the offset in the continue
/// token (the whole list when no limit is asked), no ResourceClaims; records each slice list's
/// query. `expire_once`: the first request with a continue token gets 410 Gone.
fn fake_api(
    slices: Vec<ResourceSlice>,
    expire_once: bool,
) -> (kube::Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use http::{Response, StatusCode};
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let queries = Arc::new(Mutex::new(Vec::new()));
    let seen = queries.clone();
    let expired = Arc::new(AtomicBool::new(!expire_once));
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let param = |k: &str| {
            query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        };
        let (status, body) = if path.ends_with("/resourceclaims") {
            let list = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                "metadata": {}, "items": []});
            (StatusCode::OK, list)
        } else if path.ends_with("/resourceslices") {
            seen.lock().unwrap().push(query.clone());
            let from: usize = param("continue").map_or(0, |c| c.parse().unwrap());
            let limit: usize = param("limit").map_or(slices.len(), |l| l.parse().unwrap());
            if from > 0 && !expired.swap(true, Ordering::SeqCst) {
                let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Expired", "code": 410, "message": "too old"});
                (StatusCode::GONE, gone)
            } else {
                let to = (from + limit).min(slices.len());
                let cont = if to < slices.len() {
                    to.to_string()
                } else {
                    String::new()
                };
                let list = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": "100", "continue": cont},
                    "items": &slices[from..to]});
                (StatusCode::OK, list)
            }
        } else {
            let missing = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404, "message": path});
            (StatusCode::NOT_FOUND, missing)
        };
        let resp = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        std::future::ready(Ok::<_, std::convert::Infallible>(resp))
    });
    (kube::Client::new(svc, "default"), queries)
}

#[tokio::test]
async fn resource_slices_are_listed_in_pages() {
    use crate::fetch::{SLICE_PAGE_SIZE, inventory, published_slices};
    let mut all = Vec::new();
    for i in 0..60 {
        all.extend(slices(&format!("node-{i:02}"), "H100-80GB:2"));
    }
    assert!(all.len() > SLICE_PAGE_SIZE as usize, "{}", all.len());
    let whole = Inventory::new(&all, &[]).unwrap();
    let shown = |inv: &Inventory| {
        (
            format!("{:?}", inv.gpus),
            format!("{:?}", inv.devices),
            format!("{:?}", inv.capacity),
        )
    };

    let (client, queries) = fake_api(all.clone(), false);
    let inv = inventory(&client).await.unwrap();
    assert_eq!(shown(&inv), shown(&whole));
    let queries = queries.lock().unwrap().clone();
    assert_eq!(
        queries.len(),
        all.len().div_ceil(SLICE_PAGE_SIZE as usize),
        "{queries:?}"
    );
    for q in &queries {
        assert!(
            q.contains("fieldSelector=spec.driver%3Dmig.das.com")
                && q.contains(&format!("limit={SLICE_PAGE_SIZE}")),
            "{q}"
        );
    }
    assert!(
        queries[1].contains(&format!("continue={SLICE_PAGE_SIZE}")),
        "{queries:?}"
    );

    // Pages of 7; a continue token that expired between pages: listed again, once.
    let (client, queries) = fake_api(all.clone(), true);
    let published = published_slices(&client, 7).await.unwrap();
    assert_eq!(
        shown(&Inventory::from_published(published, &[])),
        shown(&whole)
    );
    assert_eq!(
        queries.lock().unwrap().len(),
        all.len().div_ceil(7) + 2,
        "one page, the expired one, then every page"
    );
}

/// A listed slice is decoded into only what the inventory reads: the six attributes, the
/// counters, the taints' effects; not the device capacity, the other attributes or metadata.
#[test]
fn a_listed_slice_keeps_only_what_the_inventory_reads() {
    use crate::fields::SliceFields;
    let mut s = slices("n0", "H100-80GB:1")
        .into_iter()
        .find(|s| s.spec.devices.as_ref().is_some_and(|d| !d.is_empty()))
        .unwrap();
    s.metadata.uid = Some("uid-of-the-slice".into());
    let fields: SliceFields = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    let d = &fields.spec.devices.as_ref().unwrap()[0];
    let a = d.attributes.as_ref().unwrap();
    let attr = |name: &str| {
        s.spec.devices.as_ref().unwrap()[0]
            .attributes
            .as_ref()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap()
    };
    use das_api::attributes as at;
    assert_eq!(a.profile.as_ref().unwrap().string, attr(at::PROFILE).string);
    assert_eq!(a.gpu_index.as_ref().unwrap().int, attr(at::GPU_INDEX).int);
    assert_eq!(
        a.placement_start.as_ref().unwrap().int,
        attr(at::PLACEMENT_START).int
    );
    assert_eq!(
        a.placement_size.as_ref().unwrap().int,
        attr(at::PLACEMENT_SIZE).int
    );
    assert_eq!(
        a.product_name.as_ref().unwrap().string,
        attr(at::PRODUCT_NAME).string
    );
    assert_eq!(
        a.parent_uuid.as_ref().unwrap().string,
        attr(at::PARENT_UUID).string
    );
    assert!(!d.consumes_counters.as_ref().unwrap().is_empty());
    // Nothing else is decoded: the types have no field for it.
    let debug = format!("{fields:?}");
    for absent in [
        "uid-of-the-slice",
        "Hopper",
        "580.95",
        "copyEngines",
        "multiprocessors",
        "nodeName",
    ] {
        assert!(!debug.contains(absent), "{absent} in {debug}");
    }
}
