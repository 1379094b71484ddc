//! Device configuration (docs/design.md §3, "Device configuration"), end to end through the real
//! scheduler and kubelet: a claim whose config for `mig.das.com` does not decode fails to prepare
//! with the decoder's message in the pod's events and gets no slice; a valid `MigDeviceConfig`
//! and a config for another driver are accepted, and their pods run.

use anyhow::{Result, ensure};
use das_e2e::Cluster;
use das_e2e::plugin::{cluster_with_plugins, live_slices};
use das_e2e::workload::{
    create_config_template, create_pod, wait_pod_event_containing, wait_running,
};
use serde_json::json;

const NODE: &str = "n0";

#[tokio::test]
async fn device_configs_are_decoded_strictly_and_other_drivers_ignored() {
    let (cluster, _) = cluster_with_plugins(&[(NODE, "H100-80GB:1")]).await;
    cluster.check(scenario(&cluster).await);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let bad = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "Exclusive", "timeSlice": "1ms"}});
    let good = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "Exclusive"}});
    create_config_template(&c, "bad", "mig.das.com", bad).await?;
    create_config_template(&c, "good", "mig.das.com", good).await?;
    create_config_template(&c, "other", "gpu.nvidia.com", json!({"not": "ours"})).await?;

    create_pod(&c, "bad", "bad", None).await?;
    let msg = wait_pod_event_containing(
        &c,
        "bad",
        "FailedPrepareDynamicResources",
        "device configuration for mig.das.com",
    )
    .await?;
    ensure!(
        msg.contains("device configuration for mig.das.com")
            && msg.contains(
                "unknown field `timeSlice`, expected one of `strategy`, `mps`, `timeSlicing`"
            ),
        "bad's event does not give the decoder's message: {msg}"
    );
    ensure!(
        live_slices(cluster, NODE)?.is_empty(),
        "a slice was made for a claim whose config is invalid"
    );
    for pod in ["good", "other"] {
        create_pod(&c, pod, pod, None).await?;
        wait_running(&c, pod).await?;
    }
    Ok(())
}
