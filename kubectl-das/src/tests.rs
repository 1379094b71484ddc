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
