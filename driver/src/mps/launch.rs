//! What starts one MPS control daemon, as data ([`Launch`]), and the one function that starts
//! it ([`Launch::spawn`]): the plugin uses it for a daemon it runs as its own child
//! ([`spawn`]), the MPS host for a daemon it runs on the plugin's request
//! ([`super::host`]), so both start exactly the same process.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use super::commands;
use super::daemon::{self, ControlBinary, DaemonProcess, DaemonSpec, MpsError, OUTPUT_FILE};

/// One daemon's process: program, arguments, environment, where its output and pid file go,
/// and the shm directory to bind over its `/dev/shm`. Built by [`Launch::new`] (pure); sent to
/// the MPS host as the `spawn` request's body (JSON, camelCase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Launch {
    /// The control binary ([`ControlBinary::program`]).
    pub program: PathBuf,
    /// Its arguments: the binary's leading ones, then the daemon's (`-f`, protocol 3's `-p 3`).
    pub args: Vec<String>,
    /// Environment added to the starter's own (the plugin's, or the MPS host's, which the
    /// daemon inherits), in order (a later entry wins): the binary's, then the daemon's
    /// (`CUDA_VISIBLE_DEVICES`, `CUDA_MPS_PIPE_DIRECTORY`, …).
    pub env: Vec<(String, String)>,
    /// The file its standard output and error are appended to (`<log dir>/daemon.out`).
    pub output: PathBuf,
    /// The pid file written once it runs (`<pid> <start time>`, see [`DaemonProcess`]).
    pub pid_file: PathBuf,
    /// Its control socket, removed before the start: one left by a killed daemon would make
    /// the new one look ready at once.
    pub control_socket: PathBuf,
    /// The shm directory bound over `/dev/shm` in a mount namespace of its own
    /// ([`ControlBinary::shm_over_dev_shm`]); `None`: it shares the starter's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_over_dev_shm: Option<PathBuf>,
}

impl Launch {
    /// The process of `spec`'s daemon run with `bin`.
    pub fn new(bin: &ControlBinary, spec: &DaemonSpec) -> Self {
        let mut env = bin.env.clone();
        env.extend(commands::daemon_env(&spec.dirs, &spec.device_uuid));
        let mut args = bin.leading_args.clone();
        args.extend(commands::daemon_args(spec.protocol));
        Self {
            program: bin.program.clone(),
            args,
            env,
            output: spec.dirs.log.join(OUTPUT_FILE),
            pid_file: spec.dirs.pid_file.clone(),
            control_socket: spec.dirs.control_socket(),
            shm_over_dev_shm: bin.shm_over_dev_shm.then(|| spec.dirs.shm.clone()),
        }
    }

    /// Whether every file of the launch is an absolute path under `root` (the MPS host takes
    /// only daemons of its state dir's `mps/`), without `..`.
    ///
    /// # Errors
    /// The first path that is not, named with `root`.
    pub fn check_under(&self, root: &Path) -> Result<(), MpsError> {
        let mut paths = vec![
            ("output", &self.output),
            ("pidFile", &self.pid_file),
            ("controlSocket", &self.control_socket),
        ];
        if let Some(shm) = &self.shm_over_dev_shm {
            paths.push(("shmOverDevShm", shm));
        }
        for (field, p) in paths {
            let inside = p.is_absolute()
                && p.starts_with(root)
                && p != root
                && !p
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
            if !inside {
                return Err(MpsError(format!(
                    "{field} {} is not a path under {} (valid: the files of a daemon's directory <state dir>/mps/<id>/)",
                    p.display(),
                    root.display()
                )));
            }
        }
        if self.program.as_os_str().is_empty() {
            return Err(MpsError(
                "program is empty (valid: the control binary's path)".to_string(),
            ));
        }
        Ok(())
    }

    /// Starts the daemon (its directories must exist) in a process group of its own (a signal
    /// to the starter's group does not reach it, and [`daemon::kill_group`] reaches the MPS
    /// server it starts too), standard input closed, its output appended to [`Self::output`],
    /// and writes its pid file. Returns the child (to reap) and the process as the pid file
    /// records it.
    ///
    /// # Errors
    /// The output or pid file could not be made (the process started is then killed and
    /// reaped: nothing would record it), or the binary not run.
    pub async fn spawn(&self) -> Result<(Child, DaemonProcess), MpsError> {
        let _ = std::fs::remove_file(&self.control_socket);
        let open_err = |e: io::Error| MpsError(format!("open {}: {e}", self.output.display()));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.output)
            .map_err(open_err)?;
        let err = out.try_clone().map_err(open_err)?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(shm) = &self.shm_over_dev_shm {
            shm_over_dev_shm(&mut cmd, shm)?;
        }
        let mut child = cmd.spawn().map_err(|e| {
            MpsError(format!(
                "run {} for the MPS control daemon: {e}",
                self.program.display()
            ))
        })?;
        let recorded = match child.id() {
            Some(pid) => daemon::write_pid_file(&self.pid_file, pid),
            None => Err(MpsError(
                "the MPS control daemon exited at once".to_string(),
            )),
        };
        match recorded {
            Ok(p) => Ok((child, p)),
            Err(e) => {
                // Without its pid file no later plugin could find it: it must not outlive
                // this call.
                daemon::kill_child(&mut child).await;
                Err(e)
            }
        }
    }
}

/// Has the daemon's child, before it runs the binary, make a mount namespace of its own with
/// `shm` bound over `/dev/shm`.
fn shm_over_dev_shm(cmd: &mut Command, shm: &Path) -> Result<(), MpsError> {
    let bad = |e: std::ffi::NulError| MpsError(format!("{}: {e}", shm.display()));
    let source = CString::new(shm.as_os_str().as_bytes()).map_err(bad)?;
    let target = CString::new("/dev/shm").map_err(bad)?;
    let root = CString::new("/").map_err(bad)?;
    // SAFETY: between fork and exec the closure calls only unshare(2) and mount(2), which are
    // async-signal-safe, on strings allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Starts the daemon of `spec` in the foreground (`-f`) as this process's child, as
/// [`Launch::spawn`] does (its own process group, output appended to its log directory, pid
/// file), its directories made first. Returns once it runs: [`daemon::wait_ready`] waits for its
/// control socket.
///
/// # Errors
/// The directories, the output file or the pid file could not be made (the process started is
/// then killed and reaped: nothing would record it), or the binary not run.
pub async fn spawn(bin: &ControlBinary, spec: &DaemonSpec) -> Result<Child, MpsError> {
    daemon::make_dirs(&spec.dirs)?;
    Launch::new(bin, spec).spawn().await.map(|(child, _)| child)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::commands::Protocol;
    use crate::mps::{MpsDirs, MpsLimits, Shm};

    fn spec(protocol: Protocol) -> DaemonSpec {
        let id = "0123456789abcdef".to_string();
        DaemonSpec {
            dirs: MpsDirs::new(Path::new("/var/lib/das"), &id),
            id,
            device_uuid: "MIG-1".to_string(),
            limits: MpsLimits::default(),
            owner: "ns/c (uid) device d".to_string(),
            protocol,
            shm: Shm::Directory,
        }
    }

    #[test]
    fn a_launch_runs_the_binarys_arguments_then_the_daemons_with_both_environments() {
        let bin = ControlBinary::stand_in(PathBuf::from("/bin/das-kubelet-plugin"));
        let l = Launch::new(&bin, &spec(Protocol::V3));
        assert_eq!(l.program, PathBuf::from("/bin/das-kubelet-plugin"));
        assert_eq!(l.args, ["mps-control-stand-in", "-f", "-p", "3"]);
        assert!(
            l.env
                .contains(&("CUDA_VISIBLE_DEVICES".to_string(), "MIG-1".to_string()))
        );
        assert_eq!(
            l.output,
            PathBuf::from("/var/lib/das/mps/0123456789abcdef/log/daemon.out")
        );
        assert_eq!(
            l.pid_file,
            PathBuf::from("/var/lib/das/mps/0123456789abcdef/daemon.pid")
        );
        assert_eq!(l.shm_over_dev_shm, None);

        let mut nvidia = ControlBinary::nvidia(PathBuf::from("/driver/bin/mps"), None);
        nvidia.env = vec![("PATH".to_string(), "/driver/bin".to_string())];
        let l = Launch::new(&nvidia, &spec(Protocol::V2));
        assert_eq!(l.args, ["-f"]);
        assert_eq!(l.env[0], ("PATH".to_string(), "/driver/bin".to_string()));
        assert_eq!(
            l.shm_over_dev_shm,
            Some(PathBuf::from("/var/lib/das/mps/0123456789abcdef/shm"))
        );
    }

    #[test]
    fn a_launch_travels_as_camel_case_json_and_refuses_unknown_fields() {
        let bin = ControlBinary::stand_in(PathBuf::from("/bin/p"));
        let l = Launch::new(&bin, &spec(Protocol::V2));
        let json = serde_json::to_value(&l).unwrap();
        assert!(json.get("pidFile").is_some() && json.get("controlSocket").is_some());
        assert!(json.get("shmOverDevShm").is_none(), "None is left out");
        let back: Launch = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, l);
        let mut extra = json;
        extra["user"] = serde_json::json!("root");
        let e = serde_json::from_value::<Launch>(extra).unwrap_err();
        assert!(e.to_string().contains("unknown field `user`"), "{e}");
    }

    #[test]
    fn only_files_under_the_hosts_directory_are_taken() {
        let bin = ControlBinary::stand_in(PathBuf::from("/bin/p"));
        let l = Launch::new(&bin, &spec(Protocol::V2));
        l.check_under(Path::new("/var/lib/das/mps")).unwrap();
        let e = l.check_under(Path::new("/other/mps")).unwrap_err();
        assert!(
            e.0.starts_with("output /var/lib/das/mps/0123456789abcdef/log/daemon.out is not a path under /other/mps"),
            "{e}"
        );
        let mut escape = l.clone();
        escape.pid_file = PathBuf::from("/var/lib/das/mps/../../../etc/passwd");
        let e = escape
            .check_under(Path::new("/var/lib/das/mps"))
            .unwrap_err();
        assert!(e.0.starts_with("pidFile "), "{e}");
        let mut relative = l.clone();
        relative.control_socket = PathBuf::from("mps/x/pipe/control");
        assert!(relative.check_under(Path::new("mps")).is_err());
        let mut empty = l;
        empty.program = PathBuf::new();
        let e = empty
            .check_under(Path::new("/var/lib/das/mps"))
            .unwrap_err();
        assert!(e.0.contains("program is empty"), "{e}");
    }
}
