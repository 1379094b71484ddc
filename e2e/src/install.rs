//! DAS on the local cluster as the Helm chart installs it: the chart is rendered, its
//! cluster-level objects (CRD, DeviceClasses, ServiceAccounts, RBAC, the ResourceSlice policy,
//! the webhook configuration) are applied as they are, and each component runs as a local
//! process with the environment and arguments of its container in the chart, under its own
//! service-account identity (a TokenRequest token; the node plugin's is bound to a stand-in pod
//! on its node, exactly what a DaemonSet pod's projected token carries).
//!
//! What differs from a real install, and why: processes instead of pods (the hollow kubelets run
//! no containers), so host paths, metrics addresses and TLS files are overridden to local ones
//! (every override must name a variable the chart sets: see [`chart::container_env`]); the
//! webhook is registered by URL on loopback (no Service routing without kube-proxy); emulated
//! GPUs are given per node, where the chart has one list for all nodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

// Where the DAS binaries are and the chart as the local cluster renders it, re-exported from
// the modules that own them (the tests and benchmarks name them here).
pub use crate::binaries::{Binaries, DasBinary};
pub use crate::chart::render;
use crate::chart::{self, NAMESPACE, PodFacts, Rendered};
use crate::cluster::Cluster;
use crate::das::{self, PluginDirs};
pub use crate::paths::target_dir;
use crate::pki::loopback_serving;
use crate::wait;
use crate::workload::free_port;
use crate::{kubeconfig, real_install};

/// Kinds applied to the cluster as rendered (the workloads run as local processes instead).
const APPLIED_KINDS: &[&str] = &[
    "CustomResourceDefinition",
    "DeviceClass",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Service accounts of the chart (templates/*-rbac.yaml).
pub const PLUGIN_SA: &str = "das-kubelet-plugin";
pub const CONTROLLER_SA: &str = "das-controller";
pub const WEBHOOK_SA: &str = "das-webhook";

/// What [`install`] started, for tests and the demo.
#[derive(Clone, Debug, Default)]
pub struct Installed {
    /// node → metrics port of its plugin.
    pub plugin_metrics: BTreeMap<String, u16>,
    pub controller_metrics: Option<u16>,
    pub webhook_port: Option<u16>,
}

/// Creates the install namespace and applies the chart's cluster-level objects
/// ([`APPLIED_KINDS`]) with the admin kubeconfig, then waits for the CRD.
pub async fn apply_access(cluster: &Cluster, rendered: &Rendered) -> Result<()> {
    let kc = &cluster.kubeconfig;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let objects: Vec<&Value> = std::iter::once(&ns)
        .chain(
            rendered
                .objects
                .iter()
                .filter(|o| APPLIED_KINDS.iter().any(|k| o["kind"] == *k)),
        )
        .collect();
    chart::apply(kc, objects)?;
    if rendered
        .of_kind("CustomResourceDefinition")
        .next()
        .is_some()
    {
        chart::kubectl(
            kc,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd/allocationclaims.inference.redhat.com",
            ],
            None,
        )?;
    }
    Ok(())
}

/// A stand-in for the DaemonSet pod of the plugin on `node`: same service account, bound to
/// the node. Its UID is the plugin's POD_UID and its token carries the node's name.
pub async fn stand_in_pod(client: &Client, rendered: &Rendered, node: &str) -> Result<Pod> {
    create_stand_in_pod(client, rendered, node, false).await
}

/// Label of the stand-in plugin pods of hollow nodes beside a DaemonSet installed by Helm
/// ([`install_with_helm`]), in place of the DaemonSet's selector label
/// `app.kubernetes.io/name`: the DaemonSet controller would adopt pods its selector matches and
/// delete them from nodes its node selector leaves out (and with them the plugins' node-bound
/// tokens).
pub const STAND_IN_NAME: &str = "das-kubelet-plugin-stand-in";

async fn create_stand_in_pod(
    client: &Client,
    rendered: &Rendered,
    node: &str,
    beside_daemonset: bool,
) -> Result<Pod> {
    let ds = rendered.get("DaemonSet", "das-kubelet-plugin")?;
    let tmpl = &ds["spec"]["template"];
    let mut labels = tmpl["metadata"]["labels"].clone();
    if beside_daemonset {
        labels["app.kubernetes.io/name"] = json!(STAND_IN_NAME);
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("das-kubelet-plugin-{node}"),
            "namespace": NAMESPACE,
            "labels": labels,
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": tmpl["spec"]["serviceAccountName"],
            "containers": [{"name": "plugin", "image": tmpl["spec"]["containers"][0]["image"]}],
        }
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    api.create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await
        .with_context(|| format!("create the stand-in plugin pod on {node}"))
}

/// A token of service account `sa` in the install namespace (TokenRequest API), bound to `pod`
/// when given, so that it carries the pod's node name as a DaemonSet pod's projected token does.
pub async fn token(client: &Client, sa: &str, pod: Option<&Pod>) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let bound_object_ref = pod.map(|p| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: p.metadata.name.clone(),
        uid: p.metadata.uid.clone(),
    });
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref,
            expiration_seconds: Some(48 * 3600),
        }),
        ..Default::default()
    };
    let out = api
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .with_context(|| format!("TokenRequest for service account {sa}"))?;
    out.status
        .and_then(|s| s.token)
        .context("TokenRequest answered without a token")
}

/// Writes a kubeconfig for service account `sa` (optionally bound to `pod`) under the cluster's
/// PKI dir and returns its path.
pub async fn identity(
    cluster: &Cluster,
    sa: &str,
    pod: Option<&Pod>,
    tag: &str,
) -> Result<PathBuf> {
    let token = token(&cluster.client(), sa, pod).await?;
    let path = cluster.pki_dir.join(format!("{sa}-{tag}.kubeconfig"));
    let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
    kubeconfig::with_token(&cluster.kubeconfig, &path, &token, &user)?;
    Ok(path)
}

/// Installs DAS from the chart: access objects, then the node plugin on every node of `gpus`
/// (node → emulated GPUs), the controller and the webhook when their binaries are given.
/// Returns once the plugins have published and the webhook (if any) translates pods.
pub async fn install(
    cluster: &mut Cluster,
    gpus: &[(String, String)],
    bins: &Binaries,
) -> Result<Installed> {
    install_rendered(cluster, &render()?, gpus, bins).await
}

/// [`install`] from the chart as `rendered` (e.g. [`chart::render_with`] other values).
pub async fn install_rendered(
    cluster: &mut Cluster,
    rendered: &Rendered,
    gpus: &[(String, String)],
    bins: &Binaries,
) -> Result<Installed> {
    apply_access(cluster, rendered).await?;
    let mut installed = Installed::default();
    for (node, models) in gpus {
        let port = start_plugin(cluster, rendered, &bins.plugin, node, models).await?;
        installed.plugin_metrics.insert(node.clone(), port);
    }
    if let Some(bin) = &bins.controller {
        installed.controller_metrics = Some(start_controller(cluster, rendered, bin).await?);
    }
    let client = cluster.client();
    let nodes: Vec<&str> = gpus.iter().map(|(n, _)| n.as_str()).collect();
    das::wait_nodes_published(&client, &nodes).await?;
    if let Some(bin) = &bins.webhook {
        installed.webhook_port = Some(start_webhook(cluster, rendered, bin).await?);
    }
    Ok(installed)
}

/// DAS installed as a user installs it on the real-runtime node `runtime` (node, emulated
/// GPUs): the DAS image (debug binaries) imported into its containerd and `helm install` of the
/// chart, whose DaemonSet, controller and webhook run there as pods
/// ([`crate::real_install`]); the plugins of the hollow nodes in `hollow` (which run no
/// containers) as processes beside it, as [`start_plugin`] starts them, their stand-in pods
/// labelled [`STAND_IN_NAME`]. `sets` (`KEY=VALUE`) go to `helm install` as `--set`s and into
/// the chart the hollow nodes' plugins are rendered from. Needs a cluster with a Service
/// network. Returns once every node has published.
pub async fn install_with_helm(
    cluster: &mut Cluster,
    runtime: &(String, String),
    hollow: &[(String, String)],
    plugin: &Path,
    sets: &[&str],
) -> Result<Installed> {
    const TAG: &str = "local";
    real_install::import_image(cluster, &[TAG])?;
    real_install::install_with(cluster, &runtime.0, &runtime.1, TAG, sets)?;
    let rendered = chart::render_with(sets)?;
    let mut installed = Installed::default();
    for (node, models) in hollow {
        let port = start_plugin_process(cluster, &rendered, plugin, node, models, true).await?;
        installed.plugin_metrics.insert(node.clone(), port);
    }
    let nodes: Vec<&str> = hollow
        .iter()
        .chain(std::iter::once(runtime))
        .map(|(n, _)| n.as_str())
        .collect();
    das::wait_nodes_published(&cluster.client(), &nodes).await?;
    Ok(installed)
}

/// Starts the node plugin of `node` as the chart's DaemonSet would: its container's
/// environment, the stand-in pod's facts, the plugin service account's node-bound token.
pub async fn start_plugin(
    cluster: &mut Cluster,
    rendered: &Rendered,
    bin: &Path,
    node: &str,
    emulated_gpus: &str,
) -> Result<u16> {
    start_plugin_process(cluster, rendered, bin, node, emulated_gpus, false).await
}

async fn start_plugin_process(
    cluster: &mut Cluster,
    rendered: &Rendered,
    bin: &Path,
    node: &str,
    emulated_gpus: &str,
    beside_daemonset: bool,
) -> Result<u16> {
    let client = cluster.client();
    let pod = create_stand_in_pod(&client, rendered, node, beside_daemonset).await?;
    let kubeconfig = identity(cluster, PLUGIN_SA, Some(&pod), node).await?;
    let info = cluster.node(node).clone();
    let dirs = PluginDirs::of(&info);
    let port = free_port();
    let facts = PodFacts {
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: NAMESPACE.into(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node_name: node.into(),
        service_account: PLUGIN_SA.into(),
    };
    let container = rendered.container("DaemonSet", "das-kubelet-plugin")?;
    let mut overrides = vec![
        (
            "KUBELET_REGISTRY_DIR",
            info.registry_dir().display().to_string(),
        ),
        (
            "KUBELET_PLUGINS_DIR",
            info.plugins_dir().display().to_string(),
        ),
        ("CDI_DIR", dirs.cdi.display().to_string()),
        ("DAS_STATE_DIR", dirs.state.display().to_string()),
        ("DAS_METRICS_ADDRESS", format!("127.0.0.1:{port}")),
        ("DAS_EMULATED_GPUS", emulated_gpus.into()),
    ];
    let mut extra = vec![("KUBECONFIG", kubeconfig.display().to_string())];
    // On a real-runtime node the plugin makes stand-in device nodes, as the chart's
    // `kubeletPlugin.emulatedDeviceDir` sets it up.
    if let Some(files) = info.runtime_files() {
        overrides.push(("DAS_CDI_DEVICE_NODES", "true".into()));
        extra.push((
            "DAS_EMULATED_DEVICE_DIR",
            files.device_dir().display().to_string(),
        ));
    }
    let env = chart::container_env(container, &facts, &overrides, &extra)?;
    check_command(container, bin)?;
    cluster.spawn_program_with_env(
        &format!("das-plugin-{node}"),
        bin,
        chart::container_args(container),
        &env,
    )?;
    Ok(port)
}

/// Starts das-controller as the chart's Deployment would (one replica, leader election as
/// the chart configures it).
pub async fn start_controller(
    cluster: &mut Cluster,
    rendered: &Rendered,
    bin: &Path,
) -> Result<u16> {
    let kubeconfig = identity(cluster, CONTROLLER_SA, None, "0").await?;
    let port = free_port();
    let facts = PodFacts {
        name: "das-controller-0".into(),
        namespace: NAMESPACE.into(),
        service_account: CONTROLLER_SA.into(),
        ..Default::default()
    };
    let container = rendered.container("Deployment", "das-controller")?;
    let env = chart::container_env(
        container,
        &facts,
        &[("DAS_METRICS_ADDRESS", format!("127.0.0.1:{port}"))],
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    )?;
    check_command(container, bin)?;
    cluster.spawn_program_with_env(
        "das-controller",
        bin,
        chart::container_args(container),
        &env,
    )?;
    Ok(port)
}

/// Starts das-webhook as the chart's Deployment would, with a serving certificate for
/// 127.0.0.1 from a CA of its own, and registers the chart's Mutating- and
/// ValidatingWebhookConfiguration by URL with that CA. Returns once a legacy pod is translated (dry run).
pub async fn start_webhook(cluster: &mut Cluster, rendered: &Rendered, bin: &Path) -> Result<u16> {
    let kubeconfig = identity(cluster, WEBHOOK_SA, None, "0").await?;
    let (pki, serving) = loopback_serving(&cluster.pki_dir.join("webhook"), "das-webhook")?;
    let port = free_port();
    let facts = PodFacts {
        name: "das-webhook-0".into(),
        namespace: NAMESPACE.into(),
        service_account: WEBHOOK_SA.into(),
        ..Default::default()
    };
    let container = rendered.container("Deployment", "das-webhook")?;
    let env = chart::container_env(
        container,
        &facts,
        &[
            ("DAS_WEBHOOK_ADDRESS", format!("127.0.0.1:{port}")),
            ("DAS_WEBHOOK_TLS_CERT", serving.cert.display().to_string()),
            ("DAS_WEBHOOK_TLS_KEY", serving.key.display().to_string()),
        ],
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    )?;
    check_command(container, bin)?;
    cluster.spawn_program_with_env("das-webhook", bin, chart::container_args(container), &env)?;
    register_webhook(cluster, rendered, port, &pki.ca.cert).await?;
    Ok(port)
}

/// The chart's MutatingWebhookConfiguration, its Service reference replaced by the loopback
/// URL of the local webhook and `ca` (PEM file) as its caBundle.
pub fn webhook_configuration(rendered: &Rendered, port: u16, ca: &Path) -> Result<Value> {
    loopback_configuration(rendered, "MutatingWebhookConfiguration", port, ca)
}

/// The chart's ValidatingWebhookConfiguration (device configs of ResourceClaims and
/// ResourceClaimTemplates), by loopback URL as [`webhook_configuration`].
pub fn validating_webhook_configuration(
    rendered: &Rendered,
    port: u16,
    ca: &Path,
) -> Result<Value> {
    loopback_configuration(rendered, "ValidatingWebhookConfiguration", port, ca)
}

fn loopback_configuration(rendered: &Rendered, kind: &str, port: u16, ca: &Path) -> Result<Value> {
    use base64::Engine;
    let mut cfg = rendered.get(kind, "das-webhook")?.clone();
    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(ca)?);
    let hooks = cfg["webhooks"]
        .as_array_mut()
        .context("webhook configuration without webhooks")?;
    for h in hooks {
        let path = h["clientConfig"]["service"]["path"]
            .as_str()
            .context("webhook without a service path")?
            .to_string();
        h["clientConfig"] = json!({
            "url": format!("https://127.0.0.1:{port}{path}"),
            "caBundle": ca,
        });
    }
    Ok(cfg)
}

async fn register_webhook(
    cluster: &Cluster,
    rendered: &Rendered,
    port: u16,
    ca: &Path,
) -> Result<()> {
    let cfg = webhook_configuration(rendered, port, ca)?;
    let validating = validating_webhook_configuration(rendered, port, ca)?;
    chart::apply(&cluster.kubeconfig, [&cfg, &validating])?;
    let client = cluster.client();
    // The API server picks configurations up from an informer: wait until a legacy pod is
    // translated (dry run, so nothing stays behind).
    wait::until(
        "the webhook to translate legacy pods",
        wait::TIMEOUT,
        || async {
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "das-webhook-probe", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "x",
                    "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}
            });
            let api: Api<Pod> = Api::namespaced(client.clone(), "default");
            let dry = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let Ok(out) = api.create(&dry, &serde_json::from_value(pod)?).await else {
                return Ok(None);
            };
            Ok(out.spec.and_then(|s| s.resource_claims).map(|_| ()))
        },
    )
    .await
}

/// The container's command must be the binary we run (so the chart cannot point at another).
fn check_command(container: &Value, bin: &Path) -> Result<()> {
    let cmd = container["command"][0].as_str().unwrap_or_default();
    let file = bin.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    if cmd != file {
        bail!(
            "container {} runs `{cmd}` in the chart but the harness was given {}",
            container["name"],
            bin.display()
        );
    }
    Ok(())
}
