//! docs/examples on a cluster with DAS installed from the chart ([`crate::install::install`] with
//! the webhook and the controller): every example pod runs with exactly its slices, the legacy
//! pod through the webhook, and no component was refused by the chart's RBAC. The chart's test
//! and the compatibility subset (`e2e/tests/compat.rs`, every supported Kubernetes) share it.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use das_api::allocation::{AllocationClaim, AllocationState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

use crate::{Cluster, chart, wait};

/// Longer than [`wait::TIMEOUT`]: one wait covers every example pod on two nodes coming up at
/// once, the webhook's translation and the controller's AllocationClaims.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// The example pods (`kubectl apply -f docs/examples`): one-slice, multi-slice, the inference
/// Deployment's two replicas and legacy-slice.
pub const PODS: usize = 5;

/// Applies docs/examples, waits for the pods, and checks what each got.
pub async fn apply_and_check(cluster: &Cluster) -> Result<()> {
    let dir = crate::paths::workspace_root().join("docs/examples");
    chart::kubectl(
        &cluster.kubeconfig,
        &["apply", "-f", &dir.display().to_string()],
        None,
    )?;
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // one-slice (1) + multi-slice (3) + inference Deployment (2 × 1) + legacy-slice (1).
    let running = wait::until("every example pod to run", TIMEOUT, || async {
        let list = pods.list(&Default::default()).await?.items;
        let running = list
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        Ok((list.len() == PODS && running == PODS).then_some(list))
    })
    .await?;

    // The legacy pod was translated by the webhook into a claim of the 1g.5gb class.
    let legacy = running
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("legacy-slice"))
        .context("legacy-slice")?;
    let claims = legacy
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default();
    ensure!(
        claims.len() == 1
            && claims[0].resource_claim_template_name.as_deref() == Some("das-mig-1g-5gb-x1"),
        "legacy pod not translated: {claims:?}"
    );

    // Every device was prepared by a plugin running under the chart's RBAC: its status is on
    // the claim (resourceclaims/status + the 1.36 associated-node verbs), and the controller
    // (chart RBAC too) mirrors it as inUse.
    let all_claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    wait::until(
        "every claim's devices reported by the plugin",
        TIMEOUT,
        || async {
            let list = all_claims.list(&Default::default()).await?.items;
            let devices: usize = list
                .iter()
                .map(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.devices.as_ref())
                        .map_or(0, Vec::len)
                })
                .sum();
            Ok((list.len() == PODS && devices == 7).then_some(()))
        },
    )
    .await?;
    let allocs: Api<AllocationClaim> = Api::namespaced(client, "default");
    wait::until("7 AllocationClaims inUse", TIMEOUT, || async {
        let list = allocs.list(&Default::default()).await?.items;
        let in_use = list
            .iter()
            .filter(|a| {
                a.status
                    .as_ref()
                    .is_some_and(|s| s.state == AllocationState::InUse)
            })
            .count();
        Ok((list.len() == 7 && in_use == 7).then_some(()))
    })
    .await?;

    // Emulated GPUs from the chart: CDI specs carry the MIG UUIDs but no device nodes, so a
    // real runtime on a node without NVIDIA devices would start the containers.
    let mut specs = Vec::new();
    for node in ["n0", "n1"] {
        specs.extend(crate::das::load_specs(
            &crate::das::PluginDirs::of(cluster.node(node)).cdi,
        )?);
    }
    ensure!(
        specs.len() == PODS,
        "{} CDI specs for {PODS} claims",
        specs.len()
    );
    for spec in &specs {
        ensure!(
            spec["containerEdits"]["deviceNodes"].is_null(),
            "device nodes in {spec}"
        );
        for device in spec["devices"].as_array().into_iter().flatten() {
            let edits = &device["containerEdits"];
            ensure!(edits["deviceNodes"].is_null(), "device nodes in {spec}");
            ensure!(
                edits["env"].to_string().contains("=MIG-"),
                "no MIG UUID in {spec}"
            );
        }
    }

    // Nothing a component tried was refused: the chart's RBAC covers every call they make
    // (a missing verb shows up as a logged 403 even where the component recovers).
    for name in [
        "das-plugin-n0",
        "das-plugin-n1",
        "das-controller",
        "das-webhook",
    ] {
        let log = std::fs::read_to_string(cluster.log_of(name))?;
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
            .collect();
        ensure!(refused.is_empty(), "{name} was refused: {refused:#?}");
    }
    Ok(())
}
