//! The DAS node plugin (`das-kubelet-plugin`). Modules:
//! - [`gpu`]: GPU models and MIG profile tables (data files), the backend trait, the emulated
//!   and NVML backends.
//! - [`slices`]: building ResourceSlices from an inventory (pure).
//! - [`placement`]: the order devices are published in, which is the placement policy (pure).
//! - [`publish`]: publishing this node's ResourceSlices and keeping them published.
//! - [`kubelet`]: the kubelet side: socket paths, registration, the DRA and health gRPC services.
//! - [`handover`]: one active plugin instance per node, and the handover in a rolling update.
//! - [`claims`]: the request path: prepare, unprepare, start-up reconciliation, the reaper.
//! - [`cdi`]: CDI spec types, DAS's per-claim spec, atomic spec files.
//! - [`checkpoint`]: the versioned, atomically written record of prepared claims and their
//!   exact MIG instances.
//! - [`blocking`]: where blocking backend and file calls run.
//! - [`metrics`]: Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoint.
//!
//! The design the code follows is in docs/architecture.md.

pub mod blocking;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod gpu;
pub mod handover;
pub mod kubelet;
pub mod metrics;
pub mod placement;
pub mod publish;
pub mod slices;
