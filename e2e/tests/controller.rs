//! Cluster tests of `das-controller` on the local cluster (real kube-apiserver, scheduler,
//! controller-manager and hollow DRA kubelets) with the DAS node plugin on emulated GPUs.
//!
//! The controller and plugin binaries are the debug builds in the target directory
//! ([`DasBinary`]); `make e2e` builds them first.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::{
    AllocationClaim, AllocationState, CONDITION_DEVICE_HEALTHY, StateCondition,
};
use das_api::claim_status::{DeviceStatusData, our_results};
use das_e2e::das::{self, apply_device_classes, wait_nodes_published};
use das_e2e::install::DasBinary;
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, claim_of, create_pod, create_template, delete_pod, free_port, http_get,
};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

const NODE: &str = "n0";

/// Starts controller replica `name`; returns its metrics port.
fn start_controller(cluster: &mut Cluster, name: &str) -> Result<u16> {
    let port = free_port();
    let args = vec![
        format!("--kubeconfig={}", cluster.kubeconfig.display()),
        format!("--metrics-address=127.0.0.1:{port}"),
        format!("--leader-elect-namespace={NS}"),
        format!("--identity={name}"),
        "--lease-duration-seconds=6".into(),
        "--log-level=info,das_controller=debug".into(),
    ];
    cluster.spawn_program(name, &DasBinary::Controller.debug()?, args)?;
    Ok(port)
}

/// A one-node cluster (emulated H100 80GB x1) with the plugin, DeviceClasses and the CRD.
async fn cluster() -> Cluster {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    let setup = async {
        let n = cluster.node(NODE).clone();
        let args = das::plugin_args(&n, "H100-80GB:1", &cluster.kubeconfig.clone(), free_port());
        cluster.spawn_program("das-plugin-n0", &DasBinary::Plugin.debug()?, args)?;
        let client = cluster.client();
        apply_device_classes(&client, &["1g.10gb", "3g.40gb"]).await?;
        das::install_allocation_claim_crd(&client).await?;
        wait_nodes_published(&client, &[NODE]).await
    };
    let r = setup.await;
    cluster.check(r);
    cluster
}

/// The AllocationClaims of pod `pod`.
async fn allocs_of(client: &Client, pod: &str) -> Result<Vec<AllocationClaim>> {
    let api: Api<AllocationClaim> = Api::namespaced(client.clone(), NS);
    let all = api.list(&ListParams::default()).await?.items;
    Ok(all
        .into_iter()
        .filter(|a| a.spec.pod_ref.as_ref().is_some_and(|p| p.name == pod))
        .collect())
}

/// Waits until pod `pod` has `n` AllocationClaims, all `inUse`.
async fn wait_in_use(client: &Client, pod: &str, n: usize) -> Result<Vec<AllocationClaim>> {
    wait::until(
        &format!("{n} inUse AllocationClaims of {pod}"),
        TIMEOUT,
        || async {
            let a = allocs_of(client, pod).await?;
            let in_use = a.iter().all(|a| {
                a.status
                    .as_ref()
                    .is_some_and(|s| s.state == AllocationState::InUse)
            });
            Ok((a.len() == n && in_use).then_some(a))
        },
    )
    .await
}

/// `kubectl get allocationclaims -A` with the cluster's kubeconfig.
fn kubectl_get(cluster: &Cluster, extra: &[&str]) -> Result<String> {
    let kubectl = das_e2e::cluster::workspace_root().join(".local/bin/kubectl");
    let out = std::process::Command::new(kubectl)
        .args(["get", "allocationclaims", "-A"])
        .args(extra)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output()?;
    if !out.status.success() {
        bail!("kubectl: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// One 1-slice pod, one 3-slice pod, one unschedulable pod; then the pods are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_allocations_through_their_life() {
    let mut cluster = cluster().await;
    let port = start_controller(&mut cluster, "das-controller").expect("controller starts");
    let c = cluster.client();
    let r =
        async {
            create_template(&c, "one", "1g.10gb", 1).await?;
            create_template(&c, "three", "1g.10gb", 3).await?;
            create_template(&c, "too-many", "3g.40gb", 3).await?;
            wait::until("the controller leads and is ready", TIMEOUT, || async {
                let m = http_get(port, "/metrics").await?.1;
                let ready = http_get(port, "/readyz").await?.0 == 200;
                Ok((ready && m.contains("das_controller_leader 1")).then_some(()))
            })
            .await?;
            let before = reconciles(&http_get(port, "/metrics").await?.1);
            create_pod(&c, "single", "one", None).await?;
            let a = wait_in_use(&c, "single", 1).await?;
            // Kubelet status updates, the pod's claims being recorded and our own writes coming
            // back start no reconcile: one each for allocated (staged), bound (created) and ready
            // (inUse); the proof over every delivery order is the unit test
            // `every_interleaving_of_the_two_watches_converges_with_at_most_three_reconciles`.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let spent = reconciles(&http_get(port, "/metrics").await?.1) - before;
            ensure!(
                (1..=3).contains(&spent),
                "{spent} reconciles for one pod's start, want at most 3"
            );
            let claim = claim_of(&c, "single").await?;
            let result = our_results(&claim)
                .next()
                .context("no allocation result of mig.das.com")?;
            let a = &a[0];
            assert_eq!(a.spec.profile, "1g.10gb");
            assert_eq!(a.spec.nodename, NODE);
            assert_eq!(a.spec.device, result.device);
            assert!(a.spec.gpu_uuid.starts_with("GPU-"), "{:?}", a.spec);
            assert_eq!(a.spec.mig_placement.size, 1);
            assert!(
                result
                    .device
                    .ends_with(&format!("-{}", a.spec.mig_placement.start))
            );
            assert_eq!(a.spec.resource_claim_ref.uid, claim.uid().unwrap());
            let status = a.status.as_ref().unwrap();
            assert!(
                status
                    .mig_uuid
                    .as_deref()
                    .is_some_and(|u| u.starts_with("MIG-")),
                "{status:?}"
            );
            assert_eq!(status.conditions[0].reason, "inUse");
            let owner = &a.owner_references()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("ResourceClaim", claim.uid().unwrap().as_str())
            );

            let wide = kubectl_get(&cluster, &["-o", "wide"])?;
            assert!(
                wide.lines().next().unwrap_or("").contains("MIG UUID")
                    && wide.contains(status.mig_uuid.as_deref().unwrap()),
                "{wide}"
            );
            let table = kubectl_get(&cluster, &[])?;
            println!("{table}");
            let header: Vec<_> = table
                .lines()
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            assert_eq!(
                header,
                [
                    "NAMESPACE",
                    "NAME",
                    "PROFILE",
                    "NODE",
                    "GPU",
                    "START",
                    "SHARE",
                    "STATE",
                    "POD",
                    "AGE"
                ]
            );
            assert!(table.lines().any(|l| l.contains("single")
                && l.contains("inUse")
                && l.contains(&a.spec.gpu_uuid)));

            create_pod(&c, "triple", "three", None).await?;
            let three = wait_in_use(&c, "triple", 3).await?;
            let mut starts: Vec<_> = three.iter().map(|a| a.spec.mig_placement.start).collect();
            starts.sort();
            starts.dedup();
            assert_eq!(starts.len(), 3, "distinct placements: {starts:?}");
            assert!(!starts.contains(&a.spec.mig_placement.start));

            // Someone else's write is not mistaken for our own: it is put back.
            let api: Api<AllocationClaim> = Api::namespaced(c.clone(), NS);
            api.patch_status(
                &a.name_any(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"status": {"state": "staged"}})),
            )
            .await?;
            wait_in_use(&c, "single", 1).await?;

            create_pod(&c, "unschedulable", "too-many", None).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let p = Api::<Pod>::namespaced(c.clone(), NS)
                .get("unschedulable")
                .await?;
            assert_eq!(
                p.spec.and_then(|s| s.node_name),
                None,
                "the pod must not be scheduled"
            );
            assert!(allocs_of(&c, "unschedulable").await?.is_empty());
            let api: Api<AllocationClaim> = Api::namespaced(c.clone(), NS);
            assert_eq!(api.list(&ListParams::default()).await?.items.len(), 4);

            for p in ["single", "triple", "unschedulable"] {
                delete_pod(&c, p).await?;
            }
            wait::until("every AllocationClaim gone", TIMEOUT, || async {
                Ok(api
                    .list(&ListParams::default())
                    .await?
                    .items
                    .is_empty()
                    .then_some(()))
            })
            .await?;
            Ok(())
        };
    let r: Result<()> = r.await;
    cluster.check(r);
}

/// A pod with two containers and two claims: `main` uses both, `side` only `b`. The info gauge
/// has a row per (container, device) while the pod runs and none after; the AllocationClaims
/// say when the device's GPU turns unhealthy (a fatal XID injected into the emulated GPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_info_names_pod_container_and_claim_and_health_reaches_allocation_claims() {
    let mut cluster = cluster().await;
    let port = start_controller(&mut cluster, "das-controller").expect("controller starts");
    let r = device_info_and_health(&cluster, port).await;
    cluster.check(r);
}

async fn device_info_and_health(cluster: &Cluster, port: u16) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "one", "1g.10gb", 1).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "duo"},
        "spec": {
            "resourceClaims": [{"name": "a", "resourceClaimTemplateName": "one"},
                {"name": "b", "resourceClaimTemplateName": "one"}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "a"}, {"name": "b"}]}},
                {"name": "side", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "b"}]}}],
            "terminationGracePeriodSeconds": 0}
    }))?;
    Api::<Pod>::namespaced(c.clone(), NS)
        .create(&Default::default(), &pod)
        .await?;
    let allocs = wait_in_use(&c, "duo", 2).await?;
    for a in &allocs {
        let h = health_condition(a).context("DeviceHealthy condition")?;
        ensure!(h.status == "True" && h.reason == "Healthy", "{h:?}");
    }

    // The rows the gauge must have: one per (container, device of a claim it uses).
    let p = Api::<Pod>::namespaced(c.clone(), NS).get("duo").await?;
    let claim_name = |entry: &str| {
        p.status
            .iter()
            .flat_map(|s| s.resource_claim_statuses.iter().flatten())
            .find(|s| s.name == entry)
            .and_then(|s| s.resource_claim_name.clone())
    };
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), NS);
    let mut want = Vec::new();
    for (entry, containers) in [("a", &["main"][..]), ("b", &["main", "side"][..])] {
        let name = claim_name(entry).context("generated claim")?;
        let claim = claims.get(&name).await?;
        let data = claim
            .status
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .find_map(DeviceStatusData::of)
            .context("device status data")?;
        let gi = data.gpu_instance_id.context("gpuInstanceId")?;
        let ci = data.compute_instance_id.context("computeInstanceId")?;
        for container in containers {
            want.push(format!(
                "das_mig_device_info{{namespace=\"{NS}\",pod=\"duo\",container=\"{container}\",\
                 claim=\"{name}\",gpu_uuid=\"{}\",mig_uuid=\"{}\",gpu_instance_id=\"{gi}\",\
                 compute_instance_id=\"{ci}\",profile=\"1g.10gb\",node=\"{NODE}\"}} 1",
                data.gpu_uuid, data.mig_uuid
            ));
        }
    }
    let rows = |text: &str| -> Vec<String> {
        let mut r: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("das_mig_device_info{"))
            .map(str::to_string)
            .collect();
        r.sort();
        r
    };
    want.sort();
    wait::until("the info gauge rows of duo", TIMEOUT, || async {
        let (_, text) = http_get(port, "/metrics").await?;
        Ok((rows(&text) == want).then_some(()))
    })
    .await
    .with_context(|| format!("want {want:#?}"))?;

    // A fatal XID on the GPU: both AllocationClaims say the device is unhealthy.
    das::write_control(
        cluster.node(NODE),
        &serde_json::json!({"xidEvents": [{"gpu": 0, "xid": 79}]}),
    )?;
    wait::until(
        "DeviceHealthy=False on duo's AllocationClaims",
        TIMEOUT,
        || async {
            let a = allocs_of(&c, "duo").await?;
            let sick = a.len() == 2
                && a.iter().all(|a| {
                    health_condition(a).is_some_and(|h| h.status == "False" && h.reason == "XID")
                });
            Ok(sick.then_some(()))
        },
    )
    .await?;

    delete_pod(&c, "duo").await?;
    wait::until("no info gauge rows", TIMEOUT, || async {
        let (_, text) = http_get(port, "/metrics").await?;
        Ok(rows(&text).is_empty().then_some(()))
    })
    .await?;
    Ok(())
}

fn health_condition(a: &AllocationClaim) -> Option<&StateCondition> {
    a.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_DEVICE_HEALTHY)
}

/// Sum of the `das_controller_writes_total` samples in a metrics text.
/// The sum of every series of counter `name` (`das_controller_<x>_total`) in `metrics`.
fn total(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

/// `das_controller_reconciles_total`, every result.
fn reconciles(metrics: &str) -> u64 {
    total(metrics, "das_controller_reconciles_total")
}

fn writes(metrics: &str) -> u64 {
    total(metrics, "das_controller_writes_total")
}

/// Holder of the controller's leader Lease.
async fn leader(client: &Client) -> Result<String> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), NS);
    wait::until("a leader", TIMEOUT, || async {
        let l = api.get_opt("das-controller").await?;
        Ok(l.and_then(|l| l.spec?.holder_identity))
    })
    .await
}

/// The AllocationClaims match the live allocations exactly: one per allocated result of our
/// driver (by name), none for anything else.
async fn wait_consistent(client: &Client) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let allocs: Api<AllocationClaim> = Api::namespaced(client.clone(), NS);
    wait::until(
        "AllocationClaims to match the allocations",
        TIMEOUT,
        || async {
            let mut want: Vec<String> = Vec::new();
            for c in claims.list(&ListParams::default()).await?.items {
                if c.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                want.extend(our_results(&c).map(|r| format!("{}-{}", c.name_any(), r.device)));
            }
            let mut have: Vec<String> = allocs
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|a| a.name_any())
                .collect();
            want.sort();
            have.sort();
            Ok((want == have && !want.is_empty()).then_some(()))
        },
    )
    .await
}

/// Two replicas: only the leader writes; killing it hands over; killing every replica while
/// pods come and go, then restarting, converges to exactly the live allocations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_writes_and_restart_converges() {
    let mut cluster = cluster().await;
    let a = start_controller(&mut cluster, "ctl-a").expect("a starts");
    let b = start_controller(&mut cluster, "ctl-b").expect("b starts");
    let c = cluster.client();
    let r = async {
        create_template(&c, "one", "1g.10gb", 1).await?;
        create_pod(&c, "p1", "one", None).await?;
        wait_in_use(&c, "p1", 1).await?;
        let lead = leader(&c).await?;
        let (lead_port, follow_port, follower) = if lead == "ctl-a" {
            (a, b, "ctl-b")
        } else {
            (b, a, "ctl-a")
        };
        let (lm, fm) = (
            http_get(lead_port, "/metrics").await?.1,
            http_get(follow_port, "/metrics").await?.1,
        );
        assert!(writes(&lm) >= 2, "the leader wrote:\n{lm}");
        assert_eq!(writes(&fm), 0, "the follower must not write:\n{fm}");
        assert!(fm.contains("das_controller_leader 0"), "{fm}");
        assert_eq!(http_get(follow_port, "/readyz").await?.1, "ok");

        // The leader crashes; the follower takes over after the lease expires.
        cluster.stop_component(&lead, false)?;
        delete_pod(&c, "p1").await?;
        create_pod(&c, "p2", "one", None).await?;
        wait_in_use(&c, "p2", 1).await?;
        assert_eq!(leader(&c).await?, follower);
        wait_consistent(&c).await?;

        // Every replica down while pods come and go, then a fresh one.
        cluster.stop_component(follower, false)?;
        delete_pod(&c, "p2").await?;
        create_pod(&c, "p3", "one", None).await?;
        create_pod(&c, "p4", "one", None).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        start_controller(&mut cluster, "ctl-c")?;
        wait_in_use(&c, "p3", 1).await?;
        wait_in_use(&c, "p4", 1).await?;
        wait_consistent(&c).await?;

        // A restart with nothing changed writes nothing and deletes nothing: a reconcile before
        // the pod and slice caches are synced would find the devices unknown.
        let before: Vec<String> = [allocs_of(&c, "p3").await?, allocs_of(&c, "p4").await?]
            .concat()
            .iter()
            .filter_map(|a| a.metadata.uid.clone())
            .collect();
        cluster.stop_component("ctl-c", false)?;
        let d = start_controller(&mut cluster, "ctl-d")?;
        wait::until("ctl-d to lead", TIMEOUT, || async {
            Ok((leader(&c).await.ok().as_deref() == Some("ctl-d")).then_some(()))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let m = http_get(d, "/metrics").await?.1;
        assert!(
            !m.contains(r#"das_controller_writes_total{op="delete"}"#)
                || m.contains(r#"das_controller_writes_total{op="delete"} 0"#),
            "a restarted controller deleted something:\n{m}"
        );
        let after: Vec<String> = [allocs_of(&c, "p3").await?, allocs_of(&c, "p4").await?]
            .concat()
            .iter()
            .filter_map(|a| a.metadata.uid.clone())
            .collect();
        assert_eq!(before, after, "the AllocationClaims were not recreated");
        Ok(())
    };
    let r: Result<()> = r.await;
    cluster.check(r);
}
