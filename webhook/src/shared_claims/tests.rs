//! Unit tests of [`super`] (`shared_claims.rs`).

use super::*;

const SHARED: &str = "1g.10gb.shared.mig.das.com";

fn claim(requests: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team-a"},
        "spec": {"devices": {"requests": requests}}})
}

fn selector(ns: &str) -> Value {
    json!({"cel": {"expression": das_api::share_namespace_selector(ns)}})
}

/// `claim` with the verdict's patch applied.
fn patched(claim: &Value, verdict: &Verdict) -> Value {
    let mut after = claim.clone();
    if let Verdict::Patched { patch, .. } = verdict {
        json_patch::patch(&mut after, patch).unwrap();
    }
    after
}

#[test]
fn the_selector_names_the_namespace_and_tests_the_attribute_before_reading_it() {
    assert_eq!(
        das_api::share_namespace_selector("team-a"),
        "!(\"shareNamespace\" in device.attributes[\"mig.das.com\"]) || device.attributes[\"mig.das.com\"].shareNamespace == \"team-a\""
    );
    assert!(is_shared_class(SHARED));
    assert!(is_shared_class("1g.10gb.me.shared.mig.das.com"));
    for not in [
        "1g.10gb.mig.das.com",
        "mig.das.com",
        "shared.mig.das.com",
        "gpu.das.com",
        "",
    ] {
        assert!(!is_shared_class(not), "{not}");
    }
}

#[test]
fn every_shared_request_and_subrequest_gets_the_selector_and_nothing_else_changes() {
    let c = claim(json!([
        {"name": "share", "exactly": {"deviceClassName": SHARED,
            "selectors": [{"cel": {"expression": "device.attributes['mig.das.com'].gpuIndex == 0"}}]}},
        {"name": "mine", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}},
        {"name": "either", "firstAvailable": [
            {"name": "big", "deviceClassName": "2g.20gb.mig.das.com"},
            {"name": "small", "deviceClassName": SHARED}]}
    ]));
    let v = review("team-a", &c, true);
    let Verdict::Patched { requests, .. } = &v else {
        panic!("{v:?}")
    };
    assert_eq!(requests, &["share", "either/small"]);
    let after = patched(&c, &v);
    let r = &after["spec"]["devices"]["requests"];
    // Appended after the claim's own selector (selectors are ANDed).
    assert_eq!(r[0]["exactly"]["selectors"][1], selector("team-a"));
    assert_eq!(r[0]["exactly"]["selectors"].as_array().unwrap().len(), 2);
    assert_eq!(
        r[2]["firstAvailable"][1]["selectors"],
        json!([selector("team-a")])
    );
    // The exclusive request and subrequest are left as they were.
    assert_eq!(r[1], c["spec"]["devices"]["requests"][1]);
    assert_eq!(
        r[2]["firstAvailable"][0],
        c["spec"]["devices"]["requests"][2]["firstAvailable"][0]
    );
    // What comes out is still a ResourceClaim.
    serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceClaim>(after.clone()).unwrap();
    // A second review (reinvocation) adds nothing.
    assert_eq!(review("team-a", &after, true), Verdict::Unchanged);
}

#[test]
fn claims_without_shared_requests_are_left_alone() {
    for c in [
        claim(json!([{"name": "m", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}])),
        claim(json!([])),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "spec": {}}),
        json!({"spec": {"devices": {"requests": "not a list"}}}),
        json!(null),
    ] {
        assert_eq!(review("team-a", &c, true), Verdict::Unchanged, "{c}");
    }
}

#[test]
fn a_request_with_no_room_left_is_denied_with_the_limit() {
    let many: Vec<Value> = (0..MAX_SELECTORS)
        .map(|i| json!({"cel": {"expression": format!("device.attributes['mig.das.com'].gpuIndex != {i}")}}))
        .collect();
    let c = claim(
        json!([{"name": "share", "exactly": {"deviceClassName": SHARED, "selectors": many}}]),
    );
    match review("team-a", &c, true) {
        Verdict::Denied(why) => {
            for part in ["\"share\"", SHARED, "32 selectors", "team-a", "at most 31"] {
                assert!(why.contains(part), "{part:?} missing: {why}");
            }
        }
        other => panic!("{other:?}"),
    }
    // 31 leave room for ours.
    let mut fewer = c.clone();
    fewer["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
        .as_array_mut()
        .unwrap()
        .pop();
    assert!(matches!(
        review("team-a", &fewer, true),
        Verdict::Patched { .. }
    ));
}

#[test]
fn a_namespace_that_is_no_dns_label_is_never_written_into_a_selector() {
    let c = claim(json!([{"name": "s", "exactly": {"deviceClassName": SHARED}}]));
    for bad in ["", "Team", "a\" || true || \"", "-a", &"a".repeat(64)] {
        assert!(
            matches!(review(bad, &c, true), Verdict::Denied(_)),
            "{bad:?} was written into a selector"
        );
    }
}

/// A share's capacity request that no shareable device gives is refused, saying what is valid,
/// whether or not shares stay in their namespace; a valid one passes (and gets the selector
/// only when they do).
#[test]
fn a_share_off_the_memory_step_or_with_bad_shares_is_refused_with_what_is_valid() {
    let share = |caps: Value| {
        claim(json!([{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.shared.mig.das.com",
            "capacity": {"requests": caps}}}]))
    };
    for (caps, says) in [
        (json!({"memory": "1000Mi"}), "memory \"1000Mi\""),
        (json!({"memory": "0"}), "memory \"0\""),
        (json!({"memory": "lots"}), "memory \"lots\""),
        (json!({"shares": "0"}), "shares \"0\""),
        (json!({"shares": "65"}), "shares \"65\""),
        (json!({"shares": "1.5"}), "shares \"1.5\""),
    ] {
        for scoped in [true, false] {
            match review("team-a", &share(caps.clone()), scoped) {
                Verdict::Denied(why) => {
                    assert!(why.contains(says) && why.contains("valid is"), "{why}");
                    assert!(why.contains("gpu.shared.mig.das.com"), "{why}");
                }
                other => panic!("{caps}: {other:?}"),
            }
        }
    }
    let good = share(json!({"memory": "8Gi", "shares": "2"}));
    assert!(matches!(
        review("team-a", &good, true),
        Verdict::Patched { .. }
    ));
    assert_eq!(review("team-a", &good, false), Verdict::Unchanged);
}
