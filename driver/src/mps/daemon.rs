//! One MPS control daemon as a process: the control binary, its directories (and its shm tmpfs,
//! [`super::shm`]), starting it in the foreground (`-f`, so the plugin sees it exit) as the
//! plugin's child ([`spawn`]; the MPS host starts the same process, [`super::launch`]), the pid
//! file that lets a restarted plugin adopt a daemon still running (and lets it watch one the
//! host started), and killing it. Its control
//! commands are [`super::control`]'s; [`super::supervisor`] decides when.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::MpsLimits;
use super::commands::Protocol;
use super::layout::MpsDirs;
use super::shm::{self, Shm};
use super::stand_in;

/// How long a started daemon may take to create its control socket.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one control command (a client-mode run of the binary) may take.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a daemon has to exit after `quit` before it is killed (its claim's containers have
/// all stopped by then: the kubelet unprepares a claim only after that).
pub const QUIT_GRACE: Duration = Duration::from_secs(5);
/// How often a wait for a socket or an exit looks again.
const POLL: Duration = Duration::from_millis(20);
/// File the daemon's standard output and error go to, in its log directory.
pub(crate) const OUTPUT_FILE: &str = "daemon.out";

/// Why a daemon could not be started, configured or stopped; the text says which daemon, what
/// failed and, where the daemon wrote one, the end of its log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MpsError(pub String);

/// The program that is the control daemon, and in client mode sends it commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlBinary {
    /// The executable.
    pub program: PathBuf,
    /// Arguments before the daemon's own (the stand-in's subcommand).
    pub leading_args: Vec<String>,
    /// Environment added to both modes (`PATH`, `LD_LIBRARY_PATH` for NVIDIA's binary).
    pub env: Vec<(String, String)>,
    /// Run the daemon in a mount namespace of its own with the MIG instance's shm directory over
    /// `/dev/shm`, so it shares shared memory with its clients, whose CDI edits mount the same
    /// directory there (real GPUs; needs `CAP_SYS_ADMIN`, which the plugin has there).
    pub shm_over_dev_shm: bool,
}

impl ControlBinary {
    /// NVIDIA's `nvidia-cuda-mps-control` at `path` (found with the driver files), with
    /// `lib_dir` (the driver's libraries as the plugin sees them) first in `LD_LIBRARY_PATH` and
    /// the binary's own directory first in `PATH`: the daemon loads `libcuda.so.1` and starts
    /// `nvidia-cuda-mps-server` from there.
    pub fn nvidia(path: PathBuf, lib_dir: Option<&Path>) -> Self {
        let prepend = |var: &str, dir: &Path| {
            let old = std::env::var(var).unwrap_or_default();
            let joined = if old.is_empty() {
                dir.display().to_string()
            } else {
                format!("{}:{old}", dir.display())
            };
            (var.to_string(), joined)
        };
        let mut env = Vec::new();
        if let Some(bin_dir) = path.parent() {
            env.push(prepend("PATH", bin_dir));
        }
        if let Some(lib) = lib_dir {
            env.push(prepend("LD_LIBRARY_PATH", lib));
        }
        Self {
            program: path,
            leading_args: Vec::new(),
            env,
            shm_over_dev_shm: true,
        }
    }

    /// The emulated GPUs' stand-in: `exe` (the plugin's own binary) with the hidden subcommand
    /// [`stand_in::SUBCOMMAND`].
    pub fn stand_in(exe: PathBuf) -> Self {
        Self {
            program: exe,
            leading_args: vec![stand_in::SUBCOMMAND.to_string()],
            env: Vec::new(),
            shm_over_dev_shm: false,
        }
    }

    /// The binary with its environment and `env`, standard input closed.
    pub(super) fn command(&self, env: &[(String, String)]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.leading_args)
            .envs(self.env.iter().cloned())
            .envs(env.iter().cloned())
            .stdin(Stdio::null());
        c
    }
}

/// One daemon: whose it is, where its files are, which MIG instance it serves and with what limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSpec {
    /// [`super::layout::daemon_id`] of its claim and device.
    pub id: String,
    /// Its directories.
    pub dirs: MpsDirs,
    /// The UUID of the device it serves (its `CUDA_VISIBLE_DEVICES`): a MIG instance's MIG UUID,
    /// or a GPU's UUID for the shares of a whole GPU.
    pub device_uuid: String,
    /// Its limits: the daemon's defaults (protocol 2), the server's (protocol 3).
    pub limits: MpsLimits,
    /// Claim and device, for logs and errors (`namespace/name (uid) device`).
    pub owner: String,
    /// The protocol it speaks.
    pub protocol: Protocol,
    /// What backs its shm directory.
    pub shm: Shm,
}

/// Creates the daemon's directories: `pipe` and `log` (mode 0755: containers of any user reach
/// the sockets the daemon makes there), `shm` (mode 1777, as `/dev/shm`).
///
/// # Errors
/// A directory could not be made.
pub fn make_dirs(dirs: &MpsDirs) -> Result<(), MpsError> {
    for (dir, mode) in [
        (&dirs.root, 0o755),
        (&dirs.pipe, 0o755),
        (&dirs.log, 0o755),
        (&dirs.shm, 0o1777),
    ] {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)))
            .map_err(|e| MpsError(format!("create {}: {e}", dir.display())))?;
    }
    Ok(())
}

/// Backs the shm directory of a daemon whose directories were just made (`fresh`) as `spec.shm`
/// says: mounts its tmpfs (never a second one). A daemon started again in directories that
/// exist keeps what is there, since running containers have that very directory bind-mounted;
/// one left a plain directory (made by a plugin before tmpfs mounts) says so in the log.
///
/// # Errors
/// The tmpfs could not be mounted (the error says what privilege or flag it needs).
pub(crate) fn prepare_shm(spec: &DaemonSpec, fresh: bool) -> Result<(), MpsError> {
    let Some(size) = spec.shm.size_bytes() else {
        return Ok(());
    };
    if fresh {
        shm::ensure_mounted(&spec.dirs.shm, spec.shm)
            .map_err(|e| MpsError(format!("the shm directory of the MPS control daemon: {e}")))?;
        return Ok(());
    }
    if !shm::is_mounted(&spec.dirs.shm) {
        tracing::warn!(daemon = %spec.id, owner = %spec.owner, shm = %spec.dirs.shm.display(), size,
            "the daemon's shm directory is a plain directory, not a tmpfs (made by an older plugin): kept, as its containers have it mounted; it is bounded only once its claim is prepared again");
    }
    Ok(())
}

/// Removes the daemon's directories (all of `root`), its shm tmpfs unmounted first; already
/// gone is fine.
///
/// # Errors
/// The tmpfs could not be unmounted or the directories removed.
pub(crate) fn remove_dirs(dirs: &MpsDirs) -> Result<(), MpsError> {
    shm::unmount(&dirs.shm).map_err(|e| MpsError(e.to_string()))?;
    match std::fs::remove_dir_all(&dirs.root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(MpsError(format!("remove {}: {e}", dirs.root.display()))),
    }
}

/// Kills the process group of a daemon this process started (its server too) and reaps it.
pub(crate) async fn kill_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        // Before the reap: while the leader is unreaped its pid (the group's id) cannot be
        // given to another process.
        kill_group(pid);
    }
    let _ = child.kill().await;
}

/// Waits until the daemon has made its control socket, or `exited` says it has exited (how:
/// its exit status, or that its pid is gone), or `timeout` passed.
///
/// # Errors
/// The daemon exited or made no socket in time; with the end of its log.
pub async fn wait_ready(
    spec: &DaemonSpec,
    mut exited: impl FnMut() -> Option<String>,
    timeout: Duration,
) -> Result<(), MpsError> {
    let t0 = Instant::now();
    let socket = spec.dirs.control_socket();
    loop {
        if socket.exists() {
            return Ok(());
        }
        if let Some(how) = exited() {
            return Err(MpsError(format!(
                "the MPS control daemon exited at start ({how}){}",
                log_tail(&spec.dirs)
            )));
        }
        if t0.elapsed() >= timeout {
            return Err(MpsError(format!(
                "the MPS control daemon made no control socket {} within {} s{}",
                socket.display(),
                timeout.as_secs(),
                log_tail(&spec.dirs)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A daemon process as its pid file records it: the pid and the start time from
/// `/proc/<pid>/stat`, which tells a reused pid apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DaemonProcess {
    /// Its pid, which is also its process group's id (it leads its own group).
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` when it was started, in clock ticks since boot.
    pub start: u64,
}

impl DaemonProcess {
    /// Whether this very process still runs: its pid exists, has the recorded start time (a
    /// pid the kernel gave to another process since has another) and is no zombie.
    pub fn alive(&self) -> bool {
        self.start != 0 && start_time(self.pid) == Some(self.start) && !is_zombie(self.pid)
    }

    /// Sends SIGKILL to its process group (the control daemon and the MPS server it started:
    /// a server left running would keep the MIG instance in use), if it is still this process; a
    /// process gone already is left alone, whatever has its pid now.
    pub fn kill(&self) {
        if self.alive() {
            kill_group(self.pid);
        }
    }
}

/// Writes `<pid> <start time>` to `path` (see [`DaemonProcess`]) and returns that process.
pub(crate) fn write_pid_file(path: &Path, pid: u32) -> Result<DaemonProcess, MpsError> {
    let start = start_time(pid).unwrap_or(0);
    std::fs::write(path, format!("{pid} {start}\n"))
        .map_err(|e| MpsError(format!("write {}: {e}", path.display())))?;
    Ok(DaemonProcess { pid, start })
}

/// The process pid file `path` records (`<pid> <start time>`, [`write_pid_file`]), whether or
/// not it still runs; `None` when the file is missing or not of that form.
pub fn recorded_process(path: &Path) -> Option<DaemonProcess> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut parts = text.split_whitespace();
    Some(DaemonProcess {
        pid: parts.next()?.parse().ok()?,
        start: parts.next()?.parse().ok()?,
    })
}

/// The daemon the pid file names, if that process still runs and is the one that was started
/// (same start time): a daemon a restarted plugin may adopt.
pub(crate) fn live_process(dirs: &MpsDirs) -> Option<DaemonProcess> {
    recorded_process(&dirs.pid_file).filter(DaemonProcess::alive)
}

/// The pid of [`live_process`].
pub fn live_pid(dirs: &MpsDirs) -> Option<u32> {
    live_process(dirs).map(|p| p.pid)
}

/// Sends SIGKILL to process group `pgid` (a daemon's: it leads its own group, see
/// [`super::launch::spawn`]).
/// The callers make sure the group is still the daemon's: a child not yet reaped, a
/// [`DaemonProcess`] still alive, or a leader just seen to exit (a pid is not given to a new
/// process while a group of that id has members, so the kill reaches the daemon's server if one
/// is left; else it reaches nothing, unless in those milliseconds the pid went to a new process
/// that also made itself a group leader).
pub(crate) fn kill_group(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid)
        && pgid > 1
    {
        // SAFETY: killpg(2) takes plain integers; the group is a daemon's (see above).
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

/// Fields of `/proc/<pid>/stat` after the command name (which may hold blanks): the first is
/// the state (field 3).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot.
fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}

/// The last lines of the daemon's output (in the foreground NVIDIA's daemon logs there) and
/// of a `control.log` (where a daemon writes one), for errors (empty when there are none).
pub fn log_tail(dirs: &MpsDirs) -> String {
    let mut out = String::new();
    for name in [OUTPUT_FILE, "control.log"] {
        let Ok(text) = std::fs::read_to_string(dirs.log.join(name)) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        if !tail.is_empty() {
            out.push_str(&format!("; {name}: {tail}"));
        }
    }
    out
}
