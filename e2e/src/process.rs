//! Child processes of a test cluster: each in its own process group, output to a log file, and
//! stopped as a group (SIGTERM, then SIGKILL) so nothing outlives the cluster.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How a child's lifetime is tied to ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// The kernel kills the child when the spawning thread exits (PR_SET_PDEATHSIG): a test that
    /// is killed or aborts leaves nothing behind.
    TiedToParent,
    /// The child outlives us (`make cluster-up`); `make cluster-down` stops it by pid.
    Detached,
}

/// A running component.
pub struct Process {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    /// How it was started, to start it again ([`Process::respawn`]).
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    lifetime: Lifetime,
}

impl Process {
    /// Starts `program args...` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
        lifetime: Lifetime,
    ) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open log {}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .process_group(0);
        if lifetime == Lifetime::TiedToParent {
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("start {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
            program: program.to_path_buf(),
            args: args.to_vec(),
            env: env.to_vec(),
            lifetime,
        })
    }

    /// Starts the same program again (same arguments, environment and log file), as a
    /// supervisor restarting a crashed container would.
    pub fn respawn(&self) -> Result<Self> {
        Self::spawn(
            &self.name,
            &self.program,
            &self.args,
            &self.env,
            &self.log,
            self.lifetime,
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops the process group: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        stop_group(self.child.id() as i32, grace);
        let _ = self.child.wait();
    }

    /// Kills the process group at once (SIGKILL), like a crash.
    pub fn kill(&mut self) {
        // SAFETY: signals a process group we created.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }
}

/// Sends SIGTERM to process group `pgid`, waits up to `grace` for its leader to exit, then SIGKILL.
pub fn stop_group(pgid: i32, grace: Duration) {
    // SAFETY: plain syscalls on a process group id we created.
    unsafe {
        if libc::kill(-pgid, libc::SIGTERM) != 0 {
            return; // already gone
        }
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        // kill(pid, 0) fails once the leader has been reaped; a zombie still counts as alive, so
        // also look at /proc.
        if !alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// The last `n` lines of a log file.
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Resident memory of `pid` from `/proc/<pid>/status`: (current `VmRSS`, peak `VmHWM`), in KiB.
pub fn memory_kib(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// User + system CPU seconds process `pid` has used so far (`/proc/<pid>/stat` fields 14 and
/// 15, in clock ticks of 1/100 s: exact enough over hundreds of operations); 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the file: 12 and 13 after the name.
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

/// The pid of a running process whose component name ([`component_name`]) is `name`, if any.
pub fn find_component(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| alive(*pid) && component_name(*pid).as_deref() == Some(name))
}

/// The component name of `pid` (`argv[1]` of the multi-call binary), if it runs.
pub fn component_name(pid: i32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut argv = cmdline
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned());
    let program = argv.next()?;
    let program = program.rsplit('/').next().unwrap_or(&program).to_string();
    // The control plane is one multi-call binary: `k8s <component> ...`.
    let name = if program == "k8s" {
        argv.next()?
    } else {
        program
    };
    // DAS node plugins started from the chart get their node from the environment.
    let node = std::fs::read(format!("/proc/{pid}/environ"))
        .ok()
        .and_then(|env| {
            env.split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(b"NODE_NAME=").map(|v| v.to_vec()))
        })
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    Some(match node {
        Some(n) => format!("{name} ({n})"),
        None => name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_kills_the_whole_process_group_and_logs_are_kept() {
        let dir = std::env::temp_dir().join(format!("das-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sh.log");
        // The shell starts a grandchild in the same group; both must go.
        let script = "sleep 300 & echo started $!; wait".to_string();
        let mut p = Process::spawn(
            "sh",
            Path::new("/bin/sh"),
            &["-c".into(), script],
            &[],
            &log,
            Lifetime::TiedToParent,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !log_tail(&log, 1).starts_with("started") {
            assert!(Instant::now() < deadline, "child did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let grandchild: i32 = log_tail(&log, 1)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(alive(grandchild));
        p.stop(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) {
            assert!(
                Instant::now() < deadline,
                "grandchild {grandchild} survived the group stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(p.exited().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn log_tail_returns_the_last_lines() {
        let f = std::env::temp_dir().join(format!("das-tail-{}.log", std::process::id()));
        std::fs::write(&f, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&f, 2), "c\nd");
        assert_eq!(log_tail(&f, 10), "a\nb\nc\nd");
        let _ = std::fs::remove_file(&f);
        assert!(log_tail(&f, 1).starts_with("(no log"));
    }
}
