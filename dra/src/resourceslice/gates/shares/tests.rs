//! Unit tests of [`super`] (`gates/shares.rs`): what is left once the shareable devices go.

use serde_json::{Value, json};

use super::*;

fn spec(v: Value, count: i64) -> ResourceSliceSpec {
    let mut v = v;
    v["driver"] = json!("dev.example.com");
    v["nodeName"] = json!("n0");
    v["pool"] = json!({"name": "n0", "generation": 0, "resourceSliceCount": count});
    serde_json::from_value(v).unwrap()
}

fn exclusive(name: &str) -> Value {
    json!({"name": name, "attributes": {"kind": {"string": "whole"}}})
}

fn shareable(name: &str) -> Value {
    json!({"name": name, "allowMultipleAllocations": true,
           "attributes": {"kind": {"string": "shared"}},
           "capacity": {"shares": {"value": "4", "requestPolicy": {"default": "1"}}}})
}

/// A counter slice, a slice of exclusive and shareable devices, and, when `own_slice`, a slice
/// of shareable devices only.
fn desired(own_slice: bool) -> Vec<ResourceSliceSpec> {
    let count = if own_slice { 3 } else { 2 };
    let mut specs = vec![
        spec(
            json!({"sharedCounters": [{"name": "card-0", "counters": {"part-0": {"value": "1"}}}]}),
            count,
        ),
        spec(
            json!({"devices": [exclusive("a"), shareable("a-shared"), exclusive("b")]}),
            count,
        ),
    ];
    if own_slice {
        specs.push(spec(
            json!({"devices": [shareable("b-shared"), shareable("c-shared")]}),
            count,
        ));
    }
    specs
}

fn names(specs: &[ResourceSliceSpec]) -> Vec<String> {
    specs
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect()
}

#[test]
fn the_shareable_devices_go_and_everything_else_stays_in_order() {
    let left = without_shareable_devices(desired(true), allows_multiple_allocations);
    assert_eq!(names(&left), ["a", "b"]);
    assert_eq!(left.len(), 2, "the slice left without devices went");
    assert!(left[0].shared_counters.is_some(), "the counter slice stays");
    assert!(left.iter().all(|s| s.pool.resource_slice_count == 2));
    // A slice that kept devices keeps its count when no slice went.
    let left = without_shareable_devices(desired(false), allows_multiple_allocations);
    assert_eq!(names(&left), ["a", "b"]);
    assert!(left.iter().all(|s| s.pool.resource_slice_count == 2));
    // Nothing shareable: unchanged.
    let plain = without_shareable_devices(desired(false), allows_multiple_allocations);
    assert_eq!(
        without_shareable_devices(plain.clone(), allows_multiple_allocations),
        plain
    );
}

#[test]
fn the_driver_says_which_devices_are_shareable() {
    // Stored without `allowMultipleAllocations`, a device the driver marks by an attribute.
    let mut specs = desired(false);
    for d in specs
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
    {
        d.allow_multiple_allocations = None;
    }
    let unchanged = without_shareable_devices(specs.clone(), allows_multiple_allocations);
    assert_eq!(unchanged, specs);
    let by_kind: Shareable = |d| {
        d.attributes
            .as_ref()
            .and_then(|a| a.get("kind"))
            .and_then(|k| k.string.as_deref())
            == Some("shared")
    };
    assert_eq!(
        names(&without_shareable_devices(specs, by_kind)),
        ["a", "b"]
    );
    // A pool without devices stays as it is.
    let empty = vec![ResourceSliceSpec::default()];
    assert_eq!(
        without_shareable_devices(empty.clone(), allows_multiple_allocations),
        empty
    );
}
