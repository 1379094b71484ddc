//! `das-e2e`: a real local Kubernetes for DAS end-to-end tests and `make demo`.
//!
//! - [`cluster`]: starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and hollow
//!   kubelets running the real kubelet DRA manager (the `e2e/k8s` Go module, built by `make k8s`),
//!   waits until they are ready, and tears everything down (process groups) when dropped.
//! - [`pki`], [`kubeconfig`]: credentials for it.
//! - [`test_plugin`]: a minimal DRA kubelet plugin, to prove the kubelet → plugin gRPC path
//!   without the DAS driver.
//! - [`das`]: starting the DAS node plugin on a hollow node and seeing what a container gets.
//! - [`wait`]: polling helpers for test assertions.
//! - [`workload`]: pods, templates and probes shared by every component's e2e tests.
//! - [`chart`]: the Helm chart rendered by Helm; [`install`]: DAS installed from it (the chart's
//!   RBAC identities, environment and arguments) on the local cluster.
//! - [`soak`]: the chaos soak (pod churn, component kills, GPU faults, invariant checks).

pub mod chart;
pub mod cluster;
pub mod das;
pub mod install;
pub mod kubeconfig;
pub mod pki;
pub mod process;
pub mod soak;
pub mod test_plugin;
pub mod wait;
pub mod workload;

pub use cluster::{Cluster, ClusterConfig, NodeInfo};
