//! The DAS cluster controller (`das-controller`): mirrors every allocated DAS device into an
//! AllocationClaim (`staged` → `created` → `inUse`); see docs/design.md §6.
//!
//! - [`mirror`]: the pure function from a ResourceClaim (plus its pods and the published devices)
//!   to its desired AllocationClaims, and what must be written to get there;
//! - [`published`]: what the controller keeps of each DAS ResourceSlice (the facts the mirror
//!   reads, decoded straight from the API server's JSON);
//! - [`cache`]: the controller's reflector stores, what they keep of each object and the
//!   lookups a reconcile makes in them;
//! - [`reconcile`]: one reconcile of a ResourceClaim (the writes that make its AllocationClaims
//!   what they should be);
//! - [`sweep`]: the periodic deletion of AllocationClaims no live allocation wants;
//! - [`watching`]: the controller's watches, started (stores, trigger streams), and the proof
//!   that their caches are synced;
//! - [`controller`]: the kube-runtime controller that wires the watches, caches, triggers,
//!   reconciles and sweep together, and its start-up order in types (role → watching →
//!   synced → writing);
//! - [`triggers`]: which watch events start a reconcile (what the mirror reads changed, and not
//!   our own writes coming back);
//! - [`device_info`]: which pod and container hold each prepared MIG device (the
//!   `das_mig_device_info` gauge);
//! - [`lease`]: leader election on a `coordination.k8s.io/v1` Lease, and the [`lease::Role`]
//!   (leading, or the single replica) the controller's watches and run require;
//! - [`metrics`]: Prometheus metrics and health endpoints (it depends on no other module);
//! - [`error`]: the one error type, with the metric label of each kind of failure.
//!
//! Module dependencies have no cycle: `error`, `metrics` and `mirror` use nothing of the crate
//! (`lease` only `error`); then, each using only modules before it: `published` → `cache` →
//! `device_info` → `triggers` → `watching` (also `lease`) → `reconcile` → `sweep` →
//! `controller`.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod cache;
pub mod controller;
pub mod device_info;
pub mod error;
pub mod lease;
pub mod metrics;
pub mod mirror;
pub mod published;
pub mod reconcile;
pub mod sweep;
pub mod triggers;
pub mod watching;

pub use error::{Error, Result};
