//! `das-e2e`: a real local Kubernetes for DAS end-to-end tests and `make demo`.
//!
//! Every test that needs the local cluster (or the Helm built into `.local/bin`) lives in this
//! crate's `tests/`, one test binary per file, named by component: `plugin_*.rs` (node plugin),
//! `controller.rs`, `webhook.rs`, `chart.rs`, `kubelet_smoke.rs` (the kubelet DRA path without
//! DAS) and `soak.rs`. They run the DAS binaries from the target dir ([`binaries::DasBinary`]),
//! which `make e2e` builds before `cargo test -p das-e2e`. The library's own unit tests need no
//! cluster (`make unit` runs them).
//!
//! The modules form layers, each using only those listed before it (no import circles):
//! [`paths`] → [`binaries`] → the building blocks ([`process`], [`wait`], [`pki`],
//! [`kubeconfig`], [`workload`], [`container_view`], [`alloc_count`], [`test_plugin`]) →
//! [`runtime`] → [`cluster`] → [`chart`] →
//! [`das`] → [`image`] → [`real_install`] → [`install`] → what builds on an installed DAS
//! ([`plugin`], [`runtime_pods`], [`examples`], [`doctest`], [`kueue`], [`soak`], [`operator`]).
//!
//! - [`paths`]: the repository root, cargo's target dir and `.local`; [`binaries`]: where the
//!   programs the harness runs are (the DAS binaries, [`binaries::DasBinary`] and
//!   [`binaries::Binaries`]; the Kubernetes build and its version; `helm`, `kubectl`, the
//!   containerd build).
//! - [`cluster`]: starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and hollow
//!   kubelets running the real kubelet DRA manager (the `e2e/k8s` Go module, built by `make k8s`),
//!   waits until they are ready, and tears everything down (process groups) when dropped.
//!   A node can instead be a real-runtime node ([`runtime`]): the upstream kubelet with
//!   containerd, runc, CNI and CDI (`make containerd`), where containers really run.
//! - [`pki`], [`kubeconfig`]: credentials for it.
//! - [`test_plugin`]: a minimal DRA kubelet plugin, to prove the kubelet → plugin gRPC path
//!   without the DAS driver.
//! - [`das`]: the DAS node plugin's flags and files on a hollow node, the chart's DeviceClasses,
//!   waiting for published ResourceSlices ([`das::wait_nodes_published`],
//!   [`das::wait_pool_complete`]), and seeing what a container gets
//!   ([`container_view::ContainerView`]).
//! - [`plugin`]: the node plugin's cluster tests' set-up: plugins started directly on hollow
//!   nodes with emulated GPUs ([`plugin::cluster_with_plugins`]) and the MIG instances those
//!   GPUs hold ([`plugin::live_slices`]).
//! - [`wait`]: polling with a deadline ([`wait::until`]) and the tests' default timeout
//!   ([`wait::TIMEOUT`]).
//! - [`workload`]: pods (create, wait until running, delete), claim templates and probes
//!   ([`workload::free_port`], [`workload::http_get`]) shared by every component's tests;
//!   [`tenants`]: the same in namespaces of their own, and the `shareNamespace` a node
//!   publishes on a shareable device.
//! - [`chart`]: the Helm chart rendered by Helm; [`install`]: DAS installed from it (the chart's
//!   RBAC identities, environment and arguments) on the local cluster.
//! - [`examples`]: docs/examples applied and checked on DAS installed from the chart.
//! - [`doctest`]: shell blocks of the docs marked `sh doctest`, run against the local cluster,
//!   and the README's demo output checked against the demo's report.
//! - [`runtime_pods`]: probe pods on a real-runtime node and what their containers saw.
//! - [`real_install`]: `helm install` for real: the chart's pods from the DAS image on a real-runtime node.
//! - [`image`]: the DAS container image built here as an OCI archive (no registry, no daemon).
//! - [`soak`]: the chaos soak (pod churn, component kills, GPU faults, invariant checks).
//! - [`operator`]: the DAS operator's test helpers (kubectl on its resource, a stand-in for
//!   OpenShift's `APIServer` and its TLS security profile).
//! - [`alloc_count`]: a counting global allocator for the memory benchmarks without a cluster,
//!   fed by [`das::printed_resource_slices`] (DAS's slices as the API server returns them).

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod alloc_count;
pub mod binaries;
pub mod chart;
pub mod cluster;
pub mod container_view;
pub mod das;
pub mod doctest;
pub mod examples;
pub mod image;
pub mod install;
pub mod kubeconfig;
pub mod kueue;
pub mod operator;
pub mod paths;
pub mod pki;
pub mod plugin;
pub mod process;
pub mod real_install;
pub mod runtime;
pub mod runtime_pods;
pub mod soak;
pub mod tenants;
pub mod test_plugin;
pub mod wait;
pub mod workload;

pub use cluster::{Cluster, ClusterConfig, NodeInfo};
