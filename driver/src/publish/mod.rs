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
//! - [`publisher`]: [`Publisher`], DAS's ResourceSlice publisher: the generic one of the DRA
//!   layer (`dra_plugin::resourceslice`: the pure write plan, the publication guard that keeps
//!   the devices from being offered without the fields the API server drops, "no silent
//!   overlap", docs/design.md §4, and the I/O that keeps the pool published) for the pool of
//!   driver `mig.das.com` on the node, with DAS's Node events and their notes ([`notices`]), the
//!   `das_kubelet_plugin_apiserver_feature_gate_off` gauge, and DAS's shareable devices; in the
//!   plugin it runs [`Publisher::run_with_facts`], applying [`desired::desired_slices`] to each
//!   report of the health monitor.
//!
//! Dependencies: `gpu` (the inventory), `events` (Node events about dropped feature gates) and
//! `metrics`; nothing else of the crate, so `health` and `claims` may depend on it.

pub mod binding;
pub mod desired;
pub(crate) mod devices;
pub(crate) mod notices;
pub mod placement;
pub(crate) mod publisher;
pub mod resource_slices;

pub use dra_plugin::resourceslice::{
    FirstPublish, KubePublishApi, PublishApi, PublishError, PublishStats, PublishTotals, RunConfig,
};
pub use publisher::Publisher;
