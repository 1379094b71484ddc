//! GPUs without MIG (docs/design.md §7, "Whole GPUs"; issue 43 item 1), end to end on the local
//! cluster: one node with an emulated L4 (GPU 0, no MIG) and an H100 with MIG mode on (GPU 1),
//! the plugin run with `--whole-gpus`, the chart's cluster objects rendered with
//! `wholeGpus.enabled` and `webhook.translateWholeGpus`, and das-controller and das-webhook as
//! the chart configures them.
//!
//! The L4 is published as `gpu-0` alone, first, with NVIDIA's full-GPU attributes (`Ada
//! Lovelace`, `resource.kubernetes.io/numaNode`, …), `memory` and `multiprocessors`, and a
//! counter set of `memory` and one memory slice; the H100 as MIG devices alone. A pod asking for
//! a whole GPU gets the L4's device node and UUID and no MIG instance, its AllocationClaim holds
//! the L4 at `{0, 1}`; a slice pod beside it gets a MIG instance on the H100; a second
//! whole-GPU pod waits (the H100 is not offered whole); `kubectl das gpus` draws the L4 held
//! whole and `kubectl das free` counts it; a legacy `nvidia.com/gpu: 1` pod is translated by the
//! webhook and lands on the L4. A fatal XID on the L4 shows `Unhealthy` in its pod's
//! `allocatedResourcesStatus` and taints `gpu-0` until the quiet period passes. A second test takes the other route for legacy pods on
//! Kubernetes 1.36+: `gpu.das.com` with `extendedResourceName: nvidia.com/gpu`, no webhook.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::{AllocationClaim, AllocationState, MigPlacement};
use das_api::claim_status::{
    DeviceStatusData, REASON_WHOLE_GPU_READY, is_ready, our_device_status, our_results,
};
use das_api::{DEVICE_CLASS_WHOLE_GPU, WHOLE_GPU_PROFILE, health_taints};
use das_e2e::das::{self, ContainerView, container_view, wait_pool_complete};
use das_e2e::install::{self, Binaries};
use das_e2e::plugin::{live_slices, start_plugin_with};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, claim_of, create_class_template, create_pod, create_template, delete_pod, delete_pods,
    device_health, wait_running, wait_unschedulable,
};
use das_e2e::{Cluster, ClusterConfig, chart};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NODE: &str = "n0";
/// GPU 0: an L4 (no MIG); GPU 1: an H100 with MIG mode on.
const GPUS: &str = "L4:1,H100-80GB:1";
/// The L4's whole-GPU device.
const L4: &str = "gpu-0";
/// The plugin's flags: whole GPUs, and a 10 s quiet period after a fatal XID.
const PLUGIN_FLAGS: &[&str] = &["--whole-gpus", "--health-quiet-period-seconds=10"];
/// NVML's total memory of an L4 (`driver/data/gpus/l4.toml`), MiB.
const L4_MEMORY_MIB: u64 = 23034;

#[tokio::test]
async fn a_gpu_without_mig_is_served_whole_beside_mig_slices() {
    let kubectl_das = install::target_dir().join("debug/kubectl-das");
    assert!(
        kubectl_das.exists(),
        "{} missing: run `cargo build -p kubectl-das`",
        kubectl_das.display()
    );
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    if let Err(e) = setup(&mut cluster).await {
        return cluster.check(Err(e));
    }
    cluster.check(scenarios(&cluster, &kubectl_das).await);
}

/// `nvidia.com/gpu: 1` reaches the L4 without the webhook: the chart renders `gpu.das.com` with
/// `extendedResourceName: nvidia.com/gpu` (`wholeGpus.extendedResourceName`, 1.36+), and the
/// scheduler makes the pod's claim itself (DRAExtendedResource). Skipped before 1.36.
#[tokio::test]
async fn a_legacy_gpu_pod_reaches_the_l4_through_the_extended_resource_name() {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    let r = extended_resource(&mut cluster).await;
    cluster.check(r);
}

async fn extended_resource(cluster: &mut Cluster) -> Result<()> {
    let c = cluster.client();
    let minor: u32 = c
        .apiserver_version()
        .await?
        .minor
        .trim_end_matches('+')
        .parse()?;
    if minor < 36 {
        eprintln!("Kubernetes 1.{minor}: no extendedResourceName on DeviceClasses; skipped");
        return Ok(());
    }
    let rendered = chart::render_with(&[
        "wholeGpus.enabled=true",
        "wholeGpus.extendedResourceName=true",
    ])?;
    let class = rendered
        .get("DeviceClass", DEVICE_CLASS_WHOLE_GPU)
        .context("gpu.das.com")?;
    ensure!(
        class["spec"]["extendedResourceName"] == "nvidia.com/gpu",
        "gpu.das.com without the extended resource name: {class}"
    );
    install::apply_access(cluster, &rendered).await?;
    start_plugin_with(cluster, NODE, GPUS, PLUGIN_FLAGS)?;
    wait_pool_complete(&c, NODE).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "extended"},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "terminationGracePeriodSeconds": 0}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let claim = wait::until("the extended-resource pod to run", TIMEOUT, || async {
        let status = pods.get("extended").await?.status.unwrap_or_default();
        if status.phase.as_deref() != Some("Running") {
            return Ok(None);
        }
        Ok(status
            .extended_resource_claim_status
            .map(|s| s.resource_claim_name))
    })
    .await?;
    let claim = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.clone(), NS)
        .get(&claim)
        .await?;
    let got: Vec<String> = our_results(&claim).map(|r| r.device.clone()).collect();
    ensure!(got == [L4], "the scheduler's claim got {got:?}");
    delete_pod(&c, "extended").await
}

/// The chart's cluster objects with whole GPUs on (CRD, DeviceClasses, RBAC), the plugin with
/// `--whole-gpus` and the admin kubeconfig, das-controller and das-webhook as the chart runs
/// them (the webhook translating `nvidia.com/gpu`).
async fn setup(cluster: &mut Cluster) -> Result<()> {
    let rendered = chart::render_with(chart::WHOLE_GPUS)?;
    rendered
        .get("DeviceClass", DEVICE_CLASS_WHOLE_GPU)
        .context("the chart renders gpu.das.com with wholeGpus.enabled")?;
    install::apply_access(cluster, &rendered).await?;
    start_plugin_with(cluster, NODE, GPUS, PLUGIN_FLAGS)?;
    let bins = Binaries::in_target_dir("debug", true)?;
    let controller = bins.controller.clone().context("controller binary")?;
    let webhook = bins.webhook.clone().context("webhook binary")?;
    install::start_controller(cluster, &rendered, &controller).await?;
    wait_pool_complete(&cluster.client(), NODE).await?;
    install::start_webhook(cluster, &rendered, &webhook).await?;
    Ok(())
}

async fn scenarios(cluster: &Cluster, kubectl_das: &Path) -> Result<()> {
    let c = cluster.client();
    create_class_template(&c, "whole", DEVICE_CLASS_WHOLE_GPU, 1).await?;
    create_template(&c, "slice", "1g.10gb", 1).await?;
    let l4 = gpu_uuid(cluster, 0)?;

    the_l4_is_published_whole_with_nvidias_attributes(&c, &l4).await?;
    a_whole_gpu_pod_gets_the_l4_and_a_slice_pod_the_h100(cluster, &l4).await?;
    kubectl_das_draws_the_l4(cluster, kubectl_das).await?;
    a_fatal_xid_on_the_l4_shows_in_its_pods_status(cluster).await?;
    delete_pods(&c, &["l4", "s1", "w2"]).await?;
    two_pods_take_turns_on_a_time_sliced_l4(cluster).await?;
    a_legacy_gpu_pod_lands_on_the_l4(cluster, &l4).await?;
    cel_written_for_nvidias_driver_selects_the_l4(&c).await
}

/// GPU `index`'s UUID, from the emulated GPUs' state.
fn gpu_uuid(cluster: &Cluster, index: u64) -> Result<String> {
    let state = das::emulated_state(cluster.node(NODE))?;
    let gpu = state["gpus"]
        .as_array()
        .context("gpus")?
        .iter()
        .find(|g| g["index"] == index)
        .with_context(|| format!("no GPU {index} in the emulated state: {state}"))?;
    gpu["uuid"]
        .as_str()
        .map(str::to_string)
        .context("GPU without uuid")
}

/// The attribute `name` of `d` as JSON (string, int or version).
fn attr(d: &Device, name: &str) -> serde_json::Value {
    d.attributes
        .as_ref()
        .and_then(|a| a.get(name))
        .map(|v| serde_json::to_value(v).unwrap_or_default())
        .unwrap_or_default()
}

/// The node's devices in the order the allocator walks them (slices by name).
fn devices_in_order(slices: &[ResourceSlice]) -> Vec<Device> {
    let mut slices = slices.to_vec();
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    slices
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect()
}

/// `gpu-0` is the L4 whole, listed first: type gpu, its UUID, NVIDIA's full-GPU attribute names
/// and values, NUMA node and PCIe root, capacity memory and multiprocessors; it consumes its
/// counter set (`memory` and `memory-slice-0`) whole. No MIG device of the L4; no whole H100.
async fn the_l4_is_published_whole_with_nvidias_attributes(c: &Client, l4: &str) -> Result<()> {
    let slices = wait_pool_complete(c, NODE).await?;
    let devices = devices_in_order(&slices);
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    ensure!(
        names.first() == Some(&L4),
        "the L4 is not listed first: {names:?}"
    );
    ensure!(
        !names.iter().any(|n| n.starts_with("gpu-0-")) && !names.contains(&"gpu-1"),
        "the L4 has MIG devices or the H100 is whole: {names:?}"
    );
    ensure!(
        names.iter().any(|n| n.starts_with("gpu-1-mig-1g-10gb-")),
        "the H100's MIG devices are missing: {names:?}"
    );
    let d = &devices[0];
    let want = [
        ("type", json!({"string": "gpu"})),
        ("uuid", json!({"string": l4})),
        ("productName", json!({"string": "NVIDIA L4"})),
        ("architecture", json!({"string": "Ada Lovelace"})),
        ("cudaComputeCapability", json!({"version": "8.9.0"})),
        ("gpuIndex", json!({"int": 0})),
        ("resource.kubernetes.io/numaNode", json!({"int": 0})),
        (
            "resource.kubernetes.io/pcieRoot",
            json!({"string": "pci0000:10"}),
        ),
        (
            "resource.kubernetes.io/pciBusID",
            json!({"string": "0000:10:00.0"}),
        ),
    ];
    for (name, value) in want {
        ensure!(
            attr(d, name) == value,
            "{L4}: {name} is {}, want {value}",
            attr(d, name)
        );
    }
    for name in ["brand", "driverVersion", "cudaDriverVersion"] {
        ensure!(!attr(d, name).is_null(), "{L4} has no {name}");
    }
    ensure!(attr(d, "profile").is_null(), "{L4} has a profile attribute");
    let capacity: Vec<(String, String)> = d
        .capacity
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.value.0.clone()))
        .collect();
    ensure!(
        capacity
            == [
                ("memory".to_string(), format!("{L4_MEMORY_MIB}Mi")),
                ("multiprocessors".to_string(), "58".to_string())
            ],
        "{L4} capacity {capacity:?}"
    );
    let consumed = d.consumes_counters.as_deref().unwrap_or_default();
    ensure!(
        consumed.len() == 1 && consumed[0].counter_set == "gpu-0-counter-set",
        "{L4} consumes {consumed:?}"
    );
    let set = slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .find(|s| s.name == "gpu-0-counter-set")
        .context("the L4's counter set is not published (DRAPartitionableDevices off?)")?;
    let counters: Vec<(&str, &str)> = set
        .counters
        .iter()
        .map(|(k, v)| (k.as_str(), v.value.0.as_str()))
        .collect();
    let memory = format!("{L4_MEMORY_MIB}Mi");
    ensure!(
        counters == [("memory", memory.as_str()), ("memory-slice-0", "1")],
        "the L4's counter set {counters:?}"
    );
    ensure!(
        consumed[0].counters == set.counters,
        "{L4} does not consume its whole counter set"
    );
    Ok(())
}

/// The devices allocated to pod `pod`'s claim.
async fn allocated(c: &Client, pod: &str) -> Result<Vec<String>> {
    let claim = claim_of(c, pod).await?;
    Ok(our_results(&claim).map(|r| r.device.clone()).collect())
}

/// The CDI view of container `app` of running pod `pod`.
fn view_of(cluster: &Cluster, pod: &Pod) -> Result<ContainerView> {
    let uid = pod.metadata.uid.as_deref().context("pod uid")?;
    container_view(cluster.node(NODE), uid, "app")
}

/// The container `app` of pod `pod` has exactly the L4 whole: `/dev/nvidia0`, no MIG
/// capability node, no other GPU's node, one `DAS_GPU_UUID_*` = its UUID, no MIG UUID.
fn check_l4_view(view: &ContainerView, pod: &str, l4: &str) -> Result<()> {
    let nodes = &view.device_nodes;
    ensure!(
        nodes.iter().any(|n| n == "/dev/nvidia0"),
        "{pod}: no /dev/nvidia0 in {nodes:?}"
    );
    ensure!(
        !nodes
            .iter()
            .any(|n| n == "/dev/nvidia1" || n.contains("nvidia-caps")),
        "{pod}: another GPU's node or a MIG capability node in {nodes:?}"
    );
    let gpu_vars: Vec<&String> = view
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("DAS_GPU_UUID_"))
        .map(|(_, v)| v)
        .collect();
    ensure!(
        gpu_vars == [l4],
        "{pod}: DAS_GPU_UUID_* {gpu_vars:?}, the L4 is {l4}"
    );
    ensure!(
        view.mig_uuids().is_empty(),
        "{pod}: MIG UUIDs {:?}",
        view.mig_uuids()
    );
    Ok(())
}

/// The one AllocationClaim of pod `pod`, once `inUse`.
async fn wait_in_use(c: &Client, pod: &str) -> Result<AllocationClaim> {
    let api: Api<AllocationClaim> = Api::namespaced(c.clone(), NS);
    wait::until(
        &format!("the inUse AllocationClaim of {pod}"),
        TIMEOUT,
        || async {
            let mut a: Vec<AllocationClaim> = api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|a| a.spec.pod_ref.as_ref().is_some_and(|p| p.name == pod))
                .collect();
            let in_use = a.len() == 1
                && a[0]
                    .status
                    .as_ref()
                    .is_some_and(|s| s.state == AllocationState::InUse);
            Ok(in_use.then(|| a.remove(0)))
        },
    )
    .await
}

/// Pod `l4` (class `gpu.das.com`) gets `gpu-0`: the L4's node and UUID, no MIG instance, claim
/// status `GpuPrepared` at `{0, 1}`, an AllocationClaim of profile `gpu` at `{0, 1}`. Pod `s1`
/// (`1g.10gb`) gets a MIG instance on the H100. Pod `w2` (a whole GPU too) waits: the H100 has
/// MIG mode on and is not switchable, so it is not offered whole.
async fn a_whole_gpu_pod_gets_the_l4_and_a_slice_pod_the_h100(
    cluster: &Cluster,
    l4: &str,
) -> Result<()> {
    let c = cluster.client();
    create_pod(&c, "l4", "whole", None).await?;
    let pod = wait_running(&c, "l4").await?;
    let got = allocated(&c, "l4").await?;
    ensure!(got == [L4], "l4 got {got:?}");
    check_l4_view(&view_of(cluster, &pod)?, "l4", l4)?;
    let placement = MigPlacement { start: 0, size: 1 };
    let claim = claim_of(&c, "l4").await?;
    let status = our_device_status(&claim, NODE, L4)
        .with_context(|| format!("no status.devices entry for {L4}: {:?}", claim.status))?;
    ensure!(is_ready(status), "not Ready: {status:?}");
    let reason = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str());
    ensure!(
        reason == Some(REASON_WHOLE_GPU_READY),
        "Ready reason {reason:?}"
    );
    let data = DeviceStatusData::of(status).with_context(|| format!("status data {status:?}"))?;
    ensure!(
        data.profile == WHOLE_GPU_PROFILE
            && data.gpu_uuid == l4
            && data.mig_uuid.is_empty()
            && data.placement == placement,
        "status data {data:?}"
    );
    let a = wait_in_use(&c, "l4").await?;
    ensure!(
        a.spec.profile == WHOLE_GPU_PROFILE
            && a.spec.device == L4
            && a.spec.gpu_uuid == l4
            && a.spec.mig_placement == placement,
        "AllocationClaim spec {:?}",
        a.spec
    );

    create_pod(&c, "s1", "slice", None).await?;
    let pod = wait_running(&c, "s1").await?;
    let got = allocated(&c, "s1").await?;
    ensure!(
        got.len() == 1 && got[0].starts_with("gpu-1-mig-1g-10gb-"),
        "s1 got {got:?}"
    );
    let view = view_of(cluster, &pod)?;
    let live = live_slices(cluster, NODE)?;
    ensure!(
        live.len() == 1 && live[0].0 == 1 && view.mig_uuids() == [live[0].3.clone()],
        "live slices {live:?}, s1 sees {:?}",
        view.mig_uuids()
    );
    ensure!(
        view.device_nodes.iter().any(|n| n == "/dev/nvidia1")
            && !view.device_nodes.iter().any(|n| n == "/dev/nvidia0"),
        "s1's device nodes {:?}",
        view.device_nodes
    );

    create_pod(&c, "w2", "whole", None).await?;
    let why = wait_unschedulable(&c, "w2").await?;
    eprintln!("w2 waits for a whole GPU while the L4 is held: {why}");
    Ok(())
}

/// Waits until pod `pod`'s DAS devices show `health` (one device each).
async fn wait_device_health(c: &Client, pod: &str, health: &str) -> Result<()> {
    wait::until(&format!("{pod}'s device {health}"), TIMEOUT, || async {
        Ok((device_health(c, pod).await? == [health]).then_some(()))
    })
    .await
}

/// Health of a GPU without MIG (issue 43 item 5): a fatal XID on the L4 taints `gpu-0` and
/// shows `Unhealthy` in the running whole-GPU pod's status, while the slice pod on the H100
/// stays `Healthy`; after the quiet period (10 s) both are `Healthy` and the taint is gone.
async fn a_fatal_xid_on_the_l4_shows_in_its_pods_status(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    wait_device_health(&c, "l4", "Healthy").await?;
    das::write_control(
        cluster.node(NODE),
        &json!({"xidEvents": [{"gpu": 0, "xid": 79}]}),
    )?;
    wait_device_health(&c, "l4", "Unhealthy").await?;
    l4_taints(&c, |keys| keys == [health_taints::XID]).await?;
    ensure!(
        device_health(&c, "s1").await? == ["Healthy"],
        "the slice on the H100 stays Healthy"
    );
    wait_device_health(&c, "l4", "Healthy").await?;
    l4_taints(&c, |keys| keys.is_empty()).await
}

/// Waits until the published L4 device's taint keys pass `want`.
async fn l4_taints(c: &Client, want: impl Fn(&[String]) -> bool) -> Result<()> {
    wait::until("the L4's taints", TIMEOUT, || async {
        let devices = das::pool_devices(c, NODE).await?;
        let l4 = devices
            .iter()
            .find(|d| d.name == L4)
            .context("gpu-0 published")?;
        let keys: Vec<String> = l4.taints.iter().flatten().map(|t| t.key.clone()).collect();
        Ok(want(&keys).then_some(()))
    })
    .await
}

/// The L4's compute time slice level as the emulated GPUs' state has it (0 when absent).
fn l4_time_slice(cluster: &Cluster) -> Result<u64> {
    let state = das::emulated_state(cluster.node(NODE))?;
    Ok(state["gpus"][0]["timeSlice"].as_u64().unwrap_or(0))
}

/// A `MigDeviceConfig` asking for time-slicing with `interval`.
fn time_slicing(interval: &str) -> serde_json::Value {
    json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}})
}

/// Time-slicing (issue 43 item 3, docs/design.md §7, "Time-slicing"), as
/// docs/examples/time-slicing/ shows it: a claim for a whole GPU with `TimeSlicing`/`Short`,
/// shared by two pods, gets the L4 and sets its time slice (level 1, read back from the emulated
/// GPU); once both pods are gone it is back to the default. A claim with an interval NVIDIA
/// does not name is denied at admission, saying what is valid.
async fn two_pods_take_turns_on_a_time_sliced_l4(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let example = das_e2e::paths::workspace_root().join("docs/examples/time-slicing");
    let example = example.display().to_string();
    chart::kubectl(&cluster.kubeconfig, &["apply", "-f", &example], None)?;
    for pod in ["tick-a", "tick-b"] {
        wait_running(&c, pod).await?;
    }
    let claim = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.clone(), NS)
        .get("time-sliced-gpu")
        .await?;
    let got: Vec<String> = our_results(&claim).map(|r| r.device.clone()).collect();
    ensure!(got == [L4], "time-sliced-gpu got {got:?}");
    ensure!(
        l4_time_slice(cluster)? == 1,
        "the L4's time slice is not Short"
    );
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let path = das::PluginDirs::of(cluster.node(NODE))
        .state
        .join(das_driver::claims::checkpoint::CHECKPOINT_FILE_NAME);
    let checkpoint: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let record = &checkpoint["claims"][uid.as_str()];
    ensure!(
        record["devices"][0]["timeSlice"] == "Short",
        "the record of time-sliced-gpu: {record}"
    );
    delete_pods(&c, &["tick-a", "tick-b"]).await?;
    wait::until(
        "the L4's time slice back to the default",
        TIMEOUT,
        || async { Ok((l4_time_slice(cluster)? == 0).then_some(())) },
    )
    .await?;
    Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.clone(), NS)
        .delete("time-sliced-gpu", &Default::default())
        .await?;
    a_bad_interval_is_denied_at_admission(&c).await
}

/// A ResourceClaim whose time slice NVIDIA does not name is denied by das-webhook (a dry run,
/// retried until the API server calls the webhook), with what is valid.
async fn a_bad_interval_is_denied_at_admission(c: &Client) -> Result<()> {
    let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "ts-bad"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_WHOLE_GPU}}],
            "config": [{"opaque": {"driver": das_api::DRIVER_NAME, "parameters": time_slicing("Fast")}}]
        }}
    }))?;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let api = Api::namespaced(c.clone(), NS);
    let denied = wait::until("the bad interval denied", TIMEOUT, || async {
        match api.create(&dry, &claim).await {
            Ok(_) => Ok(None),
            Err(e) => Ok(Some(e.to_string())),
        }
    })
    .await?;
    ensure!(
        denied.contains(r#"sharing.timeSlicing.interval \"Fast\" is not valid; valid: Default, Short, Medium, Long"#)
            || denied.contains(r#"sharing.timeSlicing.interval "Fast" is not valid; valid: Default, Short, Medium, Long"#),
        "{denied}"
    );
    Ok(())
}

/// Runs `kubectl-das <args>` against the cluster; its stdout, or an error with its stderr.
fn kubectl_das(bin: &Path, cluster: &Cluster, args: &[&str]) -> Result<String> {
    let out = Command::new(bin)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "kubectl-das {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into())
}

/// `kubectl das gpus` draws the L4 as one cell held whole by `l4` (legend: profile `gpu`,
/// `(whole GPU)`) and the H100 with `s1`'s slice; `kubectl das free` has no whole GPU left and
/// six more `1g.10gb`; `-o json` gives the L4 one memory slice, none free.
async fn kubectl_das_draws_the_l4(cluster: &Cluster, bin: &Path) -> Result<()> {
    let text = kubectl_das(bin, cluster, &["gpus", "--color=never"])?;
    eprintln!("kubectl das gpus:\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    let row = |gpu: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(NODE) && l.contains(&format!(" {gpu} ")))
            .copied()
    };
    let l4_row = row("gpu-0").with_context(|| format!("no row for the L4:\n{text}"))?;
    ensure!(
        l4_row.contains("NVIDIA L4") && l4_row.trim_end().ends_with("[A]"),
        "the L4's row: {l4_row}"
    );
    let h100_row = row("gpu-1").with_context(|| format!("no row for the H100:\n{text}"))?;
    let cells = h100_row.rsplit_once('[').map_or("", |(_, c)| c);
    ensure!(
        cells.trim_end().ends_with(']') && cells.matches('B').count() == 1,
        "the H100's row: {h100_row}"
    );
    ensure!(
        lines.iter().any(|l| l.starts_with("A ")
            && l.contains(" l4 ")
            && l.contains(" gpu ")
            && l.contains("(whole GPU)")),
        "the legend does not show l4 holding the L4 whole:\n{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&kubectl_das(bin, cluster, &["gpus", "-o", "json"])?)?;
    let l4 = json["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["index"] == 0)
        .with_context(|| format!("no GPU 0 in {json}"))?;
    ensure!(
        l4["memorySlices"] == 1 && l4["freeMemorySlices"] == 0,
        "kubectl das gpus -o json for the L4: {l4}"
    );
    let free = kubectl_das(bin, cluster, &["free"])?;
    eprintln!("kubectl das free:\n{free}");
    let count = |profile: &str| -> Option<String> {
        free.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(profile))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
    };
    ensure!(count("gpu").as_deref() == Some("0"), "free gpu: {free}");
    ensure!(
        count("1g.10gb").as_deref() == Some("6"),
        "free 1g.10gb: {free}"
    );
    Ok(())
}

/// A ResourceClaimTemplate `name` for one whole GPU (`gpu.das.com`) that also matches the CEL
/// `expression`.
async fn create_selector_template(c: &Client, name: &str, expression: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(c.clone(), NS);
    let t = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DEVICE_CLASS_WHOLE_GPU,
            "selectors": [{"cel": {"expression": expression}}]}}]}}}
    }))?;
    api.create(&PostParams::default(), &t).await?;
    Ok(())
}

/// The selector of docs/operations.md ("Whole GPUs"), as written for NVIDIA's driver with the
/// driver name changed: at least 20 GiB and compute capability 8.9 or newer gets the L4; asking
/// for Hopper's 9.0 waits (the H100 is not offered whole).
async fn cel_written_for_nvidias_driver_selects_the_l4(c: &Client) -> Result<()> {
    let memory = "device.capacity['mig.das.com'].memory.compareTo(quantity('20Gi')) >= 0";
    let cc = |v: &str| {
        format!(
            "device.attributes['mig.das.com'].cudaComputeCapability.compareTo(semver('{v}')) >= 0"
        )
    };
    let ada = "device.attributes['mig.das.com'].architecture == 'Ada Lovelace' \
               && device.attributes['resource.kubernetes.io'].numaNode == 0";
    create_selector_template(c, "ada", &format!("{memory} && {} && {ada}", cc("8.9.0"))).await?;
    create_selector_template(c, "hopper", &format!("{memory} && {}", cc("9.0.0"))).await?;
    create_pod(c, "ada", "ada", None).await?;
    wait_running(c, "ada").await?;
    let got = allocated(c, "ada").await?;
    ensure!(got == [L4], "ada got {got:?}");
    create_pod(c, "hopper", "hopper", None).await?;
    let why = wait_unschedulable(c, "hopper").await?;
    eprintln!("a whole GPU of compute capability 9.0 waits: {why}");
    delete_pods(c, &["ada", "hopper"]).await
}

/// `nvidia.com/gpu: 1` becomes a claim from `das-gpu-x1` and runs on the L4 with its UUID;
/// `nvidia.com/gpu: 2` is denied (the node offers one whole GPU: the H100 is MIG only).
async fn a_legacy_gpu_pod_lands_on_the_l4(cluster: &Cluster, l4: &str) -> Result<()> {
    let c = cluster.client();
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    // The earlier claims are gone, so the webhook's count and the scheduler see the L4 free.
    wait::until("gpu-0 to be allocated to no claim", TIMEOUT, || async {
        let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
            Api::namespaced(c.clone(), NS);
        let held = claims
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|cl| our_results(cl).any(|r| r.device == L4));
        Ok((!held).then_some(()))
    })
    .await?;
    let legacy = |name: &str, n: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": n}}}],
                "terminationGracePeriodSeconds": 0}
        }))?)
    };
    match api
        .create(&PostParams::default(), &legacy("legacy-two", "2")?)
        .await
    {
        Ok(_) => bail!("a pod asking for 2 whole GPUs was admitted; the node offers 1"),
        Err(kube::Error::Api(s)) => ensure!(
            s.message.contains("at most 1 whole GPUs fit on one node"),
            "{}",
            s.message
        ),
        Err(e) => return Err(e.into()),
    }
    let created = api
        .create(&PostParams::default(), &legacy("legacy-gpu", "1")?)
        .await?;
    let claims: Vec<Option<String>> = created
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .map(|r| r.resource_claim_template_name.clone())
        .collect();
    ensure!(
        claims == [Some("das-gpu-x1".to_string())],
        "legacy-gpu's claims {claims:?}"
    );
    let pod = wait_running(&c, "legacy-gpu").await?;
    let got = allocated(&c, "legacy-gpu").await?;
    ensure!(got == [L4], "legacy-gpu got {got:?}");
    check_l4_view(&view_of(cluster, &pod)?, "legacy-gpu", l4)?;
    delete_pod(&c, "legacy-gpu").await
}
