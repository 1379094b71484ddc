//! Filling a node: 2 × H100-80GB take exactly 14 `1g.10gb` slices (7 per GPU); the 15th pod stays
//! Pending until one is deleted, then runs.

use anyhow::{Result, ensure};
use das_e2e::Cluster;
use das_e2e::plugin::{cluster_with_plugins, live_slices};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_pod, create_template, delete_pod, phase, wait_running};

#[tokio::test]
async fn a_full_node_holds_back_the_next_pod_until_a_slice_frees() {
    let (cluster, _) = cluster_with_plugins(&[("n0", "H100-80GB:2")]).await;
    cluster.check(scenario(&cluster).await);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    for i in 0..14 {
        create_pod(&c, &format!("p{i}"), "one-1g", None).await?;
    }
    for i in 0..14 {
        wait_running(&c, &format!("p{i}")).await?;
    }
    let live = live_slices(cluster, "n0")?;
    ensure!(live.len() == 14, "14 slices expected: {live:?}");
    for gpu in 0..2 {
        ensure!(
            live.iter().filter(|s| s.0 == gpu).count() == 7,
            "7 per GPU: {live:?}"
        );
    }

    create_pod(&c, "p14", "one-1g", None).await?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(c.clone(), NS);
    wait::until("the 15th pod to be unschedulable", TIMEOUT, || async {
        let p = pods.get("p14").await?;
        let conds = p.status.and_then(|s| s.conditions).unwrap_or_default();
        Ok(conds
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False")
            .then_some(()))
    })
    .await?;
    ensure!(phase(&c, "p14").await? == "Pending");

    delete_pod(&c, "p3").await?;
    wait_running(&c, "p14").await?;
    ensure!(live_slices(cluster, "n0")?.len() == 14);
    Ok(())
}
