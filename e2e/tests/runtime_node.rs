//! DAS on a real-runtime node: the upstream kubelet with containerd v2 (CRI, CDI on), runc and
//! CNI bridge networking ([`das_e2e::runtime`]), DAS installed from the chart with the plugin's
//! emulated GPUs making stand-in device nodes. Containers really run the probe image, and what
//! they report (`kubectl logs`, through the API server and the kubelet) is what containerd
//! resolved from our CDI specs: no resolver of ours is involved.
//!
//! Needs root, runc and `make containerd`; `make e2e` builds them.

use anyhow::{Context, Result, bail, ensure};
use das_driver::claims::PodContainers;
use das_driver::claims::container_marks::ClaimMarks;
use das_driver::claims::cri::CriRuntime;
use das_e2e::das::{self, PluginDirs};
use das_e2e::install::{self, Binaries};
use das_e2e::plugin::live_slices;
use das_e2e::runtime::{self};
use das_e2e::runtime_pods::{
    check_container, create, one_slice_pod, pod_claims, probe, wait_pod, wait_ready,
};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_class_template, create_template, delete_pod, delete_pods};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::time::Duration;

const NODE: &str = "r0";
/// Two GPUs with MIG mode on and, served whole (`wholeGpus.enabled`), GPU 2 with MIG mode off.
const GPUS: &str = "H100-80GB:2,H100-80GB:1:mig-off";

#[tokio::test]
async fn containers_on_a_real_runtime_get_exactly_their_slices() {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.runtime_nodes = vec![NODE.into()];
    let mut cluster = Cluster::start(config).await.expect("cluster starts");
    let setup = async {
        let bins = Binaries::in_target_dir("debug", true)?;
        let rendered = das_e2e::chart::render_with(&["wholeGpus.enabled=true"])?;
        install::install_rendered(
            &mut cluster,
            &rendered,
            &[(NODE.into(), GPUS.into())],
            &bins,
        )
        .await?;
        das::wait_pool_complete(&cluster.client(), NODE).await?;
        let c = cluster.client();
        create_template(&c, "one-1g", "1g.10gb", 1).await?;
        create_template(&c, "one-7g", "7g.80gb", 1).await?;
        create_template(&c, "one-2g", "2g.20gb", 1).await?;
        create_class_template(&c, "one-gpu", das_api::DEVICE_CLASS_WHOLE_GPU, 1).await
    };
    if let Err(e) = setup.await {
        return cluster.check(Err(e));
    }
    cluster.check(scenarios(&cluster).await);
}

async fn scenarios(cluster: &Cluster) -> Result<()> {
    one_slice(cluster).await?;
    a_whole_gpu_container_sees_only_its_gpu(cluster).await?;
    two_claims_and_two_requests_in_one_container(cluster).await?;
    two_containers_see_only_their_own(cluster).await?;
    init_container_then_main_container(cluster).await?;
    killed_container_restarts_with_the_same_slice(cluster).await?;
    broken_cdi_spec_is_reported_by_the_runtime(cluster).await?;
    a_force_deleted_pods_slice_outlives_its_container(cluster).await?;
    Ok(())
}

/// A 1-slice pod: the container holds exactly its MIG UUID, its device nodes and the driver's
/// compute and utility files (the emulated GPUs' stand-in install); deleting the pod removes the
/// container, destroys the slice and removes the CDI spec.
async fn one_slice(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let (pod, uuid) = one_slice_pod(cluster, NODE, "one").await?;
    let view = check_container(cluster, NODE, &pod, "app", 1).await?;
    let got: Vec<&str> = view.files.keys().map(String::as_str).collect();
    for want in [
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "/usr/local/nvidia/lib64/libnvidia-nvvm.so.4",
        "/usr/local/nvidia/bin/nvidia-smi",
    ] {
        ensure!(got.contains(&want), "no {want} in the container: {got:?}");
    }
    ensure!(
        !got.iter()
            .any(|f| f.contains("GLX") || f.ends_with("libcuda.so")),
        "graphics libraries or development links were mounted: {got:?}"
    );
    ensure!(
        live_uuids(cluster)?.contains(&uuid),
        "MIG {uuid} the container got is not live on the GPUs"
    );
    let claim = pod_claims(&c, &pod).await?.remove(0);
    let spec = spec_file(cluster, &claim);
    ensure!(spec.exists(), "no CDI spec {}", spec.display());
    let id = container_id(&pod, "app")?;
    delete_pod(&c, "one").await?;
    wait::until("the slice destroyed", TIMEOUT, || async {
        Ok((!live_uuids(cluster)?.contains(&uuid) && !spec.exists()).then_some(()))
    })
    .await?;
    ensure!(
        runtime::container_pid(&files(cluster), &id).is_err(),
        "container {id} still runs after its pod was deleted"
    );
    Ok(())
}

/// A pod asking for a whole GPU (`gpu.das.com`): its container holds exactly GPU 2's device
/// node (no other GPU's, no MIG capability node) with the control and UVM nodes, and GPU 2's
/// UUID in its `DAS_GPU_UUID_*` variable; no MIG instance is made; deleting the pod removes the
/// CDI spec.
async fn a_whole_gpu_container_sees_only_its_gpu(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create(
        &c,
        NODE,
        "whole",
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [probe("app", &["gpu"])],
        }),
    )
    .await?;
    let pod = wait_ready(&c, "whole").await?;
    let seen = check_container(cluster, NODE, &pod, "app", 0).await?;
    let mut nodes: Vec<&str> = seen
        .device_nodes
        .iter()
        .map(String::as_str)
        .filter(|p| p.starts_with("/dev/nvidia"))
        .collect();
    nodes.sort();
    ensure!(
        nodes
            == [
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia2",
                "/dev/nvidiactl"
            ],
        "the whole-GPU container has device nodes {nodes:?}"
    );
    let state = das::emulated_state(cluster.node(NODE))?;
    let gpu2 = state["gpus"][2]["uuid"].as_str().context("GPU 2's UUID")?;
    let gpu_vars: Vec<&String> = seen
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("DAS_GPU_UUID_"))
        .map(|(_, v)| v)
        .collect();
    ensure!(
        gpu_vars == [gpu2],
        "the container's DAS_GPU_UUID_* are {gpu_vars:?}, GPU 2 is {gpu2}"
    );
    ensure!(
        live_uuids(cluster)?.is_empty(),
        "a MIG instance was made for a whole GPU"
    );
    let claim = pod_claims(&c, &pod).await?.remove(0);
    let spec = spec_file(cluster, &claim);
    delete_pod(&c, "whole").await?;
    wait::until("the whole GPU's CDI spec removed", TIMEOUT, || async {
        Ok((!spec.exists()).then_some(()))
    })
    .await
}

/// Two legacy profiles (two claims made by the webhook) in one container, and a claim of two
/// requests in another pod's container: each sees every one of its MIG UUIDs and no other.
async fn two_claims_and_two_requests_in_one_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let mut legacy = probe("app", &[]);
    legacy["resources"] =
        json!({"limits": {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}});
    create(&c, NODE, "legacy", json!({"containers": [legacy]})).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), NS);
    let two: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "two-requests"},
        "spec": {"devices": {"requests": [
            {"name": "small", "exactly": {"deviceClassName": das_api::profile_device_class("1g.10gb")}},
            {"name": "large", "exactly": {"deviceClassName": das_api::profile_device_class("3g.40gb")}}
        ]}}
    }))?;
    claims.create(&PostParams::default(), &two).await?;
    create(
        &c,
        NODE,
        "requests",
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "two-requests"}],
            "containers": [probe("app", &["gpu"])],
        }),
    )
    .await?;
    let legacy = wait_ready(&c, "legacy").await?;
    let requests = wait_ready(&c, "requests").await?;
    let a = check_container(cluster, NODE, &legacy, "app", 2).await?;
    let b = check_container(cluster, NODE, &requests, "app", 2).await?;
    ensure!(
        a.mig_uuids().iter().all(|u| !b.mig_uuids().contains(u)),
        "two pods share a MIG UUID: {:?} / {:?}",
        a.mig_uuids(),
        b.mig_uuids()
    );
    das_e2e::workload::delete_pods(&c, &["legacy", "requests"]).await?;
    claims
        .delete("two-requests", &Default::default())
        .await
        .map(|_| ())
        .context("delete claim two-requests")
}

/// Two containers of one pod, each with its own claim, see only their own slice.
async fn two_containers_see_only_their_own(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create(
        &c,
        NODE,
        "pair",
        json!({
            "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "one-1g"},
                {"name": "b", "resourceClaimTemplateName": "one-2g"}
            ],
            "containers": [probe("first", &["a"]), probe("second", &["b"])],
        }),
    )
    .await?;
    let pod = wait_ready(&c, "pair").await?;
    let first = check_container(cluster, NODE, &pod, "first", 1).await?;
    let second = check_container(cluster, NODE, &pod, "second", 1).await?;
    ensure!(
        first.mig_uuids() != second.mig_uuids(),
        "both containers got {:?}",
        first.mig_uuids()
    );
    delete_pod(&c, "pair").await
}

/// A classic init container with the claim runs to completion, then the main container starts
/// and gets the same slice.
async fn init_container_then_main_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let mut init = probe("init", &["gpu"]);
    init["args"] = json!(["exit"]);
    create(
        &c,
        NODE,
        "init",
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-1g"}],
            "initContainers": [init],
            "containers": [probe("app", &["gpu"])],
        }),
    )
    .await?;
    let pod = wait_ready(&c, "init").await?;
    let init = check_container(cluster, NODE, &pod, "init", 1).await?;
    let app = check_container(cluster, NODE, &pod, "app", 1).await?;
    ensure!(
        init.mig_uuids() == app.mig_uuids(),
        "init container got {:?}, main container {:?}",
        init.mig_uuids(),
        app.mig_uuids()
    );
    delete_pod(&c, "init").await
}

/// The container's process is killed (not the pod): the kubelet restarts the container and it
/// gets the same MIG UUID; the slice was never destroyed and made again (a new one would have a
/// new UUID).
async fn killed_container_restarts_with_the_same_slice(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let (pod, before) = one_slice_pod(cluster, NODE, "restart").await?;
    kill_container(cluster, &pod, "app")?;
    let pod = wait_restarted(&c, "restart").await?;
    let after = check_container(cluster, NODE, &pod, "app", 1)
        .await?
        .mig_uuids();
    ensure!(
        after == [before.clone()],
        "restarted container got {after:?}, had {before:?}"
    );
    delete_pod(&c, "restart").await
}

/// A CDI spec made unreadable under a running pod: the restarted container cannot be created,
/// the runtime's message reaches the pod's events, and deleting the pod still destroys the
/// slice and removes the spec.
async fn broken_cdi_spec_is_reported_by_the_runtime(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let (pod, uuid) = one_slice_pod(cluster, NODE, "broken").await?;
    let claim = pod_claims(&c, &pod).await?.remove(0);
    let spec = spec_file(cluster, &claim);
    std::fs::write(&spec, b"{ this is not a CDI spec")?;
    kill_container(cluster, &pod, "app")?;
    let events: Api<Event> = Api::namespaced(c.clone(), NS);
    let message = wait::until(
        "the runtime's CDI error in the pod's events",
        TIMEOUT,
        || async {
            let lp = ListParams::default().fields("involvedObject.name=broken");
            Ok(events.list(&lp).await?.items.into_iter().find_map(|e| {
                let m = e.message.unwrap_or_default();
                (e.type_.as_deref() == Some("Warning") && m.contains("CDI")).then_some(m)
            }))
        },
    )
    .await?;
    eprintln!("the runtime's message for a broken CDI spec: {message}");
    ensure!(
        message.contains(&claim),
        "the runtime's message does not name the claim's CDI device: {message}"
    );
    delete_pod(&c, "broken").await?;
    wait::until(
        "the slice destroyed and the spec removed",
        TIMEOUT,
        || async { Ok((!live_uuids(cluster)?.contains(&uuid) && !spec.exists()).then_some(())) },
    )
    .await
}

/// Issue 30: a force-deleted pod whose container is still being stopped keeps its slice. Pod
/// `old` holds a whole GPU (`7g.80gb`), `filler` the other one; `old`'s shim is frozen
/// (SIGSTOP), so the kubelet's kill of its container cannot finish, as on a slow or wedged node;
/// `old` is force-deleted and `next` asks for `7g.80gb` at once, which only `old`'s placement
/// offers. While `old`'s container process exists its MIG instance must stay (polled every
/// 100 ms, well past the plugin's 20 s wait), `next`'s prepare fails naming the holding claim,
/// and `next` does not run. Once the shim is thawed, the container goes, the kubelet unprepares
/// the old claim and `next` runs on a new instance at that placement. The node's containerd
/// also answers DAS's CRI client (the orphan rule's evidence) about a live pod and an unknown one.
async fn a_force_deleted_pods_slice_outlives_its_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let whole = |claim: &str| {
        json!({
            "resourceClaims": [{"name": claim, "resourceClaimTemplateName": "one-7g"}],
            "containers": [probe("app", &[claim])],
        })
    };
    create(&c, NODE, "old", whole("gpu")).await?;
    let old = wait_ready(&c, "old").await?;
    let old_view = check_container(cluster, NODE, &old, "app", 1).await?;
    let old_uuid = old_view.mig_uuids().remove(0);
    create(&c, NODE, "filler", whole("gpu")).await?;
    wait_ready(&c, "filler").await?;
    cri_answers_about_pods(cluster, &old).await?;
    let old_claim = pod_claims(&c, &old).await?.remove(0);
    cri_finds_the_containers_holding_a_claim(cluster, &old_claim, &old_view).await?;
    let pid = runtime::container_pid(&files(cluster), &container_id(&old, "app")?)?;
    let shim = Frozen::parent_of(pid)?;
    Api::<Pod>::namespaced(c.clone(), NS)
        .delete("old", &DeleteParams::default().grace_period(0))
        .await
        .context("force-delete pod old")?;
    create(&c, NODE, "next", whole("gpu")).await?;
    // Frozen: the old container lives on; its slice must stay and `next` must wait.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < until {
        slice_kept_while_container_lives(cluster, pid, &old_uuid)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        process_exists(pid),
        "the old container ended while its shim was frozen"
    );
    let events: Api<Event> = Api::namespaced(c.clone(), NS);
    let lp = ListParams::default().fields("involvedObject.name=next");
    let held = events.list(&lp).await?.items.into_iter().find_map(|e| {
        let m = e.message.unwrap_or_default();
        m.contains("still prepared for").then_some(m)
    });
    let held = held.context("no event of pod next names the claim holding its placement")?;
    ensure!(
        held.contains(&old_claim),
        "the event does not name the old claim {old_claim}: {held}"
    );
    let next: Pod = Api::namespaced(c.clone(), NS).get("next").await?;
    ensure!(
        next.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running"),
        "next runs while the old container still holds its placement"
    );
    drop(shim);
    // Thawed: the kill finishes, the kubelet unprepares, and `next`'s retried prepare succeeds;
    // the old slice is never gone before the old container.
    let next = wait::until("pod next running", Duration::from_secs(120), || async {
        slice_kept_while_container_lives(cluster, pid, &old_uuid)?;
        let p: Pod = Api::namespaced(c.clone(), NS).get("next").await?;
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok(ready.then_some(p))
    })
    .await?;
    let new_uuid = check_container(cluster, NODE, &next, "app", 1)
        .await?
        .mig_uuids()
        .remove(0);
    ensure!(new_uuid != old_uuid, "next got the old instance {old_uuid}");
    ensure!(!process_exists(pid), "the old container still runs");
    eprintln!(
        "force delete: old slice {old_uuid} kept until its container was gone; next got {new_uuid}: {held}"
    );
    delete_pods(&c, &["next", "filler"]).await
}

/// Fails when `uuid` is gone from the GPUs while process `pid` (the old container) exists.
fn slice_kept_while_container_lives(cluster: &Cluster, pid: i32, uuid: &str) -> Result<()> {
    let live = live_uuids(cluster)?;
    ensure!(
        live.contains(&uuid.to_string()) || !process_exists(pid),
        "MIG {uuid} was destroyed while the force-deleted pod's container (pid {pid}) still runs"
    );
    Ok(())
}

fn process_exists(pid: i32) -> bool {
    // A zombie has exited: it can no longer open a device.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            != Some("Z")
    })
}

/// A process stopped with SIGSTOP until dropped (then SIGCONT), so a failing test never leaves
/// the node's shim frozen.
struct Frozen(i32);

impl Frozen {
    /// Freezes the parent of `pid` (a container's init: its parent is the pod's containerd shim).
    fn parent_of(pid: i32) -> Result<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let ppid: i32 = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .context("no parent in /proc/<pid>/stat")?
            .parse()?;
        let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm"))?;
        ensure!(
            comm.trim().starts_with("containerd-shim"),
            "the container's parent {ppid} is {comm:?}, not its shim"
        );
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(ppid, libc::SIGSTOP) } != 0 {
            bail!("SIGSTOP {ppid}: {}", std::io::Error::last_os_error());
        }
        Ok(Frozen(ppid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// DAS's CRI client against the node's containerd: a running pod has containers, a UID no pod
/// has has none.
async fn cri_answers_about_pods(cluster: &Cluster, pod: &Pod) -> Result<()> {
    let cri = CriRuntime::new(files(cluster).socket().to_str().context("socket path")?)
        .map_err(anyhow::Error::msg)?;
    let uid = pod.metadata.uid.clone().context("pod without UID")?;
    ensure!(
        cri.pod_has_containers(&uid)
            .await
            .map_err(anyhow::Error::msg)?,
        "containerd has no sandbox or container of running pod {uid}"
    );
    ensure!(
        !cri.pod_has_containers("00000000-0000-0000-0000-000000000000")
            .await
            .map_err(anyhow::Error::msg)?,
        "containerd has containers of a pod UID no pod has"
    );
    Ok(())
}

/// DAS's CRI client finds, from containerd's verbose container status (the OCI runtime spec
/// containerd applied the CDI edits to), the container that holds claim `claim_uid`'s devices,
/// by its CDI variable and by its capability nodes (as the orphan rule asks before a release;
/// docs/design.md §7, "A slice leaves its claim"), and none for another claim's marks.
async fn cri_finds_the_containers_holding_a_claim(
    cluster: &Cluster,
    claim_uid: &str,
    view: &das_e2e::container_view::ContainerView,
) -> Result<()> {
    let cri = CriRuntime::new(files(cluster).socket().to_str().context("socket path")?)
        .map_err(anyhow::Error::msg)?;
    let escaped = |uid: &str| uid.replace('-', "_");
    let by_env = ClaimMarks {
        env_prefixes: vec![format!("DAS_MIG_UUID_{}_", escaped(claim_uid))],
        device_paths: Vec::new(),
    };
    let found = cri
        .containers_holding(&by_env)
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        found.len() == 1
            && found[0].contains("pod default/old")
            && found[0].contains("its CDI variable"),
        "containerd's containers holding claim {claim_uid} by its variable: {found:?}"
    );
    let caps: Vec<String> = view
        .device_nodes
        .iter()
        .filter(|p| p.contains("/nvidia-caps/"))
        .cloned()
        .collect();
    ensure!(
        !caps.is_empty(),
        "the container has no capability node: {:?}",
        view.device_nodes
    );
    let by_node = ClaimMarks {
        env_prefixes: Vec::new(),
        device_paths: caps,
    };
    let found = cri
        .containers_holding(&by_node)
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        found.len() == 1 && found[0].contains("device node /dev/nvidia-caps/"),
        "containerd's containers holding claim {claim_uid}'s capability nodes: {found:?}"
    );
    let other = ClaimMarks {
        env_prefixes: vec![format!(
            "DAS_MIG_UUID_{}_",
            escaped("00000000-0000-0000-0000-000000000000")
        )],
        device_paths: vec!["/dev/nvidia-caps/nvidia-cap999999".into()],
    };
    let found = cri
        .containers_holding(&other)
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        found.is_empty(),
        "containers hold a claim no pod has: {found:?}"
    );
    Ok(())
}

/// Waits until container `app` of pod `name` restarted once and is ready again.
async fn wait_restarted(c: &Client, name: &str) -> Result<Pod> {
    wait_pod(c, name, "restarted", |s| {
        s.container_statuses
            .iter()
            .flatten()
            .any(|s| s.restart_count >= 1 && s.ready)
    })
    .await
}

fn files(cluster: &Cluster) -> runtime::RuntimeFiles {
    cluster
        .node(NODE)
        .runtime_files()
        .expect("a real-runtime node")
}

fn spec_file(cluster: &Cluster, claim_uid: &str) -> std::path::PathBuf {
    PluginDirs::of(cluster.node(NODE))
        .cdi
        .join(format!("das.com-mig_{claim_uid}.json"))
}

fn live_uuids(cluster: &Cluster) -> Result<Vec<String>> {
    Ok(live_slices(cluster, NODE)?
        .into_iter()
        .map(|s| s.3)
        .collect())
}

fn container_id(pod: &Pod, container: &str) -> Result<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find(|s| s.name == container)
        .and_then(|s| s.container_id.clone())
        .with_context(|| format!("container {container} has no ID"))
}

/// SIGKILLs the process of container `container` of `pod` on the host (the pod stays).
fn kill_container(cluster: &Cluster, pod: &Pod, container: &str) -> Result<()> {
    let pid = runtime::container_pid(&files(cluster), &container_id(pod, container)?)?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("kill {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
