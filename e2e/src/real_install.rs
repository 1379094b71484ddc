//! DAS installed the way a user installs it: `helm install` of the chart, whose DaemonSet and
//! Deployments run as pods of the DAS image ([`crate::image`], imported into the node's
//! containerd) on a real-runtime node. The cluster needs a Service network
//! ([`crate::ClusterConfig::service_network`]): the pods reach the API server through the
//! `kubernetes` Service and the API server reaches the webhook through its Service.
//!
//! The values are what a user sets for emulated GPUs (`ci/emulated-values.yaml`) plus what this
//! node differs in ([`values`]): the image, the kubelet's root dir and the CDI dir below the
//! node's directory, and the node's label and taint.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};

use crate::Cluster;
use crate::chart::{self, NAMESPACE, RELEASE};
use crate::das::{DRIVER, PluginDirs};
use crate::image::{self, ImageOptions};
use crate::plugin::live_slices;
use crate::runtime::{self, TAINT_KEY};
use crate::runtime_pods::{check_container, create, create_with, probe, wait_ready};
use crate::wait::{self, TIMEOUT};
use crate::workload::delete_pods;

/// Repository of the DAS image on the real-runtime nodes (local only, `pullPolicy: Never`).
pub const IMAGE_REPO: &str = "das.local/das";

/// Builds the DAS image once from the debug binaries (the ones `make e2e` builds) as
/// `IMAGE_REPO:<tags[0]>`, imports it into every real-runtime node's containerd and tags it
/// with the other `tags` (same content, a new name: what `helm upgrade` to a new tag rolls).
pub fn import_image(cluster: &Cluster, tags: &[&str]) -> Result<()> {
    let first = tags.first().context("at least one tag")?;
    let archive = image::build(&ImageOptions {
        name: format!("{IMAGE_REPO}:{first}"),
        profile: "debug".into(),
        version: "0.0.0-e2e".into(),
        out: cluster.dir.join("images").join("das.oci.tar"),
    })?;
    for files in cluster.nodes.iter().filter_map(|n| n.runtime_files()) {
        runtime::run(
            runtime::ctr(&files)
                .args(["images", "import"])
                .arg(&archive),
        )?;
        for tag in &tags[1..] {
            runtime::run(runtime::ctr(&files).args([
                "images",
                "tag",
                &format!("{IMAGE_REPO}:{first}"),
                &format!("{IMAGE_REPO}:{tag}"),
            ]))?;
        }
    }
    Ok(())
}

/// The values for `node` with emulated `gpus` (`MODEL:COUNT,...`) and image tag `tag`, on top
/// of `ci/emulated-values.yaml`: [`node_values`] with the image and the GPUs.
pub fn values(cluster: &Cluster, node: &str, gpus: &str, tag: &str) -> Value {
    let mut v = node_values(cluster, node);
    v["image"] = json!({"repository": IMAGE_REPO, "tag": tag, "pullPolicy": "Never"});
    v["kubeletPlugin"]["emulatedGpus"] = json!(gpus);
    v
}

/// What `node` differs in from a GPU node: host paths are the node's own (its kubelet root
/// dir, the CDI dir its containerd reads, the stand-in device nodes' dir); every DAS pod
/// selects and tolerates the real-runtime nodes.
pub fn node_values(cluster: &Cluster, node: &str) -> Value {
    let info = cluster.node(node);
    let files = info.runtime_files().expect("a real-runtime node");
    let dirs = PluginDirs::of(info);
    let select = json!({ TAINT_KEY: "true" });
    let tolerate = json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
    json!({
        "kubeletPlugin": {
            "emulatedDeviceDir": files.device_dir(),
            "kubeletDir": info.root_dir,
            "cdiDir": files.cdi_dir(),
            "stateDir": dirs.state,
            "nodeSelector": select,
            "tolerations": tolerate,
        },
        "controller": {"nodeSelector": select, "tolerations": tolerate},
        "webhook": {"nodeSelector": select, "tolerations": tolerate},
    })
}

/// Writes [`values`] as a values file in the cluster's directory; returns its path.
pub fn write_values(cluster: &Cluster, node: &str, gpus: &str, tag: &str) -> Result<PathBuf> {
    let path = cluster.dir.join("real-install-values.yaml");
    std::fs::write(
        &path,
        serde_yaml::to_string(&values(cluster, node, gpus, tag))?,
    )?;
    Ok(path)
}

/// `helm install` of the chart on `node` with image tag `tag` (imported with
/// [`import_image`]), then waits until every workload rolled out ([`wait_rolled_out`]).
pub fn install(cluster: &Cluster, node: &str, gpus: &str, tag: &str) -> Result<()> {
    install_with(cluster, node, gpus, tag, &[])
}

/// [`install`] with `--set` overrides `sets` (`KEY=VALUE`, e.g. [`chart::WHOLE_GPUS`]) on top
/// of the values files, as a user adds them to `helm install`.
pub fn install_with(
    cluster: &Cluster,
    node: &str,
    gpus: &str,
    tag: &str,
    sets: &[&str],
) -> Result<()> {
    let values = write_values(cluster, node, gpus, tag)?;
    let emulated = chart::ci_values("emulated-values.yaml");
    let mut args = vec![
        "--create-namespace".to_string(),
        format!("--values={}", emulated.display()),
        format!("--values={}", values.display()),
    ];
    args.extend(sets.iter().map(|s| format!("--set={s}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm_release(cluster, "install", &args)
}

/// `helm upgrade` to image tag `tag`, other values kept; waits for the rollout.
pub fn upgrade(cluster: &Cluster, tag: &str) -> Result<()> {
    helm_release(
        cluster,
        "upgrade",
        &["--reuse-values", &format!("--set=image.tag={tag}")],
    )
}

/// `helm rollback` to revision `revision` (1: the install); waits for the rollout.
pub fn rollback(cluster: &Cluster, revision: u32) -> Result<()> {
    chart::helm_on(
        &cluster.kubeconfig,
        &[
            "rollback",
            RELEASE,
            &revision.to_string(),
            &format!("--namespace={NAMESPACE}"),
        ],
    )?;
    wait_rolled_out(cluster)
}

/// `helm <verb>` (install, upgrade) of the chart as release [`RELEASE`] in [`NAMESPACE`] with
/// `extra` flags, then waits for the rollout.
fn helm_release(cluster: &Cluster, verb: &str, extra: &[&str]) -> Result<()> {
    let chart_dir = chart::chart_dir().display().to_string();
    let namespace = format!("--namespace={NAMESPACE}");
    let mut args = vec![verb, RELEASE, &chart_dir, &namespace];
    args.extend_from_slice(extra);
    chart::helm_on(&cluster.kubeconfig, &args)?;
    wait_rolled_out(cluster)
}

/// `helm uninstall`, waiting until its resources are deleted.
pub fn uninstall(cluster: &Cluster) -> Result<()> {
    chart::helm_on(
        &cluster.kubeconfig,
        &[
            "uninstall",
            RELEASE,
            &format!("--namespace={NAMESPACE}"),
            "--wait",
            "--timeout=2m",
        ],
    )
    .map(|_| ())
}

/// Waits until the plugin DaemonSet, the controller and the webhook Deployments rolled out
/// (`kubectl rollout status`: every pod of the current revision ready, old ones gone).
pub fn wait_rolled_out(cluster: &Cluster) -> Result<()> {
    for workload in [
        "daemonset/das-kubelet-plugin",
        "deployment/das-controller",
        "deployment/das-webhook",
    ] {
        chart::kubectl(
            &cluster.kubeconfig,
            &[
                "rollout",
                "status",
                "--namespace",
                NAMESPACE,
                "--timeout=180s",
                workload,
            ],
            None,
        )
        .with_context(|| format!("{workload} did not roll out"))?;
    }
    Ok(())
}

/// The webhook is registered by Service (not URL); a legacy pod `legacy` on `node` asking
/// `nvidia.com/mig-1g.10gb: 1` is translated by the webhook pod, which the API server calls
/// through that Service, and its container `app` sees the slice. The pod is deleted after.
pub async fn legacy_pod_admitted_through_the_service(cluster: &Cluster, node: &str) -> Result<()> {
    let c = cluster.client();
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    let config = hooks.get("das-webhook").await?;
    for hook in config.webhooks.iter().flatten() {
        let client = &hook.client_config;
        ensure!(
            client.url.is_none() && client.service.is_some(),
            "webhook {} is not called through its Service: {client:?}",
            hook.name
        );
    }
    let mut legacy = probe("app", &[]);
    legacy["resources"] = json!({"limits": {"nvidia.com/mig-1g.10gb": 1}});
    let spec = json!({"containers": [legacy]});
    // A rolled-out webhook pod is Ready before kube-proxy routes its Service to it (the
    // EndpointSlice still travels to kube-proxy), so the first call may be refused: dry runs
    // (admission only, nothing stored) wait for the route.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait::until("the webhook answers through its Service", TIMEOUT, || {
        let spec = spec.clone();
        let (c, dry_run) = (c.clone(), dry_run.clone());
        async move {
            create_with(&c, node, "legacy", spec, &dry_run)
                .await
                .map(Some)
        }
    })
    .await?;
    create(&c, node, "legacy", spec).await?;
    let pod = wait_ready(&c, "legacy").await?;
    check_container(cluster, node, &pod, "app", 1).await?;
    delete_pods(&c, &["legacy"]).await
}

/// DAS uninstalled (by `helm uninstall` or the operator): its ResourceSlices and pods go, the
/// AllocationClaim CRD stays (resource policy keep), and `node` holds no MIG slice.
pub async fn check_uninstalled(cluster: &Cluster, node: &str) -> Result<()> {
    let c = cluster.client();
    let slices: Api<ResourceSlice> = Api::all(c.clone());
    wait::until("DAS ResourceSlices removed", TIMEOUT, || async {
        let list = slices
            .list(&ListParams::default().fields(&format!("spec.driver={DRIVER}")))
            .await?;
        Ok(list.items.is_empty().then_some(()))
    })
    .await?;
    wait::until("DAS pods gone", TIMEOUT, || async {
        let pods = Api::<Pod>::namespaced(c.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await?;
        Ok(pods.items.is_empty().then_some(()))
    })
    .await?;
    Api::<CustomResourceDefinition>::all(c.clone())
        .get("allocationclaims.inference.redhat.com")
        .await
        .context("the AllocationClaim CRD was removed by the uninstall")?;
    let live = live_slices(cluster, node)?;
    ensure!(live.is_empty(), "MIG slices left after uninstall: {live:?}");
    Ok(())
}

/// Pods of DAS component `name` (the chart's `app.kubernetes.io/name` label) in [`NAMESPACE`],
/// not terminating.
///
/// # Errors
/// The API failed.
pub async fn das_pods(c: &kube::Client, name: &str) -> Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(c.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={name}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The image of `pod`'s first container (empty when none is set).
pub fn image_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// The container IDs of `pod`'s containers, as its status lists them (`None` for one not
/// created yet): a container replaced gets another.
pub fn container_ids(pod: &Pod) -> Vec<Option<String>> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|s| s.container_id.clone())
        .collect()
}
