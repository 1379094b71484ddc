//! The read-only modes that print and exit: `--print-inventory` and `--print-resource-slices`.

use anyhow::{Context, Result};
use das_driver::gpu::nvml;
use das_driver::publish::resource_slices::{self, ServerVersion, SliceOptions};

use crate::args::{Args, shared_profiles};
use crate::node::{emulated_inventory, init_nvml};

/// `--print-inventory`: read-only listing of the GPUs, then exit.
pub(crate) fn print_inventory(args: &Args) -> Result<()> {
    match &args.emulated_gpus {
        Some(spec) => {
            // Read-only: the emulated GPUs' state is not opened.
            let gpus = das_driver::gpu::emulated::emulated_inventory(spec, &args.node_name)
                .with_context(|| format!("emulated GPUs {spec:?}"))?;
            for g in gpus {
                let serves = match (g.mig_enabled, args.whole_gpus) {
                    (true, _) => "MIG slices",
                    (false, true) => "whole GPU",
                    (false, false) if g.model.mig => "nothing (MIG off, no --whole-gpus)",
                    (false, false) => "nothing (no MIG, no --whole-gpus)",
                };
                let mig = match (g.model.mig, g.mig_enabled) {
                    (false, _) => "none",
                    (true, true) => "on",
                    (true, false) => "off",
                };
                println!(
                    "GPU {}: {} {} minor {} MIG {mig} model {} profiles {} serves {serves}",
                    g.index,
                    g.product_name,
                    g.uuid,
                    g.minor,
                    g.model.name,
                    g.model.profile_names()
                );
            }
        }
        None => print!("{}", nvml::inventory_report(&init_nvml()?)),
    }
    Ok(())
}

/// `--print-resource-slices`: the emulated GPUs' desired slices as a JSON `List`, then exit;
/// as published to a Kubernetes 1.37 server (with the shareable devices of --shared-profiles).
pub(crate) fn print_resource_slices(args: &Args) -> Result<()> {
    let spec = args.emulated_gpus.as_deref().unwrap_or_default();
    let node = if args.node_name.is_empty() {
        "node"
    } else {
        &args.node_name
    };
    let gpus = emulated_inventory(args, spec, node)?;
    let (options, _) = SliceOptions::for_server(PRINTED_FOR, shared_profiles(args));
    let slices = resource_slices::desired_resource_slices(node, &gpus, options)?;
    let items: Vec<_> = slices.into_iter().map(|s| s.slice).collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    println!("{}", serde_json::to_string_pretty(&list)?);
    Ok(())
}

/// The server `--print-resource-slices` lays the slices out for.
const PRINTED_FOR: ServerVersion = ServerVersion {
    major: 1,
    minor: 37,
    patch: 0,
};
