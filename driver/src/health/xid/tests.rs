//! Unit tests of [`super`] (`xid.rs`).

use super::*;

#[test]
fn application_xids_are_not_fatal_and_the_rest_are() {
    let none = BTreeSet::new();
    for x in APPLICATION_XIDS {
        assert!(!is_fatal(x, &none), "{x}");
    }
    for x in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 999] {
        assert!(is_fatal(x, &none), "{x}");
    }
    assert!(
        !is_fatal(119, &BTreeSet::from([119])),
        "operators may ignore more"
    );
    assert_eq!(describe(79), "GPU has fallen off the bus");
}

#[test]
fn bus_and_uncontained_memory_errors_are_gpu_wide_and_a_contained_one_is_not() {
    for x in [48, 79, 95] {
        assert!(is_gpu_wide(x), "{x}");
    }
    for x in [94, 119, 13] {
        assert!(!is_gpu_wide(x), "{x}");
    }
}

#[test]
fn the_ignored_list_parses_and_bad_entries_are_named() {
    assert_eq!(
        parse_ignored(" 109, 119 ,").unwrap(),
        BTreeSet::from([109, 119])
    );
    assert!(parse_ignored("").unwrap().is_empty());
    let e = parse_ignored("109,x9").unwrap_err();
    assert!(e.contains("\"x9\""), "{e}");
}
