//! GPU health on the local cluster (emulated GPUs, faults through the plugin's control file):
//! a fatal XID taints every device of its GPU in the published ResourceSlices, the scheduler
//! keeps new pods off it (a pod whose claim tolerates the taint still lands), running pods see
//! `Unhealthy` in `allocatedResourcesStatus`, and the taint goes after the quiet period. With
//! `--health-evict-on-fatal` the real taint eviction controller evicts the pod on the GPU and
//! its slice is destroyed. A non-fatal XID changes only a metric and an event. A lost GPU does
//! not stop the other GPU from serving prepares and unprepares.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use das_api::health_taints;
use das_e2e::Cluster;
use das_e2e::das::{DRIVER, pool_devices, write_control};
use das_e2e::plugin::{cluster_with_configured_plugins, live_slices};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, claim_of, create_pod, create_template, delete_pod, device_health, http_get, phase,
    wait_node_event, wait_running,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

/// Taints `NoSchedule`; a quiet period long enough for the steps taken while tainted.
const SCHED: &str = "n0";
/// Taints `NoExecute`.
const EVICT: &str = "n1";
const GPUS: &str = "H100-80GB:2";
const SCHED_FLAGS: &[&str] = &["--health-quiet-period-seconds=20"];
const EVICT_FLAGS: &[&str] = &[
    "--health-quiet-period-seconds=10",
    "--health-evict-on-fatal=true",
];

#[tokio::test]
async fn gpu_faults_taint_devices_evict_when_asked_and_clear_on_recovery() {
    let (cluster, ports) =
        cluster_with_configured_plugins(&[(SCHED, GPUS, SCHED_FLAGS), (EVICT, GPUS, EVICT_FLAGS)])
            .await;
    let r = async {
        let c = cluster.client();
        create_template(&c, "whole", "7g.80gb", 1).await?;
        create_template(&c, "small", "1g.10gb", 1).await?;
        tolerating_template(&c, "whole-tolerant", "7g.80gb").await?;
        for gpu in [0, 1] {
            pinned_template(&c, &format!("small-gpu{gpu}"), "1g.10gb", gpu).await?;
        }
        tokio::try_join!(
            no_schedule_then_lost(&cluster, ports[SCHED]),
            no_execute_evicts(&cluster, ports[EVICT]),
        )?;
        Ok(())
    }
    .await;
    cluster.check(r);
}

/// Node [`SCHED`]: a fatal XID on GPU 0, a non-fatal one on GPU 1, recovery, then GPU 0 lost
/// while a pod holds it.
async fn no_schedule_then_lost(cluster: &Cluster, port: u16) -> Result<()> {
    let c = cluster.client();
    let fatal = json!({"xidEvents": [{"gpu": 0, "xid": 79}]});
    write_control(cluster.node(SCHED), &fatal)?;
    let want = vec![taint(health_taints::XID, "79", "NoSchedule")];
    wait_taints(&c, SCHED, |t| {
        gpu_taints(t, 0) == [want.clone()] && gpu_taints(t, 1).is_empty()
    })
    .await?;
    wait_node_event(&c, SCHED, "GpuUnhealthy", "XID 79").await?;
    let metrics = metrics(port).await?;
    for line in [
        r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 0"#,
        r#"das_kubelet_plugin_gpu_healthy{gpu="1"} 1"#,
        r#"das_kubelet_plugin_xid_events_total{gpu="0",xid="79",fatal="true"} 1"#,
    ] {
        ensure!(metrics.contains(line), "{line} missing in\n{metrics}");
    }

    // A pod for a whole GPU lands on the healthy one; the next finds none and waits with the
    // scheduler's reason; one that tolerates the taint lands on the tainted GPU.
    create_pod(&c, "whole-a", "whole", Some(SCHED)).await?;
    wait_running(&c, "whole-a").await?;
    ensure!(
        gpu_of(&c, "whole-a").await? == 1,
        "whole-a avoids the tainted GPU"
    );
    create_pod(&c, "whole-b", "whole", Some(SCHED)).await?;
    let why = wait_unschedulable(&c, "whole-b").await?;
    refresh(cluster, SCHED, &fatal)?;
    create_pod(&c, "tolerant", "whole-tolerant", Some(SCHED)).await?;
    wait_running(&c, "tolerant").await?;
    ensure!(
        gpu_of(&c, "tolerant").await? == 0,
        "tolerant lands on GPU 0"
    );
    ensure!(
        phase(&c, "whole-b").await? == "Pending",
        "whole-b waits: {why}"
    );
    // The health stream: the kubelet shows the device Unhealthy in the running pod's status.
    wait::until(
        "tolerant's device Unhealthy in its status",
        TIMEOUT,
        || async { Ok((device_health(&c, "tolerant").await? == ["Unhealthy"]).then_some(())) },
    )
    .await?;

    // A non-fatal (application) XID: a metric and an event, no taint.
    write_control(
        cluster.node(SCHED),
        &json!({"xidEvents": [{"gpu": 1, "xid": 13}]}),
    )?;
    wait_node_event(&c, SCHED, "GpuXid", "XID 13").await?;
    let metrics = self::metrics(port).await?;
    ensure!(
        metrics
            .contains(r#"das_kubelet_plugin_xid_events_total{gpu="1",xid="13",fatal="false"} 1"#)
            && metrics.contains(r#"das_kubelet_plugin_gpu_healthy{gpu="1"} 1"#),
        "{metrics}"
    );
    ensure!(gpu_taints(&published_taints(&c, SCHED).await?, 1).is_empty());

    // Recovery after the quiet period: the taints go, and whole-b lands on GPU 0 once the
    // tolerant pod leaves it.
    wait_taints(&c, SCHED, |t| t.is_empty()).await?;
    wait_node_event(&c, SCHED, "GpuRecovered", "GPU 0").await?;
    wait::until("tolerant's device Healthy again", TIMEOUT, || async {
        Ok((device_health(&c, "tolerant").await? == ["Healthy"]).then_some(()))
    })
    .await?;
    delete_pod(&c, "tolerant").await?;
    wait_running(&c, "whole-b").await?;
    ensure!(gpu_of(&c, "whole-b").await? == 0);

    // GPU 0 lost while whole-b holds it: its devices are tainted gpu-lost, and GPU 1 keeps
    // serving unprepares and prepares.
    write_control(cluster.node(SCHED), &json!({"lostGpus": [0]}))?;
    let lost = vec![taint(health_taints::GPU_LOST, "true", "NoSchedule")];
    wait_taints(&c, SCHED, |t| gpu_taints(t, 0) == [lost.clone()]).await?;
    delete_pod(&c, "whole-a").await?;
    wait_no_slice_on(cluster, SCHED, 1).await?;
    create_pod(&c, "small-on-1", "small", Some(SCHED)).await?;
    wait_running(&c, "small-on-1").await?;
    ensure!(gpu_of(&c, "small-on-1").await? == 1);
    delete_pod(&c, "small-on-1").await?;
    wait_no_slice_on(cluster, SCHED, 1).await?;
    ensure!(
        phase(&c, "whole-b").await? == "Running",
        "NoSchedule evicts nothing"
    );
    write_control(cluster.node(SCHED), &json!({}))?;
    wait_taints(&c, SCHED, |t| t.is_empty()).await?;
    delete_pod(&c, "whole-b").await?;
    wait_no_slice_on(cluster, SCHED, 0).await?;
    Ok(())
}

/// Node [`EVICT`]: a fatal XID on GPU 0 evicts the pod there (not the one on GPU 1) and its
/// slice is destroyed.
async fn no_execute_evicts(cluster: &Cluster, port: u16) -> Result<()> {
    let c = cluster.client();
    create_pod(&c, "victim", "small-gpu0", Some(EVICT)).await?;
    create_pod(&c, "bystander", "small-gpu1", Some(EVICT)).await?;
    wait_running(&c, "victim").await?;
    wait_running(&c, "bystander").await?;
    let victim_uuid = mig_uuid_of(&c, "victim").await?;
    ensure!(
        live_slices(cluster, EVICT)?
            .iter()
            .any(|s| s.3 == victim_uuid)
    );

    write_control(
        cluster.node(EVICT),
        &json!({"xidEvents": [{"gpu": 0, "xid": 48}]}),
    )?;
    let want = vec![taint(health_taints::XID, "48", "NoExecute")];
    wait_taints(&c, EVICT, |t| gpu_taints(t, 0) == [want.clone()]).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    wait::until(
        "the taint eviction controller to evict victim",
        TIMEOUT,
        || async { Ok(pods.get_opt("victim").await?.is_none().then_some(())) },
    )
    .await?;
    wait::until("victim's slice to be destroyed", TIMEOUT, || async {
        Ok((!live_slices(cluster, EVICT)?
            .iter()
            .any(|s| s.3 == victim_uuid))
        .then_some(()))
    })
    .await?;
    ensure!(
        phase(&c, "bystander").await? == "Running",
        "the pod on the healthy GPU stays"
    );
    let metrics = metrics(port).await?;
    ensure!(
        metrics.contains(r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 0"#),
        "{metrics}"
    );
    wait_taints(&c, EVICT, |t| t.is_empty()).await?;
    delete_pod(&c, "bystander").await?;
    Ok(())
}

/// Writes `control` again with different bytes, which raises its events once more (so the
/// quiet period starts over).
fn refresh(cluster: &Cluster, node: &str, control: &Value) -> Result<()> {
    let mut again = control.clone();
    again["lostGpus"] = json!([]);
    write_control(cluster.node(node), &again)
}

/// A template for one `profile` device that tolerates every DAS health taint.
async fn tolerating_template(c: &Client, name: &str, profile: &str) -> Result<()> {
    let tolerations: Vec<Value> = [
        health_taints::XID,
        health_taints::GPU_LOST,
        health_taints::ECC,
    ]
    .iter()
    .map(|k| json!({"key": k, "operator": "Exists"}))
    .collect();
    template(
        c,
        name,
        json!({
        "deviceClassName": das_api::profile_device_class(profile),
        "tolerations": tolerations}),
    )
    .await
}

/// A template for one `profile` device on GPU `gpu` (a CEL selector on `gpuIndex`).
async fn pinned_template(c: &Client, name: &str, profile: &str, gpu: u32) -> Result<()> {
    template(
        c,
        name,
        json!({
        "deviceClassName": das_api::profile_device_class(profile),
        "selectors": [{"cel": {"expression":
            format!("device.attributes['{DRIVER}'].gpuIndex == {gpu}")}}]}),
    )
    .await
}

async fn template(c: &Client, name: &str, exactly: Value) -> Result<()> {
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}}
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &t)
        .await
        .with_context(|| format!("create template {name}"))?;
    Ok(())
}

/// A taint as (key, value, effect).
type Taint = (String, String, String);

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    (key.into(), value.into(), effect.into())
}

/// The taints of every tainted device of `node`'s pool, by device name.
async fn published_taints(c: &Client, node: &str) -> Result<BTreeMap<String, Vec<Taint>>> {
    Ok(pool_devices(c, node)
        .await?
        .iter()
        .filter_map(|d| {
            let t = d.taints.as_ref().filter(|t| !t.is_empty())?;
            let t = t
                .iter()
                .map(|t| taint(&t.key, t.value.as_deref().unwrap_or(""), &t.effect))
                .collect();
            Some((d.name.clone(), t))
        })
        .collect())
}

/// The distinct taint lists on the devices of GPU `gpu` (device names `gpu-<index>-…`); empty
/// when none is tainted.
fn gpu_taints(taints: &BTreeMap<String, Vec<Taint>>, gpu: u32) -> Vec<Vec<Taint>> {
    let mut lists: Vec<Vec<Taint>> = taints
        .iter()
        .filter(|(d, _)| d.starts_with(&format!("gpu-{gpu}-")))
        .map(|(_, t)| t.clone())
        .collect();
    lists.dedup();
    lists
}

async fn wait_taints(
    c: &Client,
    node: &str,
    ok: impl Fn(&BTreeMap<String, Vec<Taint>>) -> bool,
) -> Result<()> {
    let r = wait::until(&format!("the taints wanted on {node}"), TIMEOUT, || async {
        Ok(ok(&published_taints(c, node).await?).then_some(()))
    })
    .await;
    if r.is_err() {
        let last = published_taints(c, node).await.unwrap_or_default();
        return r.with_context(|| format!("taints on {node} now: {last:?}"));
    }
    r
}

/// The GPU index of pod `pod`'s (first) allocated device.
async fn gpu_of(c: &Client, pod: &str) -> Result<u32> {
    let claim = claim_of(c, pod).await?;
    let device = das_api::claim_status::our_results(&claim)
        .next()
        .context("no device allocated")?
        .device
        .clone();
    device
        .strip_prefix("gpu-")
        .and_then(|d| d.split('-').next())
        .and_then(|i| i.parse().ok())
        .with_context(|| format!("device name {device}"))
}

/// The MIG UUID the plugin reported for pod `pod`'s device.
async fn mig_uuid_of(c: &Client, pod: &str) -> Result<String> {
    let claim = claim_of(c, pod).await?;
    claim
        .status
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .find_map(das_api::claim_status::DeviceStatusData::of)
        .map(|d| d.mig_uuid)
        .context("no device status")
}

/// Waits until the scheduler marks `pod` unschedulable; returns its message.
async fn wait_unschedulable(c: &Client, pod: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    wait::until(&format!("{pod} to be unschedulable"), TIMEOUT, || async {
        let p = pods.get(pod).await?;
        Ok(p.status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .filter(|c| c.reason.as_deref() == Some("Unschedulable"))
            .and_then(|c| c.message))
    })
    .await
}

async fn metrics(port: u16) -> Result<String> {
    let (code, body) = http_get(port, "/metrics").await?;
    ensure!(code == 200, "/metrics answered {code}");
    Ok(body)
}

/// Waits until no MIG instance is left on GPU `gpu` of `node`.
async fn wait_no_slice_on(cluster: &Cluster, node: &str, gpu: u64) -> Result<()> {
    wait::until(
        &format!("no slice on GPU {gpu} of {node}"),
        Duration::from_secs(30),
        || async { Ok((!live_slices(cluster, node)?.iter().any(|s| s.0 == gpu)).then_some(())) },
    )
    .await
}
