//! GPU memory limits the kernel enforces, set by a CDI `createRuntime` hook (docs/design.md §7,
//! "Memory limits the kernel enforces"; facts in docs/reference/mps.md, "Memory limits the
//! kernel enforces (dmem)").
//!
//! A container runtime makes each container's leaf cgroup just before it starts the container's
//! process; only a limit on that leaf makes CUDA report the limit as the GPU's total, and a
//! parent's limit would show the whole GPU. So the limit is set by a hook DAS puts into the
//! device's CDI edits, which the runtime runs as root in its own namespaces once the leaf exists
//! and before the user process starts (the OCI runtime spec's `createRuntime`). Only a hard limit
//! is set (soft `0`): the driver adds a leaf's soft limit to every ancestor's `dmem.min` and
//! never takes it off when the leaf goes, while a hard limit leaves nothing behind.
//!
//! - `hook`: the CDI hook of one GPU's limit (`hook::memory_limit_hook`,
//!   [`MemoryLimits::hook`]) and its arguments (`hook::HookArgs`), pure;
//! - `run`: the hook itself (`das-kubelet-plugin cdi-hook memory-limit …`, [`main`]): the
//!   OCI state on standard input, the container's cgroup from `/proc/<pid>/cgroup`, and the
//!   limit, set through `nvidia-smi memory-limits` or, for emulated GPUs, written to a fake
//!   cgroup tree; small I/O steps over pure parsers;
//! - `install`: the hook's executable on the host, a copy of the plugin's binary in its
//!   kubelet plugin directory ([`install_hook`]).
//!
//! Whether a GPU gets such limits at all is `crate::gpu::memory_limits`.

use std::path::PathBuf;

pub(crate) mod hook;
pub(crate) mod install;
pub(crate) mod run;

pub use hook::{MemoryLimits, SetWith};
pub use install::{install_hook, installed_hook_path};
pub use run::main;

/// The plugin binary's subcommand of its CDI hooks: `das-kubelet-plugin cdi-hook <hook> …`.
pub const SUBCOMMAND: &str = "cdi-hook";

/// The hook that sets a container's GPU memory limit: `cdi-hook memory-limit`.
pub(crate) const MEMORY_LIMIT_HOOK: &str = "memory-limit";

/// Bytes per MiB: limits are given to `nvidia-smi` in whole MiB.
pub(crate) const MIB: u64 = 1 << 20;

/// Why a memory-limit hook cannot be built or could not set its limit. Each says what is wrong
/// and, where a value is at fault, what is valid.
#[derive(Debug, thiserror::Error)]
pub enum MemoryLimitError {
    /// A value of the hook (builder or command line) is not valid.
    #[error("invalid {what} {value:?}: valid is {valid}")]
    Invalid {
        /// Which value: "GPU UUID", "PCI bus ID", "hard limit", "hook path", "cgroup root".
        what: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        valid: &'static str,
    },
    /// Standard input is not an OCI state with the container's pid.
    #[error(
        "the OCI state on standard input is not usable: {0} (the runtime passes {{\"ociVersion\",\"id\",\"status\",\"pid\",\"bundle\"}} to a createRuntime hook)"
    )]
    State(String),
    /// The container's `/proc/<pid>/cgroup` could not be read.
    #[error(
        "read the container's cgroup {path}: {source} (is the container's process {pid} alive?)"
    )]
    ProcCgroup {
        /// The container's process.
        pid: u32,
        /// `<proc root>/<pid>/cgroup`.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// The process is in no cgroup v2 (no `0::` line), or a line is not `<id>:<controllers>:<path>`.
    #[error(
        "the container's cgroup is not cgroup v2 ({path}: {problem}): GPU memory limits need the unified hierarchy (cgroup v2, the dmem controller)"
    )]
    NotV2 {
        /// `<proc root>/<pid>/cgroup`.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// `nvidia-smi` could not be started.
    #[error("run {program}: {source}")]
    Spawn {
        /// The `nvidia-smi` it ran.
        program: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `nvidia-smi memory-limits` failed.
    #[error("nvidia-smi memory-limits exited with {status}: {output}")]
    NvidiaSmi {
        /// `status <n>` or `a signal`.
        status: String,
        /// Its output (stderr, then stdout), trimmed, at most 500 characters.
        output: String,
    },
    /// The emulated setter could not write the fake tree.
    #[error("write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
