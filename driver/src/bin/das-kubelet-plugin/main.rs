//! `das-kubelet-plugin`: the DAS node plugin. Publishes this node's MIG placements (and, with
//! `--whole-gpus`, its GPUs with MIG mode off as whole GPUs) as ResourceSlices, registers with the kubelet as DRA driver `mig.das.com`, and carves and destroys
//! MIG instances on NodePrepareResources / NodeUnprepareResources.
//!
//! - `args`: the flags (clap) and the policies they make.
//! - `node`: what is read and opened on the node (GPUs, driver files, device nodes, checkpoint),
//!   before and after taking over from the active instance.
//! - `phases`: the start-up, one type per phase (configured → taken over → reconciled →
//!   published → serving), each made only by the previous one, which wires the parts of
//!   `das_driver` together. Publication: the health monitor sends `HealthFacts` on a watch
//!   channel; the publisher turns them and the inventory's slices into what it publishes
//!   (`das_driver::publish::desired::desired_slices`).
//! - `slices`: the slices' options for the API server and the node, and the slices built from
//!   the inventory.
//! - `mps_host`: the subcommand `mps-host`, the MPS host (`das_driver::mps::host`).
//! - `print`: the read-only modes `--print-inventory` and `--print-resource-slices`.
//! - this file: the process (runtime, signals) and [`run`], the phases in their order.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod args;
mod mps_host;
mod node;
mod phases;
mod print;
mod slices;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use das_runtime::process;

use args::Args;
use phases::Configured;
use print::{print_inventory, print_resource_slices};

/// Parses the flags; runs a print mode, or the plugin until it is stopped.
fn main() -> ExitCode {
    // The emulated GPUs' stand-in MPS control daemon (das_driver::mps::stand_in): a hidden
    // subcommand, so the image needs no binary of its own for it.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(das_driver::mps::stand_in::SUBCOMMAND) {
        return ExitCode::from(das_driver::mps::stand_in::main(&argv[2..]));
    }
    // The MPS host (das_driver::mps::host): its own flags, none of the plugin's.
    if argv.get(1).map(String::as_str) == Some(das_driver::mps::host::SUBCOMMAND) {
        return mps_host::main(&argv[2..]);
    }
    // The createRuntime CDI hook that caps a container's GPU memory (docs/design.md §7,
    // "Memory limits the kernel enforces"): run by the container runtime with none of the
    // plugin's flags or environment, so it is parsed apart from them.
    if argv.get(1).map(String::as_str) == Some(das_driver::claims::memory_limits::SUBCOMMAND) {
        return ExitCode::from(das_driver::claims::memory_limits::main(&argv[2..]));
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

/// The plugin: waits to take over the node, reconciles, publishes, serves the kubelet, and
/// hands over or stops on SIGTERM; each phase makes the value the next one needs
/// (`phases.rs`).
async fn run(args: Args) -> Result<()> {
    let Some(taken_over) = Configured::start(args).await?.take_over().await? else {
        return Ok(());
    };
    let reconciled = taken_over.reconcile().await?;
    let published = reconciled.publish().await?;
    published.serve()?.until_stopped().await
}
