//! The controller's one error type: what can fail on the reconcile path (and in leader
//! election), each kind with a fixed metric label so failures are counted by cause in
//! `das_controller_errors_total{cause}` (the pattern of kube-rs's controller-rs example).
//!
//! The binary turns these into `anyhow` at its edge; nothing in the library returns a
//! `String` or `anyhow` error.

use std::time::Duration;

/// Something a reconcile (or a leader-election round) could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ResourceClaim lacks a field every stored object has (a namespace, a UID): nothing
    /// can be mirrored from it.
    #[error("ResourceClaim {claim} has no {field}")]
    MissingField {
        /// `namespace/name` of the claim, as far as it is known.
        claim: String,
        /// The missing field, e.g. `metadata.uid`.
        field: &'static str,
    },
    /// The status body of an AllocationClaim could not be serialized.
    #[error("serialize the status of AllocationClaim {name}: {source}")]
    Serialize {
        /// The AllocationClaim.
        name: String,
        /// What serde_json said.
        #[source]
        source: serde_json::Error,
    },
    /// The server-side apply of an AllocationClaim (spec, labels, owner) failed.
    #[error("apply AllocationClaim {name}: {source}")]
    Apply {
        /// The AllocationClaim.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The server-side apply of an AllocationClaim's status failed.
    #[error("apply the status of AllocationClaim {name}: {source}")]
    ApplyStatus {
        /// The AllocationClaim.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting an AllocationClaim failed (other than it being gone already).
    #[error("delete AllocationClaim {name}: {source}")]
    Delete {
        /// The AllocationClaim.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Reading, creating or replacing the leader Lease failed.
    #[error("leader lease: {0}")]
    Lease(#[source] kube::Error),
    /// The API server did not answer a leader-election round within the renew deadline.
    #[error("no answer from the API server within {0:?}")]
    LeaseTimeout(Duration),
}

impl Error {
    /// The `cause` label of `das_controller_errors_total`: one fixed value per kind of
    /// failure, so the metric's cardinality stays bounded (names and messages go to the log).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::MissingField { .. } => "missing_field",
            Self::Serialize { .. } => "serialize",
            Self::Apply { .. } => "apply",
            Self::ApplyStatus { .. } => "apply_status",
            Self::Delete { .. } => "delete",
            Self::Lease(_) => "lease",
            Self::LeaseTimeout(_) => "lease_timeout",
        }
    }
}

/// A result of the controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
