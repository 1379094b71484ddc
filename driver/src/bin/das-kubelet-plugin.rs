//! `das-kubelet-plugin`: the DAS node plugin. Publishes this node's MIG placements as
//! ResourceSlices, registers with the kubelet as DRA driver `mig.das.com`, and carves and destroys
//! MIG instances on NodePrepareResources / NodeUnprepareResources.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use das_api::DRIVER_NAME;
use das_driver::blocking::BlockingCalls;
use das_driver::claims::cdi::{DeviceNodes, Mount};
use das_driver::claims::checkpoint::CheckpointStore;
use das_driver::claims::checkpoint::{self, Checkpoint, LoadOutcome};
use das_driver::claims::cri::CriRuntime;
use das_driver::claims::driver_files::{self, DriverRoot};
use das_driver::claims::{
    ClaimHandler, HealthSource, KubeClaimApi, OrphanPolicy, PodContainers, Preparer, PreparerConfig,
};
use das_driver::gpu::emulated::EMULATED_DRIVER_VERSION;
use das_driver::gpu::emulated::device_nodes;
use das_driver::gpu::emulated::driver_files::create_stand_in_driver;
use das_driver::gpu::nvml::{self, procfs};
use das_driver::gpu::{EmulatedBackend, GpuBackend, GpuInfo, NvmlBackend, NvmlOptions, RealNvml};
use das_driver::health::monitor::Publishing;
use das_driver::health::{self, HealthBook, HealthMonitor, HealthPolicy, TaintEffect};
use das_driver::metrics::Metrics;
use das_driver::node_checks::{self, HostView, NodeChecks};
use das_driver::plugin::handover::{self, Background, Ended, Gate, Gated, Limits};
use das_driver::plugin::server::{self, SocketPaths};
use das_driver::publish::resource_slices::{self, ResourceSliceLayout};
use das_driver::publish::{Publisher, RunConfig};
use das_runtime::client::{self, Clients, KubeArgs, Timeouts};
use das_runtime::logging::LogArgs;
use das_runtime::metrics_auth::MetricsAuthArgs;
use das_runtime::probes;
use das_runtime::process::{self, Shutdown};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// `nvidia-caps` major reported for emulated GPUs (a real node reads `/proc/devices`).
const EMULATED_CAPS_MAJOR: u32 = 509;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "DAS node plugin: MIG instances on demand through Kubernetes DRA"
)]
struct Args {
    /// Name of this node (the ResourceSlice pool is named after it).
    #[arg(
        long,
        env = "NODE_NAME",
        required_unless_present_any = ["print_inventory", "print_resource_slices"],
        default_value = ""
    )]
    node_name: String,
    /// The kubelet's plugin registration directory.
    #[arg(
        long,
        env = "KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    kubelet_registry_dir: PathBuf,
    /// The kubelet's plugins directory; the DRA socket goes in `<dir>/mig.das.com/`.
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    kubelet_plugins_dir: PathBuf,
    /// Where CDI spec files are written (the container runtime must read it).
    #[arg(long, env = "CDI_DIR", default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Put the instances' device nodes (`/dev/nvidia<N>`, `nvidiactl`, `nvidia-uvm*`, the MIG
    /// capability nodes) into CDI specs. Turn it off only for emulated GPUs on nodes without
    /// NVIDIA devices, where a container runtime refuses to start a container whose CDI device
    /// names a missing node.
    #[arg(long, env = "DAS_CDI_DEVICE_NODES", default_value_t = true, action = clap::ArgAction::Set)]
    cdi_device_nodes: bool,
    /// Plugin state: checkpoint, and the emulated GPUs' state.
    #[arg(long, env = "DAS_STATE_DIR", default_value = "/var/lib/das")]
    state_dir: PathBuf,
    /// Emulate GPUs instead of using NVML, e.g. `A100-SXM4-40GB:2,H100-80GB:2`.
    #[arg(long, env = "DAS_EMULATED_GPUS")]
    emulated_gpus: Option<String>,
    /// With --emulated-gpus: make stand-in character devices for the emulated GPUs (`nvidia<N>`,
    /// `nvidiactl`, `nvidia-uvm*`, `nvidia-caps/nvidia-cap<M>`, with the driver's numbers) in
    /// this directory, and point the CDI specs' device nodes at them, so a container runtime
    /// injects device nodes as on a GPU node. Needs root (mknod).
    #[arg(long, env = "DAS_EMULATED_DEVICE_DIR", requires = "emulated_gpus")]
    emulated_device_dir: Option<PathBuf>,
    /// Where the NVIDIA driver's files are, as this process sees them (the chart mounts the
    /// host's driver root at `/driver-root`). The driver's compute and utility libraries and
    /// tools found there go into every claim's CDI spec, mounted at `/usr/local/nvidia/lib64`
    /// and `/usr/local/nvidia/bin` (docs/nvml.md). Unset: none, except with
    /// --emulated-device-dir, whose stand-in driver install is used.
    #[arg(long, env = "DAS_DRIVER_ROOT")]
    driver_root: Option<PathBuf>,
    /// The same directory as a path on the host (`/`, or `/run/nvidia/driver` with the GPU
    /// Operator's driver container): the container runtime resolves the CDI mounts there.
    /// Default: --driver-root.
    #[arg(long, env = "DAS_HOST_DRIVER_ROOT", requires = "driver_root")]
    host_driver_root: Option<PathBuf>,
    /// UID of this DaemonSet pod: makes socket names unique so two plugin pods can overlap
    /// during a rolling update.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    #[command(flatten)]
    kube: KubeArgs,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "DAS_METRICS_ADDRESS", default_value = "0.0.0.0:9402")]
    metrics_address: SocketAddr,
    #[command(flatten)]
    metrics_auth: MetricsAuthArgs,
    #[command(flatten)]
    log: LogArgs,
    /// Also destroy MIG instances at start-up that DAS did not create and no claim holds.
    #[arg(long, env = "DAS_RECLAIM_FOREIGN_SLICES")]
    reclaim_foreign_slices: bool,
    /// The node's container runtime (CRI) endpoint, e.g. `unix:///run/containerd/containerd.sock`
    /// or `unix:///var/run/crio/crio.sock`. The orphan rule asks it whether any sandbox or
    /// container of a pod is left before releasing the slices of a claim that the API server no
    /// longer allocates and the kubelet never unprepared. Unset: such slices are kept (with a
    /// Warning event on the Node) until the kubelet unprepares the claim.
    #[arg(long, env = "DAS_CONTAINER_RUNTIME_ENDPOINT", value_parser = parse_cri_endpoint)]
    container_runtime_endpoint: Option<CriRuntime>,
    /// How long a prepared claim must have been no longer allocated to this node before the
    /// orphan rule asks the container runtime about its pods, in seconds.
    #[arg(long, env = "DAS_ORPHAN_RELEASE_DELAY_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(60..))]
    orphan_release_delay_seconds: u64,
    /// Boot ID file: a different boot ID resets the checkpoint (MIG instances do not survive a reboot).
    #[arg(long, default_value = checkpoint::BOOT_ID_PATH)]
    boot_id_file: PathBuf,
    /// Print the GPUs NVML reports (MIG mode, GI profiles, placements, existing instances) and
    /// exit. Read-only: never changes MIG mode, never creates or destroys instances. With
    /// --emulated-gpus, prints the emulated inventory instead.
    #[arg(long)]
    print_inventory: bool,
    /// Print the ResourceSlices this node would publish (a JSON `List`, slices without
    /// `metadata.name`, in the layout of Kubernetes 1.35 and later: counter sets in slices of
    /// their own) and exit. Only with --emulated-gpus; read-only, no API server needed. The
    /// scheduler benchmark (`make bench-scheduler`) takes DAS's slices from it.
    #[arg(long, requires = "emulated_gpus")]
    print_resource_slices: bool,
    /// Let DAS switch MIG mode on for Hopper and newer GPUs that have it off (the GPU must be
    /// idle). Off by default: DAS then never changes MIG mode. Ampere GPUs are never switched
    /// (they need a GPU reset).
    #[arg(long, env = "DAS_ENABLE_MIG_MODE")]
    enable_mig_mode: bool,
    /// How long an unhealthy GPU must answer without a fatal XID or ECC error before the taints
    /// on its devices are removed, in seconds.
    #[arg(long, env = "DAS_HEALTH_QUIET_PERIOD_SECONDS", default_value_t = 300)]
    health_quiet_period_seconds: u64,
    /// Taint the devices of an unhealthy GPU `NoExecute` instead of `NoSchedule`: the taint
    /// eviction controller then evicts running pods whose claims do not tolerate the taint.
    #[arg(long, env = "DAS_HEALTH_EVICT_ON_FATAL", default_value_t = false, action = clap::ArgAction::Set)]
    health_evict_on_fatal: bool,
    /// XIDs not to treat as fatal, besides the application errors 13, 31, 43, 45 and 68
    /// (comma-separated, e.g. `109,119`).
    #[arg(long, env = "DAS_HEALTH_IGNORED_XIDS", default_value = "", value_parser = parse_ignored_xids)]
    health_ignored_xids: BTreeSet<u32>,
    /// procfs root for `devices` (the `nvidia-caps` major) and the MIG capability minors.
    #[arg(long, env = "DAS_PROC_ROOT", default_value = procfs::PROC_ROOT)]
    proc_root: PathBuf,
}

fn parse_cri_endpoint(endpoint: &str) -> Result<CriRuntime, String> {
    CriRuntime::new(endpoint)
}

fn parse_ignored_xids(list: &str) -> Result<BTreeSet<u32>, String> {
    health::xid::parse_ignored(list)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(code) = process::start("das-kubelet-plugin", &args.log) {
        return code;
    }
    if args.print_inventory {
        return process::exit_status(print_inventory(&args).map(|()| ExitCode::SUCCESS));
    }
    if args.print_resource_slices {
        return process::exit_status(print_resource_slices(&args).map(|()| ExitCode::SUCCESS));
    }
    limit_malloc_arenas();
    // Few threads: backend calls are per GPU and short; each idle thread costs memory.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(run(args));
    // Dropping the runtime would wait for every blocking call, one on a wedged GPU forever (in
    // a task that was aborted, or a start-up check cut short by SIGTERM).
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_LIMIT);
    process::exit_status(result.map(|()| ExitCode::SUCCESS))
}

/// How long the process waits, once `run` has returned, for blocking calls still running.
const RUNTIME_SHUTDOWN_LIMIT: Duration = Duration::from_secs(1);

/// glibc gives each thread that allocates its own malloc arena (up to 8 per core), which a
/// small, mostly idle daemon pays for in resident memory; two arenas are plenty here.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// The orphan rule of the flags.
fn orphan_policy(args: &Args) -> OrphanPolicy {
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
fn health_policy(args: &Args) -> HealthPolicy {
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

/// What this instance reads from the node before it asks the active instance to hand over:
/// whatever can fail without touching the node's shared state (the state dir, the MIG
/// instances). A bad image or a broken driver fails here, while the active instance still serves.
struct NodeCheck {
    gpus: Gpus,
    /// The GPUs: NVML's inventory, or the emulated spec's GPUs (read again from the emulated
    /// backend once it is open).
    inventory: Vec<GpuInfo>,
    /// CDI mounts of the driver's files under --driver-root; `None` without it (the emulated
    /// stand-in install, if any, is made after taking over).
    driver_mounts: Option<Vec<Mount>>,
    /// What the checks of the node set-up found (real GPUs only; reported after taking over,
    /// when the API client exists).
    setup: Option<NodeChecks>,
    boot_id: String,
}

/// The GPU backend as far as it is opened before taking over.
enum Gpus {
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
fn check_node(args: &Args) -> Result<NodeCheck> {
    let (gpus, inventory) = match &args.emulated_gpus {
        Some(spec) => {
            // Read-only: the emulated GPUs' state is not opened.
            let inventory = das_driver::gpu::emulated::emulated_inventory(spec, &args.node_name)
                .with_context(|| format!("emulated GPUs {spec:?}"))?;
            (Gpus::Emulated, inventory)
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
    let driver_mounts = match &args.driver_root {
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
    };
    let b = NvmlBackend::new(api, options).context("read the GPUs through NVML")?;
    let major = procfs::read_caps_major(&args.proc_root).context("read the nvidia-caps major")?;
    Ok((Arc::new(b), major))
}

/// The emulated backend over its state in the state dir (only once this instance is active).
fn open_emulated(args: &Args, spec: &str) -> Result<(Arc<dyn GpuBackend>, u32)> {
    let (b, reset) =
        EmulatedBackend::open_or_reset(spec, &args.node_name, &args.state_dir.join("emulated"))
            .with_context(|| format!("emulated GPUs {spec:?}"))?;
    if let Some((aside, why)) = reset {
        tracing::error!(moved_to = %aside.display(), reason = %why,
            "the emulated GPUs' state cannot be used: moved aside, the GPUs start empty");
    }
    Ok((Arc::new(b), EMULATED_CAPS_MAJOR))
}

fn init_nvml() -> Result<RealNvml> {
    RealNvml::init().context(
        "initialise NVML (libnvidia-ml.so.1): run on a node with the NVIDIA driver and make the driver libraries visible in the container (docs/nvml.md), or use --emulated-gpus",
    )
}

/// The CDI mounts of the driver's files under `root` ([`driver_files`]); read-only.
fn find_driver_files(root: &DriverRoot, inventory: &[GpuInfo]) -> Result<Vec<Mount>> {
    let version = inventory.first().map(|g| g.driver_version.clone());
    let files = driver_files::discover(root, version.as_deref())
        .context("find the NVIDIA driver's files for the containers")?;
    tracing::info!(root = %root.path.display(), host_root = %root.host_path.display(),
        version = %files.version, files = files.files.len(),
        "driver files for the containers found: every claim's CDI spec mounts them");
    Ok(files.mounts())
}

/// Without --driver-root: the CDI mounts of the emulated GPUs' stand-in driver install next to
/// their stand-in device nodes (`<--emulated-device-dir>/driver`, made here), else none.
fn stand_in_driver_mounts(args: &Args, inventory: &[GpuInfo]) -> Result<Vec<Mount>> {
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
    find_driver_files(
        &DriverRoot {
            host_path: path.clone(),
            path,
        },
        inventory,
    )
}

/// Where the CDI specs' device nodes are on the host; with --emulated-device-dir the stand-ins
/// are made here, before any spec names them.
fn device_nodes(args: &Args, inventory: &[GpuInfo], caps_major: u32) -> Result<DeviceNodes> {
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

/// `--print-inventory`: read-only listing of the GPUs, then exit.
fn print_inventory(args: &Args) -> Result<()> {
    match &args.emulated_gpus {
        Some(spec) => {
            // Read-only: the emulated GPUs' state is not opened.
            let gpus = das_driver::gpu::emulated::emulated_inventory(spec, &args.node_name)
                .with_context(|| format!("emulated GPUs {spec:?}"))?;
            for g in gpus {
                println!(
                    "GPU {}: {} {} minor {} MIG {} model {} profiles {}",
                    g.index,
                    g.product_name,
                    g.uuid,
                    g.minor,
                    if g.mig_enabled { "on" } else { "off" },
                    g.model.name,
                    g.model.profile_names()
                );
            }
        }
        None => print!("{}", nvml::inventory_report(&init_nvml()?)),
    }
    Ok(())
}

/// `--print-resource-slices`: the emulated GPUs' desired slices as a JSON `List`, then exit.
fn print_resource_slices(args: &Args) -> Result<()> {
    let spec = args.emulated_gpus.as_deref().unwrap_or_default();
    let node = if args.node_name.is_empty() {
        "node"
    } else {
        &args.node_name
    };
    let gpus = das_driver::gpu::emulated::emulated_inventory(spec, node)
        .with_context(|| format!("emulated GPUs {spec:?}"))?;
    let slices = resource_slices::desired_resource_slices(
        node,
        &gpus,
        ResourceSliceLayout::SeparateCounterSlices,
    )?;
    let items: Vec<_> = slices.into_iter().map(|s| s.slice).collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    println!("{}", serde_json::to_string_pretty(&list)?);
    Ok(())
}

/// Loads the checkpoint; returns it and whether it must be rebuilt from the backend and the API.
fn load_checkpoint(path: &std::path::Path, boot_id: &str) -> Result<(Checkpoint, bool)> {
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

async fn slice_layout(client: &kube::Client) -> Result<ResourceSliceLayout> {
    let v = client
        .apiserver_version()
        .await
        .context("read the API server version")?;
    let num = |s: &str| s.trim_end_matches('+').parse::<u32>().unwrap_or(0);
    Ok(ResourceSliceLayout::for_server_version(
        num(&v.major),
        num(&v.minor),
    ))
}

async fn run(args: Args) -> Result<()> {
    let args = Arc::new(args);
    std::fs::create_dir_all(&args.cdi_dir)
        .with_context(|| format!("create {}", args.cdi_dir.display()))?;
    handover::restrict_state_dir(&args.state_dir)
        .with_context(|| format!("create {} (mode 0700)", args.state_dir.display()))?;
    let mut shutdown = Shutdown::listen()?;
    let metrics = Arc::new(Metrics::new());
    // A panic (a poisoned lock) turns /healthz red: the kubelet restarts us (issue 30).
    probes::fail_liveness_on_panic(metrics.probe.clone());
    let stop = CancellationToken::new();
    // The clients first (no API call yet: the configuration only), for the reviews of
    // --metrics-auth=tokenreview.
    let Clients {
        calls: client,
        watches: watch_client,
    } = client::clients(&args.kube, Timeouts::default()).await?;
    // /healthz answers while this instance waits to take over; /readyz once it serves.
    let metrics_task = tokio::spawn(probes::serve(
        args.metrics_address,
        metrics.probe.clone(),
        args.metrics_auth.access(&client),
        stop.clone().cancelled_owned(),
    ));
    // Checks that touch nothing on the node come first: an instance that cannot reach the API
    // server should fail before it asks the active instance to hand over.
    let layout = slice_layout(&client).await?;
    // Then the node's GPUs and driver files, still before asking: a bad image or a broken
    // driver fails here while the active instance keeps serving. Only the node's active
    // instance touches the state dir and the GPUs' MIG instances (see handover.rs).
    let check = {
        let args = args.clone();
        move || check_node(&args)
    };
    let (node, active) = tokio::select! {
        started = handover::check_then_take_over(&args.state_dir, handover::POLL, check) => started?,
        _ = shutdown.wait() => {
            tracing::info!("stopped while waiting to take over");
            stop.cancel();
            return Ok(());
        }
    };
    let (backend, caps_major, inventory) = match node.gpus {
        Gpus::Nvml {
            backend,
            caps_major,
        } => (backend, caps_major, node.inventory),
        Gpus::Emulated => {
            let spec = args.emulated_gpus.as_deref().unwrap_or_default();
            let (backend, caps_major) = open_emulated(&args, spec)?;
            let b = backend.clone();
            let inventory = tokio::task::spawn_blocking(move || b.inventory()).await??;
            (backend, caps_major, inventory)
        }
    };
    for g in &inventory {
        tracing::info!(gpu = g.index, uuid = %g.uuid, model = %g.model.name, mig = g.mig_enabled, "GPU");
    }
    let driver_mounts = match node.driver_mounts {
        Some(mounts) => mounts,
        None => stand_in_driver_mounts(&args, &inventory)?,
    };
    let cp_path = args.state_dir.join(checkpoint::CHECKPOINT_FILE_NAME);
    let (cp, rebuild) = load_checkpoint(&cp_path, &node.boot_id)?;
    let api = Arc::new(KubeClaimApi::new(client.clone(), &args.node_name));
    if let Some(setup) = &node.setup {
        node_checks::report(setup, api.as_ref(), &metrics).await;
    }
    let preparer = Arc::new(Preparer::new(PreparerConfig {
        api: api.clone(),
        node: args.node_name.clone(),
        backend: backend.clone(),
        inventory: inventory.clone(),
        cdi_dir: args.cdi_dir.clone(),
        caps_major,
        device_nodes: device_nodes(&args, &inventory, caps_major)?,
        driver_mounts,
        checkpoint: CheckpointStore::new(cp, cp_path),
        metrics: metrics.clone(),
        blocking: BlockingCalls::Threads,
        orphans: orphan_policy(&args),
    }));
    let report = preparer
        .reconcile_at_startup(rebuild, args.reclaim_foreign_slices)
        .await?;
    tracing::info!(?report, "start-up reconciliation done");

    let desired = resource_slices::desired_resource_slices(&args.node_name, &inventory, layout)?;
    tracing::info!(slices = desired.len(), ?layout, "publishing ResourceSlices");

    // The monitor decides what is published: taints of unhealthy GPUs, and no device over a MIG
    // instance that no claim holds (found now, while no prepare runs).
    let specs: Vec<_> = desired.into_iter().map(|d| d.slice.spec).collect();
    let unclaimed = preparer.unclaimed_instances().await;
    for i in &unclaimed {
        tracing::warn!(gpu = i.gpu_index, profile = %i.profile, start = i.placement.start, mig = %i.mig_uuid,
            "a MIG instance no claim holds: the devices overlapping it are withdrawn until it is gone");
    }
    let (desired_tx, desired_rx) = watch::channel(specs.clone());
    let monitor = Arc::new(
        HealthMonitor::new(
            HealthBook::new(health_policy(&args), inventory.iter().map(|g| g.index)),
            backend.clone(),
            BlockingCalls::Threads,
            &args.node_name,
            &inventory,
            Publishing {
                specs,
                desired: desired_tx,
            },
            api,
            metrics.clone(),
        )
        .with_unclaimed_instances(preparer.clone(), unclaimed),
    );
    let specs = monitor.specs();

    // Publish once before registering, so the scheduler can place pods as soon as we answer.
    let mut publisher = Publisher::new(client.clone(), &args.node_name, None)
        .with_watch_client(watch_client)
        .with_metrics(metrics.clone());
    let stats = publisher.publish(specs.clone()).await?;
    tracing::info!(?stats, "ResourceSlices published");
    monitor.republish();
    let mut background = Background::default();
    let publish_stop = stop.child_token();
    background.spawn(
        "ResourceSlice publisher",
        publish_stop.clone(),
        async move {
            publisher
                .run(desired_rx, publish_stop, RunConfig::default())
                .await;
        },
    );
    let monitor_stop = stop.child_token();
    background.spawn(
        "health monitor",
        monitor_stop.clone(),
        monitor.clone().run(monitor_stop),
    );

    let paths = SocketPaths::new(
        &args.kubelet_registry_dir,
        &args.kubelet_plugins_dir,
        DRIVER_NAME,
        args.pod_uid.as_deref(),
    )?;
    let reaper_stop = stop.child_token();
    background.spawn(
        "reaper",
        reaper_stop.clone(),
        preparer.clone().run_reaper(reaper_stop),
    );
    let gate = Arc::new(Gate::default());
    let handler: Arc<dyn ClaimHandler> = Arc::new(Gated {
        inner: preparer.clone(),
        gate: gate.clone(),
    });
    let health: Arc<dyn HealthSource> = monitor;
    let serve_task = tokio::spawn({
        let stop = stop.clone();
        async move { server::serve(&paths, DRIVER_NAME, handler, health, stop.cancelled_owned()).await }
    });
    metrics.probe.set_ready(true);
    let mut handover_task = tokio::spawn(handover::hand_over_when_asked(
        active,
        gate,
        background,
        metrics.probe.clone(),
        stop.clone(),
        Limits::PLUGIN,
    ));

    let ended = tokio::select! {
        _ = shutdown.wait() => None,
        ended = &mut handover_task => Some(ended?),
    };
    tracing::info!("shutting down");
    metrics.probe.set_ready(false);
    stop.cancel();
    let ended = match ended {
        Some(e) => e,
        None => handover_task.await?,
    };
    if let Ended::Stuck = ended {
        // Waiting for the servers would wait for the stuck calls too: leave now. The kernel
        // frees the node's locks; the next instance recovers from the checkpoint.
        tracing::error!(
            "calls still ran {}s after the node plugin stopped taking new ones: exiting",
            handover::DRAIN_LIMIT.as_secs()
        );
        std::process::exit(1);
    }
    serve_task.await??;
    metrics_task.await??;
    match ended {
        Ended::Stopped | Ended::Stuck => Ok(()),
        Ended::NodeUnserved => anyhow::bail!(
            "the plugin instance that took over this node is gone and none waits: exiting so that this pod restarts and serves the node again"
        ),
    }
}
