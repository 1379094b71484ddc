//! Kubelet gRPC interfaces spoken by the DAS node plugin, generated at build time.
//!
//! - [`dra::v1`] and [`dra::v1beta1`]: the `DRAPlugin` service (NodePrepareResources,
//!   NodeUnprepareResources). Kubelets 1.34+ accept both and take the first one a plugin lists.
//! - [`dra_health::v1alpha1`] and [`dra_health::v1`]: the `DRAResourceHealth` stream of device
//!   health.
//! - [`pluginregistration`]: the `Registration` service the kubelet's plugin watcher calls.
//! - [`cri::v1`]: the two read-only calls of the container runtime's `RuntimeService`
//!   (ListPodSandbox, ListContainers) the plugin makes before it releases an orphaned slice.
//! - [`registration`]: the plugin side of that service ([`registration::Registrar`]).
//! - [`authority`]: serving the registration socket to the kubelet's grpc-go client, whose
//!   `:authority` h2 would reject.
//!
//! Source of the wire contract: `k8s.io/kubelet` `pkg/apis/dra/{v1,v1beta1}/api.proto` and
//! `pkg/apis/pluginregistration/v1/api.proto` (see docs/reference/dra.md, "Kubelet plugin protocol").

pub mod authority;
pub mod registration;

/// Kubelet DRA node API.
pub mod dra {
    /// `k8s.io.kubelet.pkg.apis.dra.v1`, registration string [`SERVICE_V1`].
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`, registration string [`SERVICE_V1BETA1`].
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
    /// Registration string of the v1 DRA service.
    pub const SERVICE_V1: &str = "v1.DRAPlugin";
    /// Registration string of the v1beta1 DRA service.
    pub const SERVICE_V1BETA1: &str = "v1beta1.DRAPlugin";
}

/// Device health reporting to the kubelet (KEP-4680).
pub mod dra_health {
    /// Package `v1alpha1`, registration string [`SERVICE_V1ALPHA1`].
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
    /// Registration string of the v1alpha1 health service.
    pub const SERVICE_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
    /// Package `v1` (Kubernetes 1.37+; the messages of `v1alpha1`), registration string
    /// [`SERVICE_V1`].
    pub mod v1 {
        tonic::include_proto!("v1");
    }
    /// Registration string of the v1 health service, which a 1.37+ kubelet prefers.
    pub const SERVICE_V1: &str = "v1.DRAResourceHealth";
}

/// Container Runtime Interface (`runtime.v1`, from `k8s.io/cri-api`): the subset the node plugin
/// reads. The kubelet labels sandboxes and containers with [`cri::POD_UID_LABEL`].
pub mod cri {
    /// Package `runtime.v1`.
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
    /// The label the kubelet puts on every sandbox and container: the pod's UID
    /// (`k8s.io/kubelet/pkg/types` `KubernetesPodUIDLabel`).
    pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
    /// The pod's name label on every container (`KubernetesPodNameLabel`).
    pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
    /// The pod's namespace label on every container (`KubernetesPodNamespaceLabel`).
    pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
    /// The container's name label (`KubernetesContainerNameLabel`).
    pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
    /// The key of a verbose ContainerStatus' `info` that containerd and CRI-O fill with a JSON
    /// object whose `runtimeSpec` is the container's OCI runtime spec (containerd
    /// `internal/cri/server/container_status.go` `ContainerInfo`; CRI-O's container info).
    pub const INFO_KEY: &str = "info";
}

/// Kubelet plugin registration (`pluginregistration`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
    /// `PluginInfo.type` of a DRA driver.
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
}
