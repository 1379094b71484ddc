//! The lines a prepare and an unprepare log carry their claim, in the binaries' own log formats
//! (das-runtime's subscriber; the test's runtime is current-thread and the backend calls run
//! inline, so everything logs on the test's thread), at the level filters operators use.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use das_runtime::logging::{LogFormat, capture};
use serde_json::Value;

use crate::claims::handler::ClaimHandler;
use crate::claims::testing::{MemoryApi, NODE, UID_A, inline, preparer};
use crate::gpu::{EmulatedBackend, GpuBackend};

/// The JSON line whose message is `message`.
fn json_line(lines: &[String], message: &str) -> Value {
    lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["fields"]["message"] == message)
        .unwrap_or_else(|| panic!("no line {message:?} in {lines:#?}"))
}

/// Claim `ns/a` (UID_A) allocated one MIG instance on an emulated H100, and its preparer.
fn setup(
    dir: &std::path::Path,
) -> (
    Arc<EmulatedBackend>,
    Arc<MemoryApi>,
    crate::claims::Preparer,
) {
    let emu = Arc::new(EmulatedBackend::open("H100-80GB:1", NODE, &dir.join("emu")).unwrap());
    let api = Arc::new(MemoryApi::default());
    api.allocate("ns", "a", UID_A, &[("gpu", "gpu-0-mig-1g-10gb-6")]);
    let p = preparer(dir, emu.clone(), api.clone(), inline());
    (emu, api, p)
}

fn claim_a() -> crate::claims::ClaimRef {
    crate::claims::ClaimRef {
        namespace: "ns".into(),
        name: "a".into(),
        uid: UID_A.into(),
    }
}

#[tokio::test(start_paused = true)]
async fn json_lines_of_a_prepare_and_an_unprepare_carry_the_claim_in_their_span() {
    let dir = tempfile::tempdir().unwrap();
    let (_emu, api, p) = setup(dir.path());
    // The first status write fails: its writer, a task the prepare starts, logs in its own span.
    api.failing_status_writes.store(1, Ordering::SeqCst);
    let (out, _guard) = capture(LogFormat::Json, "info");
    let done = p.prepare(vec![claim_a()]).await;
    assert!(done[UID_A].is_ok(), "{done:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let undone = p.unprepare(vec![claim_a()]).await;
    assert!(undone[UID_A].is_ok(), "{undone:?}");

    let lines = out.lines();
    let status = "writing the claim's device status failed; retrying";
    for (message, span) in [
        ("prepared", "prepare"),
        (status, "status"),
        ("unprepared", "unprepare"),
    ] {
        let line = json_line(&lines, message);
        let want = serde_json::json!({
            "name": span, "claim.uid": UID_A, "claim.namespace": "ns", "claim.name": "a",
        });
        assert_eq!(line["span"], want, "{line}");
        assert_eq!(line["spans"], Value::Array(vec![want]), "{line}");
        assert!(
            line["fields"].get("claim").is_none(),
            "the claim is the span's, not a field of the line: {line}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_warning_inside_a_prepare_keeps_its_claim_under_a_warn_filter() {
    let dir = tempfile::tempdir().unwrap();
    let (emu, _api, p) = setup(dir.path());
    p.prepare_claim(&claim_a()).await.unwrap();
    // The MIG instance is destroyed behind the plugin's back: the kubelet's retry warns and repairs.
    let instance = emu.all_instances().unwrap().remove(0);
    emu.destroy_instance(0, instance.gi_id).unwrap();
    let (out, _guard) = capture(LogFormat::Text, "warn");
    let done = p.prepare(vec![claim_a()]).await;
    assert!(done[UID_A].is_ok(), "{done:?}");

    let lines = out.lines();
    let warned = lines
        .iter()
        .find(|l| l.contains("slices recorded for this claim are gone"))
        .unwrap_or_else(|| panic!("no warning in {lines:#?}"));
    let span = format!("prepare{{claim.uid={UID_A} claim.namespace=ns claim.name=a}}");
    assert!(warned.contains(&span), "{warned}");
    assert!(
        !lines.iter().any(|l| l.contains(" INFO ")),
        "info lines are filtered out: {lines:#?}"
    );
}
