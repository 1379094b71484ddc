//! What the node plugin publishes, and publishing it. This folder alone decides the node's
//! ResourceSlices: others (the health monitor) only report facts to it.
//!
//! - [`resource_slices`]: the desired ResourceSlices of the node, built from its GPU inventory
//!   (pure): one device per (GPU with MIG on, profile, placement), one whole-GPU device per GPU
//!   with MIG off (`--whole-gpus`), counter sets with one counter per memory slice, the layout by
//!   server version.
//! - [`devices`]: the published devices by name, with their kind, GPU and placement (pure; the
//!   request path and the health monitor resolve device names with it).
//! - [`binding`]: the binding conditions of carve before bind (issue 34) on the MIG devices
//!   (pure), and the server versions that take them.
//! - [`desired`]: what is published now (pure): the inventory's slices with the facts the health
//!   monitor reports ([`desired::HealthFacts`]: device taints, devices withdrawn because an
//!   unclaimed MIG instance overlaps them), by [`desired::desired_slices`].
//! - [`placement`]: the placement policy, i.e. the order devices are listed in (pure); its
//!   allocator simulation and offline optimum for the packing benchmark are behind the
//!   `testing` feature.
//! - [`plan`]: the pure half of the publisher: ResourceSlice names, comparison keys, the
//!   reconcile plan (what to create, update, delete) and pool generations.
//! - [`gates`]: the API server's feature gates as seen in what it stores (pure): which gated
//!   fields it dropped, and when the node's devices are withdrawn because shared counters are
//!   dropped ("no silent overlap", docs/design.md §4).
//! - [`publisher`]: [`Publisher`], which carries a plan out against the API server and keeps
//!   the pool published (watch, resync, desired-state changes); in the plugin it runs
//!   [`Publisher::run_with_facts`], applying [`desired::desired_slices`] to each report of the
//!   health monitor.
//!
//! Dependencies: `gpu` (the inventory), `events` (Node events about dropped feature gates) and
//! `metrics`; nothing else of the crate, so `health` and `claims` may depend on it.

pub mod binding;
pub mod desired;
pub(crate) mod devices;
pub(crate) mod gates;
pub mod placement;
pub(crate) mod plan;
pub(crate) mod publisher;
pub mod resource_slices;

pub use publisher::{KubePublishApi, PublishApi, PublishError, PublishStats, Publisher, RunConfig};
