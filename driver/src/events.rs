//! Kubernetes Events the node plugin posts (`events.k8s.io/v1`), about this Node or a
//! ResourceClaim: GPU health transitions and unclaimed MIG instances (`crate::health`), the
//! node set-up checks (`crate::node_checks`), feature gates the API server drops
//! (`crate::publish`), and the request path's warnings (`crate::claims`).
//!
//! [`EventSink`] is the trait they post through, so each part can be unit-tested with a sink
//! that records; [`KubeEvents`] posts them with a kube [`Recorder`]. Posting is best effort: a
//! failure is logged, never returned, because no caller could do anything better than go on.
//!
//! This module depends on nothing else of the crate, so every part may post events without a
//! dependency circle.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The reporting controller of every event the plugin posts (also the field manager of its
/// writes).
pub(crate) const REPORTER: &str = "das-kubelet-plugin";

/// Longest an event post may take before it is given up (logged) by default.
pub const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest note DAS posts, in characters.
pub(crate) const MAX_NOTE_CHARS: usize = 1000;
/// Longest note the Events API accepts, in bytes of UTF-8 (`events.k8s.io/v1` validation:
/// `len(note) <= 1024`, a Go byte length).
pub const MAX_NOTE_BYTES: usize = 1024;

/// `note` cut to at most [`MAX_NOTE_CHARS`] characters and [`MAX_NOTE_BYTES`] bytes, at a
/// character boundary: an NVML or API error text with many multi-byte characters would
/// otherwise make the API server refuse the event.
pub fn cut_note(note: &str) -> String {
    let mut bytes = 0;
    note.chars()
        .take(MAX_NOTE_CHARS)
        .take_while(|c| {
            bytes += c.len_utf8();
            bytes <= MAX_NOTE_BYTES
        })
        .collect()
}

/// The type of an event (`events.k8s.io/v1` `Event.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Something users should know that is not a problem (a GPU recovered).
    Normal,
    /// Something that went wrong.
    Warning,
}

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTarget {
    /// A ResourceClaim. The UID pins the event to this claim, not to a later one of the same
    /// name (`crate::claims` builds it from its `ClaimRef`).
    Claim {
        /// Namespace of the ResourceClaim.
        namespace: String,
        /// Name of the ResourceClaim.
        name: String,
        /// UID of the ResourceClaim.
        uid: String,
    },
    /// This node.
    Node,
}

/// Where events go. Implementations bound every post in time and never fail.
#[tonic::async_trait]
pub trait EventSink: Send + Sync + 'static {
    /// Posts an event of `kind` about `about` with `reason` (CamelCase, also the event's action)
    /// and `note` (cut by [`cut_note`]). Best effort: a failure is logged, never returned.
    async fn event(&self, about: &EventTarget, kind: EventKind, reason: &str, note: String);

    /// Posts a Warning event (best effort).
    async fn warn(&self, about: &EventTarget, reason: &str, note: String) {
        self.event(about, EventKind::Warning, reason, note).await;
    }
}

/// [`EventSink`] over a kube client: events reported as [`REPORTER`] on the node.
pub(crate) struct KubeEvents {
    recorder: Recorder,
    node: String,
    timeout: Duration,
}

impl KubeEvents {
    /// Posts through `client` (built with connect and read timeouts); `node` is the Node of
    /// [`EventTarget::Node`] and the reporting instance. Each post is bounded by
    /// [`POST_TIMEOUT`].
    pub fn new(client: Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            node: node.to_string(),
            timeout: POST_TIMEOUT,
        }
    }

    /// Bounds every post by `limit` instead of [`POST_TIMEOUT`].
    pub(crate) fn with_timeout(mut self, limit: Duration) -> Self {
        self.timeout = limit;
        self
    }

    /// The object reference of `about`.
    fn reference(&self, about: &EventTarget) -> ObjectReference {
        match about {
            EventTarget::Claim {
                namespace,
                name,
                uid,
            } => ObjectReference {
                api_version: Some("resource.k8s.io/v1".into()),
                kind: Some("ResourceClaim".into()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                uid: Some(uid.clone()),
                ..Default::default()
            },
            // The node's name as its UID, as the kubelet does for its own Node events:
            // `kubectl describe node` lists the events whose `involvedObject.uid` is the Node's
            // UID or its name, so an event without a UID would not show there.
            EventTarget::Node => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.node.clone()),
                uid: Some(self.node.clone()),
                ..Default::default()
            },
        }
    }
}

#[tonic::async_trait]
impl EventSink for KubeEvents {
    async fn event(&self, about: &EventTarget, kind: EventKind, reason: &str, note: String) {
        let event = Event {
            type_: match kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: reason.to_string(),
            note: Some(cut_note(&note)),
            action: reason.to_string(),
            secondary: None,
        };
        let reference = self.reference(about);
        match tokio::time::timeout(self.timeout, self.recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(reason, error = %e, "could not post an event"),
            Err(_) => tracing::warn!(reason, "posting an event timed out"),
        }
    }
}

#[cfg(test)]
mod tests;
