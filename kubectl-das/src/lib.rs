//! `kubectl das`: what DAS does on a cluster, from the API objects any user can read.
//!
//! - `kubectl das gpus [--node N]`: every GPU's memory slices, a letter per pod that holds one,
//!   and a legend (namespace, pod, profile, placement, MIG UUID) — from the published
//!   ResourceSlices, the allocated ResourceClaims and the pods they are reserved for
//!   ([`picture`]). A whole GPU (`--whole-gpus`, profile `gpu`) held by a pod fills its row; a
//!   GPU without MIG (a T4, an L4) has one memory slice, the whole GPU, so its row is one cell.
//! - `kubectl das free [--node N] [--profile P]`: how many slices of each profile each node can
//!   still take, by the scheduler's first fit on the live occupancy ([`free`]); whole GPUs are
//!   profile `gpu`.
//! - `kubectl das claims [-n NS | -A]`: the AllocationClaims with their states ([`claims`]).
//!
//! kubectl runs the `kubectl-das` binary found on `PATH` for `kubectl das …`
//! (<https://kubernetes.io/docs/tasks/extend-kubectl/kubectl-plugins/>). Pure parts (the
//! inventory, the picture, the simulation, the tables) take API objects as values; [`fetch`]
//! reads them.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod claims;
pub mod fetch;
pub mod fields;
pub mod free;
pub mod inventory;
pub mod picture;
pub mod table;

#[cfg(test)]
mod tests;

use std::io::IsTerminal;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use kube::Client;
use serde::Serialize;

use crate::inventory::Inventory;

/// Command line of `kubectl-das`.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-das",
    bin_name = "kubectl das",
    version,
    about = "DAS (Dynamic Accelerator Slicer): who holds which MIG slice, and what still fits"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace: of the AllocationClaims (`claims`, default the context's); `gpus` labels only
    /// this namespace's slices (others are `#`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace (`claims`).
    #[arg(short = 'A', long, global = true)]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum)]
    pub output: Option<Output>,
    /// Colour: `auto` colours only on a terminal (and never with NO_COLOR set).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// The memory slices of every GPU and who holds them.
    Gpus {
        /// Only this node.
        #[arg(long)]
        node: Option<String>,
    },
    /// How many slices of each profile each node can still take now.
    Free {
        /// Only this node.
        #[arg(long)]
        node: Option<String>,
        /// Only this profile (e.g. `1g.10gb`; `gpu` for whole GPUs).
        #[arg(long)]
        profile: Option<String>,
    },
    /// The AllocationClaims (one per allocated slice) and their states.
    Claims,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Wide,
    Json,
    Yaml,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    fn enabled(self) -> bool {
        match self {
            Self::Always => true,
            Self::Never => false,
            Self::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }
}

/// Runs `cli` against the cluster of `client` (whose default namespace is the context's) and
/// returns what to print.
///
/// # Errors
/// DAS is not installed (no DeviceClass or ResourceSlices of `mig.das.com`; no AllocationClaim
/// CRD for `claims`), the API refuses a read, or a published counter is not a quantity.
pub async fn run(cli: &Cli, client: &Client) -> Result<String> {
    let wide = cli.output == Some(Output::Wide);
    match &cli.command {
        Command::Gpus { node } => {
            let inv = fetch::inventory(client).await?;
            fetch::check_node(&inv, node.as_deref())?;
            let pics = picture::pictures(&inv, node.as_deref());
            structured(cli.output, &serde_json::json!({ "gpus": pics })).unwrap_or_else(|| {
                let opts = picture::Options {
                    node: node.clone(),
                    namespace: cli.namespace.clone(),
                    wide,
                    color: cli.color.enabled(),
                };
                Ok(picture::render_text(&pics, &opts))
            })
        }
        Command::Free { node, profile } => {
            let inv = fetch::inventory(client).await?;
            fetch::check_node(&inv, node.as_deref())?;
            let rows: Vec<free::FreeProfile> = free::free_profiles(&inv)
                .into_iter()
                .filter(|f| node.as_ref().is_none_or(|n| *n == f.node))
                .filter(|f| profile.as_ref().is_none_or(|p| *p == f.profile))
                .collect();
            if let Some(p) = profile
                && rows.is_empty()
            {
                anyhow::bail!(
                    "no node publishes profile {p:?}; published profiles: {}",
                    published_profiles(&inv).join(", ")
                );
            }
            structured(cli.output, &serde_json::json!({ "free": rows }))
                .unwrap_or_else(|| Ok(free_text(&rows, wide)))
        }
        Command::Claims => {
            let ns = (!cli.all_namespaces).then(|| {
                cli.namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string())
            });
            let list = fetch::allocation_claims(client, ns.as_deref()).await?;
            let out = structured(
                cli.output,
                &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": list}),
            );
            if let Some(out) = out {
                return out;
            }
            // The GPU index column needs the published devices; a cluster whose plugins are
            // gone still lists its claims.
            let inv = fetch::inventory(client).await.unwrap_or_default();
            let text = claims::render_text(&list, &inv, cli.all_namespaces, wide);
            Ok(if text.is_empty() {
                match &ns {
                    Some(ns) => format!("No AllocationClaims in namespace {ns}.\n"),
                    None => "No AllocationClaims.\n".into(),
                }
            } else {
                text
            })
        }
    }
}

/// `-o json|yaml` of `value`; `None` for the text formats.
fn structured(output: Option<Output>, value: &impl Serialize) -> Option<Result<String>> {
    match output {
        Some(Output::Json) => Some(
            serde_json::to_string_pretty(value)
                .map(|s| s + "\n")
                .map_err(Into::into),
        ),
        Some(Output::Yaml) => Some(serde_yaml::to_string(value).map_err(Into::into)),
        _ => None,
    }
}

fn published_profiles(inv: &Inventory) -> Vec<String> {
    let mut p: Vec<String> = inv.devices.iter().map(|d| d.profile.clone()).collect();
    p.sort();
    p.dedup();
    p
}

/// `NODE PROFILE FREE GPUS` (`-o wide`: and the profile's size in memory slices).
pub fn free_text(rows: &[free::FreeProfile], wide: bool) -> String {
    use table::Cell;
    let mut header = vec!["NODE", "PROFILE", "FREE", "PER GPU"];
    if wide {
        header.insert(2, "MEMORY SLICES");
    }
    let mut out: Vec<Vec<Cell>> = vec![header.into_iter().map(Cell::from).collect()];
    for f in rows {
        let per_gpu: Vec<String> = f
            .per_gpu
            .iter()
            .map(|(g, n)| format!("gpu-{g}:{n}"))
            .collect();
        let mut row: Vec<Cell> = vec![
            f.node.clone().into(),
            f.profile.clone().into(),
            f.count.to_string().into(),
            per_gpu.join(" ").into(),
        ];
        if wide {
            row.insert(2, f.size.to_string().into());
        }
        out.push(row);
    }
    table::render(&out, false)
}
