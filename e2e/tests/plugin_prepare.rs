//! End to end on the local cluster: pods ask for MIG slices through ResourceClaimTemplates, the
//! real scheduler picks placements from the plugin's ResourceSlices, the real kubelet DRA manager
//! calls the plugin, which carves the slices on emulated GPUs and writes CDI specs.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use das_api::claim_status::{DeviceStatusData, is_ready, our_device_status, our_results};
use das_driver::gpu::find_model;
use das_e2e::Cluster;
use das_e2e::das::{self, container_view};
use das_e2e::plugin::{cluster_with_plugins, live_slices};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, claim_of, create_pod, create_template, delete_pod, http_get, wait_running,
};

const H100: &str = "n0";
const A100: &str = "n1";

#[tokio::test]
async fn slices_are_carved_exposed_through_cdi_and_destroyed() {
    let (cluster, metrics_ports) =
        cluster_with_plugins(&[(H100, "H100-80GB:2"), (A100, "A100-SXM4-40GB:2")]).await;
    cluster.check(scenario(&cluster, &metrics_ports).await);
}

async fn scenario(cluster: &Cluster, metrics_ports: &BTreeMap<String, u16>) -> Result<()> {
    one_slice_with_cdi_and_status(cluster, metrics_ports).await?;
    three_slices_in_one_container(cluster).await?;
    deleted_pod_releases_its_slice(cluster).await?;
    a_claim_with_two_requests_gives_the_container_both_slices(cluster).await?;
    a_pod_deleted_during_a_slow_prepare_leaves_nothing(cluster).await?;
    large_profiles_share_or_need_an_empty_gpu(cluster).await?;
    mixed_profiles_share_a_gpu(cluster).await?;
    Ok(())
}

async fn one_slice_with_cdi_and_status(
    cluster: &Cluster,
    metrics_ports: &BTreeMap<String, u16>,
) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    create_pod(&c, "one", "one-1g", Some(H100)).await?;
    let pod = wait_running(&c, "one").await?;
    let uid = pod.metadata.uid.context("pod uid")?;
    let view = container_view(cluster.node(H100), &uid, "app")?;
    let live = live_slices(cluster, H100)?;
    ensure!(live.len() == 1, "one slice expected on {H100}: {live:?}");
    let (_, profile, _, mig) = &live[0];
    ensure!(profile == "1g.10gb");
    ensure!(
        view.mig_uuids() == [mig.clone()],
        "container env {:?}, live slice {mig}",
        view.env
    );
    // The NVIDIA runtime hook is told to add nothing: the CDI device nodes are the access.
    ensure!(view.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("void"));
    ensure!(!view.env.contains_key("CUDA_VISIBLE_DEVICES"));
    ensure!(
        view.device_nodes
            .iter()
            .any(|n| n.starts_with("/dev/nvidia-caps/")),
        "caps nodes: {:?}",
        view.device_nodes
    );

    // The claim's status says the device is ready and names the slice.
    let claim = claim_of(&c, "one").await?;
    let devices = claim
        .status
        .as_ref()
        .and_then(|s| s.devices.as_deref())
        .unwrap_or_default();
    ensure!(devices.len() == 1, "status.devices: {devices:?}");
    let result = our_results(&claim)
        .next()
        .context("no allocation result of mig.das.com")?;
    let status = our_device_status(&claim, &result.pool, &result.device)
        .with_context(|| format!("no status.devices entry for {result:?}: {devices:?}"))?;
    ensure!(is_ready(status), "device not Ready: {devices:?}");
    let data = DeviceStatusData::of(status).with_context(|| format!("status data {status:?}"))?;
    ensure!(data.mig_uuid == *mig, "status data {data:?}");

    // The plugin is ready and counts what it did.
    let port = *metrics_ports.get(H100).context("metrics port")?;
    ensure!(
        http_get(port, "/readyz").await?.0 == 200,
        "plugin not ready"
    );
    let (code, metrics) = http_get(port, "/metrics").await?;
    ensure!(code == 200);
    ensure!(
        metrics
            .contains(r#"das_kubelet_plugin_requests_total{method="prepare",result="success"} 1"#),
        "metrics:\n{metrics}"
    );
    ensure!(
        metrics.contains(r#"das_kubelet_plugin_prepared_slices{gpu="0"} 1"#),
        "metrics:\n{metrics}"
    );
    // The slice took GPU 0's whole-GPU placement away; GPU 1 still has it.
    for line in [
        r#"das_kubelet_plugin_free_placements{gpu="0",profile="7g.80gb"} 0"#,
        r#"das_kubelet_plugin_free_placements{gpu="1",profile="7g.80gb"} 1"#,
        r#"das_kubelet_plugin_free_placements{gpu="0",profile="1g.10gb"} 6"#,
    ] {
        ensure!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }

    // The plugin streams device health; the kubelet shows it in the pod's container status.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(c.clone(), NS);
    wait::until(
        "device health Healthy in the pod status",
        TIMEOUT,
        || async {
            let p = pods.get("one").await?;
            let statuses = p
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default();
            let healthy = statuses
                .iter()
                .flat_map(|cs| cs.allocated_resources_status.iter().flatten())
                .any(|r| {
                    // Keyed by the CDI device ID the plugin returned for the request.
                    r.resources.iter().flatten().any(|h| {
                        h.resource_id.starts_with("das.com/mig=")
                            && h.health.as_deref() == Some("Healthy")
                    })
                });
            Ok(healthy.then_some(()))
        },
    )
    .await?;
    Ok(())
}

async fn three_slices_in_one_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "three-1g", "1g.10gb", 3).await?;
    create_pod(&c, "three", "three-1g", Some(H100)).await?;
    let pod = wait_running(&c, "three").await?;
    let view = container_view(cluster.node(H100), &pod.metadata.uid.context("uid")?, "app")?;
    let uuids = view.mig_uuids();
    ensure!(uuids.len() == 3, "{uuids:?}");
    ensure!(
        view.cdi_devices.len() == 3,
        "one CDI device per slice: {view:?}"
    );
    let live: Vec<String> = live_slices(cluster, H100)?
        .into_iter()
        .map(|s| s.3)
        .collect();
    for u in &uuids {
        ensure!(
            live.iter().any(|l| l == u),
            "{u} is not a live slice: {live:?}"
        );
    }
    check_no_overlap(cluster, H100, "H100-80GB")
}

async fn deleted_pod_releases_its_slice(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let claim_uid = claim_of(&c, "one")
        .await?
        .metadata
        .uid
        .context("claim uid")?;
    let mig = live_slices(cluster, H100)?
        .into_iter()
        .map(|s| s.3)
        .collect::<Vec<_>>();
    delete_pod(&c, "one").await?;
    wait::until("the slice of pod one to be destroyed", TIMEOUT, || async {
        Ok((live_slices(cluster, H100)?.len() == mig.len() - 1).then_some(()))
    })
    .await?;
    let spec = das::PluginDirs::of(cluster.node(H100))
        .cdi
        .join(format!("das.com-mig_{claim_uid}.json"));
    wait::until("the CDI spec of pod one to be deleted", TIMEOUT, || async {
        Ok((!spec.exists()).then_some(()))
    })
    .await?;
    delete_pod(&c, "three").await?;
    wait::until("every slice on n0 to be destroyed", TIMEOUT, || async {
        Ok(live_slices(cluster, H100)?.is_empty().then_some(()))
    })
    .await
}

/// One claim, two requests of different profiles: the container gets one CDI device per slice
/// and sees both MIG UUIDs (no environment key set twice).
async fn a_claim_with_two_requests_gives_the_container_both_slices(
    cluster: &Cluster,
) -> Result<()> {
    let c = cluster.client();
    let templates: kube::Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        kube::Api::namespaced(c.clone(), NS);
    let t = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-requests"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "small", "exactly": {"deviceClassName": das_api::profile_device_class("1g.10gb")}},
            {"name": "big", "exactly": {"deviceClassName": das_api::profile_device_class("3g.40gb")}}
        ]}}}
    }))?;
    templates.create(&Default::default(), &t).await?;
    create_pod(&c, "two-req", "two-requests", Some(H100)).await?;
    let pod = wait_running(&c, "two-req").await?;
    let view = container_view(cluster.node(H100), &pod.metadata.uid.context("uid")?, "app")?;
    let mut live: Vec<String> = live_slices(cluster, H100)?
        .into_iter()
        .map(|s| s.3)
        .collect();
    live.sort();
    ensure!(
        view.mig_uuids() == live,
        "container sees {:?}, live {live:?}",
        view.mig_uuids()
    );
    ensure!(view.cdi_devices.len() == 2, "{view:?}");
    ensure!(
        view.device_nodes
            .iter()
            .filter(|n| n.starts_with("/dev/nvidia-caps/"))
            .count()
            == 4,
        "a GI and a CI capability node per slice: {:?}",
        view.device_nodes
    );
    delete_pod(&c, "two-req").await?;
    wait::until("the two slices to be destroyed", TIMEOUT, || async {
        Ok(live_slices(cluster, H100)?.is_empty().then_some(()))
    })
    .await
}

/// The emulated GPUs' creates are slowed (control file); the pod is force-deleted while its
/// prepare runs: the prepare finishes, the kubelet's unprepare follows, and neither a slice nor
/// a CDI spec nor a checkpoint record is left.
async fn a_pod_deleted_during_a_slow_prepare_leaves_nothing(cluster: &Cluster) -> Result<()> {
    use das_driver::gpu::emulated::{Control, LatencyMs};
    let c = cluster.client();
    let dirs = das::PluginDirs::of(cluster.node(H100));
    let emulated = dirs.state.join("emulated");
    Control {
        latency_ms: LatencyMs {
            create: 3000,
            ..LatencyMs::default()
        },
        ..Default::default()
    }
    .write(&emulated)?;
    create_pod(&c, "slow", "one-1g", Some(H100)).await?;
    let checkpoint = dirs.state.join("checkpoint.json");
    wait::until("the prepare to start", TIMEOUT, || async {
        let text = std::fs::read_to_string(&checkpoint).unwrap_or_default();
        Ok(text.contains("PrepareStarted").then_some(()))
    })
    .await?;
    let claim_uid = claim_of(&c, "slow")
        .await?
        .metadata
        .uid
        .context("claim uid")?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(c.clone(), NS);
    pods.delete("slow", &kube::api::DeleteParams::default().grace_period(0))
        .await?;
    Control::default().write(&emulated)?;
    wait::until("pod slow to be gone", TIMEOUT, || async {
        Ok(pods.get_opt("slow").await?.is_none().then_some(()))
    })
    .await?;
    let spec = dirs.cdi.join(format!("das.com-mig_{claim_uid}.json"));
    wait::until(
        "no slice, CDI spec or record of the deleted pod",
        TIMEOUT,
        || async {
            let text = std::fs::read_to_string(&checkpoint).unwrap_or_default();
            let clean = live_slices(cluster, H100)?.is_empty()
                && !spec.exists()
                && !text.contains(&claim_uid);
            Ok(clean.then_some(()))
        },
    )
    .await
}

/// 4g.40gb and 3g.40gb fit together on one H100; 7g.80gb only goes to an empty GPU.
async fn large_profiles_share_or_need_an_empty_gpu(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    for (t, p) in [
        ("t-4g", "4g.40gb"),
        ("t-3g", "3g.40gb"),
        ("t-7g", "7g.80gb"),
    ] {
        create_template(&c, t, p, 1).await?;
    }
    create_pod(&c, "big-4g", "t-4g", Some(H100)).await?;
    wait_running(&c, "big-4g").await?;
    create_pod(&c, "big-3g", "t-3g", Some(H100)).await?;
    wait_running(&c, "big-3g").await?;
    let live = live_slices(cluster, H100)?;
    let gpu_of = |p: &str| live.iter().find(|s| s.1 == p).map(|s| s.0);
    ensure!(
        gpu_of("4g.40gb") == gpu_of("3g.40gb"),
        "4g and 3g should share a GPU: {live:?}"
    );
    create_pod(&c, "big-7g", "t-7g", Some(H100)).await?;
    wait_running(&c, "big-7g").await?;
    let live = live_slices(cluster, H100)?;
    let g7 = live.iter().find(|s| s.1 == "7g.80gb").map(|s| s.0);
    ensure!(
        live.iter().filter(|s| Some(s.0) == g7).count() == 1,
        "7g must be alone on its GPU: {live:?}"
    );
    // No empty GPU is left: a second 7g cannot be placed.
    create_pod(&c, "big-7g-2", "t-7g", Some(H100)).await?;
    wait_unschedulable(&c, "big-7g-2").await?;
    check_no_overlap(cluster, H100, "H100-80GB")?;
    for p in ["big-4g", "big-3g", "big-7g", "big-7g-2"] {
        delete_pod(&c, p).await?;
    }
    Ok(())
}

async fn mixed_profiles_share_a_gpu(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    for (t, p) in [
        ("a-1g5", "1g.5gb"),
        ("a-2g", "2g.10gb"),
        ("a-3g", "3g.20gb"),
    ] {
        create_template(&c, t, p, 1).await?;
    }
    for (pod, t) in [
        ("m-3g", "a-3g"),
        ("m-2g", "a-2g"),
        ("m-1g", "a-1g5"),
        ("m-1g-b", "a-1g5"),
    ] {
        create_pod(&c, pod, t, Some(A100)).await?;
    }
    for pod in ["m-3g", "m-2g", "m-1g", "m-1g-b"] {
        wait_running(&c, pod).await?;
    }
    let live = live_slices(cluster, A100)?;
    let mut per_gpu: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for s in &live {
        per_gpu.entry(s.0).or_default().push(&s.1);
    }
    ensure!(
        per_gpu
            .values()
            .any(|ps| ps.iter().collect::<std::collections::BTreeSet<_>>().len() >= 2),
        "some GPU should hold several profiles: {per_gpu:?}"
    );
    check_no_overlap(cluster, A100, "A100-SXM4-40GB")
}

/// Waits for the scheduler to report pod `name` unschedulable.
async fn wait_unschedulable(c: &kube::Client, name: &str) -> Result<()> {
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(c.clone(), NS);
    wait::until(
        &format!("pod {name} to be unschedulable"),
        TIMEOUT,
        || async {
            let p = api.get(name).await?;
            let unschedulable = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                });
            Ok(unschedulable.then_some(()))
        },
    )
    .await
}

/// No two live slices on one GPU share a memory slice.
fn check_no_overlap(cluster: &Cluster, node: &str, model: &str) -> Result<()> {
    let m = find_model(model)?.with_context(|| format!("model {model}"))?;
    let mut used: BTreeMap<u64, u64> = BTreeMap::new();
    for (gpu, profile, start, _) in live_slices(cluster, node)? {
        let (_, p) = m
            .profile(&profile)
            .with_context(|| format!("profile {profile}"))?;
        let mask = ((1u64 << p.placement_size) - 1) << start;
        let u = used.entry(gpu).or_default();
        ensure!(
            *u & mask == 0,
            "{profile} at {start} on GPU {gpu} overlaps another slice"
        );
        *u |= mask;
    }
    Ok(())
}
