//! The node plugin on the test cluster as its own cluster tests run it (`e2e/tests/plugin_*.rs`):
//! `das-kubelet-plugin` started directly with flags (admin kubeconfig, emulated GPUs) on hollow
//! nodes, the chart's DeviceClasses, and what the emulated GPUs hold. [`crate::install`] starts
//! DAS as the Helm chart configures it instead.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use crate::binaries::DasBinary;
use crate::cluster::{Cluster, ClusterConfig};
use crate::das::{self, apply_device_classes, wait_pool_complete};
use crate::workload::free_port;

/// Profiles the tests ask for (DeviceClasses are created for them).
pub const PROFILES: &[&str] = &[
    "1g.5gb", "1g.10gb", "1g.20gb", "2g.10gb", "2g.20gb", "3g.20gb", "3g.40gb", "4g.40gb",
    "7g.80gb",
];

/// Component name of the plugin on `node`.
pub fn plugin_name(node: &str) -> String {
    format!("das-plugin-{node}")
}

/// Starts (or restarts) the plugin (the debug build, see [`DasBinary::debug`]) on `node` with
/// emulated `gpus`; returns its metrics port.
pub fn start_plugin(cluster: &mut Cluster, node: &str, gpus: &str) -> Result<u16> {
    start_plugin_with(cluster, node, gpus, &[])
}

/// [`start_plugin`] with `extra` flags after the usual ones.
pub fn start_plugin_with(
    cluster: &mut Cluster,
    node: &str,
    gpus: &str,
    extra: &[&str],
) -> Result<u16> {
    let n = cluster.node(node).clone();
    let port = free_port();
    let mut args = das::plugin_args(&n, gpus, &cluster.kubeconfig.clone(), port);
    args.extend(extra.iter().map(|a| a.to_string()));
    cluster.spawn_program(&plugin_name(node), &DasBinary::Plugin.debug()?, args)?;
    Ok(port)
}

/// A cluster with `nodes` = [(name, emulated GPUs)], a DAS plugin on each, the DeviceClasses of
/// [`PROFILES`], and every node's pool of ResourceSlices complete. Returns the cluster and the
/// metrics port of each node's plugin.
pub async fn cluster_with_plugins(nodes: &[(&str, &str)]) -> (Cluster, BTreeMap<String, u16>) {
    let nodes: Vec<(&str, &str, &[&str])> = nodes.iter().map(|(n, g)| (*n, *g, &[][..])).collect();
    cluster_with_configured_plugins(&nodes).await
}

/// [`cluster_with_plugins`] with extra plugin flags per node: `nodes` = [(name, emulated GPUs,
/// flags)].
pub async fn cluster_with_configured_plugins(
    nodes: &[(&str, &str, &[&str])],
) -> (Cluster, BTreeMap<String, u16>) {
    let names: Vec<&str> = nodes.iter().map(|(n, _, _)| *n).collect();
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&names))
        .await
        .expect("cluster starts");
    let mut metrics_ports = BTreeMap::new();
    for (node, gpus, flags) in nodes {
        let port = start_plugin_with(&mut cluster, node, gpus, flags).expect("plugin starts");
        metrics_ports.insert(node.to_string(), port);
    }
    let client = cluster.client();
    let setup = async {
        apply_device_classes(&client, PROFILES).await?;
        for (node, _, _) in nodes {
            wait_pool_complete(&client, node).await?;
        }
        Ok(())
    };
    cluster.check(setup.await);
    (cluster, metrics_ports)
}

/// A live MIG instance on an emulated GPU: (GPU index, profile, placement start, MIG UUID).
pub type LiveSlice = (u64, String, u64, String);

/// The live MIG instances of the emulated GPUs on `node` (their state file).
pub fn live_slices(cluster: &Cluster, node: &str) -> Result<Vec<LiveSlice>> {
    let state = das::emulated_state(cluster.node(node))?;
    let mut out = Vec::new();
    for g in state["gpus"].as_array().context("gpus")? {
        for i in g["instances"].as_array().context("instances")? {
            out.push((
                g["index"].as_u64().unwrap_or_default(),
                i["profile"].as_str().unwrap_or_default().to_string(),
                i["start"].as_u64().unwrap_or_default(),
                i["migUuid"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    Ok(out)
}
