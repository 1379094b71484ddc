//! Start-up checks of the node set-up that DAS's CDI specs rely on but do not control, on real
//! GPUs only (docs/nvml.md, "What the plugin checks at start-up"). Each check that finds a problem
//! logs a warning, posts a Warning event on the Node and sets
//! `das_kubelet_plugin_node_setup_warning{check}` to 1 (0 when the check passed); none stops the
//! plugin, and none changes the node.
//!
//! - [`Check::VisibleDevicesEnvvar`]: the NVIDIA container toolkit's
//!   [`ACCEPT_ENVVAR_UNPRIVILEGED`] is true, or unset, which the toolkit reads as true. Any
//!   unprivileged pod that runs under the `nvidia` runtime (the default runtime with the GPU
//!   Operator, or `runtimeClassName: nvidia`), with or without a DAS claim, can then set
//!   `NVIDIA_VISIBLE_DEVICES=all` and get every GPU and MIG device of the node (docs/nvml.md,
//!   "Isolation: device nodes under CDI", item 1). A config file that is absent is no problem
//!   (the toolkit may not be installed: a CDI-only runtime needs none); one that cannot be read
//!   or parsed is logged with the file and the error.
//! - [`Check::NvidiaUvm`]: `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` exist. Every DAS spec
//!   names them ([`crate::claims::cdi::NVIDIA_UVM_PATH`]) and a runtime refuses a CDI device node
//!   that is missing on the host, so without them every pod with a DAS claim fails in
//!   ContainerCreating (`failed to stat CDI host device "/dev/nvidia-uvm"`). Loading the
//!   `nvidia-uvm` module does not create them; `nvidia-modprobe -u -c=0` does, and so does the
//!   NVIDIA runtime hook when it sets up a container that asks for GPUs, which DAS's
//!   `NVIDIA_VISIBLE_DEVICES=void` skips. DAS never creates them itself.
//!
//! Facts and sources: docs/reference/mig.md, "The container toolkit's config and nvidia-uvm".
//!
//! Decisions are pure ([`envvar_setting`], [`HostView::new`]); the reads are small and run in
//! the binary's start-up check before the take-over; [`report`] posts the events and sets the
//! gauges once the API client exists.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::events::{EventSink, EventTarget};
use crate::metrics::Metrics;

/// The toolkit key that lets unprivileged containers ask for GPUs with `NVIDIA_VISIBLE_DEVICES`
/// (top-level in the toolkit's `config.toml`; true when absent). NVIDIA/nvidia-container-toolkit
/// `internal/config/config.go` (`AcceptEnvvarUnprivileged`, default true), used by
/// `internal/modifier/cdi.go` (`getDevicesFromSpec`: the devices of the variable are taken when
/// the key is true or the container is privileged).
pub(crate) const ACCEPT_ENVVAR_UNPRIVILEGED: &str =
    "accept-nvidia-visible-devices-envvar-when-unprivileged";

/// The toolkit's config files, relative to the host's root:
/// - `etc/nvidia-container-runtime/config.toml`: a package install (the toolkit reads
///   `$XDG_CONFIG_HOME/nvidia-container-runtime/config.toml`, `/etc` when unset);
/// - `usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml`: the GPU Operator's
///   toolkit container (NVIDIA/nvidia-container-toolkit `cmd/nvidia-ctk-installer/main.go`:
///   install dir `/usr/local/nvidia`, components in `toolkit/`;
///   `cmd/nvidia-ctk-installer/toolkit/toolkit.go`, `installToolkitConfig`: the config in
///   `<toolkit dir>/.config/nvidia-container-runtime/config.toml`, with
///   [`ACCEPT_ENVVAR_UNPRIVILEGED`] from `ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED`,
///   default true).
pub const TOOLKIT_CONFIG_FILES: [&str; 2] = [
    "etc/nvidia-container-runtime/config.toml",
    "usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
];

/// The unified-memory device nodes every DAS CDI spec names, below `/dev`
/// ([`crate::claims::cdi::NVIDIA_UVM_PATH`], [`crate::claims::cdi::NVIDIA_UVM_TOOLS_PATH`]).
pub(crate) const UVM_NODES: [&str; 2] = ["nvidia-uvm", "nvidia-uvm-tools"];

/// The container's own `/dev`: in the privileged plugin container it holds the host's device
/// nodes as they were when the container started.
pub(crate) const CONTAINER_DEV: &str = "/dev";

/// One start-up check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    /// The toolkit lets unprivileged pods ask for GPUs by environment.
    VisibleDevicesEnvvar,
    /// The unified-memory device nodes are missing.
    NvidiaUvm,
}

impl Check {
    /// The `check` label of `das_kubelet_plugin_node_setup_warning`.
    pub fn label(self) -> &'static str {
        match self {
            Check::VisibleDevicesEnvvar => "visible_devices_envvar",
            Check::NvidiaUvm => "nvidia_uvm",
        }
    }

    /// The reason of the Warning event on the Node (docs/design.md §3, "Node events").
    pub fn reason(self) -> &'static str {
        match self {
            Check::VisibleDevicesEnvvar => "ToolkitAcceptsVisibleDevicesEnvvar",
            Check::NvidiaUvm => "NvidiaUvmMissing",
        }
    }
}

/// A problem a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Which check found it.
    pub check: Check,
    /// What is wrong and what to do (the log line and the event's note; under the Events API's
    /// 1 kB).
    pub note: String,
    /// Post a Warning event with it: false for a config file that could not be read, where DAS
    /// cannot tell what the toolkit does (logged only; the gauge still says so).
    pub event: bool,
}

/// What the checks found at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeChecks {
    /// The checks that ran (their gauge is set, to 0 when they found nothing).
    pub ran: Vec<Check>,
    /// What they found.
    pub problems: Vec<Problem>,
}

/// Where the plugin sees the host's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// The host's root directory, when the plugin has one: the driver root mounted from the
    /// host's `/` (the chart's default `kubeletPlugin.driverRoot: /`). With another driver root
    /// (the GPU Operator's driver container, `/run/nvidia/driver`) the toolkit's config, which is
    /// on the host, is not visible, and that check does not run.
    pub root: Option<PathBuf>,
    /// Directories that show the host's `/dev`: `<root>/dev` (live) and the container's own
    /// [`CONTAINER_DEV`] (as at the container's start; the NVIDIA runtime hook may create the
    /// nodes on the host later in that start, for the plugin pod of the chart's `runtimeClass`
    /// route). A node counts as present when any has it.
    pub dev: Vec<PathBuf>,
    /// Check the unified-memory nodes: only when the CDI specs name the host's device nodes.
    pub uvm: bool,
}

impl HostView {
    /// The view of a plugin whose driver root is `driver_root` (as the plugin sees it) and
    /// `host_driver_root` on the host (default: `driver_root`); `device_nodes` says whether the
    /// CDI specs name the host's device nodes.
    pub fn new(
        driver_root: Option<&Path>,
        host_driver_root: Option<&Path>,
        device_nodes: bool,
    ) -> Self {
        let root = driver_root
            .filter(|path| host_driver_root.unwrap_or(path) == Path::new("/"))
            .map(Path::to_path_buf);
        let mut dev: Vec<PathBuf> = root.iter().map(|r| r.join("dev")).collect();
        dev.push(PathBuf::from(CONTAINER_DEV));
        Self {
            root,
            dev,
            uvm: device_nodes,
        }
    }
}

/// What a toolkit config says about [`ACCEPT_ENVVAR_UNPRIVILEGED`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvvarSetting {
    /// Unprivileged pods may ask for GPUs by environment: the key is true (`explicit`) or absent.
    Accepted {
        /// The key is in the file (else the toolkit's default applies).
        explicit: bool,
    },
    /// The key is false: only privileged containers may.
    Refused,
    /// The text is not TOML, or the key is not a boolean (the toolkit cannot load it either).
    Malformed(String),
}

/// Reads [`ACCEPT_ENVVAR_UNPRIVILEGED`] from the text of a toolkit `config.toml`: a top-level
/// key; the same name inside a table is another setting and does not count.
pub fn envvar_setting(config: &str) -> EnvvarSetting {
    let table: toml::Table = match toml::from_str(config) {
        Ok(t) => t,
        Err(e) => {
            let line = e.span().map(|span| {
                let before = &config.as_bytes()[..span.start.min(config.len())];
                before.iter().filter(|&&b| b == b'\n').count() + 1
            });
            return EnvvarSetting::Malformed(match line {
                Some(line) => format!("invalid TOML at line {line}: {}", e.message()),
                None => format!("invalid TOML: {}", e.message()),
            });
        }
    };
    match table.get(ACCEPT_ENVVAR_UNPRIVILEGED) {
        None => EnvvarSetting::Accepted { explicit: false },
        Some(toml::Value::Boolean(true)) => EnvvarSetting::Accepted { explicit: true },
        Some(toml::Value::Boolean(false)) => EnvvarSetting::Refused,
        Some(other) => EnvvarSetting::Malformed(format!(
            "{ACCEPT_ENVVAR_UNPRIVILEGED} is a {}, not a boolean",
            other.type_str()
        )),
    }
}

/// The problem of toolkit config `file` (as the host names it) with setting `setting`, if any.
pub(crate) fn envvar_problem(file: &Path, setting: &EnvvarSetting) -> Option<Problem> {
    let value = match setting {
        EnvvarSetting::Refused => return None,
        EnvvarSetting::Accepted { explicit: true } => "true",
        EnvvarSetting::Accepted { explicit: false } => "unset, which the toolkit reads as true",
        EnvvarSetting::Malformed(why) => {
            return Some(unreadable_config(file, why));
        }
    };
    Some(Problem {
        check: Check::VisibleDevicesEnvvar,
        note: format!(
            "NVIDIA container toolkit config {}: {ACCEPT_ENVVAR_UNPRIVILEGED} is {value}. Any unprivileged pod on this node that runs under the nvidia runtime (the default runtime with the GPU Operator, or runtimeClassName: nvidia), with or without a DAS claim, can set NVIDIA_VISIBLE_DEVICES=all and get every GPU and MIG device, bypassing DAS. Set it to false (GPU Operator: toolkit env ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false); new containers see the change, and the plugin checks again when it restarts.",
            file.display()
        ),
        event: true,
    })
}

fn unreadable_config(file: &Path, why: &str) -> Problem {
    Problem {
        check: Check::VisibleDevicesEnvvar,
        note: format!(
            "NVIDIA container toolkit config {} cannot be read ({why}): DAS cannot tell whether unprivileged pods may ask for GPUs with NVIDIA_VISIBLE_DEVICES",
            file.display()
        ),
        event: false,
    }
}

/// The problems of the toolkit configs ([`TOOLKIT_CONFIG_FILES`]) below `root`, the host's root
/// as the plugin sees it; notes name the files as the host does. Absent files are logged at
/// debug level only.
pub fn check_toolkit_configs(root: &Path) -> Vec<Problem> {
    let mut problems = Vec::new();
    for rel in TOOLKIT_CONFIG_FILES {
        let host_file = Path::new("/").join(rel);
        let path = root.join(rel);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::debug!(file = %host_file.display(), "no NVIDIA container toolkit config here");
                continue;
            }
            Err(e) => {
                problems.push(unreadable_config(&host_file, &e.to_string()));
                continue;
            }
        };
        let setting = match String::from_utf8(bytes) {
            Ok(text) => envvar_setting(&text),
            Err(_) => EnvvarSetting::Malformed("not UTF-8".into()),
        };
        problems.extend(envvar_problem(&host_file, &setting));
    }
    problems
}

/// Why a unified-memory node `name` is not usable in any of `dev_dirs`, or `None` when one of
/// them has it as a character device (symlinks followed).
fn uvm_node_missing(dev_dirs: &[PathBuf], name: &str) -> Option<String> {
    let mut first_why = None;
    for dir in dev_dirs {
        let why = match std::fs::metadata(dir.join(name)) {
            Ok(m) if m.file_type().is_char_device() => return None,
            Ok(_) => "not a character device".to_string(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => "missing".to_string(),
            Err(e) => e.to_string(),
        };
        first_why.get_or_insert(why);
    }
    Some(first_why.unwrap_or_else(|| "missing".into()))
}

/// The problem of the unified-memory nodes ([`UVM_NODES`]) in `dev_dirs` (each shows the host's
/// `/dev`), if any.
pub(crate) fn check_uvm_nodes(dev_dirs: &[PathBuf]) -> Option<Problem> {
    let missing: Vec<String> = UVM_NODES
        .iter()
        .filter_map(|name| {
            uvm_node_missing(dev_dirs, name).map(|why| format!("/dev/{name} ({why})"))
        })
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(Problem {
        check: Check::NvidiaUvm,
        note: format!(
            "{} not usable on this node (the nvidia-uvm kernel module is not loaded, or its device nodes were never created). Every DAS CDI spec names both, so pods with DAS claims fail in ContainerCreating (failed to stat CDI host device \"/dev/nvidia-uvm\"). On the node, as root: nvidia-modprobe -u -c=0 (loads nvidia-uvm and creates both nodes; modprobe nvidia-uvm alone leaves the nodes to udev), or let the GPU Operator's driver container and validator do it; then restart the DAS plugin pod to clear this warning.",
            missing.join(", ")
        ),
        event: true,
    })
}

/// Runs the checks `view` allows (reads files; blocking).
pub fn run(view: &HostView) -> NodeChecks {
    let mut checks = NodeChecks::default();
    match &view.root {
        Some(root) => {
            checks.ran.push(Check::VisibleDevicesEnvvar);
            checks.problems.extend(check_toolkit_configs(root));
        }
        None => tracing::info!(
            "the NVIDIA container toolkit's config is not checked: the driver root is not the host's / (docs/nvml.md)"
        ),
    }
    if view.uvm {
        checks.ran.push(Check::NvidiaUvm);
        checks.problems.extend(check_uvm_nodes(&view.dev));
    }
    checks
}

/// Logs each problem, posts the Warning events on the Node through `api` (best effort) and sets
/// the gauges of the checks that ran.
pub async fn report(checks: &NodeChecks, api: &dyn EventSink, metrics: &Metrics) {
    for check in &checks.ran {
        let found = checks.problems.iter().any(|p| p.check == *check);
        metrics.set_node_setup_warning(check.label(), found);
    }
    for p in &checks.problems {
        tracing::warn!(check = p.check.label(), "{}", p.note);
        if p.event {
            api.warn(&EventTarget::Node, p.check.reason(), p.note.clone())
                .await;
        }
    }
}

#[cfg(test)]
mod tests;
