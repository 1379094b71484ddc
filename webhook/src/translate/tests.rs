//! Unit tests of the translation (docs/design.md §8): shape of the patched pod, names, idempotence and
//! every denial.

use super::*;
use serde_json::{Value, json};

fn offered() -> Offered {
    profiles().into()
}

fn profiles() -> Vec<String> {
    // As the chart names the classes: NVIDIA's names (`1g.10gb+me` → `1g.10gb.me`), and a real
    // Blackwell `-me` profile.
    ["1g.10gb", "1g.10gb.me", "1g.24gb-me", "2g.20gb", "3g.40gb"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).expect("test pod")
}

/// A pod with one container `app` whose resources are `resources`.
fn one(resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "app", "image": "i", "resources": resources}]}})
}

/// Applies the translation's patch to `raw`, as the API server does.
fn apply(raw: &Value, t: &Translation) -> Value {
    let mut out = raw.clone();
    json_patch::patch(&mut out, &t.patch).expect("patch applies");
    out
}

fn ok(raw: &Value) -> (Translation, Value) {
    let t = translate(&pod(raw.clone()), &offered()).expect("translated");
    let after = apply(raw, &t);
    (t, after)
}

fn denied(raw: Value) -> String {
    translate(&pod(raw), &offered())
        .expect_err("denied")
        .to_string()
}

#[test]
fn one_slice_becomes_a_claim_from_a_template() {
    let raw = one(
        json!({"limits": {"nvidia.com/mig-1g.10gb": "1", "cpu": "2"},
        "requests": {"nvidia.com/mig-1g.10gb": "1", "cpu": "1"}}),
    );
    let (t, after) = ok(&raw);
    assert_eq!(
        after["spec"]["resourceClaims"],
        json!([{"name": "mig-app-1g-10gb", "resourceClaimTemplateName": "das-mig-1g-10gb-x1"}])
    );
    let res = &after["spec"]["containers"][0]["resources"];
    assert_eq!(res["claims"], json!([{"name": "mig-app-1g-10gb"}]));
    assert_eq!(res["limits"], json!({"cpu": "2"}), "other limits untouched");
    assert_eq!(
        res["requests"],
        json!({"cpu": "1"}),
        "other requests untouched"
    );
    let ann: Vec<Translated> = serde_json::from_str(
        after["metadata"]["annotations"][TRANSLATION_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        ann,
        vec![Translated {
            container: "app".into(),
            resource: "nvidia.com/mig-1g.10gb".into(),
            count: 1,
            claim: "mig-app-1g-10gb".into(),
            template: "das-mig-1g-10gb-x1".into(),
        }]
    );
    assert_eq!(t.templates.len(), 1);
    let tv = serde_json::to_value(&t.templates[0]).unwrap();
    assert_eq!(tv["metadata"]["name"], "das-mig-1g-10gb-x1");
    assert_eq!(
        tv["spec"]["spec"]["devices"]["requests"],
        json!([{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com",
            "allocationMode": "ExactCount", "count": 1}}])
    );
}

#[test]
fn count_goes_into_the_template() {
    let raw = one(json!({"limits": {"nvidia.com/mig-1g.10gb": "3"}}));
    let (t, after) = ok(&raw);
    assert_eq!(
        after["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
        "das-mig-1g-10gb-x3"
    );
    let tv = serde_json::to_value(&t.templates[0]).unwrap();
    assert_eq!(
        tv["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"],
        3
    );
    assert!(
        after["spec"]["containers"][0]["resources"]
            .get("limits")
            .is_none()
    );
}

#[test]
fn requests_only_are_translated_too() {
    let raw = one(json!({"requests": {"nvidia.com/mig-2g.20gb": "2", "memory": "1Gi"}}));
    let (_, after) = ok(&raw);
    let res = &after["spec"]["containers"][0]["resources"];
    assert_eq!(res["requests"], json!({"memory": "1Gi"}));
    assert_eq!(res["claims"], json!([{"name": "mig-app-2g-20gb"}]));
}

#[test]
fn me_profile_uses_nvidias_name_for_the_class_and_dns_names() {
    let raw = one(json!({"limits": {"nvidia.com/mig-1g.10gb.me": "1"}}));
    let (t, after) = ok(&raw);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(
        after["spec"]["resourceClaims"][0]["name"],
        "mig-app-1g-10gb-me"
    );
    let tv = serde_json::to_value(&t.templates[0]).unwrap();
    assert_eq!(tv["metadata"]["name"], "das-mig-1g-10gb-me-x1");
    assert_eq!(
        tv["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "1g.10gb.me.mig.das.com"
    );
}

#[test]
fn old_me_spellings_still_work_with_a_warning() {
    for old in ["nvidia.com/mig-1g.10gb-me", "nvidia.com/mig-1g.10gb+me"] {
        let raw = one(json!({"limits": {old: "1"}}));
        let (t, after) = ok(&raw);
        assert_eq!(
            t.warnings,
            [format!(
                "{old} is deprecated: use nvidia.com/mig-1g.10gb.me, the name NVIDIA's device plugin uses"
            )]
        );
        let tv = serde_json::to_value(&t.templates[0]).unwrap();
        assert_eq!(tv["metadata"]["name"], "das-mig-1g-10gb-me-x1");
        assert_eq!(
            tv["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
            "1g.10gb.me.mig.das.com"
        );
        assert!(
            after["spec"]["containers"][0]["resources"]["limits"]
                .as_object()
                .is_none_or(|l| l.is_empty()),
            "the old key is removed too"
        );
        assert_eq!(
            t.translated[0].resource, old,
            "the annotation keeps what the pod said"
        );
    }
}

#[test]
fn a_real_dash_me_profile_is_not_taken_for_an_alias() {
    let raw = one(json!({"limits": {"nvidia.com/mig-1g.24gb-me": "1"}}));
    let (t, _) = ok(&raw);
    assert!(t.warnings.is_empty());
    let tv = serde_json::to_value(&t.templates[0]).unwrap();
    assert_eq!(tv["metadata"]["name"], "das-mig-1g-24gb--me-x1");
    assert_eq!(
        tv["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "1g.24gb-me.mig.das.com"
    );
}

#[test]
fn init_and_regular_containers_each_get_their_own_claim() {
    let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "init", "image": "i",
                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
            "containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}}},
                {"name": "plain", "image": "i", "resources": {"limits": {"cpu": "1"}}}]}});
    let (t, after) = ok(&raw);
    let names: Vec<&str> = after["spec"]["resourceClaims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "mig-init-1g-10gb",
            "mig-a-1g-10gb",
            "mig-b-1g-10gb",
            "mig-b-2g-20gb"
        ]
    );
    assert_eq!(
        after["spec"]["initContainers"][0]["resources"]["claims"],
        json!([{"name": "mig-init-1g-10gb"}])
    );
    assert_eq!(
        after["spec"]["containers"][1]["resources"]["claims"],
        json!([{"name": "mig-b-1g-10gb"}, {"name": "mig-b-2g-20gb"}])
    );
    assert_eq!(
        after["spec"]["containers"][2]["resources"],
        json!({"limits": {"cpu": "1"}})
    );
    let tnames: Vec<String> = t
        .templates
        .iter()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        tnames,
        ["das-mig-1g-10gb-x1", "das-mig-2g-20gb-x1"],
        "one template per (profile, count)"
    );
}

#[test]
fn translating_twice_changes_nothing() {
    let raw = one(json!({"limits": {"nvidia.com/mig-1g.10gb": "2"}}));
    let (_, after) = ok(&raw);
    let again = translate(&pod(after), &offered()).expect("still valid");
    assert!(again.is_empty());
    assert!(again.patch.0.is_empty());
    assert!(again.templates.is_empty());
}

#[test]
fn pod_without_legacy_requests_is_left_alone() {
    let t = translate(&pod(one(json!({"limits": {"cpu": "1"}}))), &offered()).unwrap();
    assert!(t.is_empty() && t.patch.0.is_empty());
}

#[test]
fn fields_unknown_to_the_typed_pod_survive_the_patch() {
    let mut raw = one(json!({"limits": {"nvidia.com/mig-1g.10gb": "1"}}));
    raw["spec"]["someFutureField"] = json!({"x": 1});
    let (_, after) = ok(&raw);
    assert_eq!(after["spec"]["someFutureField"], json!({"x": 1}));
}

#[test]
fn names_stay_dns_labels_whatever_the_container_name() {
    let long = "c".repeat(63);
    let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": long, "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "1"}}},
            {"name": format!("{long}x"), "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "1"}}}]}});
    let (_, after) = ok(&raw);
    let claims = after["spec"]["resourceClaims"].as_array().unwrap();
    let a = claims[0]["name"].as_str().unwrap();
    let b = claims[1]["name"].as_str().unwrap();
    for n in [a, b] {
        assert!(n.len() <= 63, "{n}");
        assert!(
            n.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
        assert!(!n.starts_with('-') && !n.ends_with('-'));
    }
    assert_ne!(a, b);
}

#[test]
fn claim_names_avoid_existing_pod_claims() {
    let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"resourceClaims": [{"name": "mig-app-1g-10gb", "resourceClaimName": "mine"}],
            "containers": [{"name": "app", "image": "i",
                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}});
    let (_, after) = ok(&raw);
    assert_eq!(
        after["spec"]["resourceClaims"][1]["name"],
        "mig-app-1g-10gb-2"
    );
}

#[test]
fn unknown_profile_is_denied_with_the_offered_list() {
    let m = denied(one(json!({"limits": {"nvidia.com/mig-9g.99gb": "1"}})));
    assert!(m.contains("unknown MIG profile \"9g.99gb\""), "{m}");
    assert!(
        m.contains("1g.10gb, 1g.10gb.me, 1g.24gb-me, 2g.20gb, 3g.40gb"),
        "{m}"
    );
    let none = translate(
        &pod(one(json!({"limits": {"nvidia.com/mig-1g.10gb": "1"}}))),
        &Offered::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(none.contains("offers none"), "{none}");
}

#[test]
fn non_positive_integer_quantities_are_denied() {
    for q in ["0", "1.5", "500m", "-1", "1k", "2e0"] {
        let m = denied(one(json!({"limits": {"nvidia.com/mig-1g.10gb": q}})));
        assert!(m.contains("is not a positive integer"), "{q}: {m}");
        assert!(m.contains("container \"app\""), "{m}");
    }
}

#[test]
fn requests_different_from_limits_are_denied() {
    let m = denied(one(json!({"limits": {"nvidia.com/mig-1g.10gb": "2"},
        "requests": {"nvidia.com/mig-1g.10gb": "1"}})));
    assert!(m.contains("requests (1) and limits (2) differ"), "{m}");
}

#[test]
fn a_das_claim_for_the_same_profile_is_denied() {
    let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"resourceClaims": [{"name": "mine", "resourceClaimTemplateName": "das-mig-1g-10gb-x1"}],
            "containers": [{"name": "app", "image": "i", "resources": {
                "claims": [{"name": "mine"}],
                "limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}});
    let m = denied(raw);
    assert!(m.contains("already holds DAS claim \"mine\""), "{m}");
}

#[test]
fn every_problem_is_reported_and_nothing_applied() {
    let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/mig-7g.80gb": "1"}}},
            {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "0"}}}]}});
    let d = translate(&pod(raw), &offered()).unwrap_err();
    assert_eq!(d.problems.len(), 2, "{d}");
}

#[test]
fn offered_profiles_come_from_class_names() {
    assert_eq!(
        offered_profile("1g.10gb.mig.das.com").as_deref(),
        Some("1g.10gb")
    );
    assert_eq!(
        offered_profile("1g.10gb.me.mig.das.com").as_deref(),
        Some("1g.10gb.me")
    );
    assert_eq!(offered_profile("mig.das.com"), None);
    assert_eq!(offered_profile("gpu.nvidia.com"), None);
}

/// Issue 12: a count beyond what one node holds (or beyond what one claim can be allocated) is
/// denied with the maximum, instead of a pod that stays Pending for ever.
#[test]
fn counts_beyond_one_node_are_denied_with_the_maximum() {
    let mut o = offered();
    o.max_per_node.insert("1g.10gb".into(), 14);
    let huge = pod(one(
        json!({"limits": {"nvidia.com/mig-1g.10gb": "4294967295"}}),
    ));
    let m = translate(&huge, &o).unwrap_err().to_string();
    assert!(
        m.contains("4294967295 slices cannot be allocated") && m.contains("at most 14"),
        "{m}"
    );
    let beyond_u64 = pod(one(
        json!({"limits": {"nvidia.com/mig-1g.10gb": "99999999999999999999999"}}),
    ));
    let m = translate(&beyond_u64, &o).unwrap_err().to_string();
    assert!(m.contains("at most 14"), "{m}");
    let over = pod(one(json!({"limits": {"nvidia.com/mig-1g.10gb": "15"}})));
    let m = translate(&over, &o).unwrap_err().to_string();
    assert!(
        m.contains("at most 14 1g.10gb slices fit on one node"),
        "{m}"
    );
    assert!(
        translate(
            &pod(one(json!({"limits": {"nvidia.com/mig-1g.10gb": "14"}}))),
            &o
        )
        .is_ok()
    );
    // Without published capacity, the claim limit still holds.
    let m = translate(
        &pod(one(json!({"limits": {"nvidia.com/mig-2g.20gb": "33"}}))),
        &o,
    )
    .unwrap_err()
    .to_string();
    assert!(m.contains("at most 32"), "{m}");
}

#[test]
fn a_template_that_asks_for_something_else_is_a_mismatch() {
    let want = template("1g.10gb", 2);
    assert_eq!(template_mismatch(&want, &want), None);
    // The API server's defaults are no difference.
    let mut defaulted: serde_json::Value = serde_json::to_value(&want).unwrap();
    defaulted["metadata"]["uid"] = json!("u");
    assert_eq!(
        template_mismatch(&serde_json::from_value(defaulted).unwrap(), &want),
        None
    );
    for (what, bad) in [
        ("count", template("1g.10gb", 3)),
        ("class", template("2g.20gb", 2)),
    ] {
        let why = template_mismatch(&bad, &want).expect(what);
        assert!(why.contains("it asks for"), "{what}: {why}");
    }
    let mut selector: serde_json::Value = serde_json::to_value(&want).unwrap();
    selector["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] =
        json!([{"cel": {"expression": "true"}}]);
    assert!(template_mismatch(&serde_json::from_value(selector).unwrap(), &want).is_some());
}

/// What a cluster with `gpu.das.com` and nodes of up to 8 whole GPUs offers, with
/// `--translate-whole-gpus`.
fn with_whole_gpus() -> Offered {
    Offered {
        whole_gpus: Some(WholeGpus {
            class: true,
            max_per_node: Some(8),
        }),
        ..offered()
    }
}

fn whole(raw: &Value) -> (Translation, Value) {
    let t = translate(&pod(raw.clone()), &with_whole_gpus()).expect("translated");
    let after = apply(raw, &t);
    (t, after)
}

fn whole_denied(raw: Value, offered: &Offered) -> String {
    translate(&pod(raw), offered)
        .expect_err("denied")
        .to_string()
}

#[test]
fn whole_gpus_are_left_alone_unless_translated() {
    let raw = one(json!({"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}}));
    let (t, after) = ok(&raw);
    assert_eq!(t.translated.len(), 1, "{:?}", t.translated);
    assert_eq!(
        after["spec"]["containers"][0]["resources"]["limits"],
        json!({"nvidia.com/gpu": "1"}),
        "nvidia.com/gpu stays for NVIDIA's device plugin"
    );
    let only = pod(one(json!({"limits": {"nvidia.com/gpu": "1"}})));
    assert!(translate(&only, &offered()).unwrap().is_empty());
    assert!(wanted(&only, false).is_empty());
    assert_eq!(wanted(&only, true), ["nvidia.com/gpu"]);
}

#[test]
fn whole_gpus_become_a_claim_for_gpu_das_com() {
    let raw = one(json!({"limits": {"nvidia.com/gpu": "2", "cpu": "2"},
        "requests": {"nvidia.com/gpu": "2"}}));
    let (t, after) = whole(&raw);
    assert_eq!(
        after["spec"]["resourceClaims"],
        json!([{"name": "gpu-app", "resourceClaimTemplateName": "das-gpu-x2"}])
    );
    let res = &after["spec"]["containers"][0]["resources"];
    assert_eq!(res["claims"], json!([{"name": "gpu-app"}]));
    assert_eq!(res["limits"], json!({"cpu": "2"}));
    assert!(res.get("requests").is_none(), "{res}");
    assert_eq!(
        t.translated,
        [Translated {
            container: "app".into(),
            resource: "nvidia.com/gpu".into(),
            count: 2,
            claim: "gpu-app".into(),
            template: "das-gpu-x2".into(),
        }]
    );
    assert!(t.warnings.is_empty());
    let tv = serde_json::to_value(&t.templates[0]).unwrap();
    assert_eq!(tv["metadata"]["name"], "das-gpu-x2");
    assert_eq!(
        tv["metadata"]["annotations"]["mig.das.com/legacy-resource"],
        "nvidia.com/gpu"
    );
    assert_eq!(
        tv["spec"]["spec"]["devices"]["requests"],
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.das.com",
            "allocationMode": "ExactCount", "count": 2}}])
    );
    assert_eq!(
        template_mismatch(&t.templates[0], &whole_gpu_template(2)),
        None
    );
    assert!(template_mismatch(&t.templates[0], &whole_gpu_template(1)).is_some());
    let again = translate(&pod(after), &with_whole_gpus()).expect("still valid");
    assert!(again.is_empty(), "translating twice changes nothing");
}

#[test]
fn whole_gpus_and_slices_in_one_pod_get_a_claim_each() {
    let raw = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1",
                "nvidia.com/mig-1g.10gb": "1"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let (t, after) = whole(&raw);
    let names: Vec<&str> = after["spec"]["resourceClaims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mig-a-1g-10gb", "gpu-a", "gpu-b"]);
    let tnames: Vec<String> = t
        .templates
        .iter()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(tnames, ["das-mig-1g-10gb-x1", "das-gpu-x1"]);
    for c in 0..2 {
        assert!(
            after["spec"]["containers"][c]["resources"]
                .get("limits")
                .is_none()
        );
    }
}

#[test]
fn whole_gpu_requests_are_denied_as_slices_are() {
    let o = with_whole_gpus();
    for q in ["0", "1.5", "500m"] {
        let m = whole_denied(one(json!({"limits": {"nvidia.com/gpu": q}})), &o);
        assert!(
            m.contains("container \"app\": nvidia.com/gpu: quantity")
                && m.contains("ask for a whole number of GPUs"),
            "{q}: {m}"
        );
    }
    let m = whole_denied(
        one(json!({"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}})),
        &o,
    );
    assert!(
        m.contains("requests (1) and limits (2) differ; whole GPUs cannot be overcommitted"),
        "{m}"
    );
    let m = whole_denied(one(json!({"limits": {"nvidia.com/gpu": "9"}})), &o);
    assert!(
        m.contains("9 GPUs cannot be allocated to one pod; at most 8 whole GPUs fit on one node"),
        "{m}"
    );
    assert!(translate(&pod(one(json!({"limits": {"nvidia.com/gpu": "8"}}))), &o).is_ok());
    let unknown = Offered {
        whole_gpus: Some(WholeGpus {
            class: true,
            max_per_node: None,
        }),
        ..offered()
    };
    let m = whole_denied(one(json!({"limits": {"nvidia.com/gpu": "33"}})), &unknown);
    assert!(m.contains("at most 32"), "{m}");
    let no_class = Offered {
        whole_gpus: Some(WholeGpus::default()),
        ..offered()
    };
    let m = whole_denied(one(json!({"limits": {"nvidia.com/gpu": "1"}})), &no_class);
    assert!(m.contains("no DeviceClass gpu.das.com"), "{m}");
    assert!(!offers(&no_class, "nvidia.com/gpu") && offers(&o, "nvidia.com/gpu"));
    assert!(offers(&o, "1g.10gb") && !offers(&o, "9g.99gb"));
    let held = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"resourceClaims": [{"name": "mine", "resourceClaimTemplateName": "das-gpu-x1"}],
            "containers": [{"name": "app", "image": "i", "resources": {
                "claims": [{"name": "mine"}], "limits": {"nvidia.com/gpu": "1"}}}]}});
    let m = whole_denied(held, &o);
    assert!(
        m.contains("already holds DAS claim \"mine\" for whole GPUs"),
        "{m}"
    );
}
