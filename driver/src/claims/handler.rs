//! What the kubelet-facing server calls, from the generic DRA layer (`dra_plugin`): the claim
//! and device types of the DRA gRPC API ([`ClaimRef`], [`PreparedDevice`]) and the trait the
//! request path implements ([`ClaimHandler`], `dra_plugin::Driver` with [`PrepareError`] as its
//! error). This module only ties them to the request path's own types: a claim is an Event
//! target, and the handover gate's answers are prepare errors.

pub use dra_plugin::Driver as ClaimHandler;
pub use dra_plugin::{ClaimRef, PreparedDevice};

use super::PrepareError;
use crate::events::EventTarget;
use dra_plugin::handover::GateError;

impl From<&ClaimRef> for EventTarget {
    /// An event about the claim `c`, by namespace, name and UID.
    fn from(c: &ClaimRef) -> Self {
        EventTarget::Claim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        }
    }
}

impl From<GateError> for PrepareError {
    /// The gate's answer in the request path's words: [`PrepareError::HandedOver`] (DAS's text
    /// the kubelet shows), or an internal error for a call whose task failed.
    fn from(e: GateError) -> Self {
        match e {
            GateError::HandedOver => PrepareError::HandedOver,
            GateError::CallFailed(_) => PrepareError::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet sees the same texts as when the gate was DAS's own.
    #[test]
    fn gate_answers_keep_the_request_paths_texts() {
        let handed_over = PrepareError::from(GateError::HandedOver);
        assert!(matches!(handed_over, PrepareError::HandedOver));
        assert!(
            handed_over
                .to_string()
                .starts_with("this DAS node plugin instance has handed over to a newer one"),
            "{handed_over}"
        );
        let failed = PrepareError::from(GateError::CallFailed("task 7 panicked".into()));
        assert_eq!(
            failed.to_string(),
            "internal error: the call failed: task 7 panicked"
        );
        assert_eq!(failed.metric_label(), "internal");
    }
}
