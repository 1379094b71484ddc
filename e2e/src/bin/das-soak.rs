//! `das-soak`: the chaos soak (`make soak`). Starts a 2-node local cluster with DAS installed
//! from the chart, runs the seeded pod churn with component kills and emulated-GPU faults, and
//! prints the figures as Markdown for docs/reliability.md. Exits non-zero on any invariant
//! violation. See `das_e2e::soak`.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use das_e2e::soak::{self, SoakConfig};

#[derive(Parser)]
#[command(about = "Chaos soak of DAS on the local cluster")]
struct Args {
    /// Pod cycles.
    #[arg(long, default_value_t = 500)]
    cycles: usize,
    /// Seed of the workload and the chaos.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Cycles in flight at once.
    #[arg(long, default_value_t = 6)]
    concurrency: usize,
    /// Phases (the invariants are checked after each, once the cluster converged).
    #[arg(long, default_value_t = 5)]
    phases: usize,
    /// Shortest pause between two chaos actions, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    chaos_min_ms: u64,
    /// Longest pause between two chaos actions, in milliseconds.
    #[arg(long, default_value_t = 6000)]
    chaos_max_ms: u64,
    /// No kills and no faults (the churn alone).
    #[arg(long)]
    no_chaos: bool,
    /// Cargo profile of the DAS binaries to run (`release` or `debug`).
    #[arg(long, default_value = "release")]
    profile: String,
    /// Run this node plugin binary instead (e.g. an earlier build, for comparison).
    #[arg(long)]
    plugin_bin: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "das_e2e=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("das-soak: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool> {
    let cfg = SoakConfig {
        seed: args.seed,
        cycles: args.cycles,
        concurrency: args.concurrency,
        phases: args.phases,
        chaos: (!args.no_chaos).then_some((
            Duration::from_millis(args.chaos_min_ms),
            Duration::from_millis(args.chaos_max_ms),
        )),
        binaries: {
            let mut b = soak::binaries(&args.profile)?;
            if let Some(p) = args.plugin_bin {
                b.plugin = p;
            }
            b
        },
        converge_limit: Duration::from_secs(150),
    };
    let report = soak::run(&cfg).await?;
    println!("{}", report.markdown(&cfg));
    for v in &report.violations {
        println!("violation: {v}");
    }
    Ok(report.violations.is_empty())
}
