//! The plugin's flags ([`Args`], parsed by clap from the command line and the environment) and
//! what they turn into: the orphan rule, the health policy and the shared profiles.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use das_driver::claims::checkpoint;
use das_driver::claims::cri::CriRuntime;
use das_driver::claims::orphans::RuntimeError;
use das_driver::claims::{OrphanPolicy, PodContainers};
use das_driver::gpu::memory_limits::{EnforcementChoice, EnforcementSettings};
use das_driver::gpu::nvml::procfs;
use das_driver::gpu::pci;
use das_driver::health::{self, HealthPolicy, TaintEffect};
use das_driver::publish::resource_slices::{SharePolicy, SharedProfiles};
use das_runtime::client::KubeArgs;
use das_runtime::logging::LogArgs;
use das_runtime::metrics_auth::MetricsAuthArgs;

/// The flags of `das-kubelet-plugin`; each also reads the environment variable named in its
/// `env`.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "DAS node plugin: MIG instances on demand through Kubernetes DRA"
)]
pub(crate) struct Args {
    /// Name of this node (the ResourceSlice pool is named after it).
    #[arg(
        long,
        env = "NODE_NAME",
        required_unless_present_any = ["print_inventory", "print_resource_slices"],
        default_value = ""
    )]
    pub(crate) node_name: String,
    /// The kubelet's plugin registration directory.
    #[arg(
        long,
        env = "KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub(crate) kubelet_registry_dir: PathBuf,
    /// The kubelet's plugins directory; the DRA socket goes in `<dir>/mig.das.com/`.
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub(crate) kubelet_plugins_dir: PathBuf,
    /// Where CDI spec files are written (the container runtime must read it).
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi")]
    pub(crate) cdi_dir: PathBuf,
    /// Put the instances' device nodes (`/dev/nvidia<N>`, `nvidiactl`, `nvidia-uvm*`, the MIG
    /// capability nodes) into CDI specs. Turn it off only for emulated GPUs on nodes without
    /// NVIDIA devices, where a container runtime refuses to start a container whose CDI device
    /// names a missing node.
    #[arg(long, env = "DAS_CDI_DEVICE_NODES", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) cdi_device_nodes: bool,
    /// Plugin state: checkpoint, and the emulated GPUs' state.
    #[arg(long, env = "DAS_STATE_DIR", default_value = "/var/lib/das")]
    pub(crate) state_dir: PathBuf,
    /// Emulate GPUs instead of using NVML, e.g. `A100-SXM4-40GB:2,H100-80GB:2`, or a mixed node
    /// `L4:1,H100-80GB:1` (models without MIG are served with --whole-gpus).
    #[arg(long, env = "DAS_EMULATED_GPUS")]
    pub(crate) emulated_gpus: Option<String>,
    /// With --emulated-gpus: make stand-in character devices for the emulated GPUs (`nvidia<N>`,
    /// `nvidiactl`, `nvidia-uvm*`, `nvidia-caps/nvidia-cap<M>`, with the driver's numbers) in
    /// this directory, and point the CDI specs' device nodes at them, so a container runtime
    /// injects device nodes as on a GPU node. Needs root (mknod).
    #[arg(long, env = "DAS_EMULATED_DEVICE_DIR", requires = "emulated_gpus")]
    pub(crate) emulated_device_dir: Option<PathBuf>,
    /// Where the NVIDIA driver's files are, as this process sees them (the chart mounts the
    /// host's driver root at `/driver-root`). The driver's compute and utility libraries and
    /// tools found there go into every claim's CDI spec, mounted at `/usr/local/nvidia/lib64`
    /// and `/usr/local/nvidia/bin` (docs/nvml.md). Unset: none, except with
    /// --emulated-device-dir, whose stand-in driver install is used.
    #[arg(long, env = "DAS_DRIVER_ROOT")]
    pub(crate) driver_root: Option<PathBuf>,
    /// The same directory as a path on the host (`/`, or `/run/nvidia/driver` with the GPU
    /// Operator's driver container): the container runtime resolves the CDI mounts there.
    /// Default: --driver-root.
    #[arg(long, env = "DAS_HOST_DRIVER_ROOT", requires = "driver_root")]
    pub(crate) host_driver_root: Option<PathBuf>,
    /// The MPS control binary the MPS devices' daemons run (docs/design.md §7, "MPS on a
    /// slice"): a program that behaves as NVIDIA's `nvidia-cuda-mps-control` (`-f` runs the
    /// daemon, no `-f` sends standard input's commands to it). Default: `nvidia-cuda-mps-control`
    /// among the driver files under --driver-root; with --emulated-gpus, this binary's stand-in
    /// daemon.
    #[arg(long, env = "DAS_MPS_CONTROL_BINARY")]
    pub(crate) mps_control_binary: Option<PathBuf>,
    /// The size of the tmpfs each MPS daemon gets as its slice's `/dev/shm` (a Kubernetes
    /// quantity, at least 1Mi), mounted on `<state dir>/mps/<id>/shm` before the daemon starts
    /// (needs CAP_SYS_ADMIN; in a container, the state dir mounted with
    /// `mountPropagation: Bidirectional`). `0`: a plain directory on the state dir's file
    /// system instead, unbounded (development without privileges only).
    #[arg(long, env = "DAS_MPS_SHM_SIZE", default_value = das_driver::mps::shm::DEFAULT_SIZE, value_parser = parse_shm_size)]
    pub(crate) mps_shm_size: das_driver::mps::Shm,
    /// How containers of an MPS claim mount their MPS pipe directory: `ro` (no container can
    /// create or remove anything there; clients still connect to the daemon's sockets) or `rw`
    /// (as NVIDIA's DRA driver mounts it: the escape hatch should an MPS client need to write
    /// there).
    #[arg(long, env = "DAS_MPS_PIPE_MOUNT", default_value = "ro", value_parser = das_driver::mps::supervisor::PipeMount::parse)]
    pub(crate) mps_pipe_mount: das_driver::mps::supervisor::PipeMount,
    /// The MPS protocol of the daemons: `2`, `3` (a named server per slice and a namespace per
    /// claim or share with its own limits, which the client cannot change; NVIDIA driver r615+)
    /// or `auto` (3 where the GPUs' driver version is 615 or newer, else 2; emulated GPUs
    /// report 580, so 2).
    #[arg(long, env = "DAS_MPS_PROTOCOL", default_value = "auto", value_parser = parse_mps_protocol)]
    pub(crate) mps_protocol: das_driver::mps::ProtocolChoice,
    /// The socket of the node's MPS host (`das-kubelet-plugin mps-host`, the chart's
    /// `das-mps-host` DaemonSet with `mps.host.enabled`; docs/design.md §7, "Who runs the
    /// daemons"), normally `<state dir>/mps/host.sock`: the MPS daemons are started there, not
    /// as this plugin's children, and so outlive an upgrade or a crash of the plugin. The
    /// plugin watches them by pid, so it must share the host's PID namespace (hostPID). Unset:
    /// the plugin starts them itself.
    #[arg(long, env = "DAS_MPS_HOST_SOCKET")]
    pub(crate) mps_host_socket: Option<PathBuf>,
    /// UID of this DaemonSet pod: makes socket names unique so two plugin pods can overlap
    /// during a rolling update.
    #[arg(long, env = "POD_UID")]
    pub(crate) pod_uid: Option<String>,
    #[command(flatten)]
    pub(crate) kube: KubeArgs,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "DAS_METRICS_ADDRESS", default_value = "0.0.0.0:9402")]
    pub(crate) metrics_address: SocketAddr,
    #[command(flatten)]
    pub(crate) metrics_auth: MetricsAuthArgs,
    #[command(flatten)]
    pub(crate) log: LogArgs,
    /// Also destroy MIG instances at start-up that DAS did not create and no claim holds.
    #[arg(long, env = "DAS_RECLAIM_FOREIGN_SLICES")]
    pub(crate) reclaim_foreign_slices: bool,
    /// Carve before bind (issue 34): publish the MIG devices with the binding condition
    /// `mig.das.com/SliceReady` (failure condition `mig.das.com/SliceFailed`), watch the claims
    /// allocated to this node and create their slices before the scheduler binds their pods,
    /// so a slice that cannot be created reschedules its pod. Needs Kubernetes 1.36 or newer
    /// (`DRADeviceBindingConditions`); on an older API server it is off and the log says why.
    #[arg(long, env = "DAS_CARVE_BEFORE_BIND")]
    pub(crate) carve_before_bind: bool,
    /// The node's container runtime (CRI) endpoint, e.g. `unix:///run/containerd/containerd.sock`
    /// or `unix:///var/run/crio/crio.sock`. The orphan rule asks it whether any sandbox or
    /// container of a pod is left before releasing the slices of a claim that the API server no
    /// longer allocates and the kubelet never unprepared. Unset: such slices are kept (with a
    /// Warning event on the Node) until the kubelet unprepares the claim.
    #[arg(long, env = "DAS_CONTAINER_RUNTIME_ENDPOINT", value_parser = parse_cri_endpoint)]
    pub(crate) container_runtime_endpoint: Option<CriRuntime>,
    /// How long a prepared claim must have been no longer allocated to this node before the
    /// orphan rule asks the container runtime about its pods, in seconds.
    #[arg(long, env = "DAS_ORPHAN_RELEASE_DELAY_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(60..))]
    pub(crate) orphan_release_delay_seconds: u64,
    /// Boot ID file: a different boot ID resets the checkpoint (MIG instances do not survive a reboot).
    #[arg(long, default_value = checkpoint::BOOT_ID_PATH)]
    pub(crate) boot_id_file: PathBuf,
    /// Print the GPUs NVML reports (MIG mode, GI profiles, placements, existing instances) and
    /// exit. Read-only: never changes MIG mode, never creates or destroys instances. With
    /// --emulated-gpus, prints the emulated inventory instead.
    #[arg(long)]
    pub(crate) print_inventory: bool,
    /// Print the ResourceSlices this node would publish (a JSON `List`, slices without
    /// `metadata.name`, as for Kubernetes 1.37: counter sets in slices of their own, and the
    /// shareable devices of --shared-profiles) and exit. Only with --emulated-gpus; read-only, no API server needed. The
    /// scheduler benchmark (`make bench-scheduler`) takes DAS's slices from it.
    #[arg(long, requires = "emulated_gpus")]
    pub(crate) print_resource_slices: bool,
    /// Let DAS switch MIG mode on for Hopper and newer GPUs that have it off (the GPU must be
    /// idle). Off by default: DAS then never changes MIG mode. Ampere GPUs are never switched
    /// (they need a GPU reset).
    #[arg(long, env = "DAS_ENABLE_MIG_MODE")]
    pub(crate) enable_mig_mode: bool,
    /// Also serve the GPUs whose MIG mode is off and the GPUs without MIG (T4, L4, …), each as
    /// one whole-GPU device `gpu-<index>` (DeviceClass `gpu.das.com`) that holds every counter
    /// of its GPU. Off by default: such GPUs are skipped (logged), since NVIDIA's device plugin
    /// may serve them. Without --mig-mode-switching a GPU keeps its mode: GPUs with MIG on serve
    /// slices only, those with it off the whole GPU only. With --emulated-gpus: the entries
    /// marked `:mig-off` and the models without MIG.
    #[arg(long, env = "DAS_WHOLE_GPUS")]
    pub(crate) whole_gpus: bool,
    /// Let MIG mode follow demand on GPUs that switch without a reset (Hopper and newer, not a
    /// vGPU guest): each is published whole and with every MIG placement, its MIG mode is
    /// switched on before its first slice is created and off before it is served whole (only
    /// while no slice and no claim holds it). A switch that fails stops DAS switching that GPU
    /// until the plugin restarts; it then serves only what its mode serves. Never switches at
    /// start-up. Needs --whole-gpus.
    #[arg(long, env = "DAS_MIG_MODE_SWITCHING", requires = "whole_gpus")]
    pub(crate) mig_mode_switching: bool,
    /// Profiles whose placements are also published as shareable devices
    /// `gpu-<i>-mig-<profile>-<start>-shared`, which several claims share through MPS
    /// (docs/design.md §7, "Shared slices"; DeviceClasses `<profile>.shared.mig.das.com`):
    /// comma-separated profile names (`1g.10gb`) or compute sizes (`1g`: every profile of one
    /// compute slice); `gpu` also shares every GPU served whole by memory (`gpu-<i>-shared`,
    /// DeviceClass `gpu.shared.mig.das.com`; docs/design.md §7, "Memory slices of a whole
    /// GPU"). Empty (the default): nothing is shared. Published only to Kubernetes
    /// 1.36.2 or newer, and only where MPS is available (see --mps-control-binary).
    #[arg(long, env = "DAS_SHARED_PROFILES", default_value = "", value_parser = parse_shared_profiles)]
    pub(crate) shared_profiles: Selectors,
    /// The `shares` capacity of every shareable device: a claim's share of its slice's compute
    /// is the shares it asks for (1 unless it names more) over this.
    #[arg(long, env = "DAS_SHARES_PER_SLICE", default_value_t = 4, value_parser = parse_shares_per_slice)]
    pub(crate) shares_per_slice: u32,
    /// Let claims of different namespaces share one slice (docs/design.md §7, "Shares are a
    /// tenant's own"). Off (the default): a shared slice serves the namespace of its first
    /// share; its shareable device carries the attribute `shareNamespace` naming it (for
    /// das-webhook's selector), and a share from another namespace is refused at prepare. On:
    /// no attribute, no refusal; the containers of every sharing namespace reach one MPS
    /// daemon, pipe directory and shm directory (docs/operations.md, "Shared slices").
    #[arg(long, env = "DAS_SHARES_ACROSS_NAMESPACES")]
    pub(crate) shares_across_namespaces: bool,
    /// How long an unhealthy GPU must answer without a fatal XID or ECC error before the taints
    /// on its devices are removed, in seconds.
    #[arg(long, env = "DAS_HEALTH_QUIET_PERIOD_SECONDS", default_value_t = 300)]
    pub(crate) health_quiet_period_seconds: u64,
    /// Taint the devices of an unhealthy GPU `NoExecute` instead of `NoSchedule`: the taint
    /// eviction controller then evicts running pods whose claims do not tolerate the taint.
    #[arg(long, env = "DAS_HEALTH_EVICT_ON_FATAL", default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) health_evict_on_fatal: bool,
    /// XIDs not to treat as fatal, besides the application errors 13, 31, 43, 45 and 68
    /// (comma-separated, e.g. `109,119`).
    #[arg(long, env = "DAS_HEALTH_IGNORED_XIDS", default_value = "", value_parser = parse_ignored_xids)]
    pub(crate) health_ignored_xids: BTreeSet<u32>,
    /// procfs root for `devices` (the `nvidia-caps` major) and the MIG capability minors.
    #[arg(long, env = "DAS_PROC_ROOT", default_value = procfs::PROC_ROOT)]
    pub(crate) proc_root: PathBuf,
    /// Where cgroup v2 is mounted, as this process sees it and as the host has it (the hook
    /// that caps a container's GPU memory runs on the host): its `dmem.capacity` says which
    /// GPUs the kernel can cap (docs/design.md §7, "Memory limits the kernel enforces"). With
    /// --emulated-gpus, a fake tree: a directory whose `dmem.capacity` lists the emulated GPUs'
    /// bus IDs (`nvidia/0000:10:00.0/vidmem <bytes>` for GPU 0) and where the hook writes each
    /// container's `dmem.max`.
    #[arg(long, env = "DAS_CGROUP_ROOT", default_value = das_driver::gpu::memory_limits::DEFAULT_CGROUP_ROOT)]
    pub(crate) cgroup_root: PathBuf,
    /// Whether a GPU's memory shares are capped by the kernel: `auto` (where the GPU's driver is
    /// r615 or newer and the cgroup root's `dmem.capacity` lists the GPU: a `createRuntime` CDI
    /// hook sets each container's hard limit) or `mps` (never: MPS client limits only).
    #[arg(long, env = "DAS_MEMORY_ENFORCEMENT", default_value = "auto", value_parser = parse_memory_enforcement)]
    pub(crate) memory_enforcement: EnforcementChoice,
    /// sysfs root the GPUs' PCIe root complexes are read from (`bus/pci/devices/<bus id>`,
    /// published as `resource.kubernetes.io/pcieRoot`); a GPU it does not place gets none. Real
    /// GPUs only.
    #[arg(long, env = "DAS_SYS_ROOT", default_value = pci::SYS_ROOT)]
    pub(crate) sys_root: PathBuf,
}

/// The selectors of `--shared-profiles`, in the order given, without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selectors(pub(crate) Vec<String>);

/// Most shares per shareable device (`--shares-per-slice`).
const MAX_SHARES_PER_SLICE: u32 = das_api::capacities::MAX_SHARES as u32;

fn parse_shared_profiles(list: &str) -> Result<Selectors, String> {
    let mut out: Vec<String> = Vec::new();
    for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let valid = s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-'));
        let whole = s == das_api::WHOLE_GPU_PROFILE;
        if !whole && (!valid || !s.as_bytes()[0].is_ascii_digit() || !s.contains('g')) {
            return Err(format!(
                "{s:?} is not a profile: valid are profile names such as 1g.10gb or 1g.10gb+me, compute sizes such as 1g (every profile of one compute slice), or gpu (memory slices of every GPU served whole)"
            ));
        }
        if !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    }
    Ok(Selectors(out))
}

fn parse_shares_per_slice(value: &str) -> Result<u32, String> {
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_SHARES_PER_SLICE).contains(&n) => Ok(n),
        _ => Err(format!(
            "{value:?} is not a number of shares per slice: valid is a whole number from 1 to {MAX_SHARES_PER_SLICE}"
        )),
    }
}

/// The profiles of the flags that get shareable devices, and how they are cut (before the
/// server's version and MPS decide whether any are published).
pub(crate) fn shared_profiles(args: &Args) -> SharedProfiles {
    SharedProfiles {
        selectors: args.shared_profiles.0.clone(),
        policy: share_policy(args),
        ..Default::default()
    }
}

/// How the flags cut shareable devices (the default memory step).
pub(crate) fn share_policy(args: &Args) -> SharePolicy {
    SharePolicy {
        shares: args.shares_per_slice,
        across_namespaces: args.shares_across_namespaces,
        ..SharePolicy::default()
    }
}

fn parse_shm_size(value: &str) -> Result<das_driver::mps::Shm, String> {
    das_driver::mps::Shm::parse(value).map_err(|e| e.to_string())
}

fn parse_mps_protocol(value: &str) -> Result<das_driver::mps::ProtocolChoice, String> {
    das_driver::mps::ProtocolChoice::parse(value).map_err(|e| e.to_string())
}

fn parse_memory_enforcement(value: &str) -> Result<EnforcementChoice, String> {
    EnforcementChoice::parse(value).map_err(|e| e.to_string())
}

/// The memory-enforcement settings of the flags: `--memory-enforcement`, `--cgroup-root`, and
/// whether the GPUs are emulated (their fake tree alone decides).
pub(crate) fn enforcement_settings(args: &Args) -> EnforcementSettings {
    EnforcementSettings {
        choice: args.memory_enforcement,
        cgroup_root: args.cgroup_root.clone(),
        emulated: args.emulated_gpus.is_some(),
    }
}

fn parse_cri_endpoint(endpoint: &str) -> Result<CriRuntime, RuntimeError> {
    CriRuntime::new(endpoint)
}

fn parse_ignored_xids(list: &str) -> Result<BTreeSet<u32>, String> {
    health::xid::parse_ignored(list)
}

/// The orphan rule of the flags.
pub(crate) fn orphan_policy(args: &Args) -> OrphanPolicy {
    let runtime = args.container_runtime_endpoint.clone();
    match &runtime {
        Some(cri) => {
            tracing::info!(socket = %cri.socket().display(), delay_s = args.orphan_release_delay_seconds,
            "orphaned claims are released once the container runtime has no container of their pods")
        }
        None => tracing::info!(
            "no container runtime endpoint: orphaned claims keep their slices until the kubelet unprepares them"
        ),
    }
    OrphanPolicy {
        delay: Duration::from_secs(args.orphan_release_delay_seconds),
        runtime: runtime.map(|r| Arc::new(r) as Arc<dyn PodContainers>),
    }
}

/// The health policy of the flags.
pub(crate) fn health_policy(args: &Args) -> HealthPolicy {
    HealthPolicy {
        quiet_period: Duration::from_secs(args.health_quiet_period_seconds),
        ignored_xids: args.health_ignored_xids.clone(),
        effect: if args.health_evict_on_fatal {
            TaintEffect::NoExecute
        } else {
            TaintEffect::NoSchedule
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["das-kubelet-plugin", "--node-name", "n0"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    }

    #[test]
    fn mig_mode_switching_needs_whole_gpus() {
        let err = parse(&["--mig-mode-switching"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--whole-gpus"), "{err}");
        let args = parse(&["--mig-mode-switching", "--whole-gpus"]).unwrap();
        assert!(args.mig_mode_switching && args.whole_gpus);
        assert!(!parse(&[]).unwrap().mig_mode_switching, "off by default");
        assert!(!parse(&[]).unwrap().carve_before_bind, "off by default");
        assert!(parse(&["--carve-before-bind"]).unwrap().carve_before_bind);
    }

    #[test]
    fn shared_profiles_and_shares_per_slice_default_to_nothing_shared_and_four() {
        let args = parse(&[]).unwrap();
        assert_eq!(shared_profiles(&args), SharedProfiles::default());
        assert_eq!(share_policy(&args), SharePolicy::default());
        let args = parse(&[
            "--shared-profiles",
            " 1g, 2g.20gb ,1g.10gb+me,1g,",
            "--shares-per-slice",
            "8",
        ])
        .unwrap();
        let shared = shared_profiles(&args);
        assert_eq!(shared.selectors, ["1g", "2g.20gb", "1g.10gb+me"]);
        assert_eq!(shared.policy.shares, 8);
        assert!(
            !shared.policy.across_namespaces,
            "one namespace per slice by default"
        );
        assert_eq!(
            shared.policy.memory_step_bytes,
            SharePolicy::default().memory_step_bytes
        );
        assert_eq!(
            parse(&["--shares-per-slice", "64"])
                .unwrap()
                .shares_per_slice,
            64
        );
    }

    #[test]
    fn shares_across_namespaces_is_an_opt_in() {
        let args = parse(&["--shares-across-namespaces"]).unwrap();
        assert!(share_policy(&args).across_namespaces);
        assert!(shared_profiles(&args).policy.across_namespaces);
    }

    #[test]
    fn mps_flags_default_to_an_8gi_tmpfs_a_read_only_pipe_and_the_drivers_protocol() {
        use das_driver::mps::supervisor::PipeMount;
        use das_driver::mps::{Protocol, ProtocolChoice, Shm};
        let args = parse(&[]).unwrap();
        assert_eq!(
            args.mps_shm_size,
            Shm::Tmpfs {
                size_bytes: 8 << 30
            }
        );
        assert_eq!(args.mps_pipe_mount, PipeMount::ReadOnly);
        assert_eq!(args.mps_protocol, ProtocolChoice::Auto);
        assert_eq!(
            args.mps_host_socket, None,
            "the plugin starts its daemons itself"
        );
        let args = parse(&[
            "--mps-shm-size=0",
            "--mps-pipe-mount=rw",
            "--mps-protocol=3",
            "--mps-host-socket=/var/lib/das/mps/host.sock",
        ])
        .unwrap();
        assert_eq!(
            args.mps_host_socket.as_deref(),
            Some(std::path::Path::new("/var/lib/das/mps/host.sock"))
        );
        assert_eq!(args.mps_shm_size, Shm::Directory);
        assert_eq!(args.mps_pipe_mount, PipeMount::ReadWrite);
        assert_eq!(args.mps_protocol, ProtocolChoice::Fixed(Protocol::V3));
        for (flag, bad, says) in [
            ("--mps-shm-size", "lots", "such as 8Gi"),
            ("--mps-shm-size", "100Ki", "less than 1Mi"),
            ("--mps-pipe-mount", "readonly", "valid: ro"),
            ("--mps-protocol", "4", "valid: auto"),
        ] {
            let err = parse(&[&format!("{flag}={bad}")]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn memory_enforcement_detects_by_default_under_sys_fs_cgroup_and_mps_turns_it_off() {
        let args = parse(&[]).unwrap();
        assert_eq!(
            enforcement_settings(&args),
            EnforcementSettings {
                choice: EnforcementChoice::Auto,
                cgroup_root: PathBuf::from("/sys/fs/cgroup"),
                emulated: false,
            }
        );
        let args = parse(&[
            "--memory-enforcement=mps",
            "--cgroup-root=/tmp/fake-cgroup",
            "--emulated-gpus=H100-80GB:1",
        ])
        .unwrap();
        let settings = enforcement_settings(&args);
        assert_eq!(settings.choice, EnforcementChoice::Mps);
        assert_eq!(settings.cgroup_root, PathBuf::from("/tmp/fake-cgroup"));
        assert!(settings.emulated);
        let err = parse(&["--memory-enforcement=dmem"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(err.to_string().contains("valid are auto"), "{err}");
    }

    #[test]
    fn bad_shared_profiles_and_shares_per_slice_say_what_is_valid() {
        for bad in ["0", "65", "-1", "four", ""] {
            let err = parse(&[&format!("--shares-per-slice={bad}")]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            assert!(err.to_string().contains("from 1 to 64"), "{err}");
        }
        for bad in ["mig-1g.10gb", "1g 10gb", "all", "1g.10gb;2g"] {
            let err = parse(&[&format!("--shared-profiles={bad}")]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            assert!(err.to_string().contains("such as 1g.10gb"), "{err}");
        }
    }
}
