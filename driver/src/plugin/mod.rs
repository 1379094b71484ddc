//! The kubelet-facing side of the node plugin.
//!
//! - [`server`]: socket paths, plugin registration, and the DRA (`v1` and `v1beta1`) and
//!   resource-health gRPC services; it only translates between gRPC and
//!   [`crate::claims::ClaimHandler`]. The DRA logic is the `v1` service's; the `v1beta1` service
//!   converts its messages at the edge (`server/v1beta1_edge.rs`) and calls it. Failures are
//!   [`server::SocketPathError`] and [`server::ServeError`].
//! - [`handover`]: one active plugin instance per node (a file lock in the state dir) and the
//!   handover between instances in a rolling update, each wait bounded:
//!   - `handover/lock.rs`: the lock files ([`handover::Active`], [`handover::Waiting`]);
//!   - `handover/takeover.rs`: a new instance checks its GPUs before it asks
//!     ([`handover::check_then_take_over`], failing with [`handover::TakeOverError`]);
//!   - `handover/gate.rs`: the active one drains calls ([`handover::Gate`], [`handover::Gated`]);
//!   - `handover/background.rs`: and stops its background tasks ([`handover::Background`]);
//!   - `handover/mod.rs`: the limits and the sequence ([`handover::hand_over_when_asked`]).

pub mod handover;
pub mod server;
