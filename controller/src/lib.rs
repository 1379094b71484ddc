//! The DAS cluster controller (`das-controller`): mirrors every allocated DAS device into an
//! AllocationClaim (`staged` → `created` → `inUse`); see docs/design.md §6.
//!
//! - [`mirror`]: the pure function from a ResourceClaim (plus its pods and the published devices)
//!   to its desired AllocationClaims;
//! - [`published`]: what the controller keeps of each DAS ResourceSlice (the facts the mirror
//!   reads, decoded straight from the API server's JSON);
//! - [`reconcile`]: the kube-runtime controller that applies them;
//! - [`triggers`]: which watch events start a reconcile (what the mirror reads changed, and not
//!   our own writes coming back);
//! - [`device_info`]: which pod and container hold each prepared MIG device (the
//!   `das_mig_device_info` gauge);
//! - [`lease`]: leader election on a `coordination.k8s.io/v1` Lease;
//! - [`metrics`]: Prometheus metrics and health endpoints.

pub mod device_info;
pub mod lease;
pub mod metrics;
pub mod mirror;
pub mod published;
pub mod reconcile;
pub mod triggers;
