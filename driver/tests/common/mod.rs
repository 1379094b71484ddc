//! Shared set-up for the node plugin's end-to-end tests: a local cluster whose hollow nodes run
//! `das-kubelet-plugin` with emulated GPUs, and helpers to create pods that ask for MIG slices.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use das_e2e::das::{self, apply_device_classes};
use das_e2e::{Cluster, ClusterConfig, wait};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

#[allow(unused_imports)] // each test binary uses its own subset
pub use das_e2e::workload::{NS, claim_of, create_template, free_port, http_get, wait_running};
pub const T: Duration = Duration::from_secs(60);

/// Profiles the tests ask for (DeviceClasses are created for them).
pub const PROFILES: &[&str] = &[
    "1g.5gb", "1g.10gb", "1g.20gb", "2g.10gb", "2g.20gb", "3g.20gb", "3g.40gb", "4g.40gb",
    "7g.80gb",
];

/// The plugin binary built by cargo for this test.
pub fn plugin_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_das-kubelet-plugin"))
}

/// Component name of the plugin on `node`.
pub fn plugin_name(node: &str) -> String {
    format!("das-plugin-{node}")
}

/// Starts (or restarts) the plugin on `node` with emulated `gpus`; returns its metrics port.
pub fn start_plugin(cluster: &mut Cluster, node: &str, gpus: &str) -> Result<u16> {
    let n = cluster.node(node).clone();
    let port = free_port();
    let args = das::plugin_args(&n, gpus, &cluster.kubeconfig.clone(), port);
    cluster.spawn_program(&plugin_name(node), plugin_binary(), args)?;
    Ok(port)
}

/// Metrics port of the plugin on each node, as started by [`cluster_with_plugins`].
pub static METRICS_PORTS: std::sync::Mutex<Vec<(String, u16)>> = std::sync::Mutex::new(Vec::new());

/// A cluster with `nodes` = [(name, emulated GPUs)], DAS plugins on each, DeviceClasses, and
/// every node's ResourceSlices published.
pub async fn cluster_with_plugins(nodes: &[(&str, &str)]) -> Cluster {
    let names: Vec<&str> = nodes.iter().map(|(n, _)| *n).collect();
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&names))
        .await
        .expect("cluster starts");
    for (node, gpus) in nodes {
        let port = start_plugin(&mut cluster, node, gpus).expect("plugin starts");
        METRICS_PORTS.lock().unwrap().push((node.to_string(), port));
    }
    let client = cluster.client();
    let setup = async {
        apply_device_classes(&client, PROFILES).await?;
        for (node, _) in nodes {
            wait_published(&client, node).await?;
        }
        Ok(())
    };
    cluster.check(setup.await);
    cluster
}

/// Waits until `node`'s pool is complete: every slice of the newest generation is there.
pub async fn wait_published(client: &Client, node: &str) -> Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    wait::until(&format!("ResourceSlices of {node}"), T, || async {
        let lp = ListParams::default()
            .fields(&format!("spec.driver={},spec.nodeName={node}", das::DRIVER));
        let slices = api.list(&lp).await?.items;
        let Some(newest) = slices.iter().map(|s| s.spec.pool.generation).max() else {
            return Ok(None);
        };
        let current: Vec<_> = slices
            .into_iter()
            .filter(|s| s.spec.pool.generation == newest)
            .collect();
        let complete = current
            .first()
            .is_some_and(|s| s.spec.pool.resource_slice_count as usize == current.len());
        Ok(complete.then_some(current))
    })
    .await
}

/// Creates pod `name` with one container `app` using a claim from `template`, optionally pinned
/// to `node`.
pub async fn create_pod(
    client: &Client,
    name: &str,
    template: &str,
    node: Option<&str>,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut spec = json!({
        "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "mig"}]}}],
        "terminationGracePeriodSeconds": 0
    });
    if let Some(n) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": n});
    }
    let pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )?;
    api.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("create pod {name}"))?;
    Ok(())
}

/// Deletes pod `name` and waits until it is gone (its claim unprepared by the kubelet).
pub async fn delete_pod(client: &Client, name: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    api.delete(name, &DeleteParams::default().grace_period(0))
        .await?;
    wait::until(&format!("pod {name} to be gone"), T, || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// Live slices of the emulated GPUs on `node`: (gpu index, profile, start, MIG UUID).
pub fn live_slices(cluster: &Cluster, node: &str) -> Result<Vec<(u64, String, u64, String)>> {
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

/// Pod phase, or "" when unknown.
pub async fn phase(client: &Client, pod: &str) -> Result<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    Ok(api
        .get(pod)
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default())
}
