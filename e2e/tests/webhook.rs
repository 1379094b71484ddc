//! Cluster tests of `das-webhook` on the local cluster (real kube-apiserver with admission
//! webhooks, scheduler, controller-manager, hollow DRA kubelets) with the DAS node plugin on an
//! emulated H100 80GB and das-controller: legacy `nvidia.com/mig-*` pods behave as they did with the seed operator
//! (docs/design.md §8).
//!
//! The webhook is registered by URL on loopback with its own CA. The webhook, plugin and
//! controller binaries are the debug builds in the target directory ([`DasBinary`]); `make e2e`
//! builds them first.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::AllocationClaim;
use das_api::claim_status::our_results;
use das_e2e::das::{self, apply_device_classes, container_view, wait_nodes_published};
use das_e2e::install::DasBinary;
use das_e2e::pki::loopback_serving;
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, claim_of, delete_pod, delete_pods, free_port, wait_running};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: &str = "n0";
const WEBHOOK: &str = "legacy-pods.mig.das.com";
/// Profiles with a DeviceClass on the test cluster.
const PROFILES: &[&str] = &["1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb"];

/// The running webhook: its port and the CA that signed its certificate.
struct Webhook {
    port: u16,
    ca: PathBuf,
    /// The serving certificate and key files the webhook watches.
    serving: das_e2e::pki::CertFiles,
}

#[tokio::test]
async fn legacy_mig_pods_are_translated_and_run() {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    let hook = match setup(&mut cluster).await {
        Ok(h) => h,
        Err(e) => return cluster.check(Err(e)),
    };
    cluster.check(scenarios(&cluster, &hook).await);
}

async fn scenarios(cluster: &Cluster, hook: &Webhook) -> Result<()> {
    let c = cluster.client();
    pod_without_mig_never_reaches_the_webhook(&c, hook).await?;
    whole_gpu_pods_are_left_alone_without_the_flag(&c, hook).await?;
    one_slice(cluster).await?;
    me_profile_by_nvidias_name(cluster).await?;
    three_slices_in_one_container(cluster).await?;
    two_containers_and_an_init_container(cluster).await?;
    two_profiles_in_one_container(cluster).await?;
    bad_pods_are_denied(&c).await?;
    device_configs_are_checked_at_admission(&c, hook).await?;
    more_than_a_node_holds_is_denied_with_the_maximum(&c).await?;
    a_template_that_asks_for_something_else_is_not_used(&c).await?;
    updates_and_ephemeral_containers_of_a_translated_pod(&c).await?;
    dra_quota_replaces_the_legacy_quota(&c).await?;
    dry_run_creates_nothing(&c).await?;
    mixed_profiles_share_the_gpu(cluster).await?;
    fill_then_pending_then_runs(&c).await?;
    deployment_of_two(&c).await?;
    deleted_template_is_created_again(&c).await?;
    certificate_rotation_is_picked_up(cluster, hook).await?;
    Ok(())
}

/// Cluster (one node, emulated H100 80GB x1), plugin, DeviceClasses, webhook and its
/// MutatingWebhookConfiguration.
async fn setup(cluster: &mut Cluster) -> Result<Webhook> {
    let n = cluster.node(NODE).clone();
    let args = das::plugin_args(&n, "H100-80GB:1", &cluster.kubeconfig.clone(), free_port());
    let plugin = DasBinary::Plugin.debug()?;
    cluster.spawn_program("das-plugin-n0", &plugin, args)?;
    let client = cluster.client();
    apply_device_classes(&client, PROFILES).await?;
    das::install_allocation_claim_crd(&client).await?;
    let controller = DasBinary::Controller.debug()?;
    let args = das::controller_args(&cluster.kubeconfig.clone(), free_port());
    cluster.spawn_program("das-controller", &controller, args)?;
    wait_nodes_published(&client, &[NODE]).await?;
    let hook = start_webhook(cluster)?;
    wait::until("webhook /healthz", TIMEOUT, || async {
        Ok(https(&hook, "GET", "/healthz", "")
            .await
            .ok()
            .filter(|r| r.0 == 200))
    })
    .await?;
    register_webhook(&client, &hook).await?;
    Ok(hook)
}

/// Issues a serving certificate for 127.0.0.1 from a CA of the webhook's own and starts it.
fn start_webhook(cluster: &mut Cluster) -> Result<Webhook> {
    let (pki, serving) = loopback_serving(&cluster.pki_dir.join("webhook"), "das-webhook")?;
    let port = free_port();
    let args = vec![
        format!("--kubeconfig={}", cluster.kubeconfig.display()),
        format!("--listen=127.0.0.1:{port}"),
        format!("--tls-cert-file={}", serving.cert.display()),
        format!("--tls-key-file={}", serving.key.display()),
        "--cert-reload-interval-seconds=1".into(),
        "--log-level=info,das_webhook=debug".into(),
    ];
    cluster.spawn_program("das-webhook", &DasBinary::Webhook.debug()?, args)?;
    Ok(Webhook {
        port,
        ca: pki.ca.cert.clone(),
        serving,
    })
}

/// The Helm chart's MutatingWebhookConfiguration (matchConditions, namespaceSelector,
/// failurePolicy, sideEffects as the chart renders them), by URL on loopback instead of a
/// Service reference.
async fn register_webhook(client: &Client, hook: &Webhook) -> Result<()> {
    let rendered = das_e2e::install::render()?;
    let cfg = das_e2e::install::webhook_configuration(&rendered, hook.port, &hook.ca)?;
    ensure!(
        cfg["webhooks"][0]["name"] == WEBHOOK,
        "unexpected webhook in the chart: {}",
        cfg["webhooks"][0]["name"]
    );
    let cfg: MutatingWebhookConfiguration = serde_json::from_value(cfg)?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &cfg)
        .await?;
    let rendered = das_e2e::install::render()?;
    let validating =
        das_e2e::install::validating_webhook_configuration(&rendered, hook.port, &hook.ca)?;
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(validating)?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await?;
    // The API server picks configurations up from an informer: wait until a legacy pod is
    // translated (dry run, so nothing stays behind).
    wait_translating(client).await
}

/// Waits until a legacy pod is translated (dry run, so nothing stays behind).
async fn wait_translating(client: &Client) -> Result<()> {
    wait::until("webhook configuration active", TIMEOUT, || async {
        let p = pod_json("probe", &[("app", "nvidia.com/mig-1g.10gb", "1")], None);
        let api: Api<Pod> = Api::namespaced(client.clone(), NS);
        let out = api
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &serde_json::from_value(p)?,
            )
            .await?;
        Ok(out
            .spec
            .and_then(|s| s.resource_claims)
            .is_some()
            .then_some(()))
    })
    .await
}

/// `method path` over HTTPS to the webhook, trusting only its CA: (status, body).
async fn https(hook: &Webhook, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(&hook.ca)? {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", hook.port)).await?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?;
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await; // peers may close without close_notify
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("HTTP status line")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Sum of `das_webhook_admission_requests_total` over outcomes.
async fn reviews_seen(hook: &Webhook) -> Result<f64> {
    metric_sum(hook, "das_webhook_admission_requests_total").await
}

/// Sum of every series of `name` on the webhook's /metrics.
async fn metric_sum(hook: &Webhook, name: &str) -> Result<f64> {
    let (code, body) = https(hook, "GET", "/metrics", "").await?;
    ensure!(code == 200, "/metrics answered {code}");
    Ok(body
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// docs/design.md §8, "Device configuration at admission": a claim or template whose config for
/// mig.das.com does not decode is denied with the decoder's words (the same a prepare fails
/// with, e2e/tests/plugin_device_config.rs); a valid one is admitted; another driver's config
/// is never sent to the webhook (the chart's matchConditions).
async fn device_configs_are_checked_at_admission(c: &Client, hook: &Webhook) -> Result<()> {
    let devices = |driver: &str, parameters: &Value| {
        json!({"devices": {
            "requests": [{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}],
            "config": [{"requests": ["mig"], "opaque": {"driver": driver, "parameters": parameters}}]
        }})
    };
    let claim = |name: &str, driver: &str, parameters: &Value| -> Result<ResourceClaim> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": devices(driver, parameters)
        }))?)
    };
    let bad = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "Exclusive", "timeSlice": "1ms"}});
    let good = json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig"});
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), NS);
    // The API server reads new configurations from an informer: wait for the first denial.
    let denied = wait::until("device-config validation active", TIMEOUT, || async {
        match claims
            .create(&PostParams::default(), &claim("bad", "mig.das.com", &bad)?)
            .await
        {
            Err(kube::Error::Api(e)) => Ok(Some(e.message)),
            Err(e) => Err(e.into()),
            Ok(_) => {
                claims.delete("bad", &DeleteParams::default()).await?;
                Ok(None)
            }
        }
    })
    .await?;
    ensure!(
        denied.contains(
            "the device configuration for mig.das.com: spec.devices.config[0].opaque.parameters: MigDeviceConfig: unknown field `timeSlice`"
        ),
        "the claim's denial does not give the field and the decoder's words: {denied}"
    );
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad-config"},
        "spec": {"spec": devices("mig.das.com", &bad)},
    }))?;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), NS);
    let err = templates
        .create(&PostParams::default(), &template)
        .await
        .err()
        .context("a template with a bad config was admitted")?;
    ensure!(
        err.to_string().contains("spec.spec.devices.config[0].opaque.parameters: MigDeviceConfig: unknown field `timeSlice`"),
        "the template's denial: {err}"
    );
    claims
        .create(
            &PostParams::default(),
            &claim("good-config", "mig.das.com", &good)?,
        )
        .await
        .context("a valid MigDeviceConfig was denied")?;
    let seen = metric_sum(hook, "das_webhook_device_config_reviews_total").await?;
    claims
        .create(
            &PostParams::default(),
            &claim("other-driver", "gpu.nvidia.com", &json!({"not": "ours"}))?,
        )
        .await
        .context("another driver's config was denied")?;
    let after = metric_sum(hook, "das_webhook_device_config_reviews_total").await?;
    ensure!(
        after == seen,
        "a claim with only another driver's config was sent to the webhook ({seen} -> {after})"
    );
    for name in ["good-config", "other-driver"] {
        claims.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// Pod JSON: `containers` = [(name, resource, quantity)] (limits only); `init` likewise.
fn pod_json(
    name: &str,
    containers: &[(&str, &str, &str)],
    init: Option<(&str, &str, &str)>,
) -> Value {
    let c = |(n, r, q): (&str, &str, &str)| {
        json!({"name": n, "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {r: q, "cpu": "100m"}}})
    };
    let mut spec = json!({
        "containers": containers.iter().map(|x| c(*x)).collect::<Vec<_>>(),
        "terminationGracePeriodSeconds": 0
    });
    if let Some(i) = init {
        // A native sidecar: the hollow kubelet's fake runtime never ends a container, so a
        // classic init container would keep the pod in Init for ever.
        let mut ic = c(i);
        ic["restartPolicy"] = json!("Always");
        spec["initContainers"] = json!([ic]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

async fn create(c: &Client, pod: Value) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    Ok(api
        .create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await?)
}

/// MIG UUIDs container `container` of running pod `pod` sees (its CDI devices resolved and
/// merged as a runtime does; an environment key set to two values fails).
fn visible(cluster: &Cluster, pod: &Pod, container: &str) -> Result<Vec<String>> {
    let uid = pod.metadata.uid.as_deref().context("pod uid")?;
    let view = container_view(cluster.node(NODE), uid, container)?;
    let uuids = view.mig_uuids();
    ensure!(
        !uuids.is_empty(),
        "{container}: no DAS_MIG_UUID_* in {:?}",
        view.env
    );
    Ok(uuids)
}

async fn pod_without_mig_never_reaches_the_webhook(c: &Client, hook: &Webhook) -> Result<()> {
    let before = reviews_seen(hook).await?;
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {"cpu": "100m"}}}], "terminationGracePeriodSeconds": 0}});
    let pod = create(c, p).await?;
    ensure!(pod.spec.and_then(|s| s.resource_claims).is_none());
    wait_running(c, "plain").await?;
    let after = reviews_seen(hook).await?;
    ensure!(
        after == before,
        "webhook saw {} reviews for a plain pod",
        after - before
    );
    delete_pod(c, "plain").await
}

/// Without `--translate-whole-gpus` (and the chart's `webhook.translateWholeGpus`), a pod asking
/// for `nvidia.com/gpu` is not sent to the webhook and is admitted as it is; sent anyway, the
/// webhook allows it without a patch.
async fn whole_gpu_pods_are_left_alone_without_the_flag(c: &Client, hook: &Webhook) -> Result<()> {
    let before = reviews_seen(hook).await?;
    let pod = create(
        c,
        pod_json("gpu-plain", &[("app", "nvidia.com/gpu", "1")], None),
    )
    .await?;
    let spec = pod.spec.context("spec")?;
    ensure!(
        spec.resource_claims.is_none(),
        "claims added: {:?}",
        spec.resource_claims
    );
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    ensure!(
        limits.contains_key("nvidia.com/gpu"),
        "nvidia.com/gpu removed: {limits:?}"
    );
    let after = reviews_seen(hook).await?;
    ensure!(
        after == before,
        "webhook saw {} reviews for an nvidia.com/gpu pod",
        after - before
    );
    delete_pod(c, "gpu-plain").await?;

    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "whole-gpu-off", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NS, "operation": "CREATE", "userInfo": {},
            "object": pod_json("gpu-sent", &[("app", "nvidia.com/gpu", "1")], None)}});
    let (code, body) = https(hook, "POST", "/mutate-pods", &review.to_string()).await?;
    ensure!(code == 200, "/mutate-pods answered {code}: {body}");
    let response = &serde_json::from_str::<Value>(&body)?["response"];
    ensure!(
        response["allowed"] == true && response["patch"].is_null(),
        "an nvidia.com/gpu pod was changed or refused: {response}"
    );
    Ok(())
}

async fn one_slice(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let created = create(
        &c,
        pod_json("one", &[("app", "nvidia.com/mig-1g.10gb", "1")], None),
    )
    .await?;
    let spec = created.spec.as_ref().context("spec")?;
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    ensure!(
        !limits.keys().any(|k| k.starts_with("nvidia.com/mig-")),
        "legacy limit left: {limits:?}"
    );
    ensure!(limits.contains_key("cpu"), "cpu limit lost: {limits:?}");
    let pod = wait_running(&c, "one").await?;
    let uuids = visible(cluster, &pod, "app")?;
    ensure!(
        uuids.len() == 1 && uuids[0].starts_with("MIG-"),
        "{uuids:?}"
    );
    let tpl = Api::<ResourceClaimTemplate>::namespaced(c.clone(), NS)
        .get("das-mig-1g-10gb-x1")
        .await?;
    ensure!(
        tpl.metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("das-webhook")
    );
    delete_pod(&c, "one").await
}

/// `nvidia.com/mig-1g.10gb.me`, as NVIDIA's device plugin names the `+me` profile, runs on the
/// H100; the pre-0.3 spelling `nvidia.com/mig-1g.10gb-me` too, with a warning kubectl prints.
async fn me_profile_by_nvidias_name(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create(
        &c,
        pod_json("me", &[("app", "nvidia.com/mig-1g.10gb.me", "1")], None),
    )
    .await?;
    let pod = wait_running(&c, "me").await?;
    ensure!(visible(cluster, &pod, "app")?.len() == 1);
    let claim = claim_of(&c, "me").await?;
    let device = &our_results(&claim).next().context("allocated")?.device;
    ensure!(device.contains("-mig-1g-10gb-me-"), "{device}");
    delete_pod(&c, "me").await?;

    let old = pod_json("me-old", &[("app", "nvidia.com/mig-1g.10gb-me", "1")], None);
    let out =
        std::process::Command::new(das_e2e::cluster::workspace_root().join(".local/bin/kubectl"))
            .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
            .args(["create", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .expect("piped")
                    .write_all(old.to_string().as_bytes())?;
                child.wait_with_output()
            })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "kubectl create: {stderr}");
    ensure!(
        stderr.contains(
            "Warning: nvidia.com/mig-1g.10gb-me is deprecated: use nvidia.com/mig-1g.10gb.me"
        ),
        "kubectl shows the deprecation: {stderr}"
    );
    wait_running(&c, "me-old").await?;
    delete_pod(&c, "me-old").await
}

async fn three_slices_in_one_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create(
        &c,
        pod_json("three", &[("app", "nvidia.com/mig-1g.10gb", "3")], None),
    )
    .await?;
    let pod = wait_running(&c, "three").await?;
    let uuids = visible(cluster, &pod, "app")?;
    ensure!(uuids.len() == 3, "{uuids:?}");
    delete_pod(&c, "three").await
}

async fn two_containers_and_an_init_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let p = pod_json(
        "two",
        &[
            ("a", "nvidia.com/mig-1g.10gb", "1"),
            ("b", "nvidia.com/mig-1g.10gb", "1"),
        ],
        Some(("init", "nvidia.com/mig-1g.10gb", "1")),
    );
    create(&c, p).await?;
    let pod = wait_running(&c, "two").await?;
    let a = visible(cluster, &pod, "a")?;
    let b = visible(cluster, &pod, "b")?;
    let i = visible(cluster, &pod, "init")?;
    ensure!(
        a.len() == 1 && b.len() == 1 && i.len() == 1,
        "a={a:?} b={b:?} init={i:?}"
    );
    ensure!(
        a != b && a != i && b != i,
        "slices shared: a={a:?} b={b:?} init={i:?}"
    );
    delete_pod(&c, "two").await
}

/// One container asking for two legacy profiles gets two claims (one per profile); the runtime
/// merges the two CDI specs, and the container sees both MIG UUIDs.
async fn two_profiles_in_one_container(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mixed"},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}}}],
            "terminationGracePeriodSeconds": 0}});
    let created = create(&c, p).await?;
    let claims = created
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default();
    ensure!(claims.len() == 2, "one claim per profile: {claims:?}");
    let pod = wait_running(&c, "mixed").await?;
    let uuids = visible(cluster, &pod, "app")?;
    ensure!(uuids.len() == 2, "both slices visible: {uuids:?}");
    let state = das::emulated_state(cluster.node(NODE))?;
    let live: Vec<String> = state["gpus"][0]["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["migUuid"].as_str().map(str::to_string))
        .collect();
    for u in &uuids {
        ensure!(live.contains(u), "{u} is not a live slice: {live:?}");
    }
    delete_pod(&c, "mixed").await
}

/// One emulated H100 holds at most 7 `1g.10gb` slices: 8 is denied naming 7 (the webhook counts
/// what the published devices allow), and so is 4294967295.
async fn more_than_a_node_holds_is_denied_with_the_maximum(c: &Client) -> Result<()> {
    for n in ["8", "4294967295"] {
        let p = pod_json("huge", &[("app", "nvidia.com/mig-1g.10gb", n)], None);
        expect_denied(c, p, &["at most 7 1g.10gb slices fit on one node"]).await?;
    }
    Ok(())
}

/// A template named like one the webhook makes but asking for something else is never used.
async fn a_template_that_asks_for_something_else_is_not_used(c: &Client) -> Result<()> {
    let ns = "tpl-test";
    namespace(c, ns).await?;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), ns);
    let wrong: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "das-mig-1g-10gb-x2"},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": das_api::profile_device_class("1g.10gb"),
            "allocationMode": "ExactCount", "count": 3}}]}}}
    }))?;
    templates.create(&PostParams::default(), &wrong).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let p = pod_json("two", &[("app", "nvidia.com/mig-1g.10gb", "2")], None);
    match pods
        .create(&PostParams::default(), &serde_json::from_value(p)?)
        .await
    {
        Ok(_) => bail!("a pod was put on a template that asks for 3 slices"),
        Err(kube::Error::Api(s)) => ensure!(
            s.message
                .contains("das-mig-1g-10gb-x2 exists but it asks for")
                && s.message.contains("delete it"),
            "{}",
            s.message
        ),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

async fn namespace(c: &Client, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
    let ns = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// After translation, a pod's other updates go through (the webhook only sees creations), an
/// ephemeral container asking for a legacy MIG resource is refused by the API server itself
/// (ephemeral containers have no resources), and a plain one (`kubectl debug`) is added.
async fn updates_and_ephemeral_containers_of_a_translated_pod(c: &Client) -> Result<()> {
    create(
        c,
        pod_json("upd", &[("app", "nvidia.com/mig-1g.10gb", "1")], None),
    )
    .await?;
    wait_running(c, "upd").await?;
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    api.patch(
        "upd",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await?;
    let eph = |resources: Value| {
        json!({"spec": {"ephemeralContainers": [{"name": "debug", "image": "registry.k8s.io/pause:3.10",
            "resources": resources}]}})
    };
    let refused = api
        .patch_subresource(
            "ephemeralcontainers",
            "upd",
            &PatchParams::default(),
            &Patch::Strategic(eph(json!({"limits": {"nvidia.com/mig-1g.10gb": "1"}}))),
        )
        .await;
    match refused {
        Err(kube::Error::Api(s)) => ensure!(
            s.message.contains("ephemeralContainers") && s.message.contains("resources"),
            "{}",
            s.message
        ),
        other => bail!("an ephemeral container with MIG resources was added: {other:?}"),
    }
    let added = api
        .patch_subresource(
            "ephemeralcontainers",
            "upd",
            &PatchParams::default(),
            &Patch::Strategic(eph(json!({}))),
        )
        .await?;
    let spec = added.spec.context("spec")?;
    ensure!(spec.ephemeral_containers.iter().flatten().count() == 1);
    ensure!(
        spec.resource_claims.iter().flatten().count() == 1,
        "the translated claim is kept"
    );
    delete_pod(c, "upd").await
}

/// The translation removes `nvidia.com/mig-*` from the pod, so a ResourceQuota on
/// `requests.nvidia.com/mig-1g.10gb` no longer counts; the DRA quota on the profile's class
/// (`<class>.deviceclass.resource.k8s.io/devices`) does: with a limit of 2, the third legacy
/// pod's claim is refused by the quota and the pod does not run.
async fn dra_quota_replaces_the_legacy_quota(c: &Client) -> Result<()> {
    let ns = "quota-test";
    namespace(c, ns).await?;
    let class = das_api::profile_device_class("1g.10gb");
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = Api::namespaced(c.clone(), ns);
    let q = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "mig"},
        "spec": {"hard": {
            format!("{class}.deviceclass.resource.k8s.io/devices"): "2",
            "requests.nvidia.com/mig-1g.10gb": "1"}}}))?;
    quotas.create(&PostParams::default(), &q).await?;
    wait::until("the quota to be computed", TIMEOUT, || async {
        let q = quotas.get("mig").await?;
        Ok(q.status.and_then(|s| s.hard).is_some().then_some(()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    for name in ["q1", "q2", "q3"] {
        let p = pod_json(name, &[("app", "nvidia.com/mig-1g.10gb", "1")], None);
        pods.create(&PostParams::default(), &serde_json::from_value(p)?)
            .await
            .with_context(|| format!("create {name}"))?;
    }
    for name in ["q1", "q2"] {
        wait::until(&format!("{name} to run"), TIMEOUT, || async {
            let p = pods.get(name).await?;
            Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
        })
        .await?;
    }
    // Two pods run although the legacy quota says 1: it no longer counts.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), ns);
    wait::until("q3's claim to be refused by the quota", TIMEOUT, || async {
        let refused = events
            .list(&ListParams::default().fields("involvedObject.name=q3"))
            .await?
            .items
            .iter()
            .any(|e| {
                e.message
                    .as_deref()
                    .unwrap_or("")
                    .contains("exceeded quota")
            });
        Ok(refused.then_some(()))
    })
    .await?;
    let q3 = pods.get("q3").await?;
    ensure!(
        q3.status.and_then(|s| s.phase).as_deref() != Some("Running"),
        "q3 runs beyond the quota"
    );
    let used = quotas
        .get("mig")
        .await?
        .status
        .and_then(|s| s.used)
        .unwrap_or_default();
    ensure!(
        used.get(&format!("{class}.deviceclass.resource.k8s.io/devices"))
            .map(|q| q.0.as_str())
            == Some("2"),
        "{used:?}"
    );
    for name in ["q1", "q2", "q3"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    Ok(())
}

/// Creates `pod` expecting a denial whose message contains every one of `want`.
async fn expect_denied(c: &Client, pod: Value, want: &[&str]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    match api
        .create(&PostParams::default(), &serde_json::from_value(pod)?)
        .await
    {
        Ok(p) => bail!("pod {:?} admitted", p.metadata.name),
        Err(kube::Error::Api(s)) => {
            ensure!(
                s.message.contains(WEBHOOK),
                "not denied by the webhook: {}",
                s.message
            );
            for w in want {
                ensure!(s.message.contains(w), "message {:?} lacks {w:?}", s.message);
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

async fn bad_pods_are_denied(c: &Client) -> Result<()> {
    let unknown = pod_json("bad1", &[("app", "nvidia.com/mig-9g.99gb", "1")], None);
    expect_denied(
        c,
        unknown,
        &[
            "unknown MIG profile \"9g.99gb\"",
            "1g.10gb, 1g.10gb.me, 2g.20gb, 3g.40gb",
        ],
    )
    .await?;
    let frac = pod_json("bad2", &[("app", "nvidia.com/mig-1g.10gb", "500m")], None);
    expect_denied(c, frac, &["is not a positive integer"]).await?;
    let zero = pod_json("bad3", &[("app", "nvidia.com/mig-1g.10gb", "0")], None);
    expect_denied(c, zero, &["is not a positive integer"]).await?;
    let mut differ = pod_json("bad4", &[("app", "nvidia.com/mig-1g.10gb", "2")], None);
    differ["spec"]["containers"][0]["resources"]["requests"] =
        json!({"nvidia.com/mig-1g.10gb": "1"});
    expect_denied(c, differ, &["requests (1) and limits (2) differ"]).await?;
    let mut both = pod_json("bad5", &[("app", "nvidia.com/mig-1g.10gb", "1")], None);
    both["spec"]["resourceClaims"] =
        json!([{"name": "mine", "resourceClaimTemplateName": "das-mig-1g-10gb-x1"}]);
    both["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "mine"}]);
    expect_denied(c, both, &["already holds DAS claim \"mine\""]).await?;
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    ensure!(
        api.list(&ListParams::default()).await?.items.is_empty(),
        "a denied pod exists"
    );
    Ok(())
}

async fn dry_run_creates_nothing(c: &Client) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    let pod = pod_json("dry", &[("app", "nvidia.com/mig-1g.10gb", "5")], None);
    let out = api
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &serde_json::from_value(pod)?,
        )
        .await?;
    let claims = out.spec.and_then(|s| s.resource_claims).unwrap_or_default();
    ensure!(
        claims
            .first()
            .and_then(|c| c.resource_claim_template_name.as_deref())
            == Some("das-mig-1g-10gb-x5"),
        "dry run not translated: {claims:?}"
    );
    let tpls = Api::<ResourceClaimTemplate>::namespaced(c.clone(), NS);
    ensure!(
        tpls.get_opt("das-mig-1g-10gb-x5").await?.is_none(),
        "dry run created a template"
    );
    ensure!(api.get_opt("dry").await?.is_none(), "dry run created a pod");
    Ok(())
}

async fn mixed_profiles_share_the_gpu(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    create(
        &c,
        pod_json("small", &[("app", "nvidia.com/mig-1g.10gb", "1")], None),
    )
    .await?;
    create(
        &c,
        pod_json("medium", &[("app", "nvidia.com/mig-2g.20gb", "1")], None),
    )
    .await?;
    let s = wait_running(&c, "small").await?;
    let m = wait_running(&c, "medium").await?;
    let su = visible(cluster, &s, "app")?;
    let mu = visible(cluster, &m, "app")?;
    ensure!(su != mu, "1g and 2g got the same slice");
    delete_pods(&c, &["small", "medium"]).await
}

/// An H100 80GB has 7 `1g.10gb` slices: 7 pods run, the 8th waits until one is deleted.
async fn fill_then_pending_then_runs(c: &Client) -> Result<()> {
    let names: Vec<String> = (0..7).map(|i| format!("fill-{i}")).collect();
    for n in &names {
        create(
            c,
            pod_json(n, &[("app", "nvidia.com/mig-1g.10gb", "1")], None),
        )
        .await?;
    }
    for n in &names {
        wait_running(c, n).await?;
    }
    create(
        c,
        pod_json("extra", &[("app", "nvidia.com/mig-1g.10gb", "1")], None),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    let phase = api
        .get("extra")
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default();
    ensure!(phase == "Pending", "8th pod is {phase}, expected Pending");
    delete_pod(c, "fill-0").await?;
    wait_running(c, "extra").await?;
    let mut rest: Vec<&str> = names[1..].iter().map(String::as_str).collect();
    rest.push("extra");
    delete_pods(c, &rest).await
}

async fn deployment_of_two(c: &Client) -> Result<()> {
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "legacy"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "legacy"}},
            "template": {"metadata": {"labels": {"app": "legacy"}}, "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}}
    }))?;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    deployments.create(&PostParams::default(), &d).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    let lp = ListParams::default().labels("app=legacy");
    wait::until(
        "2 running legacy Deployment pods with claims",
        Duration::from_secs(90),
        || async {
            let items = pods.list(&lp).await?.items;
            let ok = items.len() == 2
                && items.iter().all(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && p.spec
                            .as_ref()
                            .and_then(|s| s.resource_claims.as_ref())
                            .is_some_and(|v| v.len() == 1)
                });
            Ok(ok.then_some(()))
        },
    )
    .await?;
    let allocs: Api<AllocationClaim> = Api::namespaced(c.clone(), NS);
    wait::until(
        "an AllocationClaim for each Deployment pod",
        TIMEOUT,
        || async {
            let mut owners: Vec<String> = allocs
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|a| a.spec.pod_ref.map(|p| p.name))
                .filter(|n| n.starts_with("legacy-"))
                .collect();
            owners.sort();
            owners.dedup();
            Ok((owners.len() == 2).then_some(()))
        },
    )
    .await?;
    deployments
        .delete("legacy", &DeleteParams::default())
        .await?;
    Ok(())
}

/// The webhook creates a template again when it was deleted (its watch saw the deletion).
async fn deleted_template_is_created_again(c: &Client) -> Result<()> {
    let tpls: Api<ResourceClaimTemplate> = Api::namespaced(c.clone(), NS);
    tpls.delete("das-mig-1g-10gb-x1", &DeleteParams::default())
        .await?;
    // Let the webhook's watch see the deletion.
    tokio::time::sleep(Duration::from_secs(1)).await;
    create(
        c,
        pod_json("again", &[("app", "nvidia.com/mig-1g.10gb", "1")], None),
    )
    .await?;
    wait_running(c, "again").await?;
    ensure!(tpls.get_opt("das-mig-1g-10gb-x1").await?.is_some());
    delete_pod(c, "again").await
}

/// New CA and serving pair written over the files the webhook reads: the webhook serves the new
/// certificate without a restart, and with the new caBundle the API server calls it again.
async fn certificate_rotation_is_picked_up(cluster: &Cluster, hook: &Webhook) -> Result<()> {
    use base64::Engine;
    let (pki, new) = loopback_serving(
        &cluster.pki_dir.join("webhook-rotated"),
        "das-webhook-rotated",
    )?;
    std::fs::copy(&new.key, &hook.serving.key)?;
    std::fs::copy(&new.cert, &hook.serving.cert)?;
    let rotated = Webhook {
        port: hook.port,
        ca: pki.ca.cert.clone(),
        serving: new,
    };
    wait::until("the rotated certificate served", TIMEOUT, || async {
        Ok(https(&rotated, "GET", "/healthz", "")
            .await
            .ok()
            .filter(|r| r.0 == 200))
    })
    .await?;
    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&rotated.ca)?);
    let patch: json_patch::Patch = serde_json::from_value(json!([{"op": "replace",
        "path": "/webhooks/0/clientConfig/caBundle", "value": ca}]))?;
    Api::<MutatingWebhookConfiguration>::all(cluster.client())
        .patch(
            "das-webhook",
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await?;
    wait_translating(&cluster.client()).await
}
