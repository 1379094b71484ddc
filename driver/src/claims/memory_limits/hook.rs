//! The CDI hook of one GPU's memory limit, and its command line (pure, but for
//! [`MemoryLimits::decide`], which reads `dmem.capacity` once per GPU at start-up).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::Parser;

use super::{MEMORY_LIMIT_HOOK, MIB, MemoryLimitError, SUBCOMMAND};
use crate::claims::cdi::Hook;
use crate::gpu::memory_limits::{
    DEFAULT_CGROUP_ROOT, EnforcementSettings, MemoryEnforcement, gpu_memory_enforcement,
};
use crate::gpu::{GpuInfo, pci};

/// The OCI hook point: run in the runtime's namespaces once the container's cgroup exists,
/// before its process runs the user's program (OCI runtime spec, `config.md`, "createRuntime").
pub(crate) const HOOK_POINT: &str = "createRuntime";

/// How long the runtime lets the hook run, in seconds, before it fails the container's create
/// (`nvidia-smi` initialises the driver when no persistence daemon holds it open).
pub(crate) const HOOK_TIMEOUT_SECONDS: i64 = 60;

/// How the hook sets the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetWith {
    /// NVIDIA's `nvidia-smi memory-limits --set` (real GPUs): `program` and `library_dir` are
    /// HOST paths, since the runtime runs the hook on the host.
    NvidiaSmi {
        /// `nvidia-smi` on the host.
        program: PathBuf,
        /// The driver's library directory on the host, as `LD_LIBRARY_PATH` (a driver root
        /// other than `/`).
        library_dir: Option<PathBuf>,
    },
    /// Emulated GPUs: the hook writes `<leaf>/dmem.max` under the cgroup root, a fake tree
    /// (`--cgroup-root` of a test), as NVIDIA's call would write it on a node.
    Emulated,
}

impl SetWith {
    /// The hook's arguments that say so: `--set-with nvidia-smi=<path>` (and `--library-dir
    /// <dir>`) or `--set-with emulated`.
    fn hook_args(&self) -> Vec<String> {
        match self {
            SetWith::Emulated => vec!["--set-with".into(), "emulated".into()],
            SetWith::NvidiaSmi {
                program,
                library_dir,
            } => {
                let mut args = vec![
                    "--set-with".into(),
                    format!("nvidia-smi={}", program.display()),
                ];
                if let Some(dir) = library_dir {
                    args.extend(["--library-dir".into(), dir.display().to_string()]);
                }
                args
            }
        }
    }
}

/// The value of `--set-with`: `nvidia-smi=<absolute path>` or `emulated`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetWithValue {
    /// `nvidia-smi=<path>`.
    NvidiaSmi(PathBuf),
    /// `emulated`.
    Emulated,
}

fn parse_set_with(value: &str) -> Result<SetWithValue, String> {
    match value.split_once('=') {
        None if value == "emulated" => Ok(SetWithValue::Emulated),
        Some(("nvidia-smi", path)) if path.starts_with('/') => {
            Ok(SetWithValue::NvidiaSmi(PathBuf::from(path)))
        }
        _ => Err(format!(
            "{value:?} is not a setter: valid are nvidia-smi=<absolute path of nvidia-smi> and emulated"
        )),
    }
}

/// The hook's command line after `das-kubelet-plugin cdi-hook memory-limit`; it needs none of
/// the plugin's flags or environment.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(
    name = "das-kubelet-plugin cdi-hook memory-limit",
    about = "Sets the hard GPU memory limit of the container whose OCI state is on standard input (a CDI createRuntime hook)"
)]
pub(crate) struct HookArgs {
    /// The GPU's UUID (`GPU-…`), as `nvidia-smi -i` takes it.
    #[arg(long)]
    pub(crate) gpu: String,
    /// The GPU's PCI bus ID (`0000:01:00.0`): its dmem region `nvidia/<bus ID>/vidmem`.
    #[arg(long)]
    pub(crate) pci_bus_id: String,
    /// The hard limit in MiB (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) hard_limit_mib: u64,
    /// Where cgroup v2 is mounted (absolute; a fake tree with `--set-with emulated`).
    #[arg(long, default_value = DEFAULT_CGROUP_ROOT)]
    pub(crate) cgroup_root: PathBuf,
    /// `nvidia-smi=<absolute path>` (real GPUs) or `emulated` (the fake tree).
    #[arg(long, value_parser = parse_set_with)]
    pub(crate) set_with: SetWithValue,
    /// The NVIDIA driver's library directory, `LD_LIBRARY_PATH` of `nvidia-smi`.
    #[arg(long)]
    pub(crate) library_dir: Option<PathBuf>,
    /// Where `<pid>/cgroup` is read (tests).
    #[arg(long, default_value = "/proc", hide = true)]
    pub(crate) proc_root: PathBuf,
}

impl HookArgs {
    /// The setter of `--set-with` and `--library-dir`.
    pub(crate) fn set_with(&self) -> SetWith {
        match &self.set_with {
            SetWithValue::Emulated => SetWith::Emulated,
            SetWithValue::NvidiaSmi(program) => SetWith::NvidiaSmi {
                program: program.clone(),
                library_dir: self.library_dir.clone(),
            },
        }
    }
}

fn invalid(what: &'static str, value: impl ToString, valid: &'static str) -> MemoryLimitError {
    MemoryLimitError::Invalid {
        what,
        value: value.to_string(),
        valid,
    }
}

/// The CDI hook that caps GPU `gpu_uuid` (PCI bus ID `pci_bus_id`, any of NVML's or the
/// kernel's forms) at `hard_limit_bytes` for the container whose device carries it:
/// `createRuntime`, path `hook_path` (the installed executable, a host path), args
/// `[<hook_path>, "cdi-hook", "memory-limit", "--gpu", <UUID>, "--pci-bus-id", <bus ID in the
/// standard form>, "--hard-limit-mib", <MiB>, "--cgroup-root", <root>, "--set-with", …]`,
/// timeout [`HOOK_TIMEOUT_SECONDS`]. The limit is rounded down to whole MiB (what
/// `nvidia-smi` takes). Hooks need no newer `cdiVersion` than 0.3.0 (CDI `specs-go/version.go`
/// has no rule for them).
///
/// # Errors
/// [`MemoryLimitError::Invalid`]: a limit below 1 MiB, an empty or blank UUID, a bus ID of no
/// standard form, a relative hook path or cgroup root.
pub(crate) fn memory_limit_hook(
    hook_path: &Path,
    gpu_uuid: &str,
    pci_bus_id: &str,
    hard_limit_bytes: u64,
    cgroup_root: &Path,
    set_with: &SetWith,
) -> Result<Hook, MemoryLimitError> {
    let mib = hard_limit_bytes / MIB;
    if mib == 0 {
        return Err(invalid(
            "hard limit",
            format!("{hard_limit_bytes} bytes"),
            "at least 1 MiB (1048576 bytes); a share without memory gets no hook",
        ));
    }
    if gpu_uuid.is_empty() || gpu_uuid.contains(char::is_whitespace) {
        return Err(invalid("GPU UUID", gpu_uuid, "a GPU-… UUID without blanks"));
    }
    let bus = pci::standard_bus_id(pci_bus_id)
        .ok_or_else(|| invalid("PCI bus ID", pci_bus_id, "a bus ID such as 0000:01:00.0"))?;
    for (what, path) in [("hook path", hook_path), ("cgroup root", cgroup_root)] {
        if !path.is_absolute() {
            return Err(invalid(what, path.display(), "an absolute host path"));
        }
    }
    let path = hook_path.display().to_string();
    let mut args = vec![
        path.clone(),
        SUBCOMMAND.into(),
        MEMORY_LIMIT_HOOK.into(),
        "--gpu".into(),
        gpu_uuid.into(),
        "--pci-bus-id".into(),
        bus,
        "--hard-limit-mib".into(),
        mib.to_string(),
        "--cgroup-root".into(),
        cgroup_root.display().to_string(),
    ];
    args.extend(set_with.hook_args());
    Ok(Hook {
        hook_name: HOOK_POINT.into(),
        path,
        args,
        env: Vec::new(),
        timeout: Some(HOOK_TIMEOUT_SECONDS),
    })
}

/// What the plugin knows at start-up to give a container a GPU memory limit: the installed hook
/// ([`super::install_hook`]), the cgroup root and the setter, the `--memory-enforcement`
/// settings, and which GPUs they gave limits, decided once ([`Self::decide`]) so that what is
/// published and what each prepare writes agree and no prepare reads `dmem.capacity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimits {
    /// The hook's executable on the host (`<kubelet plugins dir>/mig.das.com/bin/das-kubelet-plugin`).
    pub hook_path: PathBuf,
    /// cgroup v2's mount on the host (`--cgroup-root`).
    pub cgroup_root: PathBuf,
    /// How the hook sets a limit.
    pub set_with: SetWith,
    /// Which GPUs get limits (`--memory-enforcement`, `--cgroup-root`, emulated or not).
    pub enforcement: EnforcementSettings,
    /// The UUIDs of the GPUs whose memory the kernel enforces ([`MemoryEnforcement::Enforced`]).
    pub enforced: BTreeSet<String>,
}

impl MemoryLimits {
    /// The limits of the GPUs of `inventory`, each GPU's level decided now
    /// ([`gpu_memory_enforcement`]).
    pub fn decide(
        hook_path: PathBuf,
        cgroup_root: PathBuf,
        set_with: SetWith,
        enforcement: EnforcementSettings,
        inventory: &[GpuInfo],
    ) -> Self {
        let enforced = inventory
            .iter()
            .filter(|g| gpu_memory_enforcement(&enforcement, g) == MemoryEnforcement::Enforced)
            .map(|g| g.uuid.clone())
            .collect();
        Self {
            hook_path,
            cgroup_root,
            set_with,
            enforcement,
            enforced,
        }
    }

    /// The level GPU `gpu` gives a memory share, as decided at start-up.
    pub fn enforcement(&self, gpu: &GpuInfo) -> MemoryEnforcement {
        if self.enforced.contains(&gpu.uuid) {
            MemoryEnforcement::Enforced
        } else {
            MemoryEnforcement::Mps
        }
    }

    /// The hook that caps `gpu` at `hard_limit_bytes` for a container ([`memory_limit_hook`]);
    /// `None` when the GPU's memory is not [`MemoryEnforcement::Enforced`] here or it has no
    /// PCI bus ID.
    ///
    /// # Errors
    /// As [`memory_limit_hook`].
    pub fn hook(
        &self,
        gpu: &GpuInfo,
        hard_limit_bytes: u64,
    ) -> Result<Option<Hook>, MemoryLimitError> {
        let Some(bus) = gpu.pci_bus_id.as_deref() else {
            return Ok(None);
        };
        if self.enforcement(gpu) != MemoryEnforcement::Enforced {
            return Ok(None);
        }
        memory_limit_hook(
            &self.hook_path,
            &gpu.uuid,
            bus,
            hard_limit_bytes,
            &self.cgroup_root,
            &self.set_with,
        )
        .map(Some)
    }
}
