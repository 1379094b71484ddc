//! What the kubelet's health stream reads (`crate::plugin::server` serves it as
//! `NodeWatchResources`): every published device's health, and a signal that it may have
//! changed. [`super::HealthMonitor`] is the source the plugin runs.

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
