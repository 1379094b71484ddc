//! The requests of [`KubeNodeEvents`] against a mocked API server
//! ([`crate::testing::api_server`]).

use http::Method;
use serde_json::json;

use super::*;
use crate::resourceslice::Pool;
use crate::testing::api_server::{ANY, ApiServer, Exchange, finished};

#[tokio::test]
async fn a_notice_is_posted_in_default_regarding_the_node_by_name() {
    let (client, server) = ApiServer::new();
    let notice = Notice::TaintsDropped;
    let note = notice.note(&Pool::new("dev.example.com", "n0"));
    let server = server.run(vec![
        Exchange::new(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
        )
        .body(json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            // A Node is cluster-scoped: the event goes to `default`.
            "metadata": {"name": ANY},
            "eventTime": ANY,
            "type": "Warning",
            "reason": "DeviceTaintsDropped",
            "action": "DeviceTaintsDropped",
            "note": note,
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": "n0", "uid": "n0"},
            "reportingController": "example-kubelet-plugin",
            "reportingInstance": "n0",
        }))
        .answer(201, json!({})),
    ]);
    let events = KubeNodeEvents::new(client, "example-kubelet-plugin", "n0");
    events.post(&notice, note.clone()).await;
    drop(events);
    finished(server).await;
}

#[tokio::test]
async fn a_refused_post_is_logged_not_returned() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events?",
        )
        .body(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": ANY}, "eventTime": ANY, "type": "Normal",
            "reason": "SharedCountersKept", "action": "SharedCountersKept", "note": "kept",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": "n0", "uid": "n0"},
            "reportingController": "example-kubelet-plugin", "reportingInstance": "n0"}))
        .fail(403, "Forbidden"),
    ]);
    let events = KubeNodeEvents::new(client, "example-kubelet-plugin", "n0");
    events.post(&Notice::CountersKept, "kept".into()).await;
    drop(events);
    finished(server).await;
}

#[test]
fn notes_are_cut_to_what_the_events_api_accepts_at_a_character_boundary() {
    assert_eq!(cut_note("short"), "short");
    let long = "é".repeat(600); // 1200 bytes
    let cut = cut_note(&long);
    assert_eq!(cut.len(), MAX_NOTE_BYTES);
    assert!(long.starts_with(&cut));
    let odd = format!("a{}", "é".repeat(600));
    assert_eq!(cut_note(&odd).len(), MAX_NOTE_BYTES - 1);
}
