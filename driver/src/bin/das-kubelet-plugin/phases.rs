//! The plugin's start-up in types. Each phase is a value whose fields are private to this module
//! and whose only maker is the previous phase's method, so `main.rs` can only run them in this
//! order (issue 42):
//!
//! [`Configured::start`] → [`Configured`] → [`Configured::take_over`] → [`TakenOver`] →
//! [`TakenOver::reconcile`] → [`Reconciled`] → [`Reconciled::publish`] → [`Published`] →
//! [`Published::serve`] → [`Serving`] → [`Serving::until_stopped`].
//!
//! The rules this order keeps, and what holds each:
//! - checks that touch nothing on the node, then the node's checks, before asking the active
//!   instance to hand over: [`Configured::start`] reads the API server's version, and
//!   [`Configured::take_over`] runs `check_node` through `handover::check_then_take_over`, whose
//!   [`handover::Active`] (made only by taking `plugin.lock`) a [`TakenOver`] holds; only then
//!   is the node's shared state (the state dir, the GPUs' instances) touched;
//! - reconcile before publishing: [`Reconciled`] is made only once
//!   `Preparer::reconcile_at_startup` returned (inside it, the MPS daemons are settled before
//!   orphaned instances are destroyed: `destroy_orphans` requires the MPS layer's `Restored`);
//! - publish before registering with the kubelet: [`Published`] holds the [`FirstPublish`] that
//!   only a successful `Publisher::publish_first` makes, and `kubeletplugin::serve` requires it;
//! - the handover watched only while serving: [`Serving`] moves the [`handover::Active`] into
//!   `handover::hand_over_when_asked`.
//!
//! A binary has no doc tests: the compile-fail tests that these tokens cannot be made out of
//! order are on the library types (`dra_plugin::resourceslice::FirstPublish`,
//! `dra_plugin::handover::Active`).

use std::sync::Arc;

use anyhow::{Context, Result};
use das_api::DRIVER_NAME;
use das_driver::blocking::BlockingCalls;
use das_driver::claims::carve_watch::CarveWatch;
use das_driver::claims::checkpoint::{self, CheckpointStore};
use das_driver::claims::{KubeClaimApi, Preparer, PreparerConfig};
use das_driver::gpu::{GpuBackend, GpuInfo};
use das_driver::health::{HealthBook, HealthMonitor, HealthSource};
use das_driver::metrics::Metrics;
use das_driver::mps::MpsDaemons;
use das_driver::node_checks;
use das_driver::plugin::handover::{self, Active, Background, Ended, Gate, Gated, Limits};
use das_driver::plugin::server::{self, SocketPaths};
use das_driver::publish::desired::{HealthFacts, desired_slices};
use das_driver::publish::resource_slices::SliceOptions;
use das_driver::publish::{FirstPublish, Publisher, RunConfig};
use das_runtime::client::{self, Clients, Timeouts};
use das_runtime::probes;
use das_runtime::process::Shutdown;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::args::{Args, health_policy, orphan_policy, share_policy};
use crate::node::{
    Gpus, NodeCheck, check_node, device_nodes, load_checkpoint, memory_limits, mps_control_binary,
    mps_settings, open_emulated, stand_in_driver_mounts, time_slicer,
};
use crate::slices::{base_slices, slice_options, unless_no_mps};

/// What every phase carries: the flags, SIGTERM, the metrics and the task serving them with the
/// probes, the API clients, and the token that stops every task.
struct Process {
    args: Arc<Args>,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    /// Request/response calls (with read timeouts).
    client: kube::Client,
    /// Watches (no read timeout: a quiet watch is not a hung call).
    watch_client: kube::Client,
    stop: CancellationToken,
    metrics_task: JoinHandle<Result<()>>,
}

/// The process is set up (directories, metrics and probes served, API clients) and the API
/// server's version has given the slices' layout; nothing on the node is touched yet.
pub(crate) struct Configured {
    process: Process,
    options: SliceOptions,
    carve_before_bind: bool,
}

/// This instance is the node's active one: the node was checked, then taken over.
pub(crate) struct TakenOver {
    process: Process,
    options: SliceOptions,
    carve_before_bind: bool,
    node: NodeCheck,
    active: Active,
}

/// The GPUs are open, the checkpoint loaded and start-up reconciliation done.
pub(crate) struct Reconciled {
    process: Process,
    options: SliceOptions,
    carve_before_bind: bool,
    active: Active,
    inventory: Vec<GpuInfo>,
    api: Arc<KubeClaimApi>,
    preparer: Arc<Preparer>,
    mps: Arc<MpsDaemons>,
}

/// The ResourceSlices are published (the first publish succeeded); the publisher and the
/// health monitor run as background tasks.
pub(crate) struct Published {
    process: Process,
    carve_before_bind: bool,
    active: Active,
    preparer: Arc<Preparer>,
    mps: Arc<MpsDaemons>,
    monitor: Arc<HealthMonitor>,
    background: Background,
    first: FirstPublish,
}

/// The kubelet is served and the handover watched.
pub(crate) struct Serving {
    process: Process,
    serve_task: JoinHandle<Result<(), server::ServeError>>,
    handover_task: JoinHandle<Ended>,
}

impl Configured {
    /// Sets the process up: the CDI and state dirs (the state dir `0700`), SIGTERM, the
    /// metrics (a panic turns `/healthz` red), the API clients and the metrics and probes
    /// server (`/healthz` answers while this instance waits to take over; `/readyz` once it
    /// serves); then reads the API server's version, so an instance that cannot reach the API
    /// server fails before it asks the active instance to hand over.
    pub(crate) async fn start(args: Args) -> Result<Self> {
        let args = Arc::new(args);
        std::fs::create_dir_all(&args.cdi_dir)
            .with_context(|| format!("create {}", args.cdi_dir.display()))?;
        handover::restrict_state_dir(&args.state_dir)
            .with_context(|| format!("create {} (mode 0700)", args.state_dir.display()))?;
        let shutdown = Shutdown::listen()?;
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
        let metrics_task = tokio::spawn(probes::serve(
            args.metrics_address,
            metrics.probe.clone(),
            args.metrics_auth.access(&client),
            stop.clone().cancelled_owned(),
        ));
        let (options, carve_before_bind) = slice_options(&client, &args).await?;
        let process = Process {
            args,
            shutdown,
            metrics,
            client,
            watch_client,
            stop,
            metrics_task,
        };
        Ok(Self {
            process,
            options,
            carve_before_bind,
        })
    }

    /// Checks the node's GPUs and driver files (`check_node`, on the blocking pool), then takes
    /// the node over from the active instance, waiting for it to hand over: a bad image or a
    /// broken driver fails here while the active instance keeps serving. Only the node's
    /// active instance touches the state dir and the GPUs' MIG instances (see
    /// dra/src/handover/). `None`: stopped (SIGTERM) while waiting.
    pub(crate) async fn take_over(self) -> Result<Option<TakenOver>> {
        let Self {
            mut process,
            options,
            carve_before_bind,
        } = self;
        let check = {
            let args = process.args.clone();
            move || check_node(&args)
        };
        let state_dir = process.args.state_dir.clone();
        let (node, active) = tokio::select! {
            started = handover::check_then_take_over(&state_dir, handover::POLL, check) => started?,
            _ = process.shutdown.wait() => {
                tracing::info!("stopped while waiting to take over");
                process.stop.cancel();
                return Ok(None);
            }
        };
        Ok(Some(TakenOver {
            process,
            options,
            carve_before_bind,
            node,
            active,
        }))
    }
}

impl TakenOver {
    /// Opens what belongs to the active instance (the emulated GPUs' state, the stand-in
    /// device nodes and driver install, the MPS daemons' directories, the checkpoint), reports
    /// the node set-up checks, and reconciles checkpoint, GPUs and API server
    /// (`Preparer::reconcile_at_startup`).
    pub(crate) async fn reconcile(self) -> Result<Reconciled> {
        let Self {
            process,
            options,
            carve_before_bind,
            node,
            active,
        } = self;
        let (args, metrics) = (&process.args, &process.metrics);
        let (backend, caps_major, inventory) = open_gpus(args, node.gpus, node.inventory).await?;
        for g in &inventory {
            tracing::info!(gpu = g.index, uuid = %g.uuid, model = %g.model.name, mig = g.mig_enabled, "GPU");
        }
        let driver_mounts = match node.driver_mounts {
            Some(mounts) => mounts,
            None => stand_in_driver_mounts(args, &inventory)?,
        };
        let mps_settings = mps_settings(args, &inventory);
        let mps = Arc::new(
            MpsDaemons::new(
                mps_control_binary(args, node.mps_control, mps_settings.protocol)?,
                &args.state_dir,
                metrics.clone(),
            )
            .with_settings(mps_settings)
            .with_host(args.mps_host_socket.clone()),
        );
        let cp_path = args.state_dir.join(checkpoint::CHECKPOINT_FILE_NAME);
        let (cp, rebuild) = load_checkpoint(&cp_path, &node.boot_id)?;
        let api = Arc::new(
            KubeClaimApi::new(process.client.clone(), &args.node_name)
                .with_slice_ready(carve_before_bind),
        );
        if let Some(setup) = &node.setup {
            node_checks::report(setup, api.as_ref(), metrics).await;
        }
        let preparer = Arc::new(Preparer::new(PreparerConfig {
            api: api.clone(),
            node: args.node_name.clone(),
            backend: backend.clone(),
            inventory: inventory.clone(),
            cdi_dir: args.cdi_dir.clone(),
            caps_major,
            device_nodes: device_nodes(args, &inventory, caps_major)?,
            driver_mounts,
            checkpoint: CheckpointStore::new(cp, cp_path),
            metrics: metrics.clone(),
            blocking: BlockingCalls::Threads,
            orphans: orphan_policy(args),
            mps: mps.clone(),
            time_slicer: time_slicer(args, &backend, node.nvidia_smi),
            share_policy: share_policy(args),
            memory_limits: memory_limits(args, node.nvidia_smi_host, &inventory),
        }));
        let report = preparer
            .reconcile_at_startup(rebuild, args.reclaim_foreign_slices)
            .await?;
        tracing::info!(?report, "start-up reconciliation done");
        Ok(Reconciled {
            process,
            options,
            carve_before_bind,
            active,
            inventory,
            api,
            preparer,
            mps,
        })
    }
}

impl Reconciled {
    /// Publishes the node's ResourceSlices once (with the health monitor's first facts), before
    /// the plugin registers, so the scheduler can place pods as soon as the kubelet reaches it;
    /// then keeps them published (the publisher) and watches the GPUs (the health monitor) in
    /// the background.
    pub(crate) async fn publish(self) -> Result<Published> {
        let Self {
            process,
            options,
            carve_before_bind,
            active,
            inventory,
            api,
            preparer,
            mps,
        } = self;
        let mut options = unless_no_mps(options, &mps);
        // The GPUs the hooks cap, as start-up decided them: what is published is what a
        // prepare writes.
        options.shared.memory_enforced = preparer
            .memory_limits()
            .map(|l| l.enforced.clone())
            .unwrap_or_default();
        let base = base_slices(&process.args, &inventory, options, carve_before_bind)?;
        let (monitor, facts) = start_monitor(&process, &inventory, api, &preparer).await;
        let mut publisher = Publisher::new(process.client.clone(), &process.args.node_name, None)
            .with_watch_client(process.watch_client.clone())
            .with_metrics(process.metrics.clone());
        monitor.send_facts();
        let slices = desired_slices(&base, &facts.borrow());
        let (stats, first) = publisher.publish_first(slices).await?;
        tracing::info!(?stats, "ResourceSlices published");
        let mut background = Background::default();
        let publish_stop = process.stop.child_token();
        background.spawn(
            "ResourceSlice publisher",
            publish_stop.clone(),
            async move {
                publisher
                    .run_with_facts(base, facts, publish_stop, RunConfig::default())
                    .await;
            },
        );
        let monitor_stop = process.stop.child_token();
        background.spawn(
            "health monitor",
            monitor_stop.clone(),
            monitor.clone().run(monitor_stop),
        );
        Ok(Published {
            process,
            carve_before_bind,
            active,
            preparer,
            mps,
            monitor,
            background,
            first,
        })
    }
}

/// The health monitor, and the facts it reports for publication: taints of unhealthy GPUs,
/// and the MIG instances no claim holds, found now while no prepare runs. The publisher alone
/// turns them and the inventory's slices into what is published.
async fn start_monitor(
    process: &Process,
    inventory: &[GpuInfo],
    api: Arc<KubeClaimApi>,
    preparer: &Arc<Preparer>,
) -> (Arc<HealthMonitor>, watch::Receiver<HealthFacts>) {
    let unclaimed = preparer.unclaimed_instances().await;
    for i in &unclaimed {
        tracing::warn!(gpu = i.gpu_index, profile = %i.profile, start = i.placement.start, mig = %i.mig_uuid,
            "a MIG instance no claim holds: the devices overlapping it are withdrawn until it is gone");
    }
    let (facts_tx, facts_rx) = watch::channel(HealthFacts::default());
    // GPUs whose MIG mode switch failed (at start-up recovery, or later) serve one kind only.
    preparer.report_mig_modes_to(facts_tx.clone());
    // The namespace each shared slice serves, for das-webhook's selector (unless shares may
    // cross namespaces).
    preparer.report_share_namespaces_to(facts_tx.clone());
    let args = &process.args;
    let monitor = HealthMonitor::new(
        HealthBook::new(health_policy(args), inventory.iter().map(|g| g.index)),
        preparer.gpu_calls().clone(),
        &args.node_name,
        inventory,
        facts_tx,
        api,
        process.metrics.clone(),
    )
    .with_unclaimed_instances(preparer.clone(), unclaimed);
    (Arc::new(monitor), facts_rx)
}

impl Published {
    /// Starts the request path's background tasks (the carve-before-bind watch, the reaper,
    /// the MPS daemons' supervision), serves the kubelet behind the handover gate (registering
    /// once the DRA socket answers: `kubeletplugin::serve` requires the first publish's
    /// proof), turns `/readyz` ready and watches for a newer instance asking for the node.
    pub(crate) fn serve(self) -> Result<Serving> {
        let Self {
            process,
            carve_before_bind,
            active,
            preparer,
            mps,
            monitor,
            mut background,
            first,
        } = self;
        let args = &process.args;
        let paths = SocketPaths::new(
            &args.kubelet_registry_dir,
            &args.kubelet_plugins_dir,
            DRIVER_NAME,
            args.pod_uid.as_deref(),
        )?;
        spawn_request_path_tasks(&mut background, &process, carve_before_bind, &preparer, mps);
        let gate = Arc::new(Gate::default());
        let handler = Arc::new(Gated {
            inner: preparer,
            gate: gate.clone(),
        });
        let health: Arc<dyn HealthSource> = monitor;
        let serve_task = tokio::spawn({
            let stop = process.stop.clone();
            async move {
                let shutdown = stop.cancelled_owned();
                server::serve(&first, &paths, DRIVER_NAME, handler, health, shutdown).await
            }
        });
        process.metrics.probe.set_ready(true);
        let handover_task = tokio::spawn(handover::hand_over_when_asked(
            active,
            gate,
            background,
            process.metrics.probe.clone(),
            process.stop.clone(),
            Limits::PLUGIN,
        ));
        Ok(Serving {
            process,
            serve_task,
            handover_task,
        })
    }
}

impl Serving {
    /// Runs until SIGTERM or until the handover watch ends; then stops every task and waits
    /// for the servers. Exits the process at once when calls are stuck (waiting for the
    /// servers would wait for them too).
    ///
    /// # Errors
    /// A task failed, or the instance that took over the node is gone and none waits (this pod
    /// must restart to serve the node again).
    pub(crate) async fn until_stopped(self) -> Result<()> {
        let Self {
            mut process,
            serve_task,
            mut handover_task,
        } = self;
        let ended = tokio::select! {
            _ = process.shutdown.wait() => None,
            ended = &mut handover_task => Some(ended?),
        };
        tracing::info!("shutting down");
        process.metrics.probe.set_ready(false);
        process.stop.cancel();
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
        process.metrics_task.await??;
        match ended {
            Ended::Stopped | Ended::Stuck => Ok(()),
            Ended::NodeUnserved => anyhow::bail!(
                "the plugin instance that took over this node is gone and none waits: exiting so that this pod restarts and serves the node again"
            ),
        }
    }
}

/// The GPU backend, its `nvidia-caps` major and its GPUs: NVML's as checked before taking
/// over, or the emulated GPUs' backend, opened now over their state in the state dir.
async fn open_gpus(
    args: &Args,
    gpus: Gpus,
    checked: Vec<GpuInfo>,
) -> Result<(Arc<dyn GpuBackend>, u32, Vec<GpuInfo>)> {
    Ok(match gpus {
        Gpus::Nvml {
            backend,
            caps_major,
        } => (backend, caps_major, checked),
        Gpus::Emulated => {
            let spec = args.emulated_gpus.as_deref().unwrap_or_default();
            let (backend, caps_major) = open_emulated(args, spec)?;
            let b = backend.clone();
            let inventory = tokio::task::spawn_blocking(move || b.inventory()).await??;
            (backend, caps_major, inventory)
        }
    })
}

/// The request path's background tasks besides the kubelet's calls: the carve-before-bind
/// watch (when on), the reaper, and the MPS daemons' supervision.
fn spawn_request_path_tasks(
    background: &mut Background,
    process: &Process,
    carve_before_bind: bool,
    preparer: &Arc<Preparer>,
    mps: Arc<MpsDaemons>,
) {
    if carve_before_bind {
        let carve_stop = process.stop.child_token();
        let watch = CarveWatch::new(preparer.clone(), &process.args.node_name);
        background.spawn(
            "carve-before-bind watch",
            carve_stop.clone(),
            watch.run(process.watch_client.clone(), carve_stop),
        );
    }
    let reaper_stop = process.stop.child_token();
    background.spawn(
        "reaper",
        reaper_stop.clone(),
        preparer.clone().run_reaper(reaper_stop),
    );
    // A task that only waits: the daemons' supervision is let go of (the processes run on for
    // the next instance to adopt) with the other background work, once the gate has closed and
    // before plugin.lock is released, so an instance that handed over starts no daemon again.
    let mps_stop = process.stop.child_token();
    background.spawn("MPS daemons", mps_stop.clone(), async move {
        mps_stop.cancelled().await;
        mps.let_go().await;
    });
}
