//! The MPS host (docs/design.md §7, "MPS on a slice", "Who runs the daemons"): a long-lived
//! process per node, `das-kubelet-plugin mps-host --state-dir <dir>` (the chart's DaemonSet
//! `das-mps-host`, `mps.host.enabled`), that starts MPS control daemons on the plugin's
//! request and reaps them, so that they are no processes of the plugin's container and an
//! upgrade or a crash of the plugin leaves them running with their clients connected. It
//! only spawns, kills and lists: the plugin keeps the limits, the control commands, the
//! supervision (by pid, [`super::daemon::DaemonProcess`]) and the adoption.
//!
//! - [`protocol`]: the requests and answers, one JSON object each way per connection. Pure.
//! - [`server`]: the host: listens on [`socket_path`] (mode 0600), spawns with
//!   [`super::launch::Launch::spawn`] (what the plugin's own start runs), keeps and reaps its
//!   children.
//! - [`client`]: the plugin's side, [`HostClient`].

use std::path::{Path, PathBuf};

pub mod client;
pub mod protocol;
pub mod server;

pub use client::HostClient;

/// The hidden subcommand of `das-kubelet-plugin` that runs the host.
pub const SUBCOMMAND: &str = "mps-host";

/// The host's socket in the daemons' directory: `<state dir>/mps/host.sock`. A socket, not a
/// directory, so [`super::MpsDaemons::stop_unrecorded`] never takes it for a daemon's.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(super::layout::MPS_DIR).join("host.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_a_file_of_the_daemons_directory() {
        assert_eq!(
            socket_path(Path::new("/var/lib/das")),
            PathBuf::from("/var/lib/das/mps/host.sock")
        );
    }
}
