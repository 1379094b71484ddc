//! What the kubelet-facing server calls: the claim and device types of the DRA gRPC API as
//! the request path sees them, and the traits the request path implements. The server
//! (`crate::plugin::server`) only translates between gRPC messages and these.

use std::collections::HashMap;

use super::PrepareError;

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

/// One device's health as reported to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealthReport {
    /// Pool of the device (this node).
    pub pool: String,
    /// Published device name.
    pub device: String,
    /// Whether the device can be used.
    pub healthy: bool,
    /// Why, when unhealthy (at most 1024 characters reach the kubelet).
    pub message: String,
}

/// Where device health comes from.
#[tonic::async_trait]
pub trait HealthSource: Send + Sync + 'static {
    /// The health of every published device.
    async fn device_health(&self) -> Vec<DeviceHealthReport>;

    /// A receiver whose value changes when device health may have changed, so the health
    /// stream reports at once instead of at its next interval; `None` for the interval only.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}
