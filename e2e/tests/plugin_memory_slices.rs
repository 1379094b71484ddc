//! Memory slices of a whole GPU (docs/design.md §7, "Memory slices of a whole GPU"; issue 43
//! item 2), end to end through the real scheduler and kubelet on the default version, with an
//! emulated L4 (no MIG) served whole and shared by memory (`--whole-gpus
//! --shared-profiles=gpu`) and the emulated GPUs' stand-in MPS control daemon.
//!
//! A whole-GPU pod gets the L4 first; once it is gone two pods whose claims ask for 8Gi and
//! 12Gi of `gpu-0-shared` (class `gpu.shared.mig.das.com`) run under the GPU's one MPS daemon,
//! pinned to the L4's UUID, each container with the GPU's node and its own memory limit; a
//! third asking for more than is left stays Pending, and so does a whole-GPU pod while the
//! shares hold the GPU; a claim that requires kernel-enforced memory never lands on this GPU
//! (its device says `memoryEnforcement: mps`); once both shares are gone the daemon stops and
//! the whole-GPU pod runs. Then docs/examples/memory-slices/ runs as the docs say.
//!
//! A second test gives the kernel-enforced level (issue 43 item 2, "where the node supports
//! kernel-enforced partitioning"): with a fake cgroup tree whose `dmem.capacity` lists one of
//! two L4s, a claim requiring `memoryEnforcement == "enforced"` lands on that one and its CDI
//! device carries the `createRuntime` hook with its limit; a share of the other gets none.

use anyhow::{Context, Result, ensure};
use das_api::{DEVICE_CLASS_WHOLE_GPU, shared_whole_gpu_device_class};
use das_driver::mps::stand_in::Record;
use das_e2e::das::{apply_shared_device_classes, container_view};
use das_e2e::plugin::cluster_with_configured_plugins;
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, create_claim_pod, create_class_template, create_pod, delete_pod, wait_running,
    wait_unschedulable,
};
use das_e2e::{Cluster, chart};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;

const NODE: &str = "n0";
const GPUS: &str = "L4:1";

#[tokio::test]
async fn two_pods_share_an_l4_by_memory_under_one_mps_daemon() {
    let flags: &[&str] = &["--whole-gpus", "--shared-profiles=gpu"];
    let (cluster, _) = cluster_with_configured_plugins(&[(NODE, GPUS, flags)]).await;
    let r = scenario(&cluster).await;
    cluster.check(r);
}

/// A share of the L4 asking for `memory`.
fn share(memory: &str) -> Value {
    json!({"deviceClassName": shared_whole_gpu_device_class(),
        "capacity": {"requests": {"memory": memory}}})
}

/// What one sharing pod's container got: its GPU UUIDs, environment and pipe directory.
struct Seen {
    gpus: Vec<String>,
    env: BTreeMap<String, String>,
    pipe: PathBuf,
}

async fn seen(cluster: &Cluster, pod: &str) -> Result<Seen> {
    let p = wait_running(&cluster.client(), pod).await?;
    let uid = p.metadata.uid.context("pod uid")?;
    let view = container_view(cluster.node(NODE), &uid, "app")?;
    let gpus = view
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("DAS_GPU_UUID_"))
        .map(|(_, v)| v.clone())
        .collect();
    ensure!(
        view.device_nodes.iter().any(|n| n == "/dev/nvidia0") && view.mig_uuids().is_empty(),
        "{pod}: the L4's node and no MIG instance: {:?}",
        view.device_nodes
    );
    Ok(Seen {
        gpus,
        pipe: PathBuf::from(
            view.mounts
                .get("/tmp/nvidia-mps")
                .context("no pipe mount")?,
        ),
        env: view.env,
    })
}

/// The published `gpu-0-shared`, as the scheduler sees it.
async fn shared_device(c: &Client) -> Result<k8s_openapi::api::resource::v1::Device> {
    let slices = Api::<ResourceSlice>::all(c.clone())
        .list(&ListParams::default())
        .await?;
    slices
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .find(|d| d.name == "gpu-0-shared")
        .context("gpu-0-shared is not published")
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    apply_shared_device_classes(&c, &[das_api::WHOLE_GPU_PROFILE]).await?;
    apply_whole_gpu_class(&c).await?;
    create_class_template(&c, "whole", DEVICE_CLASS_WHOLE_GPU, 1).await?;
    let d = shared_device(&c).await?;
    let attrs = d.attributes.clone().unwrap_or_default();
    ensure!(
        attrs["type"].string.as_deref() == Some("gpu-shared")
            && attrs["memoryEnforcement"].string.as_deref() == Some("mps"),
        "gpu-0-shared's attributes: {attrs:?}"
    );

    // The GPU whole first; its shares wait for it (the same counters).
    create_pod(&c, "w1", "whole", None).await?;
    wait_running(&c, "w1").await?;
    create_claim_pod(&c, "m1", share("8Gi"), None).await?;
    wait_unschedulable(&c, "m1").await?;
    delete_pod(&c, "w1").await?;

    // Two shares with their own memory, one daemon pinned to the GPU.
    create_claim_pod(&c, "m2", share("12Gi"), None).await?;
    let (m1, m2) = (seen(cluster, "m1").await?, seen(cluster, "m2").await?);
    let l4 = m1.gpus.first().context("m1: no GPU UUID")?.clone();
    ensure!(
        m1.gpus == [l4.clone()] && m2.gpus == [l4.clone()],
        "both on the L4: {:?} {:?}",
        m1.gpus,
        m2.gpus
    );
    ensure!(m1.pipe == m2.pipe, "two daemons for one GPU");
    for (s, mib) in [(&m1, 8192), (&m2, 12288)] {
        let limit = s.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
        ensure!(
            limit.map(String::as_str) == Some(format!("0={mib}M").as_str()),
            "a share's memory limit: {:?}",
            s.env
        );
    }
    let root = m1.pipe.parent().context("pipe dir")?.to_path_buf();
    let record = Record::read(&root.join("log")).context("no stand-in record")?;
    ensure!(
        record.runs.len() == 1 && record.runs[0].visible_devices == l4,
        "the GPU's daemon: {record:?}"
    );
    let daemon = record.runs[0].pid;

    // 8Gi + 12Gi of the L4's 23034Mi: 4Gi more fits nowhere, nor does the GPU whole.
    create_claim_pod(&c, "m3", share("4Gi"), None).await?;
    let why = wait_unschedulable(&c, "m3").await?;
    ensure!(why.contains("cannot allocate all claims"), "m3: {why}");
    create_pod(&c, "w2", "whole", None).await?;
    wait_unschedulable(&c, "w2").await?;
    // A claim that needs kernel-enforced memory never lands here.
    let enforced = json!({"deviceClassName": shared_whole_gpu_device_class(),
        "capacity": {"requests": {"memory": "1Gi"}},
        "selectors": [{"cel": {"expression":
            "device.attributes['mig.das.com'].memoryEnforcement == 'enforced'"}}]});
    create_claim_pod(&c, "e1", enforced, None).await?;
    wait_unschedulable(&c, "e1").await?;
    for pod in ["m3", "e1"] {
        delete_pod(&c, pod).await?;
    }

    // The shares leave: the daemon stops with the last, and the GPU is whole again.
    delete_pod(&c, "m1").await?;
    ensure!(
        std::path::Path::new(&format!("/proc/{daemon}")).exists(),
        "the daemon went with the first share"
    );
    delete_pod(&c, "m2").await?;
    wait::until("the GPU's daemon to stop", TIMEOUT, || async {
        Ok((!root.exists()).then_some(()))
    })
    .await?;
    wait_running(&c, "w2").await?;
    delete_pod(&c, "w2").await?;
    the_example_runs(cluster, &l4).await
}

/// docs/examples/memory-slices/ as the docs say to apply it: both pods run on the L4's shares.
async fn the_example_runs(cluster: &Cluster, l4: &str) -> Result<()> {
    let c = cluster.client();
    let example = das_e2e::paths::workspace_root().join("docs/examples/memory-slices");
    let example = example.display().to_string();
    chart::kubectl(
        &cluster.kubeconfig,
        &["apply", "-n", NS, "-f", &example],
        None,
    )?;
    let mut devices = Vec::new();
    for pod in ["memory-8gi", "memory-4gi"] {
        let s = seen(cluster, pod).await?;
        ensure!(s.gpus == [l4.to_string()], "{pod}: {:?}", s.gpus);
        let p = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(c.clone(), NS)
            .get(pod)
            .await?;
        let claim = p
            .status
            .and_then(|s| s.resource_claim_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.resource_claim_name)
            .context("the pod's claim")?;
        let rc = Api::<ResourceClaim>::namespaced(c.clone(), NS)
            .get(&claim)
            .await?;
        devices.extend(das_api::claim_status::our_results(&rc).map(|r| r.device.clone()));
    }
    ensure!(
        devices == ["gpu-0-shared", "gpu-0-shared"],
        "the example's claims: {devices:?}"
    );
    for pod in ["memory-8gi", "memory-4gi"] {
        delete_pod(&c, pod).await?;
    }
    Ok(())
}

/// `gpu.das.com` as the chart renders it with whole GPUs.
async fn apply_whole_gpu_class(c: &Client) -> Result<()> {
    let rendered = chart::render_with(chart::WHOLE_GPUS)?;
    let body = rendered.get("DeviceClass", DEVICE_CLASS_WHOLE_GPU)?;
    Api::<DeviceClass>::all(c.clone())
        .patch(
            DEVICE_CLASS_WHOLE_GPU,
            &PatchParams::apply("das-e2e").force(),
            &Patch::Apply(body),
        )
        .await?;
    Ok(())
}

/// Two L4s, GPU 0 with kernel-enforced memory (the fake cgroup tree's `dmem.capacity` lists its
/// bus ID, as a node with driver r615+ and Linux 6.14+ lists it), GPU 1 without: their shareable
/// devices say `enforced` and `mps`; a claim that requires `enforced` always lands on GPU 0, and
/// its CDI device carries the `createRuntime` hook that caps its containers at the claim's
/// memory (the hook itself runs under runc in `driver/tests/cdi_hook.rs`); a share of GPU 1 gets
/// no hook.
#[tokio::test]
async fn a_claim_that_needs_enforced_memory_gets_the_gpu_whose_kernel_enforces_it() {
    let tree = tempfile::tempdir().expect("fake cgroup tree");
    std::fs::write(
        tree.path().join("dmem.capacity"),
        "nvidia/0000:10:00.0/vidmem 24152899584\n",
    )
    .expect("dmem.capacity");
    let cgroup_root = format!("--cgroup-root={}", tree.path().display());
    let flags: Vec<&str> = vec!["--whole-gpus", "--shared-profiles=gpu", &cgroup_root];
    let (cluster, _) = cluster_with_configured_plugins(&[(NODE, "L4:2", &flags)]).await;
    let r = enforced(&cluster).await;
    cluster.check(r);
}

/// The `memoryEnforcement` of each published shareable L4, by device name.
async fn enforcement_levels(c: &Client) -> Result<BTreeMap<String, String>> {
    let slices = Api::<ResourceSlice>::all(c.clone())
        .list(&ListParams::default())
        .await?;
    Ok(slices
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter_map(|d| {
            let level = d.attributes?.get("memoryEnforcement")?.string.clone()?;
            Some((d.name, level))
        })
        .collect())
}

/// The hooks of the CDI spec the plugin wrote for claim `uid`.
fn cdi_hooks(cluster: &Cluster, uid: &str) -> Result<Vec<Value>> {
    let dir = das_e2e::das::PluginDirs::of(cluster.node(NODE)).cdi;
    for e in std::fs::read_dir(&dir)? {
        let path = e?.path();
        if !path.to_string_lossy().contains(uid) {
            continue;
        }
        let spec: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        return Ok(spec["devices"][0]["containerEdits"]["hooks"]
            .as_array()
            .cloned()
            .unwrap_or_default());
    }
    anyhow::bail!("no CDI spec of claim {uid} in {}", dir.display())
}

async fn enforced(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    apply_shared_device_classes(&c, &[das_api::WHOLE_GPU_PROFILE]).await?;
    let levels = enforcement_levels(&c).await?;
    ensure!(
        levels
            == BTreeMap::from([
                ("gpu-0-shared".to_string(), "enforced".to_string()),
                ("gpu-1-shared".to_string(), "mps".to_string()),
            ]),
        "published levels: {levels:?}"
    );
    let needs_enforced = json!({"deviceClassName": shared_whole_gpu_device_class(),
        "capacity": {"requests": {"memory": "6Gi"}},
        "selectors": [{"cel": {"expression":
            "device.attributes['mig.das.com'].memoryEnforcement == 'enforced'"}}]});
    create_claim_pod(&c, "hard", needs_enforced, None).await?;
    wait_running(&c, "hard").await?;
    let rc = Api::<ResourceClaim>::namespaced(c.clone(), NS);
    let hard = rc.get("hard").await?;
    let got: Vec<String> = das_api::claim_status::our_results(&hard)
        .map(|r| r.device.clone())
        .collect();
    ensure!(got == ["gpu-0-shared"], "the enforced claim got {got:?}");
    let hooks = cdi_hooks(cluster, hard.metadata.uid.as_deref().unwrap_or_default())?;
    let [hook] = hooks.as_slice() else {
        anyhow::bail!("one hook expected: {hooks:?}")
    };
    let args: Vec<&str> = hook["args"]
        .as_array()
        .context("hook args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        hook["hookName"] == "createRuntime"
            && args.windows(2).any(|w| w == ["--hard-limit-mib", "6144"])
            && args
                .windows(2)
                .any(|w| w == ["--pci-bus-id", "0000:10:00.0"])
            && args.windows(2).any(|w| w == ["--set-with", "emulated"]),
        "the hook: {hook}"
    );
    let exe = PathBuf::from(hook["path"].as_str().context("hook path")?);
    ensure!(
        exe.is_file(),
        "the hook's executable {} is missing",
        exe.display()
    );

    // A share without the requirement that lands on GPU 1 gets no hook: MPS holds its memory.
    let on_gpu1 = json!({"deviceClassName": shared_whole_gpu_device_class(),
        "capacity": {"requests": {"memory": "20Gi"}}});
    create_claim_pod(&c, "soft", on_gpu1, None).await?;
    wait_running(&c, "soft").await?;
    let soft = rc.get("soft").await?;
    let got: Vec<String> = das_api::claim_status::our_results(&soft)
        .map(|r| r.device.clone())
        .collect();
    ensure!(got == ["gpu-1-shared"], "the 20Gi share got {got:?}");
    let hooks = cdi_hooks(cluster, soft.metadata.uid.as_deref().unwrap_or_default())?;
    ensure!(
        hooks.is_empty(),
        "a share held by MPS only has hooks: {hooks:?}"
    );
    for pod in ["hard", "soft"] {
        delete_pod(&c, pod).await?;
    }
    Ok(())
}
