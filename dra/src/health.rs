//! What the kubelet's resource-health stream reads ([`crate::kubeletplugin::serve`] serves it as
//! `NodeWatchResources`, KEP-4680): every published device's health, and a signal that it may
//! have changed. A driver without health checks of its own reports every published device
//! healthy.

/// One device's health as reported to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealthReport {
    /// Pool of the device, as published.
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
    /// stream reports at once instead of at its next interval
    /// ([`crate::kubeletplugin::HEALTH_INTERVAL`]); `None` for the interval only.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}
