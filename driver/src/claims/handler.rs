//! What the kubelet-facing server calls: the claim and device types of the DRA gRPC API as
//! the request path sees them, and the trait the request path implements. The server
//! (`crate::plugin::server`) only translates between gRPC messages and these. (Device health,
//! the other service the server answers, comes from `crate::health::source`.)

use std::collections::HashMap;

use super::PrepareError;
use crate::events::EventTarget;

/// A claim as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// UID of the ResourceClaim: the key of every per-claim state (a claim deleted and
    /// re-created under the same name is another claim).
    pub uid: String,
}

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

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// One prepared device of a claim, as reported to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDevice {
    /// Base request names (without `/<subrequest>`) the device serves.
    pub requests: Vec<String>,
    /// Pool of the device (this node).
    pub pool: String,
    /// Published device name, `gpu-<index>-mig-<profile>-<start>`.
    pub device: String,
    /// Fully-qualified CDI device IDs (`das.com/mig=<name>`).
    pub cdi_device_ids: Vec<String>,
    /// The allocation result's `shareID`, for a share of a shareable device (KEP-5075; the
    /// kubelet's v1 `Device.share_id`).
    pub share_id: Option<String>,
}

/// What prepares and unprepares claims; the gRPC layer only translates.
#[tonic::async_trait]
pub trait ClaimHandler: Send + Sync + 'static {
    /// Prepares every claim; the map has one entry per claim UID.
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>>;
    /// Unprepares every claim; idempotent; one entry per claim UID.
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), PrepareError>>;
}
