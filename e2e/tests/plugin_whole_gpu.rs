//! Whole GPUs beside MIG slices (docs/design.md §7, "Whole GPUs"), end to end on the local
//! cluster: one node with an emulated A100 with MIG mode on (GPU 0) and one with MIG mode off
//! (GPU 1), the plugin run with `--whole-gpus`, the chart's cluster objects rendered with
//! `wholeGpus.enabled` and `webhook.translateWholeGpus` (DeviceClass `gpu.das.com`, every MIG
//! class requiring `type == 'mig'`), and das-controller and das-webhook as the chart configures
//! them.
//!
//! GPU 1 is published as `gpu-1` alone, GPU 0 as MIG devices alone; a pod asking for a whole
//! GPU gets GPU 1's device node and UUID without a MIG instance, its claim's status says
//! `GpuPrepared` and its AllocationClaim holds the whole GPU; a second whole-GPU pod waits
//! unscheduled while a slice pod runs on GPU 0, and runs once the first is gone; a claim for a
//! slice of any profile never gets `gpu-1`; a legacy `nvidia.com/gpu: 1` pod is translated into
//! a claim from `das-gpu-x1` and runs.

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::{AllocationClaim, AllocationState, MigPlacement};
use das_api::claim_status::{
    DeviceStatusData, REASON_WHOLE_GPU_READY, is_ready, our_device_status, our_results,
};
use das_api::{DEVICE_CLASS_ALL, DEVICE_CLASS_WHOLE_GPU, WHOLE_GPU_PROFILE};
use das_e2e::das::{self, ContainerView, container_view, pool_devices, wait_pool_complete};
use das_e2e::install::{self, Binaries};
use das_e2e::plugin::{live_slices, start_plugin_with};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, claim_of, create_class_template, create_pod, create_template, delete_pod, delete_pods,
    http_get, wait_running, wait_unschedulable,
};
use das_e2e::{Cluster, ClusterConfig, chart};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const NODE: &str = "n0";
/// GPU 0 with MIG mode on (MIG devices only), GPU 1 with MIG mode off (`gpu-1` only).
const GPUS: &str = "A100-SXM4-40GB:1,A100-SXM4-40GB:1:mig-off";
/// The whole-GPU device of GPU 1.
const WHOLE: &str = "gpu-1";
/// Memory slices of an A100-SXM4-40GB: a whole GPU's placement is `{0, 8}`.
const A100_MEMORY_SLICES: i32 = 8;

/// Metrics ports of what the set-up started.
struct Ports {
    controller: u16,
}

#[tokio::test]
async fn whole_gpus_are_served_beside_mig_slices() {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    let ports = match setup(&mut cluster).await {
        Ok(p) => p,
        Err(e) => return cluster.check(Err(e)),
    };
    cluster.check(scenarios(&cluster, &ports).await);
}

/// The chart's cluster objects with whole GPUs on (CRD, DeviceClasses, RBAC), the plugin with
/// `--whole-gpus` and the admin kubeconfig (so its CDI specs name device nodes, which the
/// chart leaves out on emulated nodes without stand-ins), das-controller and das-webhook as the
/// chart runs them (the webhook with `DAS_WEBHOOK_TRANSLATE_WHOLE_GPUS`, registered with the
/// chart's configuration that sends `nvidia.com/gpu` pods).
async fn setup(cluster: &mut Cluster) -> Result<Ports> {
    let rendered = chart::render_with(chart::WHOLE_GPUS)?;
    rendered
        .get("DeviceClass", DEVICE_CLASS_WHOLE_GPU)
        .context("the chart renders gpu.das.com with wholeGpus.enabled")?;
    install::apply_access(cluster, &rendered).await?;
    start_plugin_with(cluster, NODE, GPUS, &["--whole-gpus"])?;
    let bins = Binaries::in_target_dir("debug", true)?;
    let controller = bins.controller.clone().context("controller binary")?;
    let webhook = bins.webhook.clone().context("webhook binary")?;
    let controller = install::start_controller(cluster, &rendered, &controller).await?;
    wait_pool_complete(&cluster.client(), NODE).await?;
    install::start_webhook(cluster, &rendered, &webhook).await?;
    Ok(Ports { controller })
}

async fn scenarios(cluster: &Cluster, ports: &Ports) -> Result<()> {
    let c = cluster.client();
    create_class_template(&c, "whole", DEVICE_CLASS_WHOLE_GPU, 1).await?;
    create_template(&c, "slice", "1g.5gb", 1).await?;
    create_template(&c, "full", "7g.40gb", 1).await?;
    create_class_template(&c, "any-slice", DEVICE_CLASS_ALL, 1).await?;
    let gpu1 = gpu_uuid(cluster, 1)?;

    each_gpu_is_published_as_its_mig_mode_says(&c, &gpu1).await?;
    a_whole_gpu_pod_gets_the_gpu_and_no_mig_instance(cluster, ports, &gpu1).await?;
    the_second_whole_gpu_pod_waits_while_a_slice_runs_beside(cluster).await?;
    legacy_whole_gpu_pods_are_translated(cluster, &gpu1).await?;
    a_slice_claim_never_gets_the_whole_gpu(&c).await?;
    Ok(())
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

/// The attribute `name` of `d` as a string, if it is one.
fn string_attr(d: &k8s_openapi::api::resource::v1::Device, name: &str) -> Option<String> {
    d.attributes.as_ref()?.get(name)?.string.clone()
}

/// GPU 1 (MIG mode off) is published as `gpu-1` (type gpu, its UUID, every memory slice of its
/// counter set) and nothing else; GPU 0 (MIG mode on) as MIG devices only, never `gpu-0`.
async fn each_gpu_is_published_as_its_mig_mode_says(c: &Client, gpu1: &str) -> Result<()> {
    let devices = pool_devices(c, NODE).await?;
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    ensure!(
        !names.contains(&"gpu-0"),
        "GPU 0 has MIG mode on but is published whole: {names:?}"
    );
    ensure!(
        !names.iter().any(|n| n.starts_with("gpu-1-")),
        "GPU 1 has MIG mode off but has MIG devices: {names:?}"
    );
    ensure!(
        names.iter().any(|n| n.starts_with("gpu-0-mig-1g-5gb-"))
            && names.contains(&"gpu-0-mig-7g-40gb-0"),
        "GPU 0's MIG devices are missing: {names:?}"
    );
    for d in &devices {
        let want = if d.name == WHOLE { "gpu" } else { "mig" };
        ensure!(
            string_attr(d, "type").as_deref() == Some(want),
            "{}: type {:?}, want {want}",
            d.name,
            string_attr(d, "type")
        );
    }
    let whole = devices
        .iter()
        .find(|d| d.name == WHOLE)
        .with_context(|| format!("{WHOLE} is not published: {names:?}"))?;
    ensure!(
        string_attr(whole, "uuid").as_deref() == Some(gpu1),
        "{WHOLE}: uuid {:?}, GPU 1 is {gpu1}",
        string_attr(whole, "uuid")
    );
    ensure!(
        string_attr(whole, "profile").is_none(),
        "{WHOLE} has a profile attribute"
    );
    // Every memory slice of GPU 1's counter set, so no slice of GPU 1 could be had beside it
    // (and the API server kept the counters: partitionable devices are on).
    let consumed = whole.consumes_counters.as_deref().unwrap_or_default();
    ensure!(
        consumed.len() == 1 && consumed[0].counter_set == "gpu-1-counter-set",
        "{WHOLE} consumes {consumed:?}"
    );
    let mut slices: Vec<&str> = consumed[0]
        .counters
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("memory-slice-"))
        .collect();
    slices.sort();
    let want: Vec<String> = (0..A100_MEMORY_SLICES)
        .map(|i| format!("memory-slice-{i}"))
        .collect();
    ensure!(slices == want, "{WHOLE} consumes memory slices {slices:?}");
    Ok(())
}

/// The devices allocated to pod `pod`'s claim.
async fn allocated(c: &Client, pod: &str) -> Result<Vec<String>> {
    let claim = claim_of(c, pod).await?;
    Ok(our_results(&claim).map(|r| r.device.clone()).collect())
}

/// The container `app` of pod `pod` has exactly GPU 1 whole: its device node (and no other
/// GPU's, no MIG capability node), the control and UVM nodes, one `DAS_GPU_UUID_*` = `gpu1`
/// and no MIG UUID.
fn check_whole_gpu_view(view: &ContainerView, pod: &str, gpu1: &str) -> Result<()> {
    let nodes = &view.device_nodes;
    for want in [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ] {
        ensure!(
            nodes.iter().any(|n| n == want),
            "{pod}: no {want} in {nodes:?}"
        );
    }
    ensure!(
        !nodes
            .iter()
            .any(|n| n == "/dev/nvidia0" || n.contains("nvidia-caps")),
        "{pod}: another GPU's node or a MIG capability node in {nodes:?}"
    );
    let gpu_vars: Vec<(&String, &String)> = view
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("DAS_GPU_UUID_"))
        .collect();
    ensure!(
        gpu_vars.len() == 1 && gpu_vars[0].1 == gpu1,
        "{pod}: DAS_GPU_UUID_* {gpu_vars:?}, GPU 1 is {gpu1}"
    );
    ensure!(
        view.mig_uuids().is_empty(),
        "{pod}: MIG UUIDs {:?}",
        view.mig_uuids()
    );
    ensure!(
        view.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("void"),
        "{pod}: NVIDIA_VISIBLE_DEVICES {:?}",
        view.env.get("NVIDIA_VISIBLE_DEVICES")
    );
    Ok(())
}

/// The CDI view of container `app` of running pod `pod`.
fn view_of(cluster: &Cluster, pod: &Pod) -> Result<ContainerView> {
    let uid = pod.metadata.uid.as_deref().context("pod uid")?;
    container_view(cluster.node(NODE), uid, "app")
}

/// Pod `w1` asks for one GPU of `gpu.das.com`: it gets `gpu-1`, the container sees GPU 1's node
/// and UUID, no MIG instance is made, the claim's status says `GpuPrepared` with profile `gpu`,
/// and the controller mirrors it as an AllocationClaim of profile `gpu` at `{0, 8}`, `inUse`,
/// with an info-gauge row.
async fn a_whole_gpu_pod_gets_the_gpu_and_no_mig_instance(
    cluster: &Cluster,
    ports: &Ports,
    gpu1: &str,
) -> Result<()> {
    let c = cluster.client();
    create_pod(&c, "w1", "whole", None).await?;
    let pod = wait_running(&c, "w1").await?;
    ensure!(
        allocated(&c, "w1").await? == [WHOLE],
        "w1 got {:?}",
        allocated(&c, "w1").await?
    );
    check_whole_gpu_view(&view_of(cluster, &pod)?, "w1", gpu1)?;
    let live = live_slices(cluster, NODE)?;
    ensure!(
        live.is_empty(),
        "MIG instances made for a whole GPU: {live:?}"
    );
    let state = das::emulated_state(cluster.node(NODE))?;
    ensure!(
        state["gpus"][1]["migEnabled"] == false,
        "GPU 1's MIG mode changed: {state}"
    );

    // The claim's status: Ready, reason GpuPrepared, profile gpu, the GPU's UUID, no MIG UUID.
    let claim = claim_of(&c, "w1").await?;
    let status = our_device_status(&claim, NODE, WHOLE)
        .with_context(|| format!("no status.devices entry for {WHOLE}: {:?}", claim.status))?;
    ensure!(is_ready(status), "not Ready: {status:?}");
    let reason = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str());
    ensure!(
        reason == Some(REASON_WHOLE_GPU_READY),
        "Ready reason {reason:?}: {status:?}"
    );
    let data = DeviceStatusData::of(status).with_context(|| format!("status data {status:?}"))?;
    ensure!(
        data.profile == WHOLE_GPU_PROFILE
            && data.gpu_uuid == gpu1
            && data.mig_uuid.is_empty()
            && data.placement
                == (MigPlacement {
                    start: 0,
                    size: A100_MEMORY_SLICES
                }),
        "status data {data:?}"
    );

    // The controller's AllocationClaim holds the whole GPU.
    let a = wait_in_use(&c, "w1").await?;
    ensure!(
        a.spec.profile == WHOLE_GPU_PROFILE
            && a.spec.device == WHOLE
            && a.spec.nodename == NODE
            && a.spec.gpu_uuid == gpu1
            && a.spec.mig_placement
                == (MigPlacement {
                    start: 0,
                    size: A100_MEMORY_SLICES
                }),
        "AllocationClaim spec {:?}",
        a.spec
    );
    let mig = a.status.as_ref().and_then(|s| s.mig_uuid.clone());
    ensure!(
        mig.is_none(),
        "a whole GPU's AllocationClaim has MIG UUID {mig:?}"
    );
    let claim_name = claim.metadata.name.as_deref().context("claim name")?;
    let row = format!(
        "das_mig_device_info{{namespace=\"{NS}\",pod=\"w1\",container=\"app\",\
         claim=\"{claim_name}\",gpu_uuid=\"{gpu1}\",mig_uuid=\"\",gpu_instance_id=\"\",\
         compute_instance_id=\"\",profile=\"gpu\",node=\"{NODE}\"}} 1"
    );
    wait::until("w1's info gauge row", TIMEOUT, || async {
        let (_, text) = http_get(ports.controller, "/metrics").await?;
        Ok(text.lines().any(|l| l == row).then_some(()))
    })
    .await
    .with_context(|| format!("want {row}"))
}

/// The AllocationClaims of pod `pod`.
async fn allocs_of(c: &Client, pod: &str) -> Result<Vec<AllocationClaim>> {
    let api: Api<AllocationClaim> = Api::namespaced(c.clone(), NS);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|a| a.spec.pod_ref.as_ref().is_some_and(|p| p.name == pod))
        .collect())
}

/// Waits until pod `pod` has one AllocationClaim, `inUse`; returns it.
async fn wait_in_use(c: &Client, pod: &str) -> Result<AllocationClaim> {
    wait::until(
        &format!("the inUse AllocationClaim of {pod}"),
        TIMEOUT,
        || async {
            let mut a = allocs_of(c, pod).await?;
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

/// While `w1` holds GPU 1, `w2` (a whole GPU too) is unschedulable and never bound, though GPU 0
/// has free MIG devices: a whole-GPU claim never gets a MIG device. A `1g.5gb` pod runs on
/// GPU 0 meanwhile, with GPU 0's node and a MIG instance. Once `w1` is gone, `w2` runs on
/// GPU 1.
async fn the_second_whole_gpu_pod_waits_while_a_slice_runs_beside(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create_pod(&c, "w2", "whole", None).await?;
    let why = wait_unschedulable(&c, "w2").await?;
    eprintln!("w2 waits for a whole GPU: {why}");

    create_pod(&c, "s1", "slice", None).await?;
    let pod = wait_running(&c, "s1").await?;
    let devices = allocated(&c, "s1").await?;
    ensure!(
        devices.len() == 1 && devices[0].starts_with("gpu-0-mig-1g-5gb-"),
        "s1 got {devices:?}"
    );
    let view = view_of(cluster, &pod)?;
    ensure!(
        view.device_nodes.iter().any(|n| n == "/dev/nvidia0")
            && !view.device_nodes.iter().any(|n| n == "/dev/nvidia1")
            && view
                .device_nodes
                .iter()
                .any(|n| n.starts_with("/dev/nvidia-caps/")),
        "s1's device nodes {:?}",
        view.device_nodes
    );
    let live = live_slices(cluster, NODE)?;
    ensure!(
        live.len() == 1
            && live[0].0 == 0
            && live[0].1 == "1g.5gb"
            && view.mig_uuids() == [live[0].3.clone()],
        "live slices {live:?}, s1 sees {:?}",
        view.mig_uuids()
    );
    ensure!(
        !view.env.keys().any(|k| k.starts_with("DAS_GPU_UUID_")),
        "s1 has a whole GPU's variable: {:?}",
        view.env
    );
    let w2 = Api::<Pod>::namespaced(c.clone(), NS).get("w2").await?;
    ensure!(
        w2.spec.and_then(|s| s.node_name).is_none(),
        "w2 was bound while w1 holds the GPU"
    );

    delete_pod(&c, "w1").await?;
    wait_running(&c, "w2")
        .await
        .context("w2 runs once w1 is gone")?;
    ensure!(
        allocated(&c, "w2").await? == [WHOLE],
        "w2 got {:?}",
        allocated(&c, "w2").await?
    );
    delete_pod(&c, "w2").await
}

/// `nvidia.com/gpu: 1` (requests = limits) becomes a claim `gpu-app` from template
/// `das-gpu-x1` (one device of `gpu.das.com`); the pod runs on GPU 1 with its UUID.
/// `nvidia.com/gpu: 2` is denied: one node offers one whole GPU.
async fn legacy_whole_gpu_pods_are_translated(cluster: &Cluster, gpu1: &str) -> Result<()> {
    let c = cluster.client();
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    let legacy = |name: &str, n: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": n, "cpu": "100m"},
                    "requests": {"nvidia.com/gpu": n}}}],
                "terminationGracePeriodSeconds": 0}
        }))?)
    };
    match api
        .create(&PostParams::default(), &legacy("legacy-two", "2")?)
        .await
    {
        Ok(_) => bail!("a pod asking for 2 whole GPUs was admitted; the node has 1"),
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
    let spec = created.spec.as_ref().context("spec")?;
    let claims: Vec<(String, Option<String>)> = spec
        .resource_claims
        .iter()
        .flatten()
        .map(|r| (r.name.clone(), r.resource_claim_template_name.clone()))
        .collect();
    ensure!(
        claims == [("gpu-app".to_string(), Some("das-gpu-x1".to_string()))],
        "pod claims {claims:?}"
    );
    let resources = spec.containers[0].resources.clone().unwrap_or_default();
    let names: Vec<String> = resources
        .claims
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    ensure!(names == ["gpu-app"], "container claims {names:?}");
    for (what, m) in [
        ("limits", &resources.limits),
        ("requests", &resources.requests),
    ] {
        ensure!(
            !m.iter().flatten().any(|(k, _)| k == "nvidia.com/gpu"),
            "nvidia.com/gpu left in {what}: {m:?}"
        );
    }
    let tpl = Api::<ResourceClaimTemplate>::namespaced(c.clone(), NS)
        .get("das-gpu-x1")
        .await?;
    let tpl_json = serde_json::to_value(&tpl)?;
    let request = &tpl_json["spec"]["spec"]["devices"]["requests"][0];
    ensure!(
        request["name"] == "gpu"
            && request["exactly"]["deviceClassName"] == DEVICE_CLASS_WHOLE_GPU
            && request["exactly"]["count"] == 1,
        "template das-gpu-x1 asks for {request}"
    );

    let pod = wait_running(&c, "legacy-gpu").await?;
    ensure!(
        allocated(&c, "legacy-gpu").await? == [WHOLE],
        "legacy-gpu got {:?}",
        allocated(&c, "legacy-gpu").await?
    );
    check_whole_gpu_view(&view_of(cluster, &pod)?, "legacy-gpu", gpu1)?;
    delete_pod(&c, "legacy-gpu").await
}

/// GPU 0 full (a `7g.40gb` pod, after `s1` leaves) and `gpu-1` free: a claim of the class of
/// every slice (`mig.das.com`, which checks `type == 'mig'`) is unschedulable, never given
/// `gpu-1`; a whole-GPU pod then runs on `gpu-1`, so it was free.
async fn a_slice_claim_never_gets_the_whole_gpu(c: &Client) -> Result<()> {
    delete_pod(c, "s1").await?;
    create_pod(c, "full", "full", None).await?;
    wait_running(c, "full").await?;
    ensure!(
        allocated(c, "full").await? == ["gpu-0-mig-7g-40gb-0"],
        "full got {:?}",
        allocated(c, "full").await?
    );
    // No claim holds gpu-1 any more (the generated claims of the deleted pods are gone).
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), NS);
    wait::until("gpu-1 to be allocated to no claim", TIMEOUT, || async {
        let held = claims
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|cl| our_results(cl).any(|r| r.device == WHOLE));
        Ok((!held).then_some(()))
    })
    .await?;
    create_pod(c, "any", "any-slice", None).await?;
    let why = wait_unschedulable(c, "any").await?;
    eprintln!("a slice of any profile with GPU 0 full and gpu-1 free: {why}");
    create_pod(c, "w3", "whole", None).await?;
    wait_running(c, "w3").await?;
    ensure!(
        allocated(c, "w3").await? == [WHOLE],
        "w3 got {:?}",
        allocated(c, "w3").await?
    );
    let any: Value = serde_json::to_value(Api::<Pod>::namespaced(c.clone(), NS).get("any").await?)?;
    ensure!(
        any["spec"]["nodeName"].is_null(),
        "the slice pod was bound: {}",
        any["spec"]
    );
    delete_pods(c, &["full", "any", "w3"]).await
}
