//! DAS slices under Kueue quota (docs/kueue.md), with Kueue's real controller manager
//! ([`das_e2e::kueue`], `make kueue`) and DAS installed from the chart (plugin, controller and
//! webhook). Kueue's configuration and queues are the files of docs/examples/kueue/, as the docs
//! show them. Every path is checked against the slices that got carved: the MIG UUIDs the node
//! plugin reported for the pods' claims, and their AllocationClaims.
//!
//! - (a) per-profile count through `deviceClassMappings`;
//! - (b) GPU memory through `sources[].counter` on DAS's `memory` counter, in bytes;
//! - (c) legacy `nvidia.com/mig-*` pods, which das-webhook turns into claims, charged as such;
//! - (d) a Job of 3 × `1g.10gb` admitted whole or not at all.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use das_api::allocation::AllocationClaim;
use das_e2e::chart;
use das_e2e::cluster::{Cluster, ClusterConfig};
use das_e2e::install::{self, Binaries};
use das_e2e::kueue::{self, QUEUE_LABEL};
use das_e2e::wait;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

const NS: &str = kueue::EXAMPLE_NAMESPACE;
const NODE: &str = "n0";
/// Four GPUs: room for more slices than any quota here, so a pod that waits waits for quota.
const GPUS: &str = "H100-80GB:4";
/// The scheduling gate Kueue's pod webhook puts on a managed pod until its Workload is admitted.
const ADMISSION_GATE: &str = "kueue.x-k8s.io/admission";

/// A cluster with DAS and Kueue configured by docs/examples/kueue/`<quota>`-config.yaml, the
/// queues of `<quota>`-queues.yaml applied, and namespace team-a managed by Kueue.
async fn start(quota: &str) -> Result<Cluster> {
    let bins = Binaries::in_target_dir("debug", true)?;
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE])).await?;
    let r = setup(&mut cluster, &bins, quota).await;
    cluster.check(r);
    Ok(cluster)
}

async fn setup(cluster: &mut Cluster, bins: &Binaries, quota: &str) -> Result<()> {
    install::install(cluster, &[(NODE.to_string(), GPUS.to_string())], bins).await?;
    kueue::start_example(cluster, quota).await?;
    // The ResourceClaimTemplate a pod names (Kueue reads it to charge the pod).
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-1g", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": das_api::profile_device_class("1g.10gb")}}]}}}
    });
    chart::apply(&cluster.kubeconfig, [&template])?;
    Ok(())
}

/// A pod of team-a's queue whose container uses one claim: from template `one-1g`, or
/// `nvidia.com/mig-<profile>: n` the legacy way.
fn pod(name: &str, legacy: Option<(&str, u32)>) -> Value {
    let container = match legacy {
        Some((profile, n)) => json!({"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {format!("nvidia.com/mig-{profile}"): n.to_string()}}}),
        None => json!({"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"claims": [{"name": "mig"}]}}),
    };
    let mut spec = json!({"containers": [container], "terminationGracePeriodSeconds": 0});
    if legacy.is_none() {
        spec["resourceClaims"] = json!([{"name": "mig", "resourceClaimTemplateName": "one-1g"}]);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: "team-a"}},
        "spec": spec})
}

async fn create_pods(client: &Client, pods: &[Value]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    for p in pods {
        api.create(&PostParams::default(), &serde_json::from_value(p.clone())?)
            .await
            .with_context(|| format!("create pod {}", p["metadata"]["name"]))?;
    }
    Ok(())
}

async fn delete_pods(client: &Client, names: &[&str]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    for n in names {
        api.delete(n, &DeleteParams::default().grace_period(0))
            .await?;
    }
    for n in names {
        wait::until(&format!("pod {n} gone"), wait::TIMEOUT, || async {
            Ok(api.get_opt(n).await?.is_none().then_some(()))
        })
        .await?;
    }
    Ok(())
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Pod name → the MIG UUIDs carved for it (from the node plugin's device status in its claims,
/// read as `kubectl das` reads them), for team-a's pods that hold slices.
async fn carved(client: &Client) -> Result<BTreeMap<String, Vec<String>>> {
    let inv = kubectl_das::fetch::inventory(client).await?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for h in inv.held.iter().filter(|h| h.namespace == NS) {
        let (Some(pod), Some(uuid)) = (&h.pod, &h.mig_uuid) else {
            continue;
        };
        out.entry(pod.clone()).or_default().push(uuid.clone());
    }
    Ok(out)
}

/// Waits until exactly the pods `want` (name → slices) run in team-a with that many carved
/// slices each, and the AllocationClaims of team-a say the same (each `inUse`).
async fn wait_carved(client: &Client, want: &[(&str, usize)]) -> Result<()> {
    let want: BTreeMap<String, usize> = want.iter().map(|(p, n)| (p.to_string(), *n)).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let allocs: Api<AllocationClaim> = Api::namespaced(client.clone(), NS);
    let last = std::sync::Mutex::new(String::new());
    let r = wait::until("the carved slices", wait::TIMEOUT, || {
        let (want, pods, allocs, last) = (&want, &pods, &allocs, &last);
        async move {
            let got: BTreeMap<String, usize> = carved(client)
                .await?
                .into_iter()
                .map(|(p, u)| (p, u.len()))
                .collect();
            let mut in_use: BTreeMap<String, usize> = BTreeMap::new();
            for a in allocs.list(&ListParams::default()).await?.items {
                let state = a.status.as_ref().map(|s| s.state.as_str());
                if let (Some(p), Some("inUse")) = (a.spec.pod_ref.as_ref(), state) {
                    *in_use.entry(p.name.clone()).or_default() += 1;
                }
            }
            let mut running = Vec::new();
            for p in pods.list(&ListParams::default()).await?.items {
                if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                    running.push(p.metadata.name.unwrap_or_default());
                }
            }
            running.sort();
            let want_running: Vec<String> = want.keys().cloned().collect();
            *last.lock().unwrap() =
                format!("carved {got:?}, AllocationClaims inUse {in_use:?}, running {running:?}");
            Ok((got == *want && in_use == *want && running == want_running).then_some(()))
        }
    })
    .await;
    r.with_context(|| format!("want {want:?}; last seen: {}", last.lock().unwrap()))
}

/// The Workload Kueue made for the object `kind`/`name` of team-a.
async fn workload_of(client: &Client, kind: &str, name: &str) -> Result<Option<Value>> {
    let api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NS,
        &kueue::resource("Workload", "workloads"),
    );
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find_map(|w| {
            let owned = w
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == kind && o.name == name);
            owned.then(|| serde_json::to_value(&w).unwrap_or_default())
        }))
}

/// Waits until `kind`/`name` is held back by Kueue for quota on `resource`: its Workload has
/// `QuotaReserved=False` with a message naming the resource. Returns that message.
async fn wait_pending_for_quota(
    client: &Client,
    kind: &str,
    name: &str,
    resource: &str,
) -> Result<String> {
    wait::until(
        &format!("{kind} {name} pending on quota"),
        wait::TIMEOUT,
        || async {
            let Some(w) = workload_of(client, kind, name).await? else {
                return Ok(None);
            };
            let Some(c) = condition(&w, "QuotaReserved") else {
                return Ok(None);
            };
            let msg = c["message"].as_str().unwrap_or_default();
            // "insufficient unused quota for <resource> in flavor …, <n> more needed", or
            // "insufficient quota for <resource> …" when the request exceeds the nominal quota.
            let short =
                msg.contains("insufficient") && msg.contains(&format!("quota for {resource}"));
            Ok((c["status"] == "False" && short).then(|| msg.to_string()))
        },
    )
    .await
}

/// The quota `resource` the admitted Workload of `kind`/`name` was charged, as a quantity.
async fn charged(client: &Client, kind: &str, name: &str, resource: &str) -> Result<String> {
    let w = workload_of(client, kind, name)
        .await?
        .with_context(|| format!("no Workload for {kind} {name}"))?;
    let usage = &w["status"]["admission"]["podSetAssignments"][0]["resourceUsage"][resource];
    usage.as_str().map(str::to_string).with_context(|| {
        format!(
            "Workload of {kind} {name} has no {resource} usage: {}",
            w["status"]
        )
    })
}

async fn gated(client: &Client, pod: &str) -> Result<bool> {
    let p = Api::<Pod>::namespaced(client.clone(), NS).get(pod).await?;
    Ok(p.spec
        .and_then(|s| s.scheduling_gates)
        .unwrap_or_default()
        .iter()
        .any(|g| g.name == ADMISSION_GATE))
}

#[tokio::test]
async fn slices_counted_per_profile_legacy_pods_and_whole_jobs() {
    let mut cluster = start("count").await.expect("cluster with DAS and Kueue");
    let r = count_paths(&cluster).await;
    cluster.check(r);
    cluster.stop();
}

async fn count_paths(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let quota = "mig.das.com/1g.10gb";

    // (a) Three slices of quota: three pods run with a slice each, the fourth waits gated.
    let t0 = Instant::now();
    create_pods(
        &client,
        &[pod("a1", None), pod("a2", None), pod("a3", None)],
    )
    .await?;
    wait_carved(&client, &[("a1", 1), ("a2", 1), ("a3", 1)]).await?;
    let admitted = t0.elapsed();
    create_pods(&client, &[pod("a4", None)]).await?;
    let msg = wait_pending_for_quota(&client, "Pod", "a4", quota).await?;
    ensure!(gated(&client, "a4").await?, "a4 waits but is not gated");
    assert_eq!(charged(&client, "Pod", "a1", quota).await?, "1");
    // Deleting one admits the waiting pod, which gets its slice.
    let t1 = Instant::now();
    delete_pods(&client, &["a1"]).await?;
    wait_carved(&client, &[("a2", 1), ("a3", 1), ("a4", 1)]).await?;
    let readmitted = t1.elapsed();
    println!(
        "kueue count: 3 pods admitted and carved in {:.1} s; the 4th waited ({msg}); \
         admitted and carved {:.1} s after a delete",
        admitted.as_secs_f64(),
        readmitted.as_secs_f64()
    );
    delete_pods(&client, &["a2", "a3", "a4"]).await?;
    wait_carved(&client, &[]).await?;

    // (c) A legacy pod asking nvidia.com/mig-1g.10gb: 2 is charged 2 (das-webhook turned it into a
    // claim of two 1g.10gb devices before Kueue built its Workload); a second one waits.
    create_pods(&client, &[pod("legacy1", Some(("1g.10gb", 2)))]).await?;
    wait_carved(&client, &[("legacy1", 2)]).await?;
    assert_eq!(charged(&client, "Pod", "legacy1", quota).await?, "2");
    create_pods(&client, &[pod("legacy2", Some(("1g.10gb", 2)))]).await?;
    wait_pending_for_quota(&client, "Pod", "legacy2", quota).await?;

    // (d) A Job of 3 × 1g.10gb does not fit beside legacy1 (2 + 3 > 3): no pod of it starts.
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": NS, "labels": {QUEUE_LABEL: "team-a"}},
        "spec": {"parallelism": 3, "completions": 3, "suspend": true,
            "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "one-1g"}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "mig"}]}}]}}}});
    chart::apply(&cluster.kubeconfig, [&job])?;
    wait_pending_for_quota(&client, "Job", "train", quota).await?;
    // Kueue has tried it with 1 of 3 left: it is all or nothing, so no pod of it exists.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let job_pods = || async {
        Ok::<_, anyhow::Error>(
            pods.list(&ListParams::default().labels("batch.kubernetes.io/job-name=train"))
                .await?
                .items
                .len(),
        )
    };
    ensure!(
        job_pods().await? == 0,
        "the Job started pods without being admitted whole"
    );
    wait_carved(&client, &[("legacy1", 2)]).await?;
    // With the quota free (the pending legacy2 goes first, so it cannot take the room), the
    // whole Job is admitted: three pods, three slices.
    delete_pods(&client, &["legacy2", "legacy1"]).await?;
    wait::until("the Job's three pods", wait::TIMEOUT, || async {
        Ok((job_pods().await? == 3).then_some(()))
    })
    .await?;
    let names: Vec<String> = pods
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=train"))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let want: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    wait_carved(&client, &want).await?;
    assert_eq!(charged(&client, "Job", "train", quota).await?, "3");
    Ok(())
}

#[tokio::test]
async fn gpu_memory_quota_through_the_memory_counter() {
    let mut cluster = start("memory").await.expect("cluster with DAS and Kueue");
    let r = memory_path(&cluster).await;
    cluster.check(r);
    cluster.stop();
}

async fn memory_path(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let quota = "mig.das.com/memory";
    let nominal: i128 = 40 << 30;
    // What Kueue charges a 1g.10gb: the largest `memory` its devices consume.
    let inv = kubectl_das::fetch::inventory(&client).await?;
    let per_slice = inv
        .devices
        .iter()
        .filter(|d| d.profile == "1g.10gb")
        .filter_map(|d| d.consumes.values().find_map(|c| c.get("memory")).copied())
        .max()
        .context("1g.10gb devices consume memory")?;
    let fits = (nominal / per_slice) as usize;
    ensure!(
        (2..=8).contains(&fits),
        "{fits} slices of {per_slice} bytes in 40Gi"
    );

    let names: Vec<String> = (1..=fits).map(|i| format!("m{i}")).collect();
    let t0 = Instant::now();
    create_pods(
        &client,
        &names.iter().map(|n| pod(n, None)).collect::<Vec<_>>(),
    )
    .await?;
    let want: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    wait_carved(&client, &want).await?;
    let admitted = t0.elapsed();
    let charge = charged(&client, "Pod", "m1", quota).await?;
    let bytes = kubectl_das::inventory::quantity(&charge)?;
    assert_eq!(bytes, per_slice, "m1 charged {charge}");

    // The next one does not fit in what is left.
    create_pods(&client, &[pod("waiting", None)]).await?;
    let msg = wait_pending_for_quota(&client, "Pod", "waiting", quota).await?;
    ensure!(gated(&client, "waiting").await?, "waiting is not gated");
    let t1 = Instant::now();
    delete_pods(&client, &["m1"]).await?;
    let mut want: Vec<(&str, usize)> = names[1..].iter().map(|n| (n.as_str(), 1)).collect();
    want.push(("waiting", 1));
    wait_carved(&client, &want).await?;
    println!(
        "kueue memory: {fits} × 1g.10gb ({per_slice} bytes each) admitted in 40Gi and carved in \
         {:.1} s; the next waited ({msg}); admitted and carved {:.1} s after a delete",
        admitted.as_secs_f64(),
        t1.elapsed().as_secs_f64()
    );
    let total: i128 = carved(&client)
        .await?
        .values()
        .map(|u| u.len() as i128)
        .sum::<i128>()
        * per_slice;
    ensure!(
        total <= nominal,
        "carved {total} bytes of MIG memory under a 40Gi quota"
    );
    Ok(())
}
