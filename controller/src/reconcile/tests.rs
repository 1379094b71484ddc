use super::*;

#[test]
fn ready_time_in_milliseconds_wins_over_the_whole_second_condition() {
    let claim = |data: serde_json::Value| -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": []}},
            "status": {"devices": [{"driver": "mig.das.com", "pool": "n0", "device": "d",
                "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:01Z"}],
                "data": data}]}
        }))
        .unwrap()
    };
    let base = json!({"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
        "placement": {"start": 0, "size": 1}});
    let mut with_time = base.clone();
    with_time["readyTime"] = json!("2026-01-01T00:00:01.250Z");
    assert_eq!(
        ready_since(&claim(with_time), "d").as_deref(),
        Some("2026-01-01T00:00:01.250Z")
    );
    assert_eq!(
        ready_since(&claim(base), "d").as_deref(),
        Some("2026-01-01T00:00:01Z"),
        "older plugins: the condition"
    );
    assert!(seconds_since("2026-01-01T00:00:01.250Z").is_some());
}

#[test]
fn seconds_since_parses_rfc3339() {
    assert!(seconds_since("2020-01-01T00:00:00Z").unwrap() > 0.0);
    assert!(seconds_since("garbage").is_none());
}
