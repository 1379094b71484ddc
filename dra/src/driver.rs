//! What the kubelet-facing server calls: the claim and device types of the DRA gRPC API as a
//! driver sees them, and the [`Driver`] trait a driver implements. The server
//! ([`crate::kubeletplugin`]) only translates between gRPC messages and these. (Device health,
//! the other service the server answers, comes from [`crate::health`].)

use std::collections::HashMap;

/// A claim as the kubelet names it in `NodePrepareResources` and `NodeUnprepareResources`.
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

impl std::fmt::Display for ClaimRef {
    /// `<namespace>/<name> (uid <uid>)`: how the kubelet's error texts name the claim.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// One prepared device of a claim, as reported to the kubelet (the DRA `v1` `Device` message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDevice {
    /// Base request names (without `/<subrequest>`) the device serves.
    pub requests: Vec<String>,
    /// Pool of the device, as the allocation result names it.
    pub pool: String,
    /// Device name, as published in the pool's ResourceSlices.
    pub device: String,
    /// Fully-qualified CDI device IDs (`<vendor>/<class>=<name>`) the container runtime
    /// injects.
    pub cdi_device_ids: Vec<String>,
    /// The allocation result's `shareID`, for a share of a shareable device (KEP-5075; the
    /// kubelet's v1 `Device.share_id`). A kubelet that speaks only `v1beta1` never sees it.
    pub share_id: Option<String>,
}

/// What prepares and unprepares claims: the one thing a driver must implement to be served
/// ([`crate::kubeletplugin::serve`]). The gRPC layer only translates; every decision is the
/// driver's.
///
/// One call carries every claim of one pod for this driver (docs/reference/dra.md, "Kubelet
/// plugin protocol"). The answer needs one entry per claim UID; a claim's failure is its entry's
/// `Err`, which the kubelet shows as `claim <namespace>/<name> (uid <uid>): <error>` and retries.
/// The kubelet may call again for a claim at any time (after a timeout, a restart, or a
/// handover), so both calls must be idempotent.
#[tonic::async_trait]
pub trait Driver: Send + Sync + 'static {
    /// Why a claim could not be prepared or unprepared; its `Display` text reaches the kubelet
    /// (and the pod's events) after the claim's name.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Prepares every claim; the map has one entry per claim UID.
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, Self::Error>>;

    /// Unprepares every claim; idempotent (a claim never prepared, or already unprepared, is
    /// `Ok`); one entry per claim UID. The claim may be gone from the API server by then: the
    /// driver works from its own record.
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), Self::Error>>;
}
