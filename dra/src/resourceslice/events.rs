//! [`KubeNodeEvents`]: the publisher's [`NodeEvents`] over a kube client, for a driver that has
//! no event recorder of its own.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::{NodeEvents, Notice};

/// Longest note the Events API accepts, in bytes of UTF-8 (`events.k8s.io/v1` validation:
/// `len(note) <= 1024`, a Go byte length).
pub const MAX_NOTE_BYTES: usize = 1024;

/// Longest a post may take before it is given up (logged).
pub const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// [`NodeEvents`] that post `events.k8s.io/v1` Events about the Node with a kube [`Recorder`],
/// reported as the driver's component on the node. Notes are cut to [`MAX_NOTE_BYTES`]; a post
/// that fails or takes longer than [`POST_TIMEOUT`] is logged and given up.
pub struct KubeNodeEvents {
    recorder: Recorder,
    node: ObjectReference,
}

impl KubeNodeEvents {
    /// Posts through `client` (built with connect and read timeouts) about Node `node`, as
    /// reporting controller `reporter` (the driver's component, e.g. `example-kubelet-plugin`),
    /// instance `node`.
    pub fn new(client: Client, reporter: &str, node: &str) -> Self {
        let reporter = Reporter {
            controller: reporter.into(),
            instance: Some(node.into()),
        };
        // The node's name as its UID, as the kubelet does for its own Node events: `kubectl
        // describe node` lists the events whose `involvedObject.uid` is the Node's UID or its
        // name, so an event without a UID would not show there.
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        };
        Self {
            recorder: Recorder::new(client, reporter),
            node,
        }
    }
}

#[tonic::async_trait]
impl NodeEvents for KubeNodeEvents {
    async fn post(&self, notice: &Notice, note: String) {
        let reason = notice.reason();
        let event = Event {
            type_: if notice.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(cut_note(&note)),
            action: reason.into(),
            secondary: None,
        };
        match tokio::time::timeout(POST_TIMEOUT, self.recorder.publish(&event, &self.node)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(reason, error = %e, "could not post a Node event"),
            Err(_) => tracing::warn!(reason, "posting a Node event timed out"),
        }
    }
}

/// `note` cut to at most [`MAX_NOTE_BYTES`] bytes, at a character boundary.
fn cut_note(note: &str) -> String {
    let mut end = note.len().min(MAX_NOTE_BYTES);
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note[..end].to_string()
}

#[cfg(test)]
mod tests;
