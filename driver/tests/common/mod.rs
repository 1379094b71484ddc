//! Shared set-up for the node plugin's end-to-end tests: a local cluster whose hollow nodes run
//! `das-kubelet-plugin` with emulated GPUs, and helpers to create pods that ask for MIG slices.

#![allow(dead_code)] // each test binary uses a different subset

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use das_e2e::das::{self, apply_device_classes};
use das_e2e::{Cluster, ClusterConfig, wait};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

pub const NS: &str = "default";
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// `GET http://127.0.0.1:<port><path>` over HTTP/1.0: (status code, body).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("HTTP status line")?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
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

/// Creates ResourceClaimTemplate `name` asking for `count` slices of `profile`.
pub async fn create_template(client: &Client, name: &str, profile: &str, count: u32) -> Result<()> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let class = format!("{}.{}", profile.replace('+', "-"), das::DRIVER);
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": class, "allocationMode": "ExactCount", "count": count}}]}}}
    }))?;
    api.create(&PostParams::default(), &t)
        .await
        .with_context(|| format!("create template {name}"))?;
    Ok(())
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

/// Waits until pod `name` runs; returns it.
pub async fn wait_running(client: &Client, name: &str) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait::until(
        &format!("pod {name} to run"),
        Duration::from_secs(90),
        || async {
            let p = api.get(name).await?;
            Ok(
                (p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .then_some(p),
            )
        },
    )
    .await
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

/// The ResourceClaim generated for pod `name`.
pub async fn claim_of(client: &Client, pod: &str) -> Result<ResourceClaim> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let p = pods.get(pod).await?;
    let claim = p
        .status
        .and_then(|s| s.resource_claim_statuses)
        .and_then(|v| v.into_iter().next())
        .and_then(|s| s.resource_claim_name)
        .context("pod has no generated claim")?;
    Ok(Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(&claim)
        .await?)
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
