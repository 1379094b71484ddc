//! What the node plugin publishes, and publishing it.
//!
//! - [`resource_slices`]: the desired ResourceSlices of the node, built from its GPU inventory
//!   (pure): one device per (GPU, profile, placement), counter sets with one counter per memory
//!   slice, the layout by server version.
//! - [`placement`]: the placement policy, i.e. the order devices are listed in (pure); its
//!   allocator simulation and offline optimum for the packing benchmark are behind the
//!   `testing` feature.
//! - [`plan`]: the pure half of the publisher: ResourceSlice names, comparison keys, the
//!   reconcile plan (what to create, update, delete) and pool generations.
//! - [`gates`]: the API server's feature gates as seen in what it stores (pure): which gated
//!   fields it dropped, and when the node's devices are withdrawn because shared counters are
//!   dropped ("no silent overlap", docs/design.md §4).
//! - [`publisher`]: [`Publisher`], which carries a plan out against the API server and keeps
//!   the pool published (watch, resync, desired-state changes).

pub mod gates;
pub mod placement;
pub mod plan;
pub mod publisher;
pub mod resource_slices;

pub use publisher::{KubePublishApi, PublishApi, PublishError, PublishStats, Publisher, RunConfig};
