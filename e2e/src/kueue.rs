//! Kueue on the local cluster: its controller manager (`make kueue`: sigs.k8s.io/kueue at the
//! version `e2e/kueue/go.mod` pins, unmodified) as a process against the local API server, the
//! way the DAS webhook runs here:
//!
//! - its CRDs from the release's manifests (`config/components/crd/bases`);
//! - internal certificate management off: a serving certificate for 127.0.0.1 from a CA of its
//!   own, in the `certDir` of its Configuration;
//! - its webhook configurations from the release's manifests, registered by URL on 127.0.0.1
//!   with that CA, keeping only the webhooks of the kinds it manages here (Pods, Jobs and its own
//!   objects); the Pod and Job webhooks only for namespaces labelled [`MANAGED_LABEL`], as its
//!   `managedJobsNamespaceSelector` says;
//! - the visibility API server off (it would need an APIService).
//!
//! [`start`] takes the `resources` section of Kueue's Configuration (the `deviceClassMappings`
//! that charge DAS devices against quota).

use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::chart;
use crate::cluster::Cluster;
use crate::paths::{local_dir, workspace_root};
use crate::pki::loopback_serving;
use crate::wait;
use crate::workload::free_port;

/// Label of the namespaces whose Pods and Jobs Kueue manages (value `true`).
pub const MANAGED_LABEL: &str = "das.e2e/kueue-managed";
/// Label that names a workload's LocalQueue (Kueue's `constants.QueueLabel`).
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// API group of Kueue's objects.
pub const GROUP: &str = "kueue.x-k8s.io";
/// API version of Kueue's objects the tests write.
pub const VERSION: &str = "v1beta2";

/// Where `make kueue` put the binary and the release's manifests.
pub struct KueueFiles {
    pub bin: PathBuf,
    pub crd_dir: PathBuf,
    pub webhooks: PathBuf,
    /// The release, e.g. `v0.19.2`.
    pub version: String,
}

impl KueueFiles {
    /// The files under `.local` of the workspace.
    ///
    /// # Errors
    /// `make kueue` has not run.
    pub fn built() -> Result<Self> {
        let local = local_dir();
        let files = Self {
            bin: local.join("bin/kueue"),
            crd_dir: local.join("kueue/crd"),
            webhooks: local.join("kueue/webhooks.yaml"),
            version: std::fs::read_to_string(local.join("kueue/version"))
                .unwrap_or_default()
                .trim()
                .to_string(),
        };
        if !files.bin.exists() || !files.webhooks.exists() || files.version.is_empty() {
            bail!(
                "Kueue is not built: run `make kueue` (it builds .local/bin/kueue and .local/kueue/)"
            );
        }
        Ok(files)
    }
}

/// Kueue's Configuration (`config.kueue.x-k8s.io/v1beta2`) for the local cluster.
pub fn configuration(
    webhook_port: u16,
    cert_dir: &std::path::Path,
    probe_port: u16,
    metrics_port: u16,
    resources: &Value,
) -> Value {
    json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{probe_port}")},
        "metrics": {"bindAddress": format!("127.0.0.1:{metrics_port}")},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": cert_dir},
        "leaderElection": {"leaderElect": false},
        "internalCertManagement": {"enable": false},
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "true"}},
        "integrations": {"frameworks": ["batch/job", "pod"]},
        "clientConnection": {"qps": 100, "burst": 200},
        "resources": resources,
    })
}

/// The release's webhook configurations for `port` with `ca_pem` as caBundle: only the webhooks
/// for core (Pods), `batch` (Jobs) and Kueue's own group; the Pod and Job ones limited to
/// namespaces labelled [`MANAGED_LABEL`]; names prefixed `kueue-` (as its kustomization does).
pub fn webhook_configurations(manifests: &str, port: u16, ca_pem: &[u8]) -> Result<Vec<Value>> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(manifests) {
        let mut cfg = Value::deserialize(doc).context("parse Kueue's webhook manifests")?;
        if cfg.is_null() {
            continue;
        }
        let name = cfg["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        cfg["metadata"]["name"] = json!(format!("kueue-{name}"));
        let hooks = cfg["webhooks"].as_array().cloned().unwrap_or_default();
        let kept: Vec<Value> = hooks
            .into_iter()
            .filter_map(|mut h| {
                let groups: Vec<String> = h["rules"]
                    .as_array()?
                    .iter()
                    .flat_map(|r| r["apiGroups"].as_array().cloned().unwrap_or_default())
                    .filter_map(|g| g.as_str().map(str::to_string))
                    .collect();
                let workload = groups.iter().any(|g| g.is_empty() || g == "batch");
                if !(workload || groups.iter().all(|g| g == GROUP)) {
                    return None;
                }
                let path = h["clientConfig"]["service"]["path"].as_str()?.to_string();
                h["clientConfig"] = json!({
                    "url": format!("https://127.0.0.1:{port}{path}"),
                    "caBundle": ca,
                });
                if workload {
                    h["namespaceSelector"] = json!({"matchLabels": {MANAGED_LABEL: "true"}});
                }
                Some(h)
            })
            .collect();
        ensure!(!kept.is_empty(), "no Kueue webhook kept from {name}");
        cfg["webhooks"] = json!(kept);
        out.push(cfg);
    }
    ensure!(
        out.len() == 2,
        "Kueue's manifests have {} webhook configurations, not 2",
        out.len()
    );
    Ok(out)
}

/// Installs Kueue's CRDs, starts its controller manager (component `kueue`) with `resources` as
/// the Configuration's `resources`, registers its webhooks, and returns once a ClusterQueue
/// passes its webhook (dry run) — Kueue serves.
///
/// # Errors
/// Kueue is not built, or does not come up within [`wait::TIMEOUT`].
pub async fn start(cluster: &mut Cluster, resources: &Value) -> Result<()> {
    let files = KueueFiles::built()?;
    let dir = cluster.dir.join("kueue");
    std::fs::create_dir_all(&dir)?;
    chart::apply_path(&cluster.kubeconfig, &files.crd_dir).context("apply Kueue's CRDs")?;
    chart::kubectl(
        &cluster.kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            files.crd_dir.to_str().context("CRD dir path")?,
        ],
        None,
    )
    .context("Kueue's CRDs established")?;
    let client = cluster.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            "kueue-system",
            &PatchParams::apply("das-e2e"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "kueue-system"}})),
        )
        .await?;

    let (pki, serving) = loopback_serving(&dir.join("pki"), "kueue-webhook")?;
    let cert_dir = dir.join("serving-certs");
    std::fs::create_dir_all(&cert_dir)?;
    std::fs::copy(&serving.cert, cert_dir.join("tls.crt"))?;
    std::fs::copy(&serving.key, cert_dir.join("tls.key"))?;
    install_metrics_certs(&serving)?;
    let webhook_port = free_port();
    let probe_port = free_port();
    let config = configuration(webhook_port, &cert_dir, probe_port, free_port(), resources);
    let config_path = dir.join("config.yaml");
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
    cluster.spawn_program_with_env(
        "kueue",
        &files.bin,
        vec![
            format!("--config={}", config_path.display()),
            "--feature-gates=VisibilityOnDemand=false".into(),
            "--zap-log-level=3".into(),
        ],
        &[(
            "KUBECONFIG".into(),
            cluster.kubeconfig.display().to_string(),
        )],
    )?;

    let manifests = std::fs::read_to_string(&files.webhooks)?;
    let configs = webhook_configurations(&manifests, webhook_port, &std::fs::read(&pki.ca.cert)?)?;
    chart::apply(&cluster.kubeconfig, &configs).context("register Kueue's webhooks")?;

    // Ready: its probe answers and its ClusterQueue webhook defaults a queue (dry run).
    let api: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &resource("ClusterQueue", "clusterqueues"));
    wait::until("Kueue to serve its webhooks", wait::TIMEOUT, || async {
        let probe = crate::workload::http_get(probe_port, "/readyz").await;
        if !matches!(probe, Ok((200, _))) {
            return Ok(None);
        }
        let cq: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "ClusterQueue",
            "metadata": {"name": "das-e2e-probe"},
            "spec": {"namespaceSelector": {}},
        }))?;
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        Ok(api.create(&dry, &cq).await.ok().map(|_| ()))
    })
    .await
}

/// The namespace whose workloads the example queues admit (`LocalQueue` `team-a`).
pub const EXAMPLE_NAMESPACE: &str = "team-a";

/// The quota examples of docs/examples/kueue/: `count` (slices per profile) and `memory` (GPU
/// memory through the `memory` counter).
pub const EXAMPLES: [&str; 2] = ["count", "memory"];

/// Starts Kueue with the configuration of docs/examples/kueue/`<example>`-config.yaml, applies
/// `<example>`-queues.yaml and labels namespace [`EXAMPLE_NAMESPACE`] for Kueue to manage; returns
/// once its LocalQueue is active. DAS's DeviceClasses must be installed (the mappings name them).
///
/// # Errors
/// An unknown example, Kueue not built, or Kueue not ready within [`wait::TIMEOUT`].
pub async fn start_example(cluster: &mut Cluster, example: &str) -> Result<()> {
    ensure!(
        EXAMPLES.contains(&example),
        "unknown Kueue example {example:?}; the examples are {EXAMPLES:?} (docs/examples/kueue/)"
    );
    let dir = workspace_root().join("docs/examples/kueue");
    let path = dir.join(format!("{example}-config.yaml"));
    let config: Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("parse {}", path.display()))?;
    start(cluster, &config["resources"]).await?;
    let client = cluster.client();
    Api::<Namespace>::all(client.clone())
        .patch(
            EXAMPLE_NAMESPACE,
            &PatchParams::apply("das-e2e"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": EXAMPLE_NAMESPACE, "labels": {MANAGED_LABEL: "true"}}})),
        )
        .await?;
    chart::apply_path(
        &cluster.kubeconfig,
        &dir.join(format!("{example}-queues.yaml")),
    )?;
    let lq = Api::<kube::api::DynamicObject>::namespaced_with(
        client,
        EXAMPLE_NAMESPACE,
        &resource("LocalQueue", "localqueues"),
    );
    wait::until(
        "the example LocalQueue to be active",
        wait::TIMEOUT,
        || async {
            let q = serde_json::to_value(lq.get(EXAMPLE_NAMESPACE).await?)?;
            let active = q["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Active" && c["status"] == "True");
            Ok(active.then_some(()))
        },
    )
    .await
}

/// Where Kueue's controller manager reads its metrics serving certificate when its internal
/// certificate management is off: a fixed path (`cmd/kueue/main.go`, `metricsCertPath`), where
/// its release manifests mount a Secret.
pub const METRICS_CERT_DIR: &str = "/etc/kueue/metrics/certs";

/// Puts `serving` (`tls.crt`, `tls.key`) into [`METRICS_CERT_DIR`] unless a pair is there: the
/// whole directory appears at once (a rename), so Kueues of tests running side by side never read
/// half of one pair. Nothing scrapes these metrics here; Kueue only refuses to start without them.
///
/// # Errors
/// `/etc/kueue/metrics` cannot be written (the Kueue tests need root, as the runtime-node tests do).
fn install_metrics_certs(serving: &crate::pki::CertFiles) -> Result<()> {
    let dir = std::path::Path::new(METRICS_CERT_DIR);
    if dir.join("tls.crt").exists() && dir.join("tls.key").exists() {
        return Ok(());
    }
    let parent = dir.parent().context("metrics cert dir parent")?;
    let staged = parent.join(format!(".certs-{}", std::process::id()));
    let write = || -> Result<()> {
        std::fs::create_dir_all(&staged)?;
        std::fs::copy(&serving.cert, staged.join("tls.crt"))?;
        std::fs::copy(&serving.key, staged.join("tls.key"))?;
        Ok(())
    };
    write().with_context(|| {
        format!("write Kueue's metrics certificate into {METRICS_CERT_DIR} (needs root)")
    })?;
    if std::fs::rename(&staged, dir).is_err() {
        // Another test put its pair there first: keep that one.
        std::fs::remove_dir_all(&staged).ok();
    }
    ensure!(
        dir.join("tls.key").exists(),
        "no Kueue metrics certificate in {METRICS_CERT_DIR}"
    );
    Ok(())
}

/// The API resource of a Kueue kind (`ClusterQueue`, `clusterqueues`), for dynamic clients.
pub fn resource(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = r#"---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  name: mpod.kb.io
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-ray-io-v1-rayjob}}
  name: mrayjob.kb.io
  rules: [{apiGroups: [ray.io], apiVersions: [v1], operations: [CREATE], resources: [rayjobs]}]
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate-kueue-x-k8s-io-v1beta2-clusterqueue}}
  name: vclusterqueue.kb.io
  rules: [{apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE], resources: [clusterqueues]}]
  sideEffects: None
"#;

    #[test]
    fn webhooks_go_to_loopback_and_only_managed_namespaces_get_the_pod_webhook() {
        let cfgs = webhook_configurations(MANIFESTS, 9443, b"CA").unwrap();
        assert_eq!(
            cfgs[0]["metadata"]["name"],
            "kueue-mutating-webhook-configuration"
        );
        let hooks = cfgs[0]["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 1, "the Ray webhook is dropped: {hooks:?}");
        assert_eq!(
            hooks[0]["clientConfig"]["url"],
            "https://127.0.0.1:9443/mutate--v1-pod"
        );
        assert_eq!(
            hooks[0]["namespaceSelector"]["matchLabels"][MANAGED_LABEL],
            "true"
        );
        let cq = &cfgs[1]["webhooks"][0];
        assert!(cq["namespaceSelector"].is_null(), "{cq}");
        assert_eq!(cq["clientConfig"]["caBundle"], "Q0E=");
    }
}
