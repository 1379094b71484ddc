//! DAS installed for real: `helm install` of the chart on a cluster whose node is a
//! real-runtime node (upstream kubelet, containerd, runc, CNI) with a Service network
//! (kube-proxy). The node plugin runs as the DaemonSet's pod, the controller and the webhook as
//! the Deployments' pods, all from the DAS image built here ([`das_e2e::image`]): no DAS
//! process runs outside a container. What a user's first install would otherwise find:
//!
//! - the plugin pod becomes Ready, registers with the kubelet through the hostPath mounts and
//!   publishes; a user pod gets a slice its container sees;
//! - the webhook pod admits a legacy pod, called by the API server through its Service;
//! - the controller's two pods share one Lease; the leader's deletion hands it to the other,
//!   which goes on mirroring;
//! - `helm upgrade` to a new image tag rolls the plugin with surge and keeps a running pod's
//!   slice; `helm rollback` to the install's revision does too, and the rolled-back plugin
//!   reads the checkpoint the newer one wrote (each save is written in the oldest version that
//!   holds it);
//! - `helm uninstall` keeps the CRD and leaves no ResourceSlice and no MIG slice.
//!
//! Needs root, runc, iptables and `make containerd`; `make e2e` builds them. One such cluster
//! per machine at a time (kube-proxy owns the KUBE-* iptables chains).

use anyhow::{Result, ensure};
use das_api::allocation::{AllocationClaim, AllocationState};
use das_e2e::chart::NAMESPACE;
use das_e2e::das;
use das_e2e::plugin::live_slices;
use das_e2e::real_install::{self, IMAGE_REPO, container_ids, das_pods, image_of};
use das_e2e::runtime_pods::{create_one_slice_pod, one_slice_pod};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_template, delete_pods};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

const NODE: &str = "r0";
const GPUS: &str = "H100-80GB:1";

#[tokio::test]
async fn helm_install_runs_das_as_pods_on_a_real_runtime() {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.runtime_nodes = vec![NODE.into()];
    config.service_network = true;
    let cluster = Cluster::start(config).await.expect("cluster starts");
    let result = async {
        real_install::import_image(&cluster, &["e2e-1", "e2e-2"])?;
        real_install::install(&cluster, NODE, GPUS, "e2e-1")?;
        scenarios(&cluster).await
    }
    .await;
    cluster.check(result);
}

async fn scenarios(cluster: &Cluster) -> Result<()> {
    let uuid = plugin_pod_serves_a_user_pod(cluster).await?;
    real_install::legacy_pod_admitted_through_the_service(cluster, NODE).await?;
    controller_leader_hands_over(cluster).await?;
    upgrade_rolls_the_plugin_and_keeps_the_slice(cluster, &uuid).await?;
    uninstall_leaves_the_crd_and_no_slices(cluster).await
}

/// The DaemonSet pod runs our image, is Ready, and its node's pool is published whole; a user
/// pod's container sees exactly its slice. Returns that slice's MIG UUID (the pod `user` stays).
async fn plugin_pod_serves_a_user_pod(cluster: &Cluster) -> Result<String> {
    let c = cluster.client();
    let plugin = das_pods(&c, "das-kubelet-plugin").await?;
    ensure!(plugin.len() == 1, "one plugin pod, found {}", plugin.len());
    ensure!(
        image_of(&plugin[0]) == format!("{IMAGE_REPO}:e2e-1"),
        "plugin pod runs {}",
        image_of(&plugin[0])
    );
    das::wait_pool_complete(&c, NODE).await?;
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    let (_, uuid) = one_slice_pod(cluster, NODE, "user").await?;
    ensure!(
        live_uuids(cluster)?.contains(&uuid),
        "MIG {uuid} is not live on the GPU"
    );
    Ok(uuid)
}

/// The controller's Lease is held by one of its two pods; deleting that pod hands the Lease to
/// another pod, and the AllocationClaims are still mirrored (a new pod's claim reaches inUse).
async fn controller_leader_hands_over(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let pods = das_pods(&c, "das-controller").await?;
    ensure!(pods.len() == 2, "two controller pods, found {}", pods.len());
    let leases: Api<Lease> = Api::namespaced(c.clone(), NAMESPACE);
    let leader = wait::until("a controller pod leads", TIMEOUT, || async {
        Ok(holder(&leases).await?.filter(|h| {
            pods.iter()
                .any(|p| p.metadata.name.as_deref() == Some(h.as_str()))
        }))
    })
    .await?;
    Api::<Pod>::namespaced(c.clone(), NAMESPACE)
        .delete(&leader, &DeleteParams::default())
        .await?;
    let next = wait::until("another controller pod leads", TIMEOUT, || async {
        Ok(holder(&leases).await?.filter(|h| *h != leader))
    })
    .await?;
    ensure!(
        das_pods(&c, "das-controller")
            .await?
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(next.as_str())),
        "the Lease holder {next} is not a controller pod"
    );
    create_one_slice_pod(&c, NODE, "after-failover").await?;
    let allocs: Api<AllocationClaim> = Api::namespaced(c.clone(), NS);
    wait::until(
        "the new leader mirrors the pod's claim as inUse",
        TIMEOUT,
        || async {
            let list = allocs.list(&ListParams::default()).await?.items;
            Ok(list
                .iter()
                .any(|a| {
                    a.spec
                        .pod_ref
                        .as_ref()
                        .is_some_and(|p| p.name == "after-failover")
                        && a.status
                            .as_ref()
                            .is_some_and(|s| s.state == AllocationState::InUse)
                })
                .then_some(()))
        },
    )
    .await?;
    delete_pods(&c, &["after-failover"]).await
}

/// `helm upgrade` to tag e2e-2: a new plugin pod of the new image replaces the old one (the
/// DaemonSet surges: maxSurge 1, maxUnavailable 0); the running pod keeps its container and its
/// slice, and deleting it afterwards destroys the slice through the new plugin.
async fn upgrade_rolls_the_plugin_and_keeps_the_slice(cluster: &Cluster, uuid: &str) -> Result<()> {
    let c = cluster.client();
    let before = das_pods(&c, "das-kubelet-plugin").await?;
    let old = before[0].metadata.name.clone().unwrap_or_default();
    let user_before = Api::<Pod>::namespaced(c.clone(), NS).get("user").await?;
    real_install::upgrade(cluster, "e2e-2")?;
    let after = das_pods(&c, "das-kubelet-plugin").await?;
    ensure!(
        after.len() == 1 && after[0].metadata.name.as_deref() != Some(old.as_str()),
        "the plugin pod was not replaced: {:?}",
        after.iter().map(|p| &p.metadata.name).collect::<Vec<_>>()
    );
    ensure!(
        image_of(&after[0]) == format!("{IMAGE_REPO}:e2e-2"),
        "new plugin pod runs {}",
        image_of(&after[0])
    );
    let log = das_e2e::chart::kubectl(
        &cluster.kubeconfig,
        &[
            "logs",
            "-n",
            NAMESPACE,
            after[0].metadata.name.as_deref().unwrap_or_default(),
        ],
        None,
    )?;
    ensure!(
        log.contains("took over from the previous plugin instance"),
        "the new plugin did not take over from the old one:\n{log}"
    );
    let user = Api::<Pod>::namespaced(c.clone(), NS).get("user").await?;
    ensure!(
        container_ids(&user) == container_ids(&user_before),
        "the user pod's container changed across the upgrade"
    );
    ensure!(
        live_uuids(cluster)?.contains(&uuid.to_string()),
        "MIG {uuid} was lost in the upgrade"
    );
    rollback_keeps_the_slice(cluster, uuid, &user_before).await?;
    delete_pods(&c, &["user"]).await?;
    wait::until("the slice destroyed by the new plugin", TIMEOUT, || async {
        Ok((!live_uuids(cluster)?.contains(&uuid.to_string())).then_some(()))
    })
    .await
}

/// `helm rollback` to the install's revision (image e2e-1) with the user pod running: the
/// plugin pod is replaced again, reads the checkpoint the upgraded plugin wrote (never moves it
/// aside as corrupt), and the user pod keeps its container and its slice.
async fn rollback_keeps_the_slice(cluster: &Cluster, uuid: &str, user_before: &Pod) -> Result<()> {
    let c = cluster.client();
    real_install::rollback(cluster, 1)?;
    let after = das_pods(&c, "das-kubelet-plugin").await?;
    ensure!(
        after.len() == 1 && image_of(&after[0]) == format!("{IMAGE_REPO}:e2e-1"),
        "the rolled-back plugin pod runs {:?}",
        after.iter().map(image_of).collect::<Vec<_>>()
    );
    let log = das_e2e::chart::kubectl(
        &cluster.kubeconfig,
        &[
            "logs",
            "-n",
            NAMESPACE,
            after[0].metadata.name.as_deref().unwrap_or_default(),
        ],
        None,
    )?;
    ensure!(
        !log.contains("corrupt checkpoint") && !log.contains("rebuilt the record"),
        "the rolled-back plugin did not read the checkpoint as it was:\n{log}"
    );
    let user = Api::<Pod>::namespaced(c.clone(), NS).get("user").await?;
    ensure!(
        container_ids(&user) == container_ids(user_before),
        "the user pod's container changed across the rollback"
    );
    ensure!(
        live_uuids(cluster)?.contains(&uuid.to_string()),
        "MIG {uuid} was lost in the rollback"
    );
    Ok(())
}

/// `helm uninstall`: DAS's pods and ResourceSlices go, the CRD stays (resource policy keep),
/// no MIG slice is left on the GPU.
async fn uninstall_leaves_the_crd_and_no_slices(cluster: &Cluster) -> Result<()> {
    real_install::uninstall(cluster)?;
    real_install::check_uninstalled(cluster, NODE).await
}

async fn holder(leases: &Api<Lease>) -> Result<Option<String>> {
    Ok(leases
        .get_opt("das-controller")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

fn live_uuids(cluster: &Cluster) -> Result<Vec<String>> {
    Ok(live_slices(cluster, NODE)?
        .into_iter()
        .map(|s| s.3)
        .collect())
}
