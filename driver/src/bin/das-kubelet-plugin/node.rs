//! What the plugin reads and opens on the node: the check before taking over ([`check_node`]:
//! the GPUs, the driver's files, the node set-up, the boot ID), the GPU backends (NVML or
//! emulated), the CDI specs' device nodes and driver mounts, and the checkpoint.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use das_driver::claims::cdi::{DeviceNodes, Mount};
use das_driver::claims::checkpoint::{self, Checkpoint, LoadOutcome};
use das_driver::claims::driver_files::{self, DriverFiles, DriverRoot};
use das_driver::gpu::emulated::EMULATED_DRIVER_VERSION;
use das_driver::gpu::emulated::device_nodes;
use das_driver::gpu::emulated::driver_files::create_stand_in_driver;
use das_driver::gpu::nvml::procfs;
use das_driver::gpu::{
    EmulatedBackend, GpuBackend, GpuInfo, NvmlBackend, NvmlOptions, RealNvml, TimeSlicer,
};
use das_driver::mps::supervisor::MpsSettings;
use das_driver::mps::{ControlBinary, Protocol, Shm, shm};
use das_driver::node_checks::{self, HostView, NodeChecks};

use crate::args::{Args, enforcement_settings};
use das_api::DRIVER_NAME;
use das_driver::claims::memory_limits::{MemoryLimits, SetWith, install_hook, installed_hook_path};
use das_driver::gpu::memory_limits::EnforcementChoice;

/// `nvidia-caps` major reported for emulated GPUs (a real node reads `/proc/devices`).
pub(crate) const EMULATED_CAPS_MAJOR: u32 = 509;

/// What this instance reads from the node before it asks the active instance to hand over:
/// whatever can fail without touching the node's shared state (the state dir, the MIG
/// instances). A bad image or a broken driver fails here, while the active instance still serves.
pub(crate) struct NodeCheck {
    pub(crate) gpus: Gpus,
    /// The GPUs: NVML's inventory, or the emulated spec's GPUs (read again from the emulated
    /// backend once it is open).
    pub(crate) inventory: Vec<GpuInfo>,
    /// CDI mounts of the driver's files under --driver-root; `None` without it (the emulated
    /// stand-in install, if any, is made after taking over).
    pub(crate) driver_mounts: Option<Vec<Mount>>,
    /// NVIDIA's MPS control binary among the driver's files under --driver-root, with the
    /// driver's library directory (as this process sees both), if the driver has it.
    pub(crate) mps_control: Option<(PathBuf, Option<PathBuf>)>,
    /// NVIDIA's `nvidia-smi` among the driver's files, with the driver's library directory, if
    /// the driver has it (it sets time slices).
    pub(crate) nvidia_smi: Option<(PathBuf, Option<PathBuf>)>,
    /// The same `nvidia-smi` and library directory as host paths: what the hook that caps a
    /// container's GPU memory runs (the container runtime runs it on the host).
    pub(crate) nvidia_smi_host: Option<(PathBuf, Option<PathBuf>)>,
    /// What the checks of the node set-up found (real GPUs only; reported after taking over,
    /// when the API client exists).
    pub(crate) setup: Option<NodeChecks>,
    pub(crate) boot_id: String,
}

/// The GPU backend as far as it is opened before taking over.
pub(crate) enum Gpus {
    /// NVML, initialised and its GPUs read, with the `nvidia-caps` major.
    Nvml {
        backend: Arc<dyn GpuBackend>,
        caps_major: u32,
    },
    /// Emulated GPUs with a valid spec. Their state lives in the state dir, which belongs to the
    /// active instance, so the backend is opened after taking over.
    Emulated,
}

/// [`NodeCheck`]: blocks (NVML calls); run it on the blocking pool.
pub(crate) fn check_node(args: &Args) -> Result<NodeCheck> {
    let (gpus, inventory) = match &args.emulated_gpus {
        Some(spec) => {
            // Read-only: the emulated GPUs' state is not opened.
            (
                Gpus::Emulated,
                emulated_inventory(args, spec, &args.node_name)?,
            )
        }
        None => {
            let (backend, caps_major) = open_nvml(args)?;
            let inventory = backend.inventory().context("read the GPUs through NVML")?;
            (
                Gpus::Nvml {
                    backend,
                    caps_major,
                },
                inventory,
            )
        }
    };
    let files = match &args.driver_root {
        Some(path) => {
            let root = DriverRoot {
                path: path.clone(),
                host_path: args
                    .host_driver_root
                    .clone()
                    .unwrap_or_else(|| path.clone()),
            };
            Some(find_driver_files(&root, &inventory)?)
        }
        None => None,
    };
    let mps_control = files.as_ref().and_then(|f| {
        f.tool(driver_files::MPS_CONTROL)
            .map(|bin| (bin, f.library_dir()))
    });
    let nvidia_smi = files.as_ref().and_then(|f| {
        f.tool(driver_files::NVIDIA_SMI)
            .map(|bin| (bin, f.library_dir()))
    });
    let nvidia_smi_host = files.as_ref().and_then(|f| {
        f.host_tool(driver_files::NVIDIA_SMI)
            .map(|bin| (bin, f.host_library_dir()))
    });
    let driver_mounts = files.map(|f| f.mounts());
    // The toolkit's config and the unified-memory nodes: problems are reported, never fatal.
    let setup = match &gpus {
        Gpus::Nvml { .. } => Some(node_checks::run(&HostView::new(
            args.driver_root.as_deref(),
            args.host_driver_root.as_deref(),
            args.cdi_device_nodes,
        ))),
        Gpus::Emulated => None,
    };
    let boot_id = checkpoint::read_boot_id_from(&args.boot_id_file)?;
    Ok(NodeCheck {
        gpus,
        inventory,
        driver_mounts,
        mps_control,
        nvidia_smi,
        nvidia_smi_host,
        setup,
        boot_id,
    })
}

/// The NVML backend and the `nvidia-caps` major (NVML loads `libnvidia-ml.so.1` only here, so
/// emulated mode runs without the NVIDIA driver).
fn open_nvml(args: &Args) -> Result<(Arc<dyn GpuBackend>, u32)> {
    let api = init_nvml()?;
    let options = NvmlOptions {
        proc_root: args.proc_root.clone(),
        enable_mig_mode: args.enable_mig_mode,
        mig_mode_switching: args.mig_mode_switching,
    };
    let b = NvmlBackend::with_whole_gpus(api, options, args.whole_gpus)
        .context("read the GPUs through NVML")?
        .with_sys_root(&args.sys_root);
    // A node of GPUs without MIG only (T4, L4) names no capability node: no major is fine.
    let mig = b
        .inventory()
        .context("read the GPUs through NVML")?
        .iter()
        .any(|g| g.model.mig);
    let major = procfs::caps_major_if_needed(&args.proc_root, mig)
        .context("read the nvidia-caps major")?
        .unwrap_or_else(|| {
            tracing::info!(
                "no nvidia-caps character device; none is needed: no GPU of this node has MIG"
            );
            0
        });
    Ok((Arc::new(b), major))
}

/// The emulated backend over its state in the state dir (only once this instance is active).
pub(crate) fn open_emulated(args: &Args, spec: &str) -> Result<(Arc<dyn GpuBackend>, u32)> {
    let (b, reset) =
        EmulatedBackend::open_or_reset(spec, &args.node_name, &args.state_dir.join("emulated"))
            .with_context(|| format!("emulated GPUs {spec:?}"))?;
    if let Some((aside, why)) = reset {
        tracing::error!(moved_to = %aside.display(), reason = %why,
            "the emulated GPUs' state cannot be used: moved aside, the GPUs start empty");
    }
    Ok((
        Arc::new(
            b.with_whole_gpus(args.whole_gpus)
                .with_mig_mode_switching(args.mig_mode_switching),
        ),
        EMULATED_CAPS_MAJOR,
    ))
}

/// The emulated GPUs of `spec` the backend serves, without opening its state: those with MIG
/// mode off or without MIG only with --whole-gpus (logged and skipped otherwise, as on real
/// GPUs).
pub(crate) fn emulated_inventory(args: &Args, spec: &str, node: &str) -> Result<Vec<GpuInfo>> {
    let all = das_driver::gpu::emulated::emulated_inventory(spec, node)
        .with_context(|| format!("emulated GPUs {spec:?}"))?;
    Ok(all
        .into_iter()
        .filter(|g| {
            let served = g.served(args.whole_gpus);
            if !served && g.model.mig {
                tracing::warn!(gpu = g.index, model = %g.model.name,
                    "MIG mode is off (mig-off); pass --whole-gpus to serve it as a whole GPU; skipped");
            } else if !served {
                tracing::warn!(gpu = g.index, model = %g.model.name,
                    "the GPU has no MIG: DAS serves it whole only with --whole-gpus (chart wholeGpus.enabled=true); skipped");
            }
            served
        })
        .collect())
}

pub(crate) fn init_nvml() -> Result<RealNvml> {
    RealNvml::init().context(
        "initialise NVML (libnvidia-ml.so.1): run on a node with the NVIDIA driver and make the driver libraries visible in the container (docs/nvml.md), or use --emulated-gpus",
    )
}

/// The driver's files under `root` ([`driver_files`]); read-only.
fn find_driver_files(root: &DriverRoot, inventory: &[GpuInfo]) -> Result<DriverFiles> {
    let version = inventory.first().map(|g| g.driver_version.clone());
    let files = driver_files::discover(root, version.as_deref())
        .context("find the NVIDIA driver's files for the containers")?;
    tracing::info!(root = %root.path.display(), host_root = %root.host_path.display(),
        version = %files.version, files = files.files.len(),
        "driver files for the containers found: every claim's CDI spec mounts them");
    Ok(files)
}

/// Without --driver-root: the CDI mounts of the emulated GPUs' stand-in driver install next to
/// their stand-in device nodes (`<--emulated-device-dir>/driver`, made here), else none.
pub(crate) fn stand_in_driver_mounts(args: &Args, inventory: &[GpuInfo]) -> Result<Vec<Mount>> {
    let (None, Some(dir), true) = (
        &args.driver_root,
        &args.emulated_device_dir,
        args.cdi_device_nodes,
    ) else {
        return Ok(Vec::new());
    };
    let path = dir.join("driver");
    let version = inventory
        .first()
        .map_or(EMULATED_DRIVER_VERSION, |g| g.driver_version.as_str());
    create_stand_in_driver(&path, version)
        .with_context(|| format!("stand-in driver install in {}", path.display()))?;
    Ok(find_driver_files(
        &DriverRoot {
            host_path: path.clone(),
            path,
        },
        inventory,
    )?
    .mounts())
}

/// How the node's MPS daemons run (docs/design.md §7, "MPS on a slice"): the protocol of
/// --mps-protocol for the GPUs' driver version (`inventory`'s first), the shm of
/// --mps-shm-size, the pipe mount of --mps-pipe-mount. With a tmpfs, warns when the state dir's
/// mount does not propagate mounts (a plugin in a container without
/// `mountPropagation: Bidirectional` would mount each tmpfs where no container sees it).
pub(crate) fn mps_settings(args: &Args, inventory: &[GpuInfo]) -> MpsSettings {
    let driver = inventory.first().map(|g| g.driver_version.as_str());
    let settings = MpsSettings {
        protocol: args.mps_protocol.resolve(driver),
        shm: args.mps_shm_size,
        pipe_mount: args.mps_pipe_mount,
    };
    tracing::info!(protocol = ?settings.protocol, driver = ?driver, shm_bytes = ?settings.shm.size_bytes(),
        pipe_mount = ?settings.pipe_mount, "MPS settings");
    match settings.shm {
        Shm::Directory => tracing::warn!(
            "--mps-shm-size=0: MPS shm directories are plain directories on the state dir's file system, unbounded: a client can fill the node's disk through its /dev/shm"
        ),
        Shm::Tmpfs { .. } => {
            if shm::state_dir_propagates(&args.state_dir) == Some(false) {
                tracing::warn!(state_dir = %args.state_dir.display(),
                    "the state dir's mount does not propagate mounts (no shared: peer group): if this plugin runs in a container, mount the state dir with mountPropagation: Bidirectional (the chart does), or the MPS tmpfs it mounts will not be what the containers see");
            }
        }
    }
    settings
}

/// The MPS control binary (docs/design.md §7, "MPS on a slice"): --mps-control-binary; else
/// the emulated GPUs' stand-in (this binary's hidden subcommand); else NVIDIA's
/// `nvidia-cuda-mps-control` among the driver files; else none (MPS devices are refused with
/// the reason).
///
/// # Errors
/// This binary's path is unknown (the stand-in), or `--state-dir` is too long for the daemons'
/// control sockets with `protocol` ([`das_driver::mps::layout::check_socket_path`]).
pub(crate) fn mps_control_binary(
    args: &Args,
    found: Option<(PathBuf, Option<PathBuf>)>,
    protocol: Protocol,
) -> Result<Option<ControlBinary>> {
    let emulated = args.emulated_gpus.is_some();
    let binary = match (&args.mps_control_binary, emulated, found) {
        (Some(path), _, found) => {
            let lib = found.and_then(|(_, lib)| lib);
            let mut b = ControlBinary::nvidia(path.clone(), lib.as_deref());
            // Emulated GPUs have no MPS server to share memory with.
            b.shm_over_dev_shm = !emulated;
            Some(b)
        }
        (None, true, _) => Some(ControlBinary::stand_in(
            std::env::current_exe().context("find this binary for the stand-in MPS daemon")?,
        )),
        (None, false, Some((bin, lib))) => Some(ControlBinary::nvidia(bin, lib.as_deref())),
        (None, false, None) => None,
    };
    match &binary {
        Some(b) => {
            // Fails now, not at the first MPS prepare: the daemon could never bind its socket.
            das_driver::mps::layout::check_socket_path(&args.state_dir, protocol)?;
            tracing::info!(program = %b.program.display(), "MPS devices are served with this MPS control binary")
        }
        None => tracing::warn!("{}", das_driver::mps::supervisor::NO_BINARY),
    }
    Ok(binary)
}

/// Who sets time-sliced whole GPUs' time slices (docs/design.md §7, "Time-slicing"): the
/// emulated GPUs' backend; else NVIDIA's `nvidia-smi` among the driver files (`found`); else
/// none (time-sliced devices are refused with the reason).
pub(crate) fn time_slicer(
    args: &Args,
    backend: &Arc<dyn GpuBackend>,
    found: Option<(PathBuf, Option<PathBuf>)>,
) -> TimeSlicer {
    let slicer = match (args.emulated_gpus.is_some(), found) {
        (true, _) => TimeSlicer::Backend(backend.clone()),
        (false, Some((program, library_dir))) => TimeSlicer::NvidiaSmi {
            program,
            library_dir,
        },
        (false, None) => TimeSlicer::Unavailable,
    };
    match &slicer {
        TimeSlicer::Unavailable => {
            tracing::warn!("{}", das_driver::gpu::time_slice::NO_NVIDIA_SMI)
        }
        s => tracing::info!(slicer = ?s, "time-sliced whole GPUs are set with this"),
    }
    slicer
}

/// How containers get GPU memory limits the kernel enforces (docs/design.md §7, "Memory limits
/// the kernel enforces"): installs the hook's executable, a copy of this binary, at
/// `<--kubelet-plugins-dir>/mig.das.com/bin/das-kubelet-plugin` (a host path: the chart mounts
/// the plugin's directory at the same path) and logs each GPU's level. `None`, logged, where no
/// GPU can get one: `--memory-enforcement=mps`, real GPUs without `nvidia-smi` among the driver
/// files (`nvidia_smi_host`, host paths), or an install that failed.
pub(crate) fn memory_limits(
    args: &Args,
    nvidia_smi_host: Option<(PathBuf, Option<PathBuf>)>,
    inventory: &[GpuInfo],
) -> Option<MemoryLimits> {
    let enforcement = enforcement_settings(args);
    let set_with = match (&enforcement.choice, enforcement.emulated, nvidia_smi_host) {
        (EnforcementChoice::Mps, _, _) => {
            tracing::info!("--memory-enforcement=mps: GPU memory shares are held by MPS only");
            return None;
        }
        (_, true, _) => SetWith::Emulated,
        (_, false, Some((program, library_dir))) => SetWith::NvidiaSmi {
            program,
            library_dir,
        },
        (_, false, None) => {
            tracing::warn!(
                "no nvidia-smi among the driver's files (--driver-root): GPU memory shares are held by MPS only"
            );
            return None;
        }
    };
    let hook_path = installed_hook_path(&args.kubelet_plugins_dir.join(DRIVER_NAME));
    let installed = std::env::current_exe().and_then(|exe| install_hook(&exe, &hook_path));
    match installed {
        Ok(wrote) => tracing::info!(path = %hook_path.display(), updated = wrote,
            "the GPU memory-limit hook is installed there (CDI createRuntime hook)"),
        Err(e) => {
            tracing::error!(path = %hook_path.display(), error = %e,
                "the GPU memory-limit hook could not be installed: GPU memory shares are held by MPS only");
            return None;
        }
    }
    let limits = MemoryLimits::decide(
        hook_path,
        args.cgroup_root.clone(),
        set_with,
        enforcement,
        inventory,
    );
    for g in inventory {
        tracing::info!(gpu = g.index, bus = ?g.pci_bus_id, driver = %g.driver_version,
            memory_enforcement = limits.enforcement(g).as_str(), "GPU memory limits");
    }
    Some(limits)
}

/// Where the CDI specs' device nodes are on the host; with --emulated-device-dir the stand-ins
/// are made here, before any spec names them.
pub(crate) fn device_nodes(
    args: &Args,
    inventory: &[GpuInfo],
    caps_major: u32,
) -> Result<DeviceNodes> {
    if !args.cdi_device_nodes {
        return Ok(DeviceNodes::Omitted);
    }
    let Some(dir) = &args.emulated_device_dir else {
        return Ok(DeviceNodes::Host);
    };
    let minors: Vec<u32> = inventory.iter().map(|g| g.minor).collect();
    let nodes = device_nodes::stand_in_nodes(&minors, caps_major);
    device_nodes::create_stand_in_nodes(dir, &nodes)
        .with_context(|| format!("--emulated-device-dir {}", dir.display()))?;
    tracing::info!(dir = %dir.display(), nodes = nodes.len(), "stand-in device nodes of the emulated GPUs ready");
    Ok(DeviceNodes::StandIn(dir.clone()))
}

/// Loads the checkpoint; returns it and whether it must be rebuilt from the backend and the API.
pub(crate) fn load_checkpoint(path: &std::path::Path, boot_id: &str) -> Result<(Checkpoint, bool)> {
    Ok(match Checkpoint::load(path, boot_id)? {
        LoadOutcome::Loaded(cp) => (cp, false),
        LoadOutcome::Upgraded { checkpoint, from } => {
            tracing::info!(
                from,
                to = checkpoint::CHECKPOINT_VERSION,
                "checkpoint upgraded"
            );
            (checkpoint, false)
        }
        LoadOutcome::Fresh => (Checkpoint::new(boot_id), true),
        LoadOutcome::NewBoot { previous } => {
            tracing::info!(previous = %previous.boot_id, current = boot_id, "new boot: the checkpoint of the previous boot is discarded");
            (Checkpoint::new(boot_id), false)
        }
        LoadOutcome::Corrupt { moved_to, reason } => {
            tracing::error!(moved_to = %moved_to.display(), %reason, "corrupt checkpoint moved aside; rebuilding from the GPUs and the API server");
            (Checkpoint::new(boot_id), true)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use das_driver::gpu::memory_limits::{DMEM_CAPACITY_FILE, MemoryEnforcement};

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["das-kubelet-plugin", "--node-name", "n0"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn the_memory_limit_hook_is_installed_in_the_plugins_dir_and_each_gpu_detected() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        let cgroup = dir.path().join("cgroup");
        std::fs::create_dir_all(&cgroup).unwrap();
        std::fs::write(
            cgroup.join(DMEM_CAPACITY_FILE),
            "nvidia/0000:10:00.0/vidmem 85899345920\n",
        )
        .unwrap();
        let flags = [
            format!("--kubelet-plugins-dir={}", plugins.display()),
            format!("--cgroup-root={}", cgroup.display()),
            "--emulated-gpus=H100-80GB:2".to_string(),
            "--whole-gpus".to_string(),
        ];
        let a = args(&flags.iter().map(String::as_str).collect::<Vec<_>>());
        let inventory = emulated_inventory(&a, "H100-80GB:2", "n0").unwrap();
        let limits = memory_limits(&a, None, &inventory).expect("emulated GPUs get limits");
        let installed = plugins.join("mig.das.com/bin/das-kubelet-plugin");
        assert_eq!(limits.hook_path, installed);
        assert_eq!(
            std::fs::read(&installed).unwrap(),
            std::fs::read(std::env::current_exe().unwrap()).unwrap(),
            "a copy of the running binary"
        );
        assert_eq!(limits.set_with, SetWith::Emulated);
        assert_eq!(limits.cgroup_root, cgroup);
        let levels: Vec<_> = inventory.iter().map(|g| limits.enforcement(g)).collect();
        assert_eq!(
            levels,
            [MemoryEnforcement::Enforced, MemoryEnforcement::Mps],
            "GPU 0 (0000:10:00.0) is listed, GPU 1 is not"
        );
        // --memory-enforcement=mps: nothing installed, no limits.
        let other = dir.path().join("other");
        let a = args(&[
            &format!("--kubelet-plugins-dir={}", other.display()),
            "--memory-enforcement=mps",
            "--emulated-gpus=H100-80GB:1",
        ]);
        assert_eq!(memory_limits(&a, None, &[]), None);
        assert!(!other.exists());
        // Real GPUs: nvidia-smi's host paths, or no limits without it.
        let a = args(&[&format!("--kubelet-plugins-dir={}", other.display())]);
        assert_eq!(memory_limits(&a, None, &[]), None);
        let smi = Some(("/usr/bin/nvidia-smi".into(), Some("/usr/lib64".into())));
        let real = memory_limits(&a, smi, &[]).expect("nvidia-smi found");
        assert_eq!(
            real.set_with,
            SetWith::NvidiaSmi {
                program: "/usr/bin/nvidia-smi".into(),
                library_dir: Some("/usr/lib64".into())
            }
        );
    }
}
