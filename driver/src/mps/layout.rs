//! Where an MPS daemon's files are (pure). One directory per daemon,
//! `<state dir>/mps/<id>/`, with `pipe/` (the daemon's `CUDA_MPS_PIPE_DIRECTORY`: its control
//! socket and the pipes of its server; with protocol 3 also `pipe/<server>/<namespace>/`, each
//! namespace's own control socket), `log/` (`CUDA_MPS_LOG_DIRECTORY`; in the foreground
//! NVIDIA's daemon writes its control and server log to its output, which goes to
//! `log/daemon.out`), `shm/` (the containers' `/dev/shm`, a tmpfs of `--mps-shm-size`, see
//! [`super::shm`]) and `daemon.pid` (the plugin's record of the process, to adopt it after a
//! restart). The plugin's state dir is mounted at the same path
//! on the host (the chart's `hostPath`), so these paths are also the host paths the CDI mounts
//! name.

use std::path::{Path, PathBuf};

use super::settings::Protocol;

/// Where a container finds its MIG instance's MPS pipe directory (NVIDIA's DRA driver uses the same).
pub(crate) const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// Where a container's shared memory is: MPS clients and their server exchange it there.
pub(crate) const CONTAINER_SHM_DIR: &str = "/dev/shm";
/// The variable that tells CUDA (and the control binary) where the pipe directory is.
pub(crate) const PIPE_DIR_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The variable that tells the daemon where to write its logs.
pub(crate) const LOG_DIR_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";
/// The variable that pins the daemon (and its server) to the MIG instance.
pub(crate) const VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";
/// Name of the daemon's control socket in its pipe directory (`nvidia-cuda-mps-control`
/// creates `control` there; the stand-in does the same).
pub(crate) const CONTROL_SOCKET: &str = "control";
/// Folder of the daemons below the state dir.
pub const MPS_DIR: &str = "mps";

/// The id of the daemon of `device` of claim `claim_uid`: 16 hex digits of the 64-bit FNV-1a
/// of `<claim UID>/<device>` (a shared slice's daemon, which serves every share, passes its
/// GPU's UUID for `claim_uid`: `<GPU UUID>/<device>`). Short on purpose: the control socket's path
/// (`<state dir>/mps/<id>/pipe/control`) must fit a unix socket address (108 bytes).
pub fn daemon_id(claim_uid: &str, device: &str) -> String {
    format!(
        "{:016x}",
        das_runtime::hash::fnv1a64(format!("{claim_uid}/{device}").as_bytes())
    )
}

/// The name of the one server a protocol-3 daemon runs: the MIG instance's.
pub const SERVER: &str = "slice";

/// The namespace of `device` of claim `claim_uid` on its MIG instance's server: `c` and 16 hex digits
/// of the 64-bit FNV-1a of `<claim UID>/<device>` (names allow lowercase letters, digits and
/// `_`, at most 64 characters; short, as its control socket's path must fit a unix socket
/// address). Derived, never stored: the checkpoint's claim UID and device name give it back.
pub fn namespace_name(claim_uid: &str, device: &str) -> String {
    format!(
        "c{:016x}",
        das_runtime::hash::fnv1a64(format!("{claim_uid}/{device}").as_bytes())
    )
}

/// The longest path a unix socket address holds (`sun_path`, 108 bytes with its NUL).
pub(crate) const SOCKET_PATH_MAX: usize = 107;

/// A state dir too long for the daemons' control sockets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--state-dir {state_dir:?} is too long for MPS: a daemon's control socket {socket:?} would have {len} bytes, more than a unix socket address holds ({SOCKET_PATH_MAX}); use a state dir of at most {max_state_dir} bytes"
)]
pub struct SocketPathTooLong {
    /// The state dir.
    pub state_dir: String,
    /// A control socket's path under it.
    pub socket: String,
    /// That path's length in bytes.
    pub len: usize,
    /// The longest state dir that fits.
    pub max_state_dir: usize,
}

/// Checks that the longest control socket of any daemon fits a unix socket address: NVIDIA's
/// daemon binds it by that path. Protocol 2: `<state dir>/mps/<id>/pipe/control`; protocol 3:
/// a namespace's, `<state dir>/mps/<id>/pipe/<server>/<namespace>/control` (every id and
/// namespace name has the same length).
///
/// # Errors
/// It does not fit.
pub fn check_socket_path(state_dir: &Path, protocol: Protocol) -> Result<(), SocketPathTooLong> {
    let dirs = MpsDirs::new(state_dir, &daemon_id("", ""));
    let socket = match protocol {
        Protocol::V2 => dirs.control_socket(),
        Protocol::V3 => dirs
            .namespace_dir(&namespace_name("", ""))
            .join(CONTROL_SOCKET),
    };
    let len = socket.as_os_str().len();
    if len <= SOCKET_PATH_MAX {
        return Ok(());
    }
    let state_len = state_dir.as_os_str().len();
    Err(SocketPathTooLong {
        state_dir: state_dir.display().to_string(),
        socket: socket.display().to_string(),
        len,
        max_state_dir: SOCKET_PATH_MAX.saturating_sub(len - state_len),
    })
}

/// The directories and files of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    /// `<state dir>/mps/<id>`: removed whole when the daemon stops.
    pub root: PathBuf,
    /// `<root>/pipe`.
    pub pipe: PathBuf,
    /// `<root>/log`.
    pub log: PathBuf,
    /// `<root>/shm`: the mount point of the daemon's tmpfs ([`super::shm`]; a plain directory
    /// with `--mps-shm-size=0`).
    pub shm: PathBuf,
    /// `<root>/daemon.pid`: `<pid> <start time>` of the running daemon, written by the plugin.
    pub pid_file: PathBuf,
}

impl MpsDirs {
    /// The directories of daemon `id` under `state_dir`.
    pub fn new(state_dir: &Path, id: &str) -> Self {
        let root = state_dir.join(MPS_DIR).join(id);
        Self {
            pipe: root.join("pipe"),
            log: root.join("log"),
            shm: root.join("shm"),
            pid_file: root.join("daemon.pid"),
            root,
        }
    }

    /// The control socket in the pipe directory.
    pub fn control_socket(&self) -> PathBuf {
        self.pipe.join(CONTROL_SOCKET)
    }

    /// Protocol 3: the directory of namespace `name` of the MIG instance's server,
    /// `<pipe>/<server>/<name>` (NVIDIA's MPS v3 namespaces page: a client connecting to the
    /// `control` socket there is in that namespace). It is all a container of that namespace
    /// mounts.
    pub fn namespace_dir(&self, name: &str) -> PathBuf {
        self.pipe.join(SERVER).join(name)
    }

    /// The directory a container of namespace `namespace` mounts as its pipe directory: the
    /// namespace's with protocol 3, the daemon's whole pipe directory with protocol 2.
    pub(crate) fn client_pipe_dir(&self, protocol: Protocol, namespace: &str) -> PathBuf {
        match protocol {
            Protocol::V2 => self.pipe.clone(),
            Protocol::V3 => self.namespace_dir(namespace),
        }
    }
}
