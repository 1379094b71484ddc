use serde_json::json;

use super::*;

fn devices(parameters: Value, driver: &str) -> Value {
    json!({
        "requests": [{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}],
        "config": [{"requests": ["mig"], "opaque": {"driver": driver, "parameters": parameters}}],
    })
}

fn bad() -> Value {
    json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": "Exclusive", "timeSlice": "1ms"}})
}

fn claim(devices: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": devices}})
}

fn template(devices: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {"devices": devices}}})
}

fn denied(v: Verdict) -> String {
    match v {
        Verdict::Denied(m) => m,
        Verdict::Allowed => panic!("allowed"),
    }
}

#[test]
fn a_bad_config_is_denied_with_its_field_path_and_the_decoders_words() {
    let decoder = das_api::device_config::decode(&bad()).unwrap_err();
    let m = denied(review("ResourceClaim", &claim(devices(bad(), "mig.das.com"))).unwrap());
    assert_eq!(
        m,
        format!(
            "the device configuration for mig.das.com: spec.devices.config[0].opaque.parameters: {decoder}"
        )
    );
    let m = denied(
        review(
            "ResourceClaimTemplate",
            &template(devices(bad(), "mig.das.com")),
        )
        .unwrap(),
    );
    assert!(
        m.starts_with(
            "the device configuration for mig.das.com: spec.spec.devices.config[0].opaque.parameters: "
        ),
        "{m}"
    );
    assert!(m.ends_with(&decoder), "{m}");
}

#[test]
fn good_configs_other_drivers_and_other_kinds_are_allowed() {
    let good = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig"});
    for (kind, obj) in [
        ("ResourceClaim", claim(devices(good.clone(), "mig.das.com"))),
        (
            "ResourceClaimTemplate",
            template(devices(good, "mig.das.com")),
        ),
        (
            "ResourceClaim",
            claim(devices(json!("garbage"), "gpu.nvidia.com")),
        ),
        ("ResourceClaim", claim(json!({}))),
        ("Pod", json!({"not": "a claim"})),
    ] {
        assert_eq!(
            review(kind, &obj).unwrap(),
            Verdict::Allowed,
            "{kind} {obj}"
        );
    }
}

#[test]
fn a_malformed_object_is_an_error_not_a_verdict() {
    let e = review(
        "ResourceClaim",
        &json!({"spec": {"devices": {"config": "no"}}}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("invalid type"), "{e}");
}
