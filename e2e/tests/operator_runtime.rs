//! The DAS operator installs DAS for real: a DASOperator on a cluster whose node is a
//! real-runtime node (upstream kubelet, containerd, runc, CNI) with a Service network
//! (kube-proxy), as tests/real_install.rs does with `helm install`. The operator runs as a
//! process under the bundle's RBAC (das_e2e::operator); the node plugin, the controller and the
//! webhook it installs run as pods of the DAS image built here, imported into the node's
//! containerd and named by the DASOperator's `image`.
//!
//! - A DASOperator in emulated mode (an emulated H100, log level Normal, the image override,
//!   the plugin's node selector and toleration) becomes Available once the DaemonSet and the
//!   Deployments rolled out; the plugin pod runs the image asked for and publishes its pool.
//! - A legacy pod asking `nvidia.com/mig-1g.10gb: 1` is admitted by the webhook pod through its
//!   Service, translated, and its container sees its slice.
//! - A pod with a claim gets a slice its container sees; deleting it destroys the slice.
//! - Deleting the DASOperator uninstalls DAS: no ResourceSlice, no DAS pod, no MIG slice left,
//!   the AllocationClaim CRD kept.
//!
//! What a DASOperator cannot set is where this node differs from a GPU node: its kubelet root,
//! CDI and state dirs below the node's directory, and the controller's and webhook's toleration
//! of the node's taint. The operator gets them as the chart's defaults (`--chart`, a copy of the
//! chart with those defaults, [`das_e2e::operator::chart_with_defaults`]).
//!
//! Needs root, runc, iptables, `make containerd` and `make operator`; `make e2e` builds them.
//! One such cluster per machine at a time (kube-proxy owns the KUBE-* iptables chains).

use std::time::Duration;

use anyhow::{Result, ensure};
use das_e2e::chart::NAMESPACE;
use das_e2e::operator::{self, apply_cr, env_of, json, kubectl};
use das_e2e::plugin::live_slices;
use das_e2e::real_install::{self, IMAGE_REPO};
use das_e2e::runtime_pods::one_slice_pod;
use das_e2e::workload::{create_template, delete_pods};
use das_e2e::{Cluster, ClusterConfig, das, wait};
use serde_json::{Value, json};

const NODE: &str = "r0";
const GPUS: &str = "H100-80GB:1";
const TAG: &str = "e2e-1";

/// The operator installs the whole chart and the pods start from the image on a real runtime:
/// allow more than [`wait::TIMEOUT`].
const TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn operator_installs_das_that_serves_legacy_and_claim_pods_on_a_real_runtime() {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.runtime_nodes = vec![NODE.into()];
    config.service_network = true;
    let mut cluster = Cluster::start(config).await.expect("cluster starts");
    let result = scenarios(&mut cluster).await;
    cluster.check(result);
}

async fn scenarios(cluster: &mut Cluster) -> Result<()> {
    real_install::import_image(cluster, &[TAG])?;
    // The node's values: the plugin's selector and toleration go into the DASOperator, the rest
    // (which a DASOperator cannot set) into the chart's defaults.
    let mut defaults = real_install::node_values(cluster, NODE);
    let plugin = &mut defaults["kubeletPlugin"];
    let spec = json!({
        "emulatedMode": true,
        "emulatedGpus": GPUS,
        "logLevel": "Normal",
        "image": {"reference": format!("{IMAGE_REPO}:{TAG}"), "pullPolicy": "Never"},
        "nodeSelector": plugin["nodeSelector"].take(),
        "tolerations": plugin["tolerations"].take(),
    });
    if let Value::Object(p) = plugin {
        p.remove("nodeSelector");
        p.remove("tolerations");
    }
    operator::install_crd(cluster)?;
    let chart = operator::chart_with_defaults(cluster, &defaults)?;
    operator::start_with(cluster, &[format!("--chart={}", chart.display())]).await?;

    the_resource_installs_das(cluster, &spec).await?;
    real_install::legacy_pod_admitted_through_the_service(cluster, NODE).await?;
    a_claim_pod_gets_a_slice(cluster).await?;
    deleting_the_resource_uninstalls_das(cluster).await
}

/// The DASOperator becomes Available once the workloads rolled out; the plugin pod runs the
/// image asked for, logs at Normal (`info`) and publishes the node's whole pool.
async fn the_resource_installs_das(cluster: &Cluster, spec: &Value) -> Result<()> {
    apply_cr(cluster, &spec.to_string())?;
    operator::wait_condition(cluster, "Available", "True", TIMEOUT).await?;
    real_install::wait_rolled_out(cluster)?;
    let cr = json(cluster, &["get", "dasoperator", "cluster"])?;
    for (t, want) in [("Deployed", "True"), ("Degraded", "False")] {
        let c = operator::condition(&cr, t);
        ensure!(
            c.is_some_and(|c| c["status"] == want),
            "{t} is not {want}: {c:?}"
        );
    }
    let ds = json(
        cluster,
        &["-n", NAMESPACE, "get", "daemonset", "das-kubelet-plugin"],
    )?;
    for (var, want) in [("DAS_EMULATED_GPUS", GPUS), ("DAS_LOG_LEVEL", "info")] {
        ensure!(
            env_of(&ds, var) == want,
            "plugin {var} is {:?}, want {want:?}",
            env_of(&ds, var)
        );
    }
    let images = kubectl(
        cluster,
        &[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.containers[0].image}{\"\\n\"}{end}",
        ],
        None,
    )?;
    let want = format!("{IMAGE_REPO}:{TAG}");
    let pods: Vec<&str> = images.lines().collect();
    ensure!(
        pods.iter().any(|p| p.starts_with("das-kubelet-plugin-"))
            && pods.iter().all(|p| p.ends_with(&format!("={want}"))),
        "DAS pods and their images: {pods:?}, want every one of {want}"
    );
    das::wait_pool_complete(&cluster.client(), NODE).await?;
    Ok(())
}

/// A pod with a claim gets one 1g.10gb slice its container sees; deleting the pod destroys it.
async fn a_claim_pod_gets_a_slice(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    let (_, uuid) = one_slice_pod(cluster, NODE, "user").await?;
    ensure!(
        live_slices(cluster, NODE)?.iter().any(|s| s.3 == uuid),
        "MIG {uuid} is not live on the GPU"
    );
    delete_pods(&c, &["user"]).await?;
    wait::until("the claim pod's slice destroyed", TIMEOUT, || async {
        Ok((!live_slices(cluster, NODE)?.iter().any(|s| s.3 == uuid)).then_some(()))
    })
    .await
}

/// The DASOperator's finalizer uninstalls the release: the resource goes, then DAS's slices,
/// pods and MIG slices; the AllocationClaim CRD stays.
async fn deleting_the_resource_uninstalls_das(cluster: &Cluster) -> Result<()> {
    operator::delete_and_wait_uninstalled(cluster, TIMEOUT).await?;
    real_install::check_uninstalled(cluster, NODE).await
}
