//! The kubelet-facing side of the node plugin.
//!
//! - [`server`]: socket paths, plugin registration, and the DRA (`v1` and `v1beta1`) and
//!   resource-health gRPC services; it only translates between gRPC and
//!   [`crate::claims::ClaimHandler`].
//! - [`handover`]: one active plugin instance per node (a file lock in the state dir) and the
//!   handover between instances in a rolling update: a new instance checks its GPUs before it
//!   asks ([`handover::check_then_take_over`]); the active one drains calls ([`handover::Gate`])
//!   and stops its background tasks ([`handover::Background`]), each wait bounded.

pub mod handover;
pub mod server;
