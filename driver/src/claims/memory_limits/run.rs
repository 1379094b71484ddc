//! The hook itself: `das-kubelet-plugin cdi-hook memory-limit …`, run by the container runtime
//! as a `createRuntime` hook. It reads the OCI state on standard input, finds the container's
//! leaf cgroup from `/proc/<pid>/cgroup` and sets the GPU's hard limit there. Any failure goes
//! to standard error with a non-zero exit: the runtime then fails the container's create, so no
//! container starts without its limit.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde::Deserialize;

use super::hook::{HookArgs, SetWith};
use super::{MEMORY_LIMIT_HOOK, MIB, MemoryLimitError, SUBCOMMAND};
use crate::gpu::pci;

/// The file of a cgroup's hard device-memory limits, one `<region> <bytes>|max` line per region.
pub(crate) const DMEM_MAX_FILE: &str = "dmem.max";

/// The fields of the OCI state (OCI runtime spec, `runtime.md`, "State") the hook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OciState {
    /// The container's process, which exists at `createRuntime`.
    #[serde(default)]
    pid: Option<i64>,
}

/// The container's pid from the OCI state JSON in `input` (other fields are not read).
///
/// # Errors
/// [`MemoryLimitError::State`]: not JSON, or no positive `pid`.
pub(crate) fn read_state(input: impl Read) -> Result<u32, MemoryLimitError> {
    let state: OciState =
        serde_json::from_reader(input).map_err(|e| MemoryLimitError::State(e.to_string()))?;
    match state.pid.map(u32::try_from) {
        Some(Ok(pid)) if pid > 0 => Ok(pid),
        Some(_) => Err(MemoryLimitError::State(format!(
            "pid {:?} is not a process ID",
            state.pid
        ))),
        None => Err(MemoryLimitError::State(
            "no pid: the hook runs as createRuntime, once the container's process exists".into(),
        )),
    }
}

/// The cgroup v2 path in the text of `/proc/<pid>/cgroup` (pure): the path of its `0::<path>`
/// line (cgroup(7), "/proc/[pid]/cgroup"), absolute, without `..`.
///
/// # Errors
/// The problem, for [`MemoryLimitError::NotV2`]: no `0::` line (cgroup v1 only), a line not
/// of the form `<id>:<controllers>:<path>`, or a path that is not absolute or has `..`.
pub(crate) fn cgroup_v2_path(proc_cgroup: &str) -> Result<&str, String> {
    let mut v2 = None;
    for line in proc_cgroup.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "malformed line {line:?}: expected <id>:<controllers>:<path>"
            ));
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        }
    }
    let path = v2.ok_or("no 0::<path> line, only cgroup v1 hierarchies")?;
    if path.trim_end_matches('/').is_empty() {
        // A container's runtime makes it a cgroup of its own; a limit on the root would cap
        // the whole node, and a process in the root means cgroup v2 is not in use (hybrid).
        return Err(
            "the process is in the root cgroup (0::/), not a container's own cgroup".into(),
        );
    }
    let relative = Path::new(path);
    if !relative.is_absolute() || relative.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "malformed cgroup v2 path {path:?}: expected an absolute path without .."
        ));
    }
    Ok(path)
}

/// The leaf cgroup directory: `cgroup_root` + the cgroup v2 path (`/` is the root itself).
pub(crate) fn leaf_dir(cgroup_root: &Path, cgroup_path: &str) -> PathBuf {
    cgroup_root.join(cgroup_path.trim_start_matches('/'))
}

/// The leaf cgroup of process `pid`: reads `<proc_root>/<pid>/cgroup`.
///
/// # Errors
/// [`MemoryLimitError::ProcCgroup`] (unreadable) or [`MemoryLimitError::NotV2`].
pub(crate) fn container_leaf(
    proc_root: &Path,
    pid: u32,
    cgroup_root: &Path,
) -> Result<PathBuf, MemoryLimitError> {
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let text = std::fs::read_to_string(&path).map_err(|source| MemoryLimitError::ProcCgroup {
        pid,
        path: path.clone(),
        source,
    })?;
    let cgroup = cgroup_v2_path(&text).map_err(|problem| MemoryLimitError::NotV2 {
        path: path.clone(),
        problem,
    })?;
    Ok(leaf_dir(cgroup_root, cgroup))
}

/// `nvidia-smi`'s arguments that set GPU `gpu_uuid`'s hard limit in cgroup `leaf` to `mib` MiB,
/// soft limit 0 (NVIDIA's MPS v3 memory partitioning page; `memory-limits` comes first).
pub(crate) fn nvidia_smi_args(leaf: &Path, gpu_uuid: &str, mib: u64) -> Vec<String> {
    vec![
        "memory-limits".into(),
        "--set".into(),
        "-n".into(),
        leaf.display().to_string(),
        "--soft-limit".into(),
        "0".into(),
        "--hard-limit".into(),
        mib.to_string(),
        "-i".into(),
        gpu_uuid.into(),
    ]
}

/// Runs `program` (`nvidia-smi`) with [`nvidia_smi_args`], `LD_LIBRARY_PATH=library_dir`.
///
/// # Errors
/// [`MemoryLimitError::Spawn`], or [`MemoryLimitError::NvidiaSmi`] with its output.
fn set_with_nvidia_smi(
    program: &Path,
    library_dir: Option<&Path>,
    leaf: &Path,
    gpu_uuid: &str,
    mib: u64,
) -> Result<(), MemoryLimitError> {
    let mut cmd = Command::new(program);
    cmd.args(nvidia_smi_args(leaf, gpu_uuid, mib));
    if let Some(dir) = library_dir {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    let out = cmd.output().map_err(|source| MemoryLimitError::Spawn {
        program: program.to_path_buf(),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    let text = format!(
        "{} {}",
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Err(MemoryLimitError::NvidiaSmi {
        status: out
            .status
            .code()
            .map_or_else(|| "a signal".to_string(), |c| format!("status {c}")),
        output: text.trim().chars().take(500).collect(),
    })
}

/// `dmem.max`'s text with GPU `bus`'s line set to `bytes` (pure): its `nvidia/<bus>/vidmem`
/// line replaced (bus IDs compared in the standard form), every other line kept, the line
/// added at the end when there was none.
pub(crate) fn with_dmem_limit(existing: &str, bus: &str, bytes: u64) -> String {
    let region = format!("nvidia/{bus}/vidmem");
    let same_gpu = |line: &str| {
        line.split_whitespace()
            .next()
            .and_then(|r| r.strip_prefix("nvidia/"))
            .and_then(|r| r.strip_suffix("/vidmem"))
            .and_then(pci::standard_bus_id)
            .is_some_and(|b| b == bus)
    };
    let mut out = String::new();
    let mut replaced = false;
    for line in existing.lines().filter(|l| !l.trim().is_empty()) {
        if same_gpu(line) {
            if !replaced {
                out.push_str(&format!("{region} {bytes}\n"));
            }
            replaced = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(&format!("{region} {bytes}\n"));
    }
    out
}

/// The emulated setter: writes `<leaf>/dmem.max` with [`with_dmem_limit`] (making the leaf's
/// directories), as NVIDIA's call would on a node (docs/reference/mps.md, "Memory limits the
/// kernel enforces (dmem)").
///
/// # Errors
/// [`MemoryLimitError::Write`] naming the directory or file.
pub(crate) fn set_emulated(leaf: &Path, bus: &str, bytes: u64) -> Result<(), MemoryLimitError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MemoryLimitError::Write { path, source }
    };
    std::fs::create_dir_all(leaf).map_err(write_err(leaf))?;
    let file = leaf.join(DMEM_MAX_FILE);
    let existing = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(write_err(&file)(e)),
    };
    std::fs::write(&file, with_dmem_limit(&existing, bus, bytes)).map_err(write_err(&file))
}

/// Sets the limit `args` asks for on the container whose OCI state is `state`; returns the leaf
/// cgroup it was set on.
///
/// # Errors
/// Any step's [`MemoryLimitError`].
pub(crate) fn run(args: &HookArgs, state: impl Read) -> Result<PathBuf, MemoryLimitError> {
    let bus = pci::standard_bus_id(&args.pci_bus_id).ok_or_else(|| MemoryLimitError::Invalid {
        what: "PCI bus ID",
        value: args.pci_bus_id.clone(),
        valid: "a bus ID such as 0000:01:00.0",
    })?;
    let pid = read_state(state)?;
    let leaf = container_leaf(&args.proc_root, pid, &args.cgroup_root)?;
    match args.set_with() {
        SetWith::NvidiaSmi {
            program,
            library_dir,
        } => set_with_nvidia_smi(
            &program,
            library_dir.as_deref(),
            &leaf,
            &args.gpu,
            args.hard_limit_mib,
        )?,
        SetWith::Emulated => set_emulated(&leaf, &bus, args.hard_limit_mib * MIB)?,
    }
    Ok(leaf)
}

/// The `cdi-hook` subcommand with `args` (those after `cdi-hook`), the OCI state on standard
/// input; returns the exit status: 0 once the limit is set, 1 when it could not be (the reason
/// on standard error), 2 for a bad command line (clap's message).
pub fn main(args: &[String]) -> u8 {
    let name = format!("{SUBCOMMAND} {MEMORY_LIMIT_HOOK}");
    if args.first().map(String::as_str) != Some(MEMORY_LIMIT_HOOK) {
        eprintln!(
            "das-kubelet-plugin {SUBCOMMAND}: unknown hook {:?}: valid is {MEMORY_LIMIT_HOOK}",
            args.first().map_or("", String::as_str)
        );
        return 2;
    }
    let argv =
        std::iter::once(format!("das-kubelet-plugin {name}")).chain(args[1..].iter().cloned());
    let hook = match HookArgs::try_parse_from(argv) {
        Ok(hook) => hook,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match run(&hook, std::io::stdin().lock()) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!(
                "das-kubelet-plugin {name}: GPU {} ({} MiB): {e}",
                hook.gpu, hook.hard_limit_mib
            );
            1
        }
    }
}
