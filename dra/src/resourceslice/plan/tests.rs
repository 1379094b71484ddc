//! Unit tests of [`super`] (`plan.rs`).

use super::*;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourcePool};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

const DRIVER: &str = "dev.example.com";
const NODE: &str = "n0";
const UID: &str = "uid-n0";

fn spec(devices: &[&str], count: usize) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: DRIVER.into(),
        node_name: Some(NODE.into()),
        pool: ResourcePool {
            name: NODE.into(),
            generation: 0,
            resource_slice_count: count as i64,
        },
        devices: Some(
            devices
                .iter()
                .map(|d| Device {
                    name: d.to_string(),
                    attributes: Some(BTreeMap::from([(
                        "type".to_string(),
                        DeviceAttribute {
                            string: Some("mig".into()),
                            ..Default::default()
                        },
                    )])),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    }
}

fn desired(n: usize) -> Vec<ResourceSliceSpec> {
    (0..n).map(|i| spec(&[&format!("dev-{i}")], n)).collect()
}

fn stored(index: usize, width: usize, s: &ResourceSliceSpec, generation: i64) -> ResourceSlice {
    let mut spec = s.clone();
    spec.pool.generation = generation;
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(DRIVER, NODE, index, width)),
            uid: Some(format!("uid-{index}")),
            resource_version: Some(format!("{}", 100 + index)),
            owner_references: Some(vec![node_owner(NODE, UID)]),
            ..Default::default()
        },
        spec,
    }
}

fn published(d: &[ResourceSliceSpec], generation: i64) -> Vec<ResourceSlice> {
    let w = index_width(d.len());
    d.iter()
        .enumerate()
        .map(|(i, s)| stored(i, w, s, generation))
        .collect()
}

fn target<'a>(d: &'a [ResourceSliceSpec], b: &'a Baseline) -> PlanInput<'a> {
    PlanInput {
        driver: DRIVER,
        node: NODE,
        node_uid: UID,
        desired: d,
        baseline: b,
    }
}

#[test]
fn names_sort_like_indices_and_parse_back() {
    assert_eq!(slice_name(DRIVER, "n0", 0, 5), "00000-dev.example.com-n0");
    assert_eq!(slice_name(DRIVER, "n0", 10, 5), "0000a-dev.example.com-n0");
    let w = index_width(300);
    let names: Vec<String> = (0..300).map(|i| slice_name(DRIVER, "n0", i, w)).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(index_of(n, DRIVER, "n0", w), Some(i));
    }
    assert_eq!(index_of("00000-dev.example.com-n1", DRIVER, "n0", 5), None);
    assert_eq!(index_of("0000-dev.example.com-n0", DRIVER, "n0", 5), None);
    assert_eq!(
        index_of("00000-dev.example.com-n0-x7k2p", DRIVER, "n0", 5),
        None
    );
    assert_eq!(index_of("zzzzz-dev.example.com-n0", DRIVER, "n0", 5), None);
    // Another driver's slice of the same node is never taken for one of ours.
    let other = slice_name("other.example.com", "n0", 0, 5);
    assert_eq!(other, "00000-other.example.com-n0");
    assert_eq!(index_of(&other, DRIVER, "n0", 5), None);
}

#[test]
fn index_width_grows_past_five_hex_digits() {
    assert_eq!(index_width(0), 5);
    assert_eq!(index_width(1), 5);
    assert_eq!(index_width(0x100000), 5);
    assert_eq!(index_width(0x100001), 6);
}

#[test]
fn long_node_names_are_cut_hashed_and_stay_valid() {
    let node = format!("{}.{}", "a".repeat(200), "b-".repeat(30));
    let name = slice_name(DRIVER, &node, 3, 5);
    assert_eq!(name.len(), MAX_NAME_LEN);
    assert!(name.starts_with("00003-dev.example.com-aaaa"));
    assert!(!name.contains("-.") && !name.contains(".-") && !name.contains("--"));
    assert_ne!(name, slice_name(DRIVER, &format!("{node}x"), 3, 5));
    assert_eq!(index_of(&name, DRIVER, &node, 5), Some(3));
}

#[test]
fn keys_ignore_generation_empty_collections_and_taint_time() {
    let a = spec(&["d"], 1);
    let mut b = a.clone();
    b.pool.generation = 7;
    b.shared_counters = Some(vec![]);
    b.devices.as_mut().unwrap()[0].capacity = Some(BTreeMap::new());
    assert_eq!(spec_key(&a), spec_key(&b));
    b.pool.resource_slice_count = 2;
    assert_ne!(spec_key(&a), spec_key(&b));

    let mut t1: Value =
        json!({"devices": [{"name": "d", "taints": [{"key": "k", "effect": "NoSchedule"}]}]});
    let mut t2: Value = json!({"devices": [{"name": "d", "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]}]});
    strip_taint_time_added(&mut t1);
    strip_taint_time_added(&mut t2);
    assert_eq!(t1, t2);
}

#[test]
fn generation_rule_matches_upstream() {
    assert_eq!(decide_generation(4, 0, 0), (4, false));
    assert_eq!(decide_generation(4, 0, 1), (4, false));
    assert_eq!(decide_generation(4, 0, 2), (5, true));
    assert_eq!(decide_generation(4, 1, 0), (5, true));
    assert_eq!(decide_generation(0, 3, 0), (1, true));
}

#[test]
fn empty_cluster_creates_all_at_generation_one() {
    let d = desired(3);
    let b = Baseline::new();
    let p = plan(target(&d, &b), &[]);
    assert_eq!((p.generation, p.bumped), (1, true));
    assert_eq!(p.create, vec![0, 1, 2]);
    assert!(p.update.is_empty() && p.delete.is_empty());
}

#[test]
fn identical_pool_needs_no_writes() {
    let d = desired(3);
    let b = Baseline::new();
    let p = plan(target(&d, &b), &published(&d, 4));
    assert_eq!(p.writes(), 0);
    assert_eq!((p.generation, p.bumped), (4, false));
    assert_eq!(p.unchanged, vec![0, 1, 2]);
}

#[test]
fn one_change_keeps_the_generation_two_bump_it() {
    let d = desired(3);
    let existing = published(&d, 4);
    let b = Baseline::new();
    let mut one = d.clone();
    one[1] = spec(&["other"], 3);
    let p = plan(target(&one, &b), &existing);
    assert_eq!((p.generation, p.bumped), (4, false));
    assert_eq!(p.update.iter().map(|u| u.0).collect::<Vec<_>>(), vec![1]);
    assert_eq!(p.unchanged, vec![0, 2]);

    let mut two = one.clone();
    two[2] = spec(&["other-2"], 3);
    let p = plan(target(&two, &b), &existing);
    assert_eq!((p.generation, p.bumped), (5, true));
    assert_eq!(p.update.len(), 3, "a bump rewrites every slice");
}

#[test]
fn adding_a_slice_bumps_and_rewrites_all() {
    let d = desired(3);
    let existing = published(&d, 2);
    let b = Baseline::new();
    let p = plan(target(&desired(4), &b), &existing);
    assert_eq!((p.generation, p.bumped), (3, true));
    assert_eq!(p.update.len(), 3);
    assert_eq!(p.create, vec![3]);
}

#[test]
fn a_deleted_slice_is_recreated_with_a_bump() {
    let d = desired(3);
    let mut existing = published(&d, 2);
    existing.remove(1);
    let b = Baseline::new();
    let p = plan(target(&d, &b), &existing);
    assert_eq!((p.generation, p.bumped), (3, true));
    assert_eq!(p.create, vec![1]);
    assert_eq!(p.update.len(), 2);
}

#[test]
fn shrinking_deletes_the_tail() {
    let existing = published(&desired(4), 2);
    let b = Baseline::new();
    let d = desired(1);
    let p = plan(target(&d, &b), &existing);
    let reasons: Vec<_> = p.delete.iter().map(|d| d.reason.clone()).collect();
    assert_eq!(
        reasons,
        (1..4)
            .map(|index| ObsoleteReason::BeyondCount { index, count: 1 })
            .collect::<Vec<_>>()
    );
    assert_eq!(p.delete[0].uid.as_deref(), Some("uid-1"));
    assert_eq!(p.delete[0].resource_version.as_deref(), Some("101"));
    // Only slice 0 remains and changes (its count): one update, generation kept.
    assert_eq!((p.generation, p.bumped), (2, false));
    assert_eq!(p.update.len(), 1);
}

#[test]
fn lower_generations_foreign_names_and_other_pools_are_obsolete() {
    let d = desired(2);
    let mut existing = published(&d, 3);
    existing[1].spec.pool.generation = 2;
    let mut foreign = existing[0].clone();
    foreign.metadata.name = Some("00000-dev.example.com-n0-abcde".into());
    let mut other = existing[0].clone();
    other.metadata.name = Some("other".into());
    other.spec.pool.name = "elsewhere".into();
    existing.push(foreign);
    existing.push(other);
    let b = Baseline::new();
    let p = plan(target(&d, &b), &existing);
    let reasons: Vec<_> = p.delete.iter().map(|d| d.reason.clone()).collect();
    assert!(reasons.contains(&ObsoleteReason::OtherPool("elsewhere".into())));
    assert!(reasons.contains(&ObsoleteReason::LowerGeneration {
        generation: 2,
        current: 3
    }));
    assert!(reasons.contains(&ObsoleteReason::ForeignName));
    assert_eq!(p.create, vec![1]);
    assert_eq!((p.generation, p.bumped), (4, true));
}

#[test]
fn a_missing_owner_reference_counts_as_a_change() {
    let d = desired(2);
    let mut existing = published(&d, 1);
    existing[0].metadata.owner_references = None;
    let b = Baseline::new();
    let p = plan(target(&d, &b), &existing);
    assert_eq!(p.update.iter().map(|u| u.0).collect::<Vec<_>>(), vec![0]);
    assert!(!p.bumped);
}

#[test]
fn an_adopted_baseline_stops_update_loops() {
    let d = desired(1);
    let mut existing = published(&d, 1);
    // The server dropped the attributes (as if a gate were off).
    existing[0].spec.devices.as_mut().unwrap()[0].attributes = None;
    let none = Baseline::new();
    assert_eq!(plan(target(&d, &none), &existing).update.len(), 1);
    let adopted = Baseline::from([(
        0,
        Adopted {
            sent: spec_key(&d[0]),
            stored: spec_key(&existing[0].spec),
        },
    )]);
    let p = plan(target(&d, &adopted), &existing);
    assert_eq!(p.writes(), 0);
    // A new desired spec makes the baseline stale again.
    let d2 = vec![spec(&["new"], 1)];
    assert_eq!(plan(target(&d2, &adopted), &existing).update.len(), 1);
}

#[test]
fn diff_paths_and_feature_guesses() {
    let sent = json!({"devices": [{"name": "d", "nodeAllocatableResourceMappings": {"cpu": {}}}], "pool": {"name": "n0"}});
    let stored = json!({"devices": [{"name": "d"}], "pool": {"name": "n0"}});
    let paths = diff_paths(&sent, &stored, 10);
    assert_eq!(paths, vec!["devices[0].nodeAllocatableResourceMappings"]);
    assert_eq!(
        guess_disabled_features(&paths),
        vec!["DRANodeAllocatableResources"]
    );
    assert_eq!(
        guess_disabled_features(&[
            "sharedCounters".into(),
            "devices[0].consumesCounters".into()
        ]),
        vec!["DRAPartitionableDevices"]
    );
    assert_eq!(
        guess_disabled_features(&["devices[0].capacity.memory.value".into()]),
        vec!["unknown"]
    );
    assert_eq!(diff_paths(&json!([1, 2]), &json!([1]), 10), vec!["."]);
}
