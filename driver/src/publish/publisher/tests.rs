//! Unit tests of [`super`] (`publisher.rs`).

use super::*;

#[test]
fn complete_specs_sets_pool_driver_and_node() {
    let specs = complete_specs(
        "n0",
        vec![
            ResourceSliceSpec::default(),
            ResourceSliceSpec {
                driver: "other".into(),
                node_name: Some("elsewhere".into()),
                ..Default::default()
            },
        ],
    )
    .unwrap();
    for s in &specs {
        assert_eq!(s.driver, DRIVER_NAME);
        assert_eq!(s.node_name.as_deref(), Some("n0"));
        assert_eq!(
            (
                s.pool.name.as_str(),
                s.pool.generation,
                s.pool.resource_slice_count
            ),
            ("n0", 0, 2)
        );
    }
}

#[test]
fn empty_lists_are_unset() {
    let spec = ResourceSliceSpec {
        devices: Some(vec![]),
        shared_counters: Some(vec![]),
        ..Default::default()
    };
    let specs = complete_specs("n0", vec![spec]).unwrap();
    assert!(specs[0].devices.is_none() && specs[0].shared_counters.is_none());
}

#[test]
fn an_empty_pool_is_one_empty_slice() {
    let specs = complete_specs("n0", vec![]).unwrap();
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].pool.resource_slice_count, 1);
    assert!(specs[0].devices.is_none() && specs[0].shared_counters.is_none());
}

#[test]
fn node_selecting_specs_are_refused_with_their_index() {
    let specs = vec![
        ResourceSliceSpec::default(),
        ResourceSliceSpec {
            per_device_node_selection: Some(true),
            ..Default::default()
        },
    ];
    let err = complete_specs("n0", specs).unwrap_err();
    assert!(matches!(
        err,
        PublishError::NotNodeLocal {
            index: 1,
            field: "perDeviceNodeSelection",
            ..
        }
    ));
    assert!(err.to_string().contains("#1 of pool n0"), "{err}");
}
