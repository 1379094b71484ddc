//! The stand-in MPS control daemon of emulated GPUs: the hidden subcommand `das-kubelet-plugin
//! mps-control-stand-in`, which behaves as `nvidia-cuda-mps-control` does for DAS, so the
//! plugin starts, configures, supervises and stops it exactly as it does NVIDIA's, and shipping
//! it adds no binary to the image.
//!
//! - `-f` (the daemon): makes its pipe directory (`CUDA_MPS_PIPE_DIRECTORY`), writes
//!   `control.pid` there, listens on the unix socket `control` in it, and appends a run to
//!   [`RECORD_FILE`] in its log directory (`CUDA_MPS_LOG_DIRECTORY`): its pid, its
//!   `CUDA_VISIBLE_DEVICES` and every command it gets, one per line of each connection, so
//!   tests read the limits a slice got. It exits on `quit`, or once its control socket is gone
//!   (its directory removed: nothing can reach it any more).
//! - no `-f` (the client): sends its standard input's lines to the daemon's socket and prints
//!   the answer (as NVIDIA's daemon answers: the percentage for the thread-percentage commands,
//!   `Unknown command "…"` for one it does not know; the client exits 0 either way).
//!
//! Paths are used relative to the pipe directory (the process changes into it), so a long
//! state dir does not overflow a unix socket address.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::layout::{CONTROL_SOCKET, LOG_DIR_ENV, PIPE_DIR_ENV, VISIBLE_DEVICES_ENV};

/// The plugin's hidden subcommand that runs the stand-in.
pub const SUBCOMMAND: &str = "mps-control-stand-in";
/// What the stand-in records, in its log directory.
pub const RECORD_FILE: &str = "stand-in.json";
/// The stand-in's own pid file, in its pipe directory.
pub const PID_FILE: &str = "control.pid";
/// How often the daemon looks for a connection (and for its socket, which gone ends it).
const ACCEPT_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Everything the stand-in daemons of one slice did: one run per start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The runs, oldest first.
    pub runs: Vec<Run>,
}

/// One start of the stand-in daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// Its process id.
    pub pid: u32,
    /// Its `CUDA_VISIBLE_DEVICES`: the slice's MIG UUID.
    pub visible_devices: String,
    /// Its `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe_directory: String,
    /// The commands it got, in order.
    pub commands: Vec<String>,
}

impl Record {
    /// The record in log directory `log_dir`, if there is one.
    pub fn read(log_dir: &Path) -> Option<Record> {
        let text = std::fs::read_to_string(log_dir.join(RECORD_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        let tmp = log_dir.join(format!("{RECORD_FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(tmp, log_dir.join(RECORD_FILE))
    }
}

/// Runs the stand-in with `args` (those after the subcommand); returns the exit status.
pub fn main(args: &[String]) -> u8 {
    let result = if args.iter().any(|a| a == "-f") {
        serve()
    } else {
        client()
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{SUBCOMMAND}: {e}");
            1
        }
    }
}

fn env_dir(name: &str) -> Result<PathBuf, String> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .ok_or(format!("{name} is not set"))
}

/// The daemon: see the module docs.
fn serve() -> Result<(), String> {
    let pipe = env_dir(PIPE_DIR_ENV)?;
    let log = env_dir(LOG_DIR_ENV)?;
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    std::fs::create_dir_all(&pipe).map_err(|e| io(&format!("create {}", pipe.display()), e))?;
    std::fs::create_dir_all(&log).map_err(|e| io(&format!("create {}", log.display()), e))?;
    // Absolute from here on only for the record: the socket is bound relative to the pipe dir.
    let log = std::fs::canonicalize(&log).map_err(|e| io("log directory", e))?;
    std::env::set_current_dir(&pipe).map_err(|e| io(&format!("cd {}", pipe.display()), e))?;
    let _ = std::fs::remove_file(CONTROL_SOCKET);
    let mut record = Record::read(&log).unwrap_or_default();
    record.runs.push(Run {
        pid: std::process::id(),
        visible_devices: std::env::var(VISIBLE_DEVICES_ENV).unwrap_or_default(),
        pipe_directory: pipe.display().to_string(),
        commands: Vec::new(),
    });
    record.write(&log).map_err(|e| io("write the record", e))?;
    std::fs::write(PID_FILE, format!("{}\n", std::process::id()))
        .map_err(|e| io("write the pid file", e))?;
    // Bound last: the socket appearing is what tells the plugin the daemon is ready.
    let listener = UnixListener::bind(CONTROL_SOCKET).map_err(|e| io("listen", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listen", e))?;
    loop {
        let mut conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Its directory removed (a test cluster torn down without unpreparing): no
                // plugin can reach it any more, so it ends instead of lingering.
                if !Path::new(CONTROL_SOCKET).exists() {
                    return Ok(());
                }
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
            // Another failure (out of descriptors, say) may well repeat: wait as for no
            // connection instead of spinning on it.
            Err(_) => {
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        conn.set_nonblocking(false).map_err(|e| io("accept", e))?;
        let reader = BufReader::new(conn.try_clone().map_err(|e| io("accept", e))?);
        let mut quit = false;
        for line in reader.lines() {
            let Ok(line) = line else { break };
            let command = line.trim().to_string();
            if command.is_empty() {
                continue;
            }
            let answer = answer(&record, &command);
            if let Some(run) = record.runs.last_mut() {
                run.commands.push(command.clone());
            }
            record.write(&log).map_err(|e| io("write the record", e))?;
            if let Some(a) = answer {
                let _ = writeln!(conn, "{a}");
            }
            if command == "quit" || command.starts_with("quit ") {
                quit = true;
                break;
            }
        }
        drop(conn);
        if quit {
            let _ = std::fs::remove_file(CONTROL_SOCKET);
            let _ = std::fs::remove_file(PID_FILE);
            return Ok(());
        }
    }
}

/// The commands the stand-in knows (each answered as [`answer`] says); any other is answered
/// `Unknown command "<command>"`, as NVIDIA's daemon answers one.
const KNOWN: [&str; 5] = [
    "set_default_active_thread_percentage",
    "set_default_device_pinned_mem_limit",
    "get_default_active_thread_percentage",
    "get_default_device_pinned_mem_limit",
    "quit",
];

/// The stand-in's answer to a command, as NVIDIA's daemon gives it: the percentage set (as
/// `30.0`) for `set_default_active_thread_percentage` and
/// `get_default_active_thread_percentage` (100 when none was set), the limit set (as given,
/// `2048M`; `0` when none) for `get_default_device_pinned_mem_limit 0`, `Unknown command "…"`
/// for a command it does not know, nothing for the others. The pinned memory commands name the
/// device by ordinal, and the stand-in serves one device, `0` (as DAS's daemons do, see
/// [`super::commands::LIMIT_DEVICE`]): it refuses any other (`Invalid device "…"`), stricter than
/// NVIDIA's daemon, which takes a device it does not serve silently, so tests see a command
/// that would set nothing.
fn answer(record: &Record, command: &str) -> Option<String> {
    let mut words = command.split_whitespace();
    let name = words.next().unwrap_or_default();
    if !KNOWN.contains(&name) {
        return Some(format!("Unknown command \"{command}\""));
    }
    if name.ends_with("_device_pinned_mem_limit") {
        let device = words.next().unwrap_or_default();
        if device != super::commands::LIMIT_DEVICE {
            return Some(format!("Invalid device \"{device}\""));
        }
    }
    if let Some(p) = command.strip_prefix("set_default_active_thread_percentage ") {
        return Some(format!("{p}.0"));
    }
    let last_set = |prefix: &str| -> Option<String> {
        record
            .runs
            .last()?
            .commands
            .iter()
            .rev()
            .find_map(|c| c.strip_prefix(prefix).map(str::to_string))
    };
    match name {
        "get_default_active_thread_percentage" => {
            let set = last_set("set_default_active_thread_percentage ");
            Some(format!("{}.0", set.as_deref().unwrap_or("100")))
        }
        "get_default_device_pinned_mem_limit" => {
            let set = last_set("set_default_device_pinned_mem_limit ");
            let limit = set.as_deref().and_then(|s| s.split_whitespace().nth(1));
            Some(limit.unwrap_or("0").to_string())
        }
        _ => None,
    }
}

/// [`answer`], for the unit tests.
#[cfg(test)]
pub(super) fn answer_for_tests(record: &Record, command: &str) -> Option<String> {
    answer(record, command)
}

/// The client: standard input to the daemon, its answer to standard output.
fn client() -> Result<(), String> {
    let pipe = env_dir(PIPE_DIR_ENV)?;
    std::env::set_current_dir(&pipe).map_err(|e| format!("cd {}: {e}", pipe.display()))?;
    let mut conn = UnixStream::connect(CONTROL_SOCKET).map_err(|e| {
        format!(
            "cannot connect to the MPS control daemon at {}: {e}",
            pipe.join(CONTROL_SOCKET).display()
        )
    })?;
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("read standard input: {e}"))?;
    conn.write_all(&input)
        .and_then(|()| conn.shutdown(std::net::Shutdown::Write))
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .map_err(|e| format!("read the answer: {e}"))?;
    print!("{answer}");
    Ok(())
}
