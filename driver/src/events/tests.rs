//! The requests of [`KubeEvents`] against a mocked API server ([`crate::mock_api_server`]): the
//! `events.k8s.io/v1` Event it posts about a claim or the Node, the merge patch of a repeat,
//! and the bounds of a post that fails or hangs.

use http::Method;
use serde_json::{Value, json};

use super::*;
use crate::mock_api_server::{ANY, ApiServer, Exchange, finished};

const CLAIM_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";
const NODE_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn claim() -> EventTarget {
    EventTarget::Claim {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "claim-uid".into(),
    }
}

/// The Event the plugin on node `n0` posts about claim `ns/c`.
fn claim_event(type_: &str, reason: &str, note: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": ANY, "namespace": "ns"},
        "eventTime": ANY,
        "type": type_,
        "reason": reason,
        "action": reason,
        "note": note,
        "regarding": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "namespace": "ns", "name": "c", "uid": "claim-uid"},
        "reportingController": "das-kubelet-plugin",
        "reportingInstance": "n0",
    })
}

#[tokio::test]
async fn an_event_about_a_claim_is_posted_in_its_namespace_regarding_the_claim_by_uid() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{CLAIM_EVENTS}?"))
            .body(claim_event("Warning", "PrepareFailed", "no slice"))
            .answer(201, json!({})),
    ]);
    let events = KubeEvents::new(client, "n0");
    events
        .warn(&claim(), "PrepareFailed", "no slice".into())
        .await;
    drop(events);
    let got = finished(server).await;
    let body = got[0].body.as_ref().unwrap();
    let name = body["metadata"]["name"].as_str().unwrap();
    assert!(
        name.strip_prefix("c.")
            .is_some_and(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_hexdigit())),
        "named after the claim and the time: {name}"
    );
    let time = body["eventTime"].as_str().unwrap();
    assert!(
        time.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && time.ends_with('Z'),
        "a MicroTime: {time}"
    );
}

#[tokio::test]
async fn an_event_about_the_node_is_posted_in_default_regarding_the_node_by_name() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{NODE_EVENTS}?"))
            .body(json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                // A Node is cluster-scoped: the event has no namespace of its own and goes to
                // `default`.
                "metadata": {"name": ANY},
                "eventTime": ANY,
                "type": "Normal",
                "reason": "GpuRecovered",
                "action": "GpuRecovered",
                "note": "GPU 0 answers again",
                // The node's name as its UID, as the kubelet does: `kubectl describe node`
                // finds events by the Node's UID or its name.
                "regarding": {"apiVersion": "v1", "kind": "Node", "name": "n0", "uid": "n0"},
                "reportingController": "das-kubelet-plugin",
                "reportingInstance": "n0",
            }))
            .answer(201, json!({})),
    ]);
    let events = KubeEvents::new(client, "n0");
    events
        .event(
            &EventTarget::Node,
            EventKind::Normal,
            "GpuRecovered",
            "GPU 0 answers again".into(),
        )
        .await;
    drop(events);
    let got = finished(server).await;
    let name = got[0].body.as_ref().unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(name.starts_with("n0."), "named after the node: {name}");
}

#[tokio::test]
async fn a_repeated_event_is_a_merge_patch_of_the_posted_one_counting_the_series() {
    let (client, server) = ApiServer::new();
    let first = claim_event("Warning", "PrepareFailed", "no slice");
    let mut repeat = first.clone();
    repeat["series"] = json!({"count": 2, "lastObservedTime": ANY});
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{CLAIM_EVENTS}?"))
            .body(first)
            .answer(201, json!({})),
        Exchange::new(Method::PATCH, format!("{CLAIM_EVENTS}/{ANY}?"))
            .content_type("application/merge-patch+json")
            .body(repeat)
            .answer(200, json!({})),
    ]);
    let events = KubeEvents::new(client, "n0");
    for _ in 0..2 {
        events
            .warn(&claim(), "PrepareFailed", "no slice".into())
            .await;
    }
    drop(events);
    let got = finished(server).await;
    let posted = &got[0].body.as_ref().unwrap();
    let name = posted["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        got[1].uri,
        format!("{CLAIM_EVENTS}/{name}?"),
        "the repeat patches the event posted first"
    );
    let patched = got[1].body.as_ref().unwrap();
    assert_eq!(
        patched["eventTime"], posted["eventTime"],
        "the first observation stays"
    );
}

#[tokio::test]
async fn a_long_note_is_cut_to_the_limit() {
    let (client, server) = ApiServer::new();
    let note = "x".repeat(MAX_NOTE_CHARS + 500);
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{CLAIM_EVENTS}?"))
            .body(claim_event(
                "Warning",
                "PrepareFailed",
                &note[..MAX_NOTE_CHARS],
            ))
            .answer(201, json!({})),
    ]);
    let events = KubeEvents::new(client, "n0");
    events.warn(&claim(), "PrepareFailed", note.clone()).await;
    drop(events);
    finished(server).await;
}

#[tokio::test]
async fn a_refused_post_is_not_returned_and_not_taken_for_a_posted_event() {
    let (client, server) = ApiServer::new();
    let body = claim_event("Warning", "PrepareFailed", "no slice");
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{CLAIM_EVENTS}?"))
            .body(body.clone())
            .fail(403, "Forbidden"),
        // Posted again, not patched: the refused event was never stored.
        Exchange::new(Method::POST, format!("{CLAIM_EVENTS}?"))
            .body(body)
            .answer(201, json!({})),
    ]);
    let events = KubeEvents::new(client, "n0");
    for _ in 0..2 {
        events
            .warn(&claim(), "PrepareFailed", "no slice".into())
            .await;
    }
    drop(events);
    finished(server).await;
}

#[tokio::test(start_paused = true)]
async fn a_post_without_an_answer_is_given_up_after_the_timeout() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{NODE_EVENTS}?"))
            .body(json!(ANY))
            .unanswered(),
    ]);
    let events = KubeEvents::new(client, "n0").with_timeout(Duration::from_secs(3));
    let start = tokio::time::Instant::now();
    events
        .warn(&EventTarget::Node, "GpuLost", "GPU 0 is gone".into())
        .await;
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    drop(events);
    finished(server).await;
}

#[test]
fn a_note_is_cut_to_a_thousand_characters_and_to_what_the_api_server_takes_in_bytes() {
    let ascii = "x".repeat(1500);
    assert_eq!(cut_note(&ascii).chars().count(), MAX_NOTE_CHARS);
    // 'é' is 2 bytes: 1000 of them would be 2000 bytes, which the API server refuses.
    let wide = "é".repeat(1500);
    let cut = cut_note(&wide);
    assert_eq!(cut.len(), MAX_NOTE_BYTES);
    assert_eq!(cut.chars().count(), MAX_NOTE_BYTES / 2);
    // A character that would cross the byte limit is left out whole: 1023 bytes, then 'é'.
    let kept = format!("{}a", "é".repeat(511));
    assert_eq!(cut_note(&format!("{kept}éé")), kept);
    assert_eq!(cut_note("short"), "short");
}
