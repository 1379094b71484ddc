//! Device configuration (docs/design.md §3, "Device configuration"), end to end through the real
//! scheduler and kubelet: a claim whose config for `mig.das.com` does not decode fails to prepare
//! with the decoder's message in the pod's events and gets no slice; a valid `MigDeviceConfig`
//! and a config for another driver are accepted, and their pods run.

use anyhow::{Context, Result, ensure};
use das_e2e::Cluster;
use das_e2e::plugin::{cluster_with_plugins, live_slices};
use das_e2e::workload::{NS, create_pod, wait_pod_event_containing, wait_running};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

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
    template(&c, "bad", "mig.das.com", bad).await?;
    template(&c, "good", "mig.das.com", good).await?;
    template(&c, "other", "gpu.nvidia.com", json!({"not": "ours"})).await?;

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
            && msg.contains("unknown field `timeSlice`, expected `strategy` or `mps`"),
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

/// A ResourceClaimTemplate `name` asking for one `1g.10gb` slice, with an opaque config for
/// `driver` carrying `parameters`.
async fn template(c: &kube::Client, name: &str, driver: &str, parameters: Value) -> Result<()> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), NS);
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}],
            "config": [{"requests": ["mig"], "opaque": {"driver": driver, "parameters": parameters}}]
        }}}
    }))?;
    api.create(&PostParams::default(), &t)
        .await
        .with_context(|| format!("create template {name}"))?;
    Ok(())
}
