//! What an MPS daemon is told (pure): its environment, its arguments, the control commands that
//! set a MIG instance's limits, and the check of the limits against the MIG instance.
//!
//! - Protocol 2 (every driver): the commands of NVIDIA's MPS documentation ("Control daemon
//!   commands", https://docs.nvidia.com/deploy/mps/mpsv2-interface.html), written one per line to
//!   the control binary's standard input in client mode, as NVIDIA's DRA driver does.
//! - Protocol 3 (driver r615+, CUDA 13.4; https://docs.nvidia.com/deploy/mps/mpsv3-interface.html):
//!   the daemon runs `-p 3`; DAS creates one named server per MIG instance ([`SERVER`], its
//!   `--allowed-devices` the MIG instance's MIG UUID) and one namespace per claim or share
//!   ([`namespace_name`]) with its own limits; the commands are the control binary's arguments
//!   (`nvidia-cuda-mps-control <module> <verb> [args] [--key=value]`).

use super::MpsLimits;
use super::layout::{LOG_DIR_ENV, MpsDirs, PIPE_DIR_ENV, VISIBLE_DEVICES_ENV};
pub use super::layout::{SERVER, namespace_name};
pub use super::settings::{Protocol, ProtocolChoice};

/// A namespace of a protocol-3 daemon's server: its name and its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// [`namespace_name`].
    pub name: String,
    /// Its limits (a namespace without limits gets the whole MIG instance: named namespaces do not
    /// inherit the server's).
    pub limits: MpsLimits,
}

/// The arguments of the daemon: foreground, and `-p 3` for protocol 3.
pub(crate) fn daemon_args(protocol: Protocol) -> Vec<String> {
    match protocol {
        Protocol::V2 => vec!["-f".to_string()],
        Protocol::V3 => ["-f", "-p", "3"].map(str::to_string).to_vec(),
    }
}

/// The `--key=value` flags that set `limits` in a protocol-3 command.
fn v3_limit_flags(limits: &MpsLimits) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = limits.active_thread_percentage {
        out.push(format!("--active-thread-percentage={p}"));
    }
    if let Some(mib) = limits.pinned_device_memory_limit_mib {
        out.push(format!("--pinned-memory-limit={mib}M"));
    }
    out
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// `server list`: the answer names every running server.
pub(crate) fn v3_server_list() -> Vec<String> {
    words(&["server", "list"])
}

/// `server create` of the device's server (a MIG instance or a shared whole GPU, by UUID),
/// allowed that device alone.
pub(crate) fn v3_server_create(device_uuid: &str) -> Vec<String> {
    let mut c = words(&["server", "create", SERVER]);
    c.push(format!("--allowed-devices={device_uuid}"));
    c
}

/// `server set` of the slice-wide limits (they apply to the server's `default` namespace, which
/// no container reaches); `None` without limits.
pub(crate) fn v3_server_set(limits: &MpsLimits) -> Option<Vec<String>> {
    let flags = v3_limit_flags(limits);
    (!flags.is_empty()).then(|| {
        let mut c = words(&["server", "set", SERVER]);
        c.extend(flags);
        c
    })
}

/// `namespace list` of the MIG instance's server.
pub(crate) fn v3_namespace_list() -> Vec<String> {
    let mut c = words(&["namespace", "list"]);
    c.push(format!("--server={SERVER}"));
    c
}

/// `namespace create` of `name` on the MIG instance's server.
pub(crate) fn v3_namespace_create(name: &str) -> Vec<String> {
    let mut c = words(&["namespace", "create", name]);
    c.push(format!("--server={SERVER}"));
    c
}

/// `namespace set` of `ns`'s limits; `None` without limits.
pub(crate) fn v3_namespace_set(ns: &Namespace) -> Option<Vec<String>> {
    let flags = v3_limit_flags(&ns.limits);
    (!flags.is_empty()).then(|| {
        let mut c = words(&["namespace", "set", &ns.name]);
        c.push(format!("--server={SERVER}"));
        c.extend(flags);
        c
    })
}

/// `namespace delete` of `name` on the MIG instance's server.
pub(crate) fn v3_namespace_delete(name: &str) -> Vec<String> {
    let mut c = words(&["namespace", "delete", name]);
    c.push(format!("--server={SERVER}"));
    c
}

/// Whether a `list` answer names `name` (a whole word: the answer's layout beyond that is not
/// relied on).
pub fn listed(answer: &str, name: &str) -> bool {
    answer
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w == name)
}

/// The limits of one namespace: a claim's own (its config), or for a share of a shared slice the
/// tighter of the MIG instance's config and the share's part (its thread percentage and memory), since
/// a namespace's limits replace, not narrow, the server's.
pub(crate) fn namespace_limits(config: &MpsLimits, share: Option<(u8, u64)>) -> MpsLimits {
    let Some((percent, mib)) = share else {
        return config.clone();
    };
    let tighter = |a: Option<u64>, b: u64| Some(a.map_or(b, |a| a.min(b)));
    MpsLimits {
        active_thread_percentage: tighter(
            config.active_thread_percentage.map(u64::from),
            u64::from(percent),
        )
        .map(|p| p as u8),
        pinned_device_memory_limit_mib: tighter(config.pinned_device_memory_limit_mib, mib),
    }
}

/// The command that stops the daemon (and its server, once its clients are gone).
pub(crate) const QUIT: &str = "quit";

/// The device the pinned memory limit is set for: ordinal 0, the one device the daemon sees
/// (its `CUDA_VISIBLE_DEVICES` is the MIG instance's MIG UUID alone, see [`daemon_env`]). Not the
/// UUID: NVIDIA's daemon answers nothing and sets nothing effective for a UUID it does not serve,
/// so a wrong UUID would pass silently, while ordinal 0 can only be the MIG instance.
pub(crate) const LIMIT_DEVICE: &str = "0";

/// The commands that set `limits` on a MIG instance's daemon, in order: the active thread percentage,
/// then the pinned memory limit of the MIG instance (device [`LIMIT_DEVICE`], `<N>M` in MiB). None
/// for no limits.
pub fn limit_commands(limits: &MpsLimits) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = limits.active_thread_percentage {
        out.push(format!("set_default_active_thread_percentage {p}"));
    }
    if let Some(mib) = limits.pinned_device_memory_limit_mib {
        out.push(format!(
            "set_default_device_pinned_mem_limit {LIMIT_DEVICE} {mib}M"
        ));
    }
    out
}

/// The environment of the daemon of the device of UUID `device_uuid` (a MIG instance, or a whole
/// GPU): that device alone visible, its pipe and log directories.
pub(crate) fn daemon_env(dirs: &MpsDirs, device_uuid: &str) -> Vec<(String, String)> {
    vec![
        (VISIBLE_DEVICES_ENV.to_string(), device_uuid.to_string()),
        (PIPE_DIR_ENV.to_string(), dirs.pipe.display().to_string()),
        (LOG_DIR_ENV.to_string(), dirs.log.display().to_string()),
    ]
}

/// The environment of the control binary in client mode: the daemon's pipe and log directories.
pub(crate) fn client_env(dirs: &MpsDirs) -> Vec<(String, String)> {
    vec![
        (PIPE_DIR_ENV.to_string(), dirs.pipe.display().to_string()),
        (LOG_DIR_ENV.to_string(), dirs.log.display().to_string()),
    ]
}

/// A pinned memory limit above the memory of the MIG instance it is for: a client cannot pin more than
/// the MIG instance has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "sharing.mps.pinnedDeviceMemoryLimit is {limit_mib}Mi, more than the {instance_mib}Mi of {}; valid: 1Mi to {instance_mib}Mi",
    served(profile)
)]
pub(crate) struct LimitAboveInstance {
    /// The limit asked for, in MiB.
    pub limit_mib: u64,
    /// The MIG instance's profile, or [`das_api::WHOLE_GPU_PROFILE`] for a whole GPU.
    pub profile: String,
    /// The MIG instance's memory, in MiB.
    pub instance_mib: u64,
}

/// What a limit is for, as a message names it: `a 1g.10gb slice`, `the whole GPU`.
fn served(profile: &str) -> String {
    if profile == das_api::WHOLE_GPU_PROFILE {
        "the whole GPU".into()
    } else {
        format!("a {profile} slice")
    }
}

/// Checks `limits` against the MIG instance they are for, whose memory is `instance_memory_mib` (the
/// profile's).
///
/// # Errors
/// The pinned memory limit is above the MIG instance's memory.
pub(crate) fn check_against_instance(
    limits: &MpsLimits,
    profile: &str,
    instance_memory_mib: u64,
) -> Result<(), LimitAboveInstance> {
    match limits.pinned_device_memory_limit_mib {
        Some(mib) if mib > instance_memory_mib => Err(LimitAboveInstance {
            limit_mib: mib,
            profile: profile.to_string(),
            instance_mib: instance_memory_mib,
        }),
        _ => Ok(()),
    }
}
