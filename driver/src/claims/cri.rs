//! [`CriRuntime`]: the orphan rule's evidence from the node's container runtime (containerd,
//! CRI-O) over the Container Runtime Interface: whether any pod sandbox or container, in any
//! state, still carries a pod's UID label (`io.kubernetes.pod.uid`, set by the kubelet on
//! both), and which live containers carry a claim's marks in their OCI runtime spec
//! ([`super::container_marks`]). Three read-only calls, `ListPodSandbox`, `ListContainers` and
//! `ContainerStatus` (verbose), each with a time limit.
//!
//! Source: `k8s.io/cri-api` `pkg/apis/runtime/v1/api.proto` (the subset in
//! `proto/proto/cri/v1/api.proto`); the kubelet's labels in `k8s.io/kubelet/pkg/types/labels.go`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use das_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use das_proto::cri::v1::{
    Container, ContainerFilter, ContainerState, ContainerStatusRequest, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxFilter,
};
use das_proto::cri::{
    CONTAINER_NAME_LABEL, INFO_KEY, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::container_marks::{ClaimMarks, spec_mark};
use super::orphans::{PodContainers, RuntimeError};

/// Time limit of one CRI call (connect included).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

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

    async fn containers_holding(&self, marks: &ClaimMarks) -> Result<Vec<String>, RuntimeError> {
        let mut client = self.client().await?;
        let containers = client
            .list_containers(ListContainersRequest { filter: None })
            .await
            .map_err(|s| RuntimeError::Call {
                call: "ListContainers",
                message: s.message().to_string(),
            })?
            .into_inner()
            .containers;
        let mut holding = Vec::new();
        // An exited container never runs again (the kubelet creates a new one): it holds nothing.
        for c in containers
            .iter()
            .filter(|c| c.state != ContainerState::ContainerExited as i32)
        {
            let answer = client
                .container_status(ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: true,
                })
                .await;
            let info = match answer {
                Ok(r) => r.into_inner().info,
                // Removed between the listing and this call: it holds nothing any more.
                Err(s) if s.code() == tonic::Code::NotFound => continue,
                Err(s) => {
                    return Err(RuntimeError::Call {
                        call: "ContainerStatus",
                        message: s.message().to_string(),
                    });
                }
            };
            let spec = info
                .get(INFO_KEY)
                .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
                .and_then(|mut i| i.get_mut("runtimeSpec").map(serde_json::Value::take))
                .filter(|s| !s.is_null())
                .ok_or_else(|| RuntimeError::NoRuntimeSpec {
                    container: describe(c),
                })?;
            if let Some(mark) = spec_mark(&spec, marks) {
                holding.push(format!("{} ({mark})", describe(c)));
            }
        }
        Ok(holding)
    }
}

/// `container <name> of pod <namespace>/<name>` from the kubelet's labels, or the container's ID.
fn describe(c: &Container) -> String {
    let label = |k: &str| c.labels.get(k).map(String::as_str).unwrap_or("?");
    if c.labels.contains_key(POD_NAME_LABEL) {
        format!(
            "container {} of pod {}/{}",
            label(CONTAINER_NAME_LABEL),
            label(POD_NAMESPACE_LABEL),
            label(POD_NAME_LABEL)
        )
    } else {
        format!("container {}", c.id)
    }
}

#[cfg(test)]
mod tests;
