//! The DAS node plugin (`das-kubelet-plugin`): publishes this node's MIG placements as
//! ResourceSlices and carves a MIG instance per allocated device when the kubelet prepares a
//! claim. Three paths, one folder each, plus the GPUs underneath:
//!
//! - [`plugin`]: the kubelet-facing server (registration, DRA and health gRPC services) and the
//!   handover between plugin instances on one node.
//! - [`claims`]: the request path: prepare and unprepare of claims (pure decisions in
//!   `claims::plan`, I/O in `claims::preparer`), start-up reconciliation, the reaper, the
//!   checkpoint and the CDI specs.
//! - [`publish`]: the desired ResourceSlices (devices, counter sets, layout), the placement
//!   policy (the order devices are listed in) and the publisher that keeps them on the API
//!   server.
//! - [`gpu`]: GPU models and MIG profile tables (data files), the backend trait, and the
//!   emulated and NVML backends.
//! - [`blocking`]: where blocking backend and file calls run (threads, or inline in tests).
//! - [`metrics`]: the plugin's Prometheus metrics (served by `das_runtime::probes`).
//! - [`node_checks`]: start-up checks of the node set-up the CDI specs rely on (the NVIDIA
//!   container toolkit's config, the unified-memory device nodes), reported as Node events.
//!
//! Dependencies point one way: `plugin` → `claims` → `gpu`, `publish` → `gpu`, `node_checks` →
//! `claims`; `metrics` and `blocking` depend on nothing of the crate. The design is in
//! docs/design.md; how the parts run together in docs/architecture.md.

pub mod blocking;
pub mod claims;
pub mod gpu;
pub mod health;
pub mod metrics;
pub mod node_checks;
pub mod plugin;
pub mod publish;
