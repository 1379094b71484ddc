use serde_json::json;

use super::*;

fn ok(v: serde_json::Value) -> MigDeviceConfig {
    decode(&v).unwrap()
}

fn err(v: serde_json::Value) -> String {
    decode(&v).unwrap_err()
}

#[test]
fn a_config_decodes_with_exclusive_as_the_default() {
    let base = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG});
    assert_eq!(ok(base), MigDeviceConfig::default());
    let explicit = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
        "sharing": {"strategy": "Exclusive"}});
    assert_eq!(
        ok(explicit).sharing.unwrap().strategy,
        SharingStrategy::Exclusive
    );
}

#[test]
fn an_mps_config_decodes_with_its_limits() {
    let full = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
        "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50, "pinnedDeviceMemoryLimit": "2Gi"}}});
    let c = ok(full);
    let mps = c.mps().unwrap();
    assert_eq!(mps.active_thread_percentage, Some(50));
    assert_eq!(mps.pinned_device_memory_limit_mib(), Ok(Some(2048)));
    // No `mps`: MPS without limits; exclusive: no MPS at all.
    let bare = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
        "sharing": {"strategy": "MPS"}});
    assert_eq!(ok(bare).mps(), Some(MpsConfig::default()));
    assert_eq!(MigDeviceConfig::default().mps(), None);
}

#[test]
fn a_time_slicing_config_decodes_with_its_interval() {
    let short = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}});
    let c = ok(short);
    assert_eq!(c.time_slice(), Some(TimeSliceInterval::Short));
    assert_eq!(c.mps(), None);
    // No `timeSlicing`, or no interval: the driver's default; other strategies: none.
    for bare in [
        json!({"strategy": "TimeSlicing"}),
        json!({"strategy": "TimeSlicing", "timeSlicing": {}}),
    ] {
        let v = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG, "sharing": bare});
        assert_eq!(ok(v).time_slice(), Some(TimeSliceInterval::Default));
    }
    assert_eq!(MigDeviceConfig::default().time_slice(), None);
    // NVIDIA's levels of `nvidia-smi compute-policy --set-timeslice`.
    let levels: Vec<u32> = [
        TimeSliceInterval::Default,
        TimeSliceInterval::Short,
        TimeSliceInterval::Medium,
        TimeSliceInterval::Long,
    ]
    .iter()
    .map(|i| i.level())
    .collect();
    assert_eq!(levels, [0, 1, 2, 3]);
}

#[test]
fn quantities_are_read_as_kubernetes_writes_them() {
    for (q, bytes) in [
        ("2Gi", 2u64 << 30),
        ("512Mi", 512 << 20),
        ("1.5Gi", 3 << 29),
        ("1G", 1_000_000_000),
        ("3e9", 3_000_000_000),
        ("1048576", 1 << 20),
        ("+4Ki", 4096),
        ("1Pi", 1 << 50),
    ] {
        assert_eq!(quantity_bytes(q), Ok(bytes), "{q}");
    }
    for bad in [
        "",
        "-1Gi",
        "Gi",
        "2GB",
        "100m",
        "1e",
        "99999999999999999999Ei",
    ] {
        assert!(quantity_bytes(bad).is_err(), "{bad:?} accepted");
    }
    // The exa suffixes are refused (the `kube_quantity` crate reads `E` as an exponent): no
    // slice has an exabyte, so no valid limit is lost.
    for exa in ["1Ei", "1E"] {
        assert!(
            matches!(quantity_bytes(exa), Err(QuantityError::Syntax(_))),
            "{exa}"
        );
    }
    assert_eq!(quantity_bytes("-1Gi"), Err(QuantityError::Negative));
    assert_eq!(quantity_bytes("100m"), Err(QuantityError::Fraction));
    assert_eq!(
        quantity_bytes("17179869184Gi"),
        Err(QuantityError::TooLarge)
    );
}

#[test]
fn every_bad_config_says_what_is_wrong_and_what_is_valid() {
    let cases = [
        (json!("x"), "not an object"),
        (
            json!({"kind": KIND_MIG_DEVICE_CONFIG}),
            "apiVersion is missing; valid: mig.das.com/v1alpha1",
        ),
        (
            json!({"apiVersion": "mig.das.com/v1", "kind": KIND_MIG_DEVICE_CONFIG}),
            "unknown apiVersion \"mig.das.com/v1\"; valid: mig.das.com/v1alpha1",
        ),
        (
            json!({"apiVersion": API_VERSION}),
            "kind is missing; valid: MigDeviceConfig",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": "GpuConfig"}),
            "unknown kind \"GpuConfig\" in mig.das.com/v1alpha1; valid: MigDeviceConfig",
        ),
        (
            json!({"apiVersion": 1, "kind": KIND_MIG_DEVICE_CONFIG}),
            "apiVersion and kind must be strings",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG, "shareing": {}}),
            "unknown field `shareing`, expected `sharing`",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "Mps"}}),
            "unknown variant `Mps`, expected one of `Exclusive`, `MPS`, `TimeSlicing`",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "Exclusive", "mps": {}}}),
            "sharing.mps is set but sharing.strategy is Exclusive; set strategy: MPS, or remove mps",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "TimeSlicing", "mps": {}}}),
            "sharing.mps is set but sharing.strategy is TimeSlicing; set strategy: MPS, or remove mps",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "timeSlicing": {"interval": "Short"}}}),
            "sharing.timeSlicing is set but sharing.strategy is MPS; set strategy: TimeSlicing, or remove timeSlicing",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Fast"}}}),
            "sharing.timeSlicing.interval \"Fast\" is not valid; valid: Default, Short, Medium, Long",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": 2}}}),
            "sharing.timeSlicing.interval 2 is not valid; valid: Default, Short, Medium, Long",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 0}}}),
            "sharing.mps.activeThreadPercentage 0 is not valid; valid: an integer from 1 to 100",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 300}}}),
            "activeThreadPercentage 300 is not valid; valid: an integer from 1 to 100",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": "half"}}}),
            "activeThreadPercentage \"half\" is not valid",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": "2Gb"}}}),
            "sharing.mps.pinnedDeviceMemoryLimit \"2Gb\": not a quantity (quantity parsing failed); valid: a number with an optional suffix Ki, Mi",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": "1000Ki"}}}),
            "\"1000Ki\" is below 1Mi; valid: a memory size of at least 1Mi",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
                "sharing": {"strategy": "MPS", "mps": {"threads": 50}}}),
            "unknown field `threads`, expected `activeThreadPercentage` or `pinnedDeviceMemoryLimit`",
        ),
        (
            json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG, "sharing": "yes"}),
            "MigDeviceConfig: invalid type",
        ),
    ];
    for (input, want) in cases {
        let e = err(input.clone());
        assert!(e.contains(want), "{input}: {e:?} lacks {want:?}");
    }
}

/// A claim allocated `results` (request, driver), with `config` as the allocation lists it.
fn claim(results: &[(&str, &str)], config: serde_json::Value) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .enumerate()
        .map(|(i, (request, driver))| {
            json!({"request": request, "driver": driver, "pool": "n0", "device": format!("d{i}")})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}
    }))
    .unwrap()
}

fn opaque(
    source: &str,
    driver: &str,
    requests: &[&str],
    parameters: serde_json::Value,
) -> serde_json::Value {
    json!({"source": source, "requests": requests, "opaque": {"driver": driver, "parameters": parameters}})
}

fn exclusive() -> serde_json::Value {
    json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG, "sharing": {"strategy": "Exclusive"}})
}

#[test]
fn configs_resolve_per_request_class_first_and_other_drivers_ignored() {
    let rc = claim(
        &[
            ("a", DRIVER_NAME),
            ("b/small", DRIVER_NAME),
            ("nic", "net.example.com"),
        ],
        json!([
            opaque(
                "FromClass",
                DRIVER_NAME,
                &[],
                json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG})
            ),
            opaque("FromClaim", DRIVER_NAME, &["b"], exclusive()),
            opaque(
                "FromClaim",
                "net.example.com",
                &["nic"],
                json!({"anything": "goes"})
            ),
        ]),
    );
    let got = resolve(&rc).unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), ["a", "b/small"]);
    assert_eq!(got["a"], MigDeviceConfig::default());
    assert_eq!(
        got["b/small"].sharing.as_ref().map(|s| s.strategy),
        Some(SharingStrategy::Exclusive),
        "the claim's config, naming the main request, reaches its subrequest"
    );
}

#[test]
fn a_bad_config_or_one_for_a_request_das_does_not_serve_fails_with_its_position() {
    let bad = claim(
        &[("a", DRIVER_NAME)],
        json!([opaque(
            "FromClaim",
            DRIVER_NAME,
            &[],
            json!({"apiVersion": API_VERSION, "kind": "Nope"})
        )]),
    );
    let e = resolve(&bad).unwrap_err();
    assert!(
        e.starts_with("config 0 (from FromClaim): unknown kind \"Nope\""),
        "{e}"
    );
    let elsewhere = claim(
        &[("a", DRIVER_NAME), ("nic", "net.example.com")],
        json!([opaque("FromClaim", DRIVER_NAME, &["nic"], exclusive())]),
    );
    let e = resolve(&elsewhere).unwrap_err();
    assert!(
        e.contains("names request \"nic\", but DAS was allocated nothing for it; DAS's requests in this claim: a"),
        "{e}"
    );
    // A prefix is not a request: "a" does not name "ab".
    let prefix = claim(
        &[("ab", DRIVER_NAME)],
        json!([opaque("FromClaim", DRIVER_NAME, &["a"], exclusive())]),
    );
    assert!(resolve(&prefix).is_err());
    // Another driver's config is never decoded, however bad.
    let other = claim(
        &[("a", DRIVER_NAME)],
        json!([opaque(
            "FromClaim",
            "gpu.nvidia.com",
            &["a"],
            json!("garbage")
        )]),
    );
    assert!(resolve(&other).is_ok());
}

#[test]
fn admission_checks_only_das_configs_by_their_field_path() {
    let spec = |config: serde_json::Value| -> ResourceClaimSpec {
        serde_json::from_value(json!({"devices": {
            "requests": [{"name": "a", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}],
            "config": config,
        }}))
        .unwrap()
    };
    let bad = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG,
        "sharing": {"strategy": "Exclusive", "timeSlice": "1ms"}});
    let s = spec(json!([
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": "garbage"}},
        {"requests": ["a"], "opaque": {"driver": DRIVER_NAME, "parameters": bad}},
    ]));
    let e = validate_spec(&s).unwrap_err();
    assert_eq!(
        e,
        "spec.devices.config[1].opaque.parameters: MigDeviceConfig: unknown field `timeSlice`, expected one of `strategy`, `mps`, `timeSlicing`"
    );
    // The same words as a prepare of that config (decode's message).
    assert!(e.ends_with(&decode(&bad).unwrap_err()));
    let good = json!({"apiVersion": API_VERSION, "kind": KIND_MIG_DEVICE_CONFIG});
    let s = spec(json!([{"opaque": {"driver": DRIVER_NAME, "parameters": good}}]));
    assert_eq!(validate_spec(&s), Ok(()));
    assert_eq!(validate_spec(&ResourceClaimSpec::default()), Ok(()));
}
