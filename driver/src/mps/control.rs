//! The control commands of a running daemon, each a client-mode run of the control binary
//! with the daemon's pipe directory in its environment (protocol 2: the command on its standard
//! input; protocol 3: the command as its arguments): sending one and reading the daemon's answer,
//! setting a daemon's limits, and with protocol 3 its server and namespaces (docs/design.md §7,
//! "MPS on a slice"). The commands themselves are [`super::commands`]' (pure).

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::commands::{self, Namespace, Protocol, QUIT, SERVER};
use super::daemon::{COMMAND_TIMEOUT, ControlBinary, DaemonSpec, MpsError, log_tail};
use super::layout::{CONTROL_SOCKET, MpsDirs};

/// Sends `command` to the daemon through the binary's client mode (protocol 2: the command on
/// its standard input, the daemon's pipe directory in its environment); returns what the daemon
/// answered.
///
/// # Errors
/// The client could not run, failed, took longer than [`COMMAND_TIMEOUT`], or the daemon's
/// answer refuses the command ([`refused`]).
pub async fn send(bin: &ControlBinary, dirs: &MpsDirs, command: &str) -> Result<String, MpsError> {
    run_client(bin, dirs, &[], Some(command)).await
}

/// Sends a protocol-3 command to the daemon: the control binary's arguments
/// (`server create slice --allowed-devices=…`), as NVIDIA's MPS v3 interface writes them;
/// returns what the daemon answered.
///
/// # Errors
/// As [`send`].
pub(crate) async fn send_args(
    bin: &ControlBinary,
    dirs: &MpsDirs,
    args: &[String],
) -> Result<String, MpsError> {
    run_client(bin, dirs, args, None).await
}

/// One client-mode run of the control binary with `args`, and `line` on its standard input.
async fn run_client(
    bin: &ControlBinary,
    dirs: &MpsDirs,
    args: &[String],
    line: Option<&str>,
) -> Result<String, MpsError> {
    let command = line.map_or_else(|| args.join(" "), str::to_string);
    let failed = |why: String| MpsError(format!("MPS control command {command:?}: {why}"));
    let mut child = bin
        .command(&commands::client_env(dirs))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(format!("run {}: {e}", bin.program.display())))?;
    if let Some(mut stdin) = child.stdin.take()
        && let Some(line) = line
    {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| failed(format!("write: {e}")))?;
    }
    let out = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| failed(format!("no answer within {} s", COMMAND_TIMEOUT.as_secs())))?
        .map_err(|e| failed(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(failed(format!("{} {err} {text}", out.status)));
    }
    if refused(&text) {
        return Err(failed(format!("the daemon answered {text:?}")));
    }
    Ok(text)
}

/// Whether the daemon's answer refuses the command. NVIDIA's client exits 0 even then (seen on
/// an H200: `Unknown command "…"`, status 0), so the answer is what tells.
pub fn refused(answer: &str) -> bool {
    let a = answer.to_ascii_lowercase();
    [
        "unknown command",
        "error",
        "invalid",
        "failed",
        "not supported",
    ]
    .iter()
    .any(|w| a.contains(w))
}

/// Sets the daemon's limits ([`commands::limit_commands`]), one command at a time.
///
/// # Errors
/// The first command that failed.
pub(crate) async fn apply_limits(bin: &ControlBinary, spec: &DaemonSpec) -> Result<(), MpsError> {
    for c in commands::limit_commands(&spec.limits) {
        send(bin, &spec.dirs, &c).await?;
    }
    Ok(())
}

/// Configures a daemon that runs: protocol 2, its limits ([`apply_limits`]); protocol 3, the
/// MIG instance's server (created unless listed, and checked listed right after, with the slice-wide
/// limits), each of `namespaces` with its limits ([`add_namespace`]), then checks the server is
/// still listed: a server whose
/// `--allowed-devices` names a device the daemon does not see is created, then exits, and its
/// clients would run without MPS and without limits (NVIDIA's Dynamo guide, "Verified
/// Behavior"). Idempotent: what exists is kept and its limits set again.
///
/// # Errors
/// A command failed, a namespace's directory is missing, or the server is not listed.
pub(crate) async fn configure(
    bin: &ControlBinary,
    spec: &DaemonSpec,
    namespaces: &[Namespace],
) -> Result<(), MpsError> {
    if spec.protocol == Protocol::V2 {
        return apply_limits(bin, spec).await;
    }
    let servers = send_args(bin, &spec.dirs, &commands::v3_server_list()).await?;
    if !commands::listed(&servers, SERVER) {
        send_args(
            bin,
            &spec.dirs,
            &commands::v3_server_create(&spec.device_uuid),
        )
        .await?;
        // Before anything else is asked of it: a server that exits at once fails here with
        // what it means, not with whatever the next command answers.
        check_server(bin, spec).await?;
    }
    if let Some(c) = commands::v3_server_set(&spec.limits) {
        send_args(bin, &spec.dirs, &c).await?;
    }
    let known = send_args(bin, &spec.dirs, &commands::v3_namespace_list()).await?;
    for ns in namespaces {
        add_namespace(bin, &spec.dirs, ns, commands::listed(&known, &ns.name)).await?;
    }
    check_server(bin, spec).await
}

/// Protocol 3: creates namespace `ns` on the MIG instance's server unless it `exists`, sets its
/// limits, and checks that its control socket is where the containers of the namespace mount
/// their pipe directory from ([`MpsDirs::namespace_dir`]).
///
/// # Errors
/// A command failed, or the namespace's control socket is missing.
pub(crate) async fn add_namespace(
    bin: &ControlBinary,
    dirs: &MpsDirs,
    ns: &Namespace,
    exists: bool,
) -> Result<(), MpsError> {
    if !exists {
        send_args(bin, dirs, &commands::v3_namespace_create(&ns.name)).await?;
    }
    if let Some(c) = commands::v3_namespace_set(ns) {
        send_args(bin, dirs, &c).await?;
    }
    let socket = dirs.namespace_dir(&ns.name).join(CONTROL_SOCKET);
    if !socket.exists() {
        return Err(MpsError(format!(
            "MPS namespace {}: the daemon made no control socket {} (the directory its containers mount)",
            ns.name,
            socket.display()
        )));
    }
    Ok(())
}

/// Protocol 3: [`add_namespace`] on a running daemon, after asking it whether it has the
/// namespace already.
///
/// # Errors
/// As [`add_namespace`], or the list failed.
pub(crate) async fn ensure_namespace(
    bin: &ControlBinary,
    dirs: &MpsDirs,
    ns: &Namespace,
) -> Result<(), MpsError> {
    let known = send_args(bin, dirs, &commands::v3_namespace_list()).await?;
    add_namespace(bin, dirs, ns, commands::listed(&known, &ns.name)).await
}

/// Protocol 3: deletes namespace `name` from the MIG instance's server (a share that left; its
/// containers have stopped).
///
/// # Errors
/// The command failed.
pub(crate) async fn delete_namespace(
    bin: &ControlBinary,
    dirs: &MpsDirs,
    name: &str,
) -> Result<(), MpsError> {
    send_args(bin, dirs, &commands::v3_namespace_delete(name))
        .await
        .map(|_| ())
}

/// Protocol 3: the MIG instance's server is listed by `server list`.
///
/// # Errors
/// It is not (or the list failed).
pub(crate) async fn check_server(bin: &ControlBinary, spec: &DaemonSpec) -> Result<(), MpsError> {
    let servers = send_args(bin, &spec.dirs, &commands::v3_server_list()).await?;
    if commands::listed(&servers, SERVER) {
        return Ok(());
    }
    Err(MpsError(format!(
        "the MPS server {SERVER:?} of device {} is not running after it was created (server list: {:?}); a server whose --allowed-devices names a device its daemon does not see exits, and its clients would run without MPS and without limits{}",
        spec.device_uuid,
        servers.trim(),
        log_tail(&spec.dirs)
    )))
}

/// Asks the daemon to quit ([`QUIT`]); a daemon that does not answer is for the caller to kill.
pub async fn quit(bin: &ControlBinary, dirs: &MpsDirs) -> Result<(), MpsError> {
    send(bin, dirs, QUIT).await.map(|_| ())
}
