//! [`CriRuntime`]: the orphan rule's evidence from the node's container runtime (containerd,
//! CRI-O) over the Container Runtime Interface: whether any pod sandbox or container, in any
//! state, still carries a pod's UID label (`io.kubernetes.pod.uid`, set by the kubelet on
//! both). Two read-only calls, `ListPodSandbox` and `ListContainers`, each with a time limit.
//!
//! Source: `k8s.io/cri-api` `pkg/apis/runtime/v1/api.proto` (the subset in
//! `proto/proto/cri/v1/api.proto`); the kubelet's labels in `k8s.io/kubelet/pkg/types/labels.go`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use das_proto::cri::POD_UID_LABEL;
use das_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use das_proto::cri::v1::{
    ContainerFilter, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::orphans::{PodContainers, RuntimeError};

/// Time limit of one CRI call (connect included).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The container runtime's CRI socket.
#[derive(Debug, Clone)]
pub struct CriRuntime {
    socket: PathBuf,
}

impl CriRuntime {
    /// A client of the CRI endpoint `endpoint`: `unix:///run/containerd/containerd.sock` or a
    /// plain socket path. Connects on each check (checks are rare: suspected orphans only).
    ///
    /// # Errors
    /// [`RuntimeError::NotUnixSocket`]: the endpoint is not a unix socket (CRI runtimes on
    /// Linux serve one).
    pub fn new(endpoint: &str) -> Result<Self, RuntimeError> {
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        if !path.starts_with('/') {
            return Err(RuntimeError::NotUnixSocket {
                endpoint: endpoint.to_string(),
            });
        }
        Ok(CriRuntime {
            socket: PathBuf::from(path),
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    async fn client(&self) -> Result<RuntimeServiceClient<Channel>, RuntimeError> {
        let socket = self.socket.clone();
        // The URI is a placeholder: the connector dials the socket.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .map_err(|e| RuntimeError::Connect {
                socket: self.socket.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(RuntimeServiceClient::new(channel))
    }
}

#[tonic::async_trait]
impl PodContainers for CriRuntime {
    async fn pod_has_containers(&self, pod_uid: &str) -> Result<bool, RuntimeError> {
        let selector = HashMap::from([(POD_UID_LABEL.to_string(), pod_uid.to_string())]);
        let mut client = self.client().await?;
        let sandboxes = client
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| RuntimeError::Call {
                call: "ListPodSandbox",
                message: s.message().to_string(),
            })?
            .into_inner()
            .items;
        if !sandboxes.is_empty() {
            return Ok(true);
        }
        let containers = client
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    label_selector: selector,
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| RuntimeError::Call {
                call: "ListContainers",
                message: s.message().to_string(),
            })?
            .into_inner()
            .containers;
        Ok(!containers.is_empty())
    }
}

#[cfg(test)]
mod tests;
