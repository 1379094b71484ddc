//! The kubelet's resource-health stream (KEP-4680) in both versions it speaks: `v1alpha1`
//! (kubelets 1.31 to 1.39 with `ResourceHealthStatus`) and `v1` (1.37+, which a kubelet picks
//! over `v1alpha1` when the plugin advertises both; `v1alpha1` goes in 1.40). The two packages
//! carry the same messages, so one stream of [`DeviceHealthReport`] snapshots
//! ([`report_stream`]) feeds both, each through its own generated types.

use std::pin::Pin;
use std::sync::Arc;

use das_proto::dra_health::{v1, v1alpha1};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::{HEALTH_INTERVAL, HEALTH_TIMEOUT};
use crate::health::{DeviceHealthReport, HealthSource};

/// Longest health message the kubelet keeps, in characters (KEP-4680; it truncates longer ones).
const MAX_MESSAGE_CHARS: usize = 1024;

/// Every device's health at once, then every [`HEALTH_INTERVAL`] and whenever `source` reports a
/// change, until the receiver (the kubelet's stream) is dropped.
fn report_stream(
    source: Arc<dyn HealthSource>,
) -> impl Stream<Item = Vec<DeviceHealthReport>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let mut changes = source.changes();
        loop {
            if tx.send(source.device_health().await).await.is_err() {
                return; // the kubelet went away
            }
            let changed = async {
                let gone = match changes.as_mut() {
                    Some(rx) => rx.changed().await.is_err(),
                    None => true,
                };
                if gone {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(HEALTH_INTERVAL) => {}
                _ = changed => {}
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// What every device entry of a response shares: when it was determined (unix seconds) and
/// after how many seconds without an update the kubelet reports it Unknown.
fn stamp() -> (i64, i64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    (now, HEALTH_TIMEOUT.as_secs() as i64)
}

/// One health service: `$service` serves the `DRAResourceHealth` service of package `$api`
/// from a [`HealthSource`]. A macro because the two packages' generated types are distinct
/// while their fields are the same.
macro_rules! health_service {
    ($service:ident, $api:ident) => {
        #[doc = concat!("The `", stringify!($api), ".DRAResourceHealth` service.")]
        pub(super) struct $service(pub(super) Arc<dyn HealthSource>);

        impl $service {
            /// `reports` as this version's response; unhealthy devices carry their reason.
            fn response(reports: Vec<DeviceHealthReport>) -> $api::NodeWatchResourcesResponse {
                let (now, timeout) = stamp();
                let devices = reports
                    .into_iter()
                    .map(|r| $api::DeviceHealth {
                        device: Some($api::DeviceIdentifier {
                            pool_name: r.pool,
                            device_name: r.device,
                        }),
                        health: if r.healthy {
                            $api::HealthStatus::Healthy
                        } else {
                            $api::HealthStatus::Unhealthy
                        } as i32,
                        last_updated_time: now,
                        health_check_timeout_seconds: timeout,
                        message: r.message.chars().take(MAX_MESSAGE_CHARS).collect(),
                    })
                    .collect();
                $api::NodeWatchResourcesResponse { devices }
            }
        }

        #[tonic::async_trait]
        impl $api::dra_resource_health_server::DraResourceHealth for $service {
            type NodeWatchResourcesStream = Pin<
                Box<dyn Stream<Item = Result<$api::NodeWatchResourcesResponse, Status>> + Send>,
            >;

            async fn node_watch_resources(
                &self,
                _: Request<$api::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                tracing::info!(
                    service = concat!(stringify!($api), ".DRAResourceHealth"),
                    "the kubelet watches device health"
                );
                let responses = report_stream(self.0.clone()).map(|r| Ok(Self::response(r)));
                Ok(Response::new(Box::pin(responses)))
            }
        }
    };
}

health_service!(HealthV1alpha1, v1alpha1);
health_service!(HealthV1, v1);
