//! Shared slices (docs/design.md §7, "Shared slices"): several claims hold shares of one
//! shareable device (`…-shared`, KEP-5075); the picture draws the slice once with every share in
//! its legend, `-o json` carries each claim's share, and the free counts charge the slice once.

use das_driver::publish::resource_slices::{
    ResourceSliceLayout, SharePolicy, SharedProfiles, SliceOptions, desired_resource_slices,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{claim, free_of, plain};
use crate::free::free_profiles;
use crate::inventory::Inventory;
use crate::picture::{Options, pictures, render_text};

/// The slices das-kubelet-plugin publishes on `node` for one H100 with `--shared-profiles
/// 1g.10gb` (4 shares per slice).
fn shared_slices(node: &str) -> Vec<ResourceSlice> {
    let inv = das_driver::gpu::emulated::emulated_inventory("H100-80GB:1", node).unwrap();
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: vec!["1g.10gb".into()],
            policy: SharePolicy::default(),
            ..Default::default()
        },
    };
    desired_resource_slices(node, &inv, options)
        .unwrap()
        .into_iter()
        .map(|s| s.slice)
        .collect()
}

/// The first shareable 1g.10gb device published, and its start.
fn first_shared(all: &[ResourceSlice]) -> (String, u32) {
    let inv = Inventory::new(all, &[]).unwrap();
    let d = inv
        .devices
        .iter()
        .find(|d| d.shares.is_some() && d.profile == "1g.10gb")
        .expect("a shareable device");
    assert_eq!(d.shares, Some(4), "the device's shares capacity");
    (d.name.clone(), d.start)
}

/// Claim `ns/name` of pod `pod` holding share `<name>-share` (`shares` of the slice) of
/// `device`, carved.
fn share(ns: &str, name: &str, pod: &str, device: &str, shares: u32) -> ResourceClaim {
    let mut c = claim(ns, name, Some(pod), &[("n0", device)], true);
    let status = c.status.as_mut().unwrap();
    let id = format!("{name}-share");
    let r = &mut status
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap();
    let r = &mut r.results.as_mut().unwrap()[0];
    r.share_id = Some(id.clone());
    r.consumed_capacity = Some(
        [
            ("shares".to_string(), Quantity(shares.to_string())),
            ("memory".to_string(), Quantity("2560Mi".into())),
        ]
        .into(),
    );
    status.devices.as_mut().unwrap()[0].share_id = Some(id);
    c
}

/// The picture cells `[…]` with `symbol` on memory slice `start` of 8.
fn cells(symbol: char, start: u32) -> String {
    let cells: Vec<String> = (0..8)
        .map(|i| {
            if i == start {
                symbol.to_string()
            } else {
                ".".into()
            }
        })
        .collect();
    format!("[{}]", cells.join(" "))
}

#[test]
fn a_shared_slice_is_drawn_once_with_every_share_in_its_legend() {
    let all = shared_slices("n0");
    let (device, start) = first_shared(&all);
    let claims = [
        share("default", "s1", "p1", &device, 1),
        share("default", "s2", "p2", &device, 2),
    ];
    let inv = Inventory::new(&all, &claims).unwrap();
    let pics = pictures(&inv, None);
    assert_eq!(pics[0].free_memory_slices, 7, "the slice counts once");
    let text = render_text(&pics, &plain(Options::default()));
    assert!(text.contains(&cells('A', start)), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("B ")),
        "one symbol for the slice: {text}"
    );
    let legend: Vec<&str> = text.lines().filter(|l| l.starts_with("A ")).collect();
    assert_eq!(legend.len(), 1, "{text}");
    assert!(
        legend[0].contains("shared: p1 (1 of 4 shares), p2 (2 of 4 shares)"),
        "{text}"
    );
    assert!(
        legend[0].contains("default") && legend[0].contains("MIG-"),
        "{text}"
    );
    let wide = render_text(
        &pics,
        &plain(Options {
            wide: true,
            ..Default::default()
        }),
    );
    assert!(wide.contains("s1, s2") && wide.contains(&device), "{wide}");
}

#[test]
fn json_carries_each_claims_share() {
    let all = shared_slices("n0");
    let (device, _) = first_shared(&all);
    let claims = [
        share("default", "s1", "p1", &device, 1),
        share("default", "s2", "p2", &device, 2),
    ];
    let inv = Inventory::new(&all, &claims).unwrap();
    let v = serde_json::to_value(pictures(&inv, None)).unwrap();
    let held = v[0]["held"].as_array().unwrap();
    let got: Vec<_> = held.iter().map(|h| (&h["claim"], &h["share"])).collect();
    assert_eq!(
        got,
        [
            (
                &serde_json::json!("s1"),
                &serde_json::json!({"shareID": "s1-share", "shares": 1, "of": 4,
                    "memory": "2560Mi"})
            ),
            (
                &serde_json::json!("s2"),
                &serde_json::json!({"shareID": "s2-share", "shares": 2, "of": 4,
                    "memory": "2560Mi"})
            ),
        ]
    );
    let exclusive = claim(
        "default",
        "x",
        Some("px"),
        &[("n0", "gpu-0-mig-3g-40gb-4")],
        true,
    );
    let inv = Inventory::new(&all, &[exclusive]).unwrap();
    let v = serde_json::to_value(pictures(&inv, None)).unwrap();
    assert!(v[0]["held"][0].get("share").is_none(), "{v}");
}

#[test]
fn shares_of_several_namespaces_are_named_with_theirs_and_hidden_under_n() {
    let all = shared_slices("n0");
    let (device, start) = first_shared(&all);
    let claims = [
        share("team-a", "s1", "p1", &device, 1),
        share("team-b", "s2", "p2", &device, 1),
    ];
    let inv = Inventory::new(&all, &claims).unwrap();
    let text = render_text(&pictures(&inv, None), &plain(Options::default()));
    assert!(
        text.contains("shared: team-a/p1 (1 of 4 shares), team-b/p2 (1 of 4 shares)"),
        "{text}"
    );
    let only_a = plain(Options {
        namespace: Some("team-a".into()),
        ..Default::default()
    });
    let text = render_text(&pictures(&inv, None), &only_a);
    assert!(text.contains(&cells('A', start)), "{text}");
    assert!(
        text.contains("shared: p1 (1 of 4 shares), 1 of another namespace"),
        "{text}"
    );
    assert!(!text.contains("p2"), "{text}");
    let only_c = plain(Options {
        namespace: Some("team-c".into()),
        ..Default::default()
    });
    let text = render_text(&pictures(&inv, None), &only_c);
    assert!(text.contains(&cells('#', start)), "{text}");
}

#[test]
fn free_counts_charge_a_shared_slice_once() {
    let all = shared_slices("n0");
    let (device, _) = first_shared(&all);
    let one = Inventory::new(&all, &[share("default", "s1", "p1", &device, 1)]).unwrap();
    let two = Inventory::new(
        &all,
        &[
            share("default", "s1", "p1", &device, 1),
            share("default", "s2", "p2", &device, 2),
        ],
    )
    .unwrap();
    for profile in ["1g.10gb", "3g.40gb", "7g.80gb"] {
        assert_eq!(
            free_of(&free_profiles(&one), "n0", profile),
            free_of(&free_profiles(&two), "n0", profile),
            "{profile}"
        );
    }
    assert_eq!(free_of(&free_profiles(&two), "n0", "7g.80gb").count, 0);
}

/// An L4 served whole and shared by memory (`--whole-gpus --shared-profiles gpu`): two claims
/// holding shares of `gpu-0-shared` are one cell with both shares in its legend, and `free`
/// counts the GPU neither whole nor as a free shared device.
#[test]
fn shares_of_a_whole_gpu_are_its_one_cell_with_every_share_in_its_legend() {
    let inv = das_driver::gpu::emulated::emulated_inventory("L4:1", "n0").unwrap();
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: vec![das_api::WHOLE_GPU_PROFILE.into()],
            ..Default::default()
        },
    };
    let all: Vec<ResourceSlice> = desired_resource_slices("n0", &inv, options)
        .unwrap()
        .into_iter()
        .map(|s| s.slice)
        .collect();
    let published = Inventory::new(&all, &[]).unwrap();
    let d = published
        .device("n0", "gpu-0-shared")
        .expect("the shared L4 is drawn");
    assert_eq!((d.profile.as_str(), d.start, d.size), ("gpu", 0, 1));
    assert_eq!(d.shares, Some(4));
    let mut claims = [
        share("default", "m1", "p1", "gpu-0-shared", 1),
        share("default", "m2", "p2", "gpu-0-shared", 1),
    ];
    for c in &mut claims {
        for d in c.status.as_mut().unwrap().devices.iter_mut().flatten() {
            d.data.as_mut().unwrap().0 = serde_json::json!({"migUUID": "",
                "gpuUUID": inv[0].uuid, "profile": "gpu", "placement": {"start": 0, "size": 1}});
        }
    }
    let held = Inventory::new(&all, &claims).unwrap();
    let pics = pictures(&held, None);
    assert_eq!(pics[0].free_memory_slices, 0);
    let text = render_text(&pics, &plain(Options::default()));
    assert!(
        text.lines().nth(1).is_some_and(|l| l.ends_with("[A]")),
        "{text}"
    );
    assert!(
        text.contains("shared: p1 (1 of 4 shares), p2 (1 of 4 shares)"),
        "{text}"
    );
    assert_eq!(free_of(&free_profiles(&held), "n0", "gpu").count, 0);
}
