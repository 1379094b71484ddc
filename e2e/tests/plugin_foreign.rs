//! A MIG instance DAS did not create (made with `nvidia-smi` while the plugin runs; here through
//! the emulated GPUs' control file) never leaves a pod stuck: the devices overlapping it are
//! withdrawn from the ResourceSlices, so a pod that needs that placement stays Pending with the
//! scheduler's reason (never ContainerCreating) and one that fits elsewhere runs; once the
//! instance is gone, the devices come back and the waiting pod runs.

use anyhow::{Context, Result, ensure};
use das_e2e::Cluster;
use das_e2e::das::{pool_devices, write_control};
use das_e2e::plugin::cluster_with_plugins;
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, create_pod, create_template, delete_pod, wait_node_event, wait_running,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use serde_json::json;

const NODE: &str = "n0";

#[tokio::test]
async fn devices_over_a_foreign_instance_are_withdrawn_until_it_is_gone() {
    let (cluster, _) = cluster_with_plugins(&[(NODE, "H100-80GB:1")]).await;
    let r = scenario(&cluster).await;
    cluster.check(r);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "whole", "7g.80gb", 1).await?;
    create_template(&c, "small", "1g.10gb", 1).await?;
    ensure!(
        published(&c)
            .await?
            .contains(&"gpu-0-mig-7g-80gb-0".to_string())
    );

    write_control(
        cluster.node(NODE),
        &json!({"foreignInstances": [{"gpu": 0, "profile": "1g.10gb", "start": 0}]}),
    )?;
    wait::until(
        "the devices over the foreign instance to be withdrawn",
        TIMEOUT,
        || async {
            let names = published(&c).await?;
            Ok((!names
                .iter()
                .any(|n| n == "gpu-0-mig-7g-80gb-0" || n == "gpu-0-mig-1g-10gb-0")
                && names.iter().any(|n| n == "gpu-0-mig-1g-10gb-1"))
            .then_some(()))
        },
    )
    .await?;
    wait_node_event(&c, NODE, "UnclaimedMigInstance", "no claim").await?;

    // The whole GPU cannot be had: Pending, never bound to the node.
    create_pod(&c, "whole", "whole", None).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    let why = wait::until("whole to be unschedulable", TIMEOUT, || async {
        let p = pods.get("whole").await?;
        Ok(p.status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            .and_then(|c| c.message))
    })
    .await?;
    let p = pods.get("whole").await?;
    ensure!(
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
        "not bound, so never stuck preparing: {why}"
    );
    // A slice that fits beside it runs.
    create_pod(&c, "small", "small", None).await?;
    wait_running(&c, "small").await?;

    // An administrator destroys the instance: the devices come back, and once the small pod
    // leaves, the whole GPU goes to the waiting pod.
    write_control(
        cluster.node(NODE),
        &json!({"destroyInstances": [{"gpu": 0, "start": 0}]}),
    )?;
    wait::until("the withdrawn devices to come back", TIMEOUT, || async {
        let names = published(&c).await?;
        Ok(names
            .iter()
            .any(|n| n == "gpu-0-mig-7g-80gb-0")
            .then_some(()))
    })
    .await?;
    wait_node_event(&c, NODE, "UnclaimedMigInstanceGone", "gone").await?;
    delete_pod(&c, "small").await?;
    wait_running(&c, "whole")
        .await
        .context("whole runs once the GPU is free")?;
    delete_pod(&c, "whole").await
}

/// Names of the devices published for the node.
async fn published(c: &Client) -> Result<Vec<String>> {
    Ok(pool_devices(c, NODE)
        .await?
        .into_iter()
        .map(|d| d.name)
        .collect())
}
