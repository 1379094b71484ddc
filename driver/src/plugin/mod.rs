//! The kubelet-facing side of the node plugin, from the generic DRA layer (crate `dra_plugin`,
//! folder `dra/`), under the names the plugin has always used:
//!
//! - [`server`] (`dra_plugin::kubeletplugin`): socket paths, plugin registration, and the DRA
//!   (`v1` and `v1beta1`) and resource-health gRPC services; it only translates between gRPC and
//!   [`crate::claims::ClaimHandler`] (the [`crate::claims::Preparer`] behind the handover gate)
//!   and [`crate::health::HealthSource`] (the health monitor).
//! - [`handover`] (`dra_plugin::handover`): one active plugin instance per node (a file lock in
//!   the state dir) and the handover between instances in a rolling update, each wait bounded
//!   (docs/design.md §7, "One active instance per node"). The plugin's limits are
//!   [`handover::Limits::PLUGIN`]; the chart's grace period covers [`handover::SHUTDOWN_LIMIT`].

pub use dra_plugin::handover;
pub use dra_plugin::kubeletplugin as server;
