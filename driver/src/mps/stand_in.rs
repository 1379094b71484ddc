//! The stand-in MPS control daemon of emulated GPUs: the hidden subcommand `das-kubelet-plugin
//! mps-control-stand-in`, which behaves as `nvidia-cuda-mps-control` does for DAS, so the
//! plugin starts, configures, supervises and stops it exactly as it does NVIDIA's, and shipping
//! it adds no binary to the image.
//!
//! - `-f` (the daemon; `-f -p 3` speaks protocol 3): makes its pipe directory
//!   (`CUDA_MPS_PIPE_DIRECTORY`), writes `control.pid` there, listens on the unix socket
//!   `control` in it, and appends a run to [`RECORD_FILE`] in its log directory
//!   (`CUDA_MPS_LOG_DIRECTORY`): its pid, its `CUDA_VISIBLE_DEVICES`, every command it gets, one
//!   per line of each connection, and with protocol 3 its servers and namespaces with their
//!   limits, so tests read the limits a MIG instance got ([`model`]). A protocol-3 server listens on
//!   `<server>/control` and each namespace on `<server>/<namespace>/control`, where a client of
//!   that namespace connects (`get_default_active_thread_percentage` there answers the
//!   namespace's percentage). It exits on `quit`, or once its control socket is gone (its
//!   directory removed: nothing can reach it any more).
//! - no `-f` (the client): sends its arguments as one command (protocol 3's form, `server list`),
//!   or without arguments its standard input's lines (protocol 2's), to the daemon's socket and
//!   prints the answer (as NVIDIA's daemon answers: the percentage for the thread-percentage
//!   commands, `Unknown command "…"` for one it does not know; the client exits 0 either way).
//!
//! Paths are used relative to the pipe directory (the process changes into it), so a long
//! state dir does not overflow a unix socket address.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use super::layout::{CONTROL_SOCKET, LOG_DIR_ENV, PIPE_DIR_ENV, VISIBLE_DEVICES_ENV};

pub mod model;

use model::{Effect, socket_of};
pub use model::{Limits, RECORD_FILE, Record, Run, Server};

/// The plugin's hidden subcommand that runs the stand-in.
pub const SUBCOMMAND: &str = "mps-control-stand-in";
/// The stand-in's own pid file, in its pipe directory.
pub(crate) const PID_FILE: &str = "control.pid";
/// How often the daemon looks for a connection (and for its socket, which gone ends it).
const ACCEPT_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs the stand-in with `args` (those after the subcommand); returns the exit status.
pub fn main(args: &[String]) -> u8 {
    let result = if args.iter().any(|a| a == "-f") {
        let protocol = match args.windows(2).find(|w| w[0] == "-p") {
            Some(w) if w[1] == "3" => 3,
            _ => 2,
        };
        serve(protocol)
    } else {
        client(args)
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

fn io(what: &str, e: std::io::Error) -> String {
    format!("{what}: {e}")
}

/// Binds `<dir>/control` (relative to the pipe directory), the directory made if missing.
fn listen(dir: &str) -> Result<UnixListener, String> {
    if !dir.is_empty() {
        std::fs::create_dir_all(dir).map_err(|e| io(&format!("create {dir}"), e))?;
    }
    let socket = socket_of(dir);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| io(&format!("listen {socket}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listen", e))?;
    Ok(listener)
}

/// The daemon: see the module docs.
fn serve(protocol: u8) -> Result<(), String> {
    let pipe = env_dir(PIPE_DIR_ENV)?;
    let log = env_dir(LOG_DIR_ENV)?;
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
        protocol,
        ..Run::default()
    });
    record.write(&log).map_err(|e| io("write the record", e))?;
    std::fs::write(PID_FILE, format!("{}\n", std::process::id()))
        .map_err(|e| io("write the pid file", e))?;
    // Bound last: the socket appearing is what tells the plugin the daemon is ready. Keyed by
    // directory relative to the pipe directory: "" is the daemon's own.
    let mut listeners: BTreeMap<String, UnixListener> = BTreeMap::new();
    listeners.insert(String::new(), listen("")?);
    loop {
        let accepted = listeners.iter().find_map(|(dir, l)| match l.accept() {
            Ok((conn, _)) => Some((dir.clone(), conn)),
            // No connection (or a failure that may well repeat, out of descriptors say):
            // look again after the poll instead of spinning on it.
            Err(_) => None,
        });
        let Some((dir, conn)) = accepted else {
            // Its directory removed (a test cluster torn down without unpreparing): no
            // plugin can reach it any more, so it ends instead of lingering.
            if !Path::new(CONTROL_SOCKET).exists() {
                return Ok(());
            }
            std::thread::sleep(ACCEPT_POLL);
            continue;
        };
        let quit = handle(&mut record, &log, &mut listeners, &dir, conn)?;
        if quit {
            for dir in listeners.keys() {
                let _ = std::fs::remove_file(socket_of(dir));
            }
            let _ = std::fs::remove_file(PID_FILE);
            return Ok(());
        }
    }
}

/// Serves one connection on the socket of `dir`; returns whether it asked the daemon to quit.
fn handle(
    record: &mut Record,
    log: &Path,
    listeners: &mut BTreeMap<String, UnixListener>,
    dir: &str,
    mut conn: UnixStream,
) -> Result<bool, String> {
    conn.set_nonblocking(false).map_err(|e| io("accept", e))?;
    let reader = BufReader::new(conn.try_clone().map_err(|e| io("accept", e))?);
    let Some(run) = record.runs.last_mut() else {
        return Ok(false);
    };
    if !dir.is_empty() {
        run.connections.push(socket_of(dir));
    }
    let mut quit = false;
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let command = line.trim().to_string();
        if command.is_empty() {
            continue;
        }
        if !dir.is_empty() {
            // A client of a server or namespace: it only asks.
            let a = model::answer_namespace(run, dir, &command);
            let _ = writeln!(conn, "{a}");
            continue;
        }
        let (answer, effects) = model::answer(run, &command);
        run.commands.push(command.clone());
        for e in effects {
            match e {
                Effect::Listen(d) => {
                    let l = listen(&d)?;
                    listeners.insert(d, l);
                }
                Effect::Unlisten(d) => {
                    listeners.remove(&d);
                    let _ = std::fs::remove_file(socket_of(&d));
                }
            }
        }
        if let Some(a) = answer {
            let _ = writeln!(conn, "{a}");
        }
        if command == "quit" || command.starts_with("quit ") {
            quit = true;
            break;
        }
    }
    record.write(log).map_err(|e| io("write the record", e))?;
    Ok(quit)
}

/// [`model::answer`] on the last run of `record`, for the unit tests.
#[cfg(test)]
pub(super) fn answer_for_tests(record: &Record, command: &str) -> Option<String> {
    let mut run = record.runs.last().cloned().unwrap_or_default();
    model::answer(&mut run, command).0
}

/// The client: its arguments (or standard input) to the daemon, its answer to standard output.
fn client(args: &[String]) -> Result<(), String> {
    let pipe = env_dir(PIPE_DIR_ENV)?;
    std::env::set_current_dir(&pipe).map_err(|e| format!("cd {}: {e}", pipe.display()))?;
    let mut conn = UnixStream::connect(CONTROL_SOCKET).map_err(|e| {
        format!(
            "cannot connect to the MPS control daemon at {}: {e}",
            pipe.join(CONTROL_SOCKET).display()
        )
    })?;
    let mut input = Vec::new();
    if args.is_empty() {
        std::io::stdin()
            .read_to_end(&mut input)
            .map_err(|e| format!("read standard input: {e}"))?;
    } else {
        input = format!("{}\n", args.join(" ")).into_bytes();
    }
    conn.write_all(&input)
        .and_then(|()| conn.shutdown(std::net::Shutdown::Write))
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .map_err(|e| format!("read the answer: {e}"))?;
    print!("{answer}");
    Ok(())
}
