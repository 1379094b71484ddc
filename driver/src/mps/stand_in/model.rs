//! What the stand-in daemon knows and answers (pure): its [`Record`] (one [`Run`] per start:
//! its device, the commands it got, with protocol 3 its servers and namespaces and the clients
//! that connected) and the answer to each command, as NVIDIA's daemon gives it where DAS relies
//! on it, and stricter where NVIDIA's daemon is silent, so tests see a command that would set
//! nothing. [`super`] does the sockets and files.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::super::commands::LIMIT_DEVICE;
use super::super::layout::CONTROL_SOCKET;

/// What the stand-in records, in its log directory.
pub const RECORD_FILE: &str = "stand-in.json";

/// Everything the stand-in daemons of one MIG instance did: one run per start.
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
    /// Its `CUDA_VISIBLE_DEVICES`: the MIG instance's MIG UUID, the one device it sees.
    pub visible_devices: String,
    /// Its `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe_directory: String,
    /// The protocol it was started with (`-p 3`: 3; else 2).
    #[serde(default = "two")]
    pub protocol: u8,
    /// The commands it got, in order.
    pub commands: Vec<String>,
    /// Protocol 3: its servers by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<String, Server>,
    /// The control sockets clients connected to, relative to the pipe directory (`control`,
    /// `slice/c0123…/control`), one entry per connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<String>,
}

fn two() -> u8 {
    2
}

/// A protocol-3 server of the stand-in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    /// Its `--allowed-devices`.
    pub allowed_devices: String,
    /// Whether it runs: a server allowed a device the daemon does not see is created, then
    /// exits (and is no longer listed), as NVIDIA's does.
    pub running: bool,
    /// Its limits (`server set`: the `default` namespace's).
    pub limits: Limits,
    /// Its namespaces by name, with their limits.
    pub namespaces: BTreeMap<String, Limits>,
}

/// Limits as the commands gave them (`--active-thread-percentage`, `--pinned-memory-limit`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// `--active-thread-percentage`, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<String>,
    /// `--pinned-memory-limit`, as given (`2048M`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_memory_limit: Option<String>,
}

impl Record {
    /// The record in log directory `log_dir`, if there is one.
    pub fn read(log_dir: &Path) -> Option<Record> {
        let text = std::fs::read_to_string(log_dir.join(RECORD_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes the record into `log_dir` (atomically: a test may read it any time).
    pub(super) fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        let tmp = log_dir.join(format!("{RECORD_FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(tmp, log_dir.join(RECORD_FILE))
    }
}

/// What the daemon must do besides answering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Listen on `<dir>/control` (a directory relative to the pipe directory), made if missing.
    Listen(String),
    /// Stop listening on `<dir>/control` and remove the socket (the directory stays).
    Unlisten(String),
}

/// The protocol-2 commands the stand-in knows; any other is answered `Unknown command "…"`, as
/// NVIDIA's daemon answers one.
const KNOWN_V2: [&str; 4] = [
    "set_default_active_thread_percentage",
    "set_default_device_pinned_mem_limit",
    "get_default_active_thread_percentage",
    "get_default_device_pinned_mem_limit",
];

fn unknown(command: &str) -> Option<String> {
    Some(format!("Unknown command \"{command}\""))
}

/// The answer to `command` on the daemon's own control socket, and what to do: protocol 2's
/// commands on a protocol-2 run ([`answer_v2`]), protocol 3's on a protocol-3 run
/// ([`answer_v3`]), `quit` on both; the other protocol's commands are unknown.
pub fn answer(run: &mut Run, command: &str) -> (Option<String>, Vec<Effect>) {
    let name = command.split_whitespace().next().unwrap_or_default();
    if name == "quit" {
        return (None, Vec::new());
    }
    match run.protocol {
        3 if matches!(name, "server" | "namespace") => answer_v3(run, command),
        3 => (unknown(command), Vec::new()),
        _ if KNOWN_V2.contains(&name) => (answer_v2(run, command), Vec::new()),
        _ => (unknown(command), Vec::new()),
    }
}

/// A protocol-2 answer, as NVIDIA's daemon gives it: the percentage set (as `30.0`) for
/// `set_default_active_thread_percentage` and `get_default_active_thread_percentage` (100 when
/// none was set), the limit set (as given, `2048M`; `0` when none) for
/// `get_default_device_pinned_mem_limit 0`, nothing for the others. The pinned memory commands
/// name the device by ordinal, and the stand-in serves one device, `0` (as DAS's daemons do,
/// see [`LIMIT_DEVICE`]): it refuses any other (`Invalid device "…"`), stricter than NVIDIA's
/// daemon, which takes a device it does not serve silently.
fn answer_v2(run: &Run, command: &str) -> Option<String> {
    let mut words = command.split_whitespace();
    let name = words.next().unwrap_or_default();
    if name.ends_with("_device_pinned_mem_limit") {
        let device = words.next().unwrap_or_default();
        if device != LIMIT_DEVICE {
            return Some(format!("Invalid device \"{device}\""));
        }
    }
    if let Some(p) = command.strip_prefix("set_default_active_thread_percentage ") {
        return Some(format!("{p}.0"));
    }
    let last_set = |prefix: &str| -> Option<String> {
        run.commands
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

/// Whether `name` is a valid server or namespace name (NVIDIA's MPS v3 interface: lowercase
/// letters, digits and `_`, at most 64 characters).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A protocol-3 command split into its words and its `--key=value` flags.
struct V3<'a> {
    words: Vec<&'a str>,
    flags: BTreeMap<&'a str, &'a str>,
}

fn split_v3(command: &str) -> V3<'_> {
    let mut words = Vec::new();
    let mut flags = BTreeMap::new();
    for w in command.split_whitespace() {
        match w.strip_prefix("--").and_then(|f| f.split_once('=')) {
            Some((k, v)) => {
                flags.insert(k, v);
            }
            None => words.push(w),
        }
    }
    V3 { words, flags }
}

/// Limits from a command's flags; an error for a percentage outside 1..=100 or a memory size
/// that is not `<N>M` or `<N>G`.
fn limits_of(flags: &BTreeMap<&str, &str>) -> Result<Limits, String> {
    let percentage = flags.get("active-thread-percentage").map(|p| p.to_string());
    if let Some(p) = &percentage
        && !p.parse::<u8>().is_ok_and(|n| (1..=100).contains(&n))
    {
        return Err(format!("Error: invalid active thread percentage {p}"));
    }
    let memory = flags.get("pinned-memory-limit").map(|m| m.to_string());
    if let Some(m) = &memory {
        let digits = m.trim_end_matches(['M', 'G']);
        if digits.len() + 1 != m.len() || digits.parse::<u64>().is_err() {
            return Err(format!("Error: invalid pinned memory limit {m}"));
        }
    }
    Ok(Limits {
        active_thread_percentage: percentage,
        pinned_memory_limit: memory,
    })
}

/// An answer to a command and what to do: the text (none for a command that answers nothing)
/// and the sockets to open or close.
type Answer = (Option<String>, Vec<Effect>);

/// A command that fails: answers `e`, changes nothing.
fn failed(e: String) -> Answer {
    (Some(e), Vec::new())
}

/// A protocol-3 answer (NVIDIA's MPS v3 interface): `server create|set|list|delete`,
/// `namespace create|set|list|delete` (`--server=<name>`). A list names one server or namespace
/// per line; a command that fails answers `Error: …`; the others answer nothing. A server
/// allowed a device other than the one the daemon sees runs not (silently, as NVIDIA's).
fn answer_v3(run: &mut Run, command: &str) -> Answer {
    let c = split_v3(command);
    let name = c.words.get(2).copied().unwrap_or_default();
    match (c.words.first().copied(), c.words.get(1).copied()) {
        (Some("server"), Some(verb)) => server_command(run, verb, name, &c.flags)
            .unwrap_or_else(|| (unknown(command), Vec::new())),
        (Some("namespace"), Some(verb)) => namespace_command(run, verb, name, &c.flags)
            .unwrap_or_else(|| (unknown(command), Vec::new())),
        _ => (unknown(command), Vec::new()),
    }
}

/// `server <verb> <name>` with `flags`; `None` for a verb the daemon does not know.
fn server_command(
    run: &mut Run,
    verb: &str,
    name: &str,
    flags: &BTreeMap<&str, &str>,
) -> Option<Answer> {
    let answer = match verb {
        "list" => {
            let names: Vec<&str> = run
                .servers
                .iter()
                .filter(|(_, s)| s.running)
                .map(|(n, _)| n.as_str())
                .collect();
            (Some(names.join("\n")), Vec::new())
        }
        "create" => create_server(run, name, flags),
        "set" | "delete" => {
            let Some(server) = run.servers.get_mut(name).filter(|s| s.running) else {
                return Some(failed(format!("Error: no server {name}")));
            };
            if verb == "delete" {
                let gone: Vec<Effect> = std::iter::once(name.to_string())
                    .chain(server.namespaces.keys().map(|n| format!("{name}/{n}")))
                    .map(Effect::Unlisten)
                    .collect();
                run.servers.remove(name);
                return Some((None, gone));
            }
            match limits_of(flags) {
                Ok(l) => {
                    server.limits = l;
                    (None, Vec::new())
                }
                Err(e) => failed(e),
            }
        }
        _ => return None,
    };
    Some(answer)
}

/// `server create <name>`: a server allowed a device other than the one the daemon sees is
/// created, and runs not.
fn create_server(run: &mut Run, name: &str, flags: &BTreeMap<&str, &str>) -> Answer {
    if !valid_name(name) {
        return failed(format!("Error: invalid server name \"{name}\""));
    }
    if run.servers.contains_key(name) {
        return failed(format!("Error: server {name} already exists"));
    }
    let allowed = flags.get("allowed-devices").copied().unwrap_or_default();
    let running = allowed.is_empty() || allowed == run.visible_devices;
    run.servers.insert(
        name.to_string(),
        Server {
            allowed_devices: allowed.to_string(),
            running,
            ..Server::default()
        },
    );
    let effects = if running {
        vec![Effect::Listen(name.to_string())]
    } else {
        Vec::new()
    };
    (None, effects)
}

/// `namespace <verb> <name> --server=<server>` with `flags`; `None` for a verb the daemon does
/// not know (of a server that runs: a missing server fails first).
fn namespace_command(
    run: &mut Run,
    verb: &str,
    name: &str,
    flags: &BTreeMap<&str, &str>,
) -> Option<Answer> {
    let server_name = flags.get("server").copied().unwrap_or_default();
    let Some(server) = run.servers.get_mut(server_name).filter(|s| s.running) else {
        return Some(failed(format!("Error: no server {server_name}")));
    };
    let dir = format!("{server_name}/{name}");
    let answer = match verb {
        "list" => {
            let names: Vec<&str> = server.namespaces.keys().map(String::as_str).collect();
            (Some(names.join("\n")), Vec::new())
        }
        "create" if !valid_name(name) => {
            failed(format!("Error: invalid namespace name \"{name}\""))
        }
        "create" if server.namespaces.contains_key(name) => {
            failed(format!("Error: namespace {name} already exists"))
        }
        "create" => {
            server
                .namespaces
                .insert(name.to_string(), Limits::default());
            (None, vec![Effect::Listen(dir)])
        }
        "set" => match (server.namespaces.get_mut(name), limits_of(flags)) {
            (None, _) => failed(format!("Error: no namespace {name}")),
            (_, Err(e)) => failed(e),
            (Some(ns), Ok(l)) => {
                *ns = l;
                (None, Vec::new())
            }
        },
        "delete" => match server.namespaces.remove(name) {
            Some(_) => (None, vec![Effect::Unlisten(dir)]),
            None => failed(format!("Error: no namespace {name}")),
        },
        _ => return None,
    };
    Some(answer)
}

/// The answer to `command` from a client connected to the control socket of `socket`
/// (`<server>/<namespace>`, relative to the pipe directory): the namespace's active thread
/// percentage for `get_default_active_thread_percentage` (what its clients get; 100 without
/// one), `Unknown command "…"` for anything else.
pub(crate) fn answer_namespace(run: &Run, socket: &str, command: &str) -> String {
    if command.trim() != "get_default_active_thread_percentage" {
        return format!("Unknown command \"{command}\"");
    }
    let (server, ns) = socket.split_once('/').unwrap_or((socket, "default"));
    let limits = run.servers.get(server).and_then(|s| match ns {
        "default" => Some(&s.limits),
        ns => s.namespaces.get(ns),
    });
    let percentage = limits
        .and_then(|l| l.active_thread_percentage.as_deref())
        .unwrap_or("100");
    format!("{percentage}.0")
}

/// The control socket of `dir` (relative to the pipe directory; `""`: the daemon's own).
pub(crate) fn socket_of(dir: &str) -> String {
    if dir.is_empty() {
        CONTROL_SOCKET.to_string()
    } else {
        format!("{dir}/{CONTROL_SOCKET}")
    }
}
