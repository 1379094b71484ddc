//! `das-kubelet-plugin`: the DAS node plugin. Publishes this node's MIG placements (and, with
//! `--whole-gpus`, its GPUs with MIG mode off as whole GPUs) as ResourceSlices, registers with the kubelet as DRA driver `mig.das.com`, and carves and destroys
//! MIG instances on NodePrepareResources / NodeUnprepareResources.
//!
//! - `args`: the flags (clap) and the policies they make.
//! - `node`: what is read and opened on the node (GPUs, driver files, device nodes, checkpoint),
//!   before and after taking over from the active instance.
//! - `print`: the read-only modes `--print-inventory` and `--print-resource-slices`.
//! - this file: the process (runtime, signals) and [`run`], which wires the parts of
//!   `das_driver` together. Publication: the health monitor sends `HealthFacts` on a watch
//!   channel; the publisher turns them and the inventory's slices into what it publishes
//!   (`das_driver::publish::desired::desired_slices`).

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod args;
mod node;
mod print;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use das_api::DRIVER_NAME;
use das_driver::blocking::BlockingCalls;
use das_driver::claims::carve_watch::CarveWatch;
use das_driver::claims::checkpoint::{self, CheckpointStore};
use das_driver::claims::{KubeClaimApi, Preparer, PreparerConfig};
use das_driver::health::{HealthBook, HealthMonitor, HealthSource};
use das_driver::metrics::Metrics;
use das_driver::mps::MpsDaemons;
use das_driver::node_checks;
use das_driver::plugin::handover::{self, Background, Ended, Gate, Gated, Limits};
use das_driver::plugin::server::{self, SocketPaths};
use das_driver::publish::binding;
use das_driver::publish::desired::{HealthFacts, desired_slices};
use das_driver::publish::resource_slices::{self, ServerVersion, SliceOptions};
use das_driver::publish::{Publisher, RunConfig};
use das_runtime::client::{self, Clients, Timeouts};
use das_runtime::probes;
use das_runtime::process::{self, Shutdown};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use args::{Args, health_policy, orphan_policy, share_policy, shared_profiles};
use node::{
    Gpus, check_node, device_nodes, load_checkpoint, mps_control_binary, mps_settings,
    open_emulated, stand_in_driver_mounts,
};
use print::{print_inventory, print_resource_slices};

/// Parses the flags; runs a print mode, or the plugin until it is stopped.
fn main() -> ExitCode {
    // The emulated GPUs' stand-in MPS control daemon (das_driver::mps::stand_in): a hidden
    // subcommand, so the image needs no binary of its own for it.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(das_driver::mps::stand_in::SUBCOMMAND) {
        return ExitCode::from(das_driver::mps::stand_in::main(&argv[2..]));
    }
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

/// What the slices hold for the API server's version (its layout, and the shareable devices of
/// --shared-profiles where it supports them; docs/design.md §7, "Shared slices"), and whether
/// carve before bind is on (--carve-before-bind on a server that serves binding conditions,
/// issue 34). When the flags ask for what the server cannot be given, the log says why.
async fn slice_options(client: &kube::Client, args: &Args) -> Result<(SliceOptions, bool)> {
    let info = client
        .apiserver_version()
        .await
        .context("read the API server version")?;
    let version = ServerVersion::from_info(&info);
    let (options, why_not) = SliceOptions::for_server(version, shared_profiles(args));
    if let Some(why) = why_not {
        tracing::warn!(
            profiles = ?args.shared_profiles.0, server = %info.git_version,
            "no shareable devices are published: {why}"
        );
    }
    let carve = args.carve_before_bind
        && match binding::binding_supported(version) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(server = %info.git_version, "carve before bind is off: {why}");
                false
            }
        };
    Ok((options, carve))
}

/// `options` without shareable devices when this node cannot run MPS, which every share of a
/// slice needs (docs/design.md §7, "Shared slices"); the log says why.
fn unless_no_mps(mut options: SliceOptions, mps: &MpsDaemons) -> SliceOptions {
    if !options.shared.selectors.is_empty() && !mps.available() {
        tracing::warn!(
            profiles = ?options.shared.selectors,
            "no shareable devices are published: {}",
            das_driver::mps::supervisor::NO_BINARY
        );
        options.shared.selectors.clear();
    }
    options
}

/// The plugin: waits to take over the node, publishes, serves the kubelet, and hands over or
/// stops on SIGTERM.
// Over the 80 lines of clippy.toml: issue 42's package 8 splits it into phases (remove this then).
#[allow(clippy::too_many_lines)]
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
    let (options, carve_before_bind) = slice_options(&client, &args).await?;
    // Then the node's GPUs and driver files, still before asking: a bad image or a broken
    // driver fails here while the active instance keeps serving. Only the node's active
    // instance touches the state dir and the GPUs' MIG instances (see dra/src/handover/).
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
    let mps_settings = mps_settings(&args, &inventory);
    let mps = Arc::new(
        MpsDaemons::new(
            mps_control_binary(&args, node.mps_control, mps_settings.protocol)?,
            &args.state_dir,
            metrics.clone(),
        )
        .with_settings(mps_settings),
    );
    let cp_path = args.state_dir.join(checkpoint::CHECKPOINT_FILE_NAME);
    let (cp, rebuild) = load_checkpoint(&cp_path, &node.boot_id)?;
    let api = Arc::new(
        KubeClaimApi::new(client.clone(), &args.node_name).with_slice_ready(carve_before_bind),
    );
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
        mps: mps.clone(),
        share_policy: share_policy(&args),
    }));
    let report = preparer
        .reconcile_at_startup(rebuild, args.reclaim_foreign_slices)
        .await?;
    tracing::info!(?report, "start-up reconciliation done");

    let options = unless_no_mps(options, &mps);
    let (layout, shared) = (options.layout, options.shared.selectors.clone());
    let desired = resource_slices::desired_resource_slices(&args.node_name, &inventory, options)?;
    let desired = if carve_before_bind {
        binding::with_binding_conditions(desired)
    } else {
        desired
    };
    tracing::info!(
        slices = desired.len(),
        ?layout,
        ?shared,
        carve_before_bind,
        "publishing ResourceSlices"
    );

    // The monitor reports what publication needs to know (taints of unhealthy GPUs, and the MIG
    // instances no claim holds, found now while no prepare runs); the publisher alone turns it
    // and the inventory's slices into what is published.
    let base: Vec<_> = desired.into_iter().map(|d| d.slice.spec).collect();
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
    let monitor = Arc::new(
        HealthMonitor::new(
            HealthBook::new(health_policy(&args), inventory.iter().map(|g| g.index)),
            preparer.gpu_calls().clone(),
            &args.node_name,
            &inventory,
            facts_tx,
            api,
            metrics.clone(),
        )
        .with_unclaimed_instances(preparer.clone(), unclaimed),
    );

    // Publish once before registering, so the scheduler can place pods as soon as we answer.
    let claim_watch_client = watch_client.clone();
    let mut publisher = Publisher::new(client.clone(), &args.node_name, None)
        .with_watch_client(watch_client)
        .with_metrics(metrics.clone());
    monitor.send_facts();
    let first = desired_slices(&base, &facts_rx.borrow());
    let stats = publisher.publish(first).await?;
    tracing::info!(?stats, "ResourceSlices published");
    let mut background = Background::default();
    let publish_stop = stop.child_token();
    background.spawn(
        "ResourceSlice publisher",
        publish_stop.clone(),
        async move {
            publisher
                .run_with_facts(base, facts_rx, publish_stop, RunConfig::default())
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
    if carve_before_bind {
        let carve_stop = stop.child_token();
        let watch = CarveWatch::new(preparer.clone(), &args.node_name);
        background.spawn(
            "carve-before-bind watch",
            carve_stop.clone(),
            watch.run(claim_watch_client, carve_stop),
        );
    }
    let reaper_stop = stop.child_token();
    background.spawn(
        "reaper",
        reaper_stop.clone(),
        preparer.clone().run_reaper(reaper_stop),
    );
    // A task that only waits: the daemons' supervision is let go of (the processes run on for
    // the next instance to adopt) with the other background work, once the gate has closed and
    // before plugin.lock is released, so an instance that handed over starts no daemon again.
    let mps_stop = stop.child_token();
    background.spawn("MPS daemons", mps_stop.clone(), async move {
        mps_stop.cancelled().await;
        mps.let_go().await;
    });
    let gate = Arc::new(Gate::default());
    let handler = Arc::new(Gated {
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
