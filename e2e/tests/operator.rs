//! The DAS operator (operator/, docs/openshift.md) against the local cluster: the operator runs
//! as a process (`make operator` builds it into `.local/bin`, the chart embedded) as OLM would
//! run it from the bundle: the DASOperator and AllocationClaim CRDs applied beforehand, its own
//! service account with exactly the bundle's RBAC (deploy/olm/rbac), `--install-crds=false`.
//!
//! - A DASOperator with a bad field is refused by the CRD's schema with a message that names
//!   the field and what is allowed (enum, CEL rules, unknown fields, the name `cluster`).
//! - A DASOperator with emulated mode installs DAS: release `das` in `das-system` (labelled for
//!   the privileged Pod Security level), the node plugin's DaemonSet emulating the GPUs asked
//!   for, the controller and webhook Deployments, the DeviceClasses and the AllocationClaim CRD;
//!   the status carries the Helm library's Deployed and the operator's Available, Progressing
//!   and Degraded, with events; Available turns True once the workloads report their pods.
//! - The cluster's TLS security profile reaches das-webhook: the cluster serves a minimal CRD of
//!   OpenShift's `apiservers.config.openshift.io` (das_e2e::operator), so the operator, under the
//!   bundle's RBAC, follows it: no APIServer object is OpenShift's default Intermediate
//!   (VersionTLS12 and its ciphers), an APIServer with the Modern profile rolls the webhook to
//!   `DAS_WEBHOOK_TLS_MIN_VERSION=VersionTLS13` with the TLS 1.3 suites, Old is raised from TLS 1.0
//!   to VersionTLS12 with a Warning event saying so, and `spec.webhook.tlsMinVersion` wins over
//!   the profile.
//! - The node plugin, started as a process with the environment and identity of the DaemonSet
//!   the operator rendered, serves a claim pod its slice and destroys it when the pod goes.
//! - Changing `logLevel` rolls every component with the new tracing filter; a spec the chart
//!   cannot install (cert-manager asked for, not installed) is Degraded with Helm's reason until
//!   it is fixed; a deleted Deployment is put back.
//! - Deleting the DASOperator uninstalls DAS and keeps the AllocationClaim CRD.
//!
//! What it does not show: the installed pods themselves at work. The hollow kubelet reports the
//! pods it is given as running but starts no containers, so the plugin runs as a process beside
//! its DaemonSet (as `das-cluster` runs hollow nodes' plugins beside a Helm install), and no
//! webhook serves legacy pods: the operator keeps the webhook configuration as rendered (a
//! Service reference, which needs kube-proxy and a real webhook pod), so the harness cannot
//! point it at a local process. tests/operator_runtime.rs shows the pods the operator installs
//! serving, the webhook's legacy pods included, on a real-runtime node with a Service network.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use das_e2e::chart::{NAMESPACE, Rendered};
use das_e2e::install::{self, DasBinary, STAND_IN_NAME};
use das_e2e::operator::{
    apply_cr, condition, env_of, install_apiserver_crd, json, kubectl, set_tls_profile,
    wait_condition,
};
use das_e2e::plugin::live_slices;
use das_e2e::workload::{create_pod, create_template, delete_pod, wait_running};
use das_e2e::{Cluster, ClusterConfig, wait};
use serde_json::Value;

/// The operator installs the whole chart at once and the API server is shared with the other
/// tests' clusters on a small machine: allow more than [`wait::TIMEOUT`].
const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn operator_installs_updates_and_uninstalls_das_from_one_resource() {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&["n0"]))
        .await
        .expect("cluster starts");
    let result = scenarios(&mut cluster).await;
    cluster.check(result);
}

async fn scenarios(cluster: &mut Cluster) -> Result<()> {
    das_e2e::operator::install_crd(cluster)?;
    bad_resources_are_refused_with_what_is_wrong(cluster)?;
    // Before the operator starts: it asks discovery once whether the API serves APIServers.
    install_apiserver_crd(cluster)?;
    das_e2e::operator::start(cluster).await?;
    emulated_mode_installs_das(cluster).await?;
    the_cluster_tls_profile_reaches_the_webhook(cluster).await?;
    the_plugin_as_configured_serves_a_claim(cluster).await?;
    log_level_change_rolls_every_component(cluster).await?;
    a_failed_upgrade_is_degraded_until_fixed(cluster).await?;
    a_deleted_deployment_comes_back(cluster).await?;
    deleting_the_resource_uninstalls_das(cluster).await
}

/// Each bad DASOperator is refused at create with a message naming what is wrong.
fn bad_resources_are_refused_with_what_is_wrong(cluster: &Cluster) -> Result<()> {
    let cases = [
        (
            "cluster",
            r#"{"logLevel": "Loud"}"#,
            r#"Unsupported value: "Loud": supported values: "Normal", "Debug", "Trace""#,
        ),
        (
            "cluster",
            r#"{"emulated": true}"#,
            r#"unknown field "spec.emulated""#,
        ),
        (
            "cluster",
            r#"{"emulatedGpus": "A100-SXM4-40GB:2"}"#,
            "emulatedGpus needs emulatedMode true",
        ),
        (
            "cluster",
            r#"{"emulatedMode": true, "emulatedGpus": "two A100s"}"#,
            "spec.emulatedGpus in body should match",
        ),
        (
            "cluster",
            r#"{"webhook": {"replicas": "two"}}"#,
            r#"spec.webhook.replicas: Invalid value: "string": spec.webhook.replicas in body must be of type integer"#,
        ),
        (
            "cluster",
            r#"{"webhook": {"tlsMinVersion": "VersionTLS10"}}"#,
            r#"Unsupported value: "VersionTLS10": supported values: "VersionTLS12", "VersionTLS13""#,
        ),
        ("das", "{}", "a DASOperator must be named cluster"),
    ];
    for (name, spec, want) in cases {
        let cr = format!(
            r#"{{"apiVersion": "operator.das.com/v1alpha1", "kind": "DASOperator", "metadata": {{"name": "{name}"}}, "spec": {spec}}}"#
        );
        match kubectl(cluster, &["create", "-f", "-"], Some(&cr)) {
            Ok(_) => bail!("DASOperator {name} with spec {spec} was accepted"),
            Err(e) => {
                let msg = format!("{e:#}");
                ensure!(
                    msg.contains(want),
                    "spec {spec}: want {want:?} in the refusal, got: {msg}"
                );
            }
        }
    }
    Ok(())
}

async fn emulated_mode_installs_das(cluster: &Cluster) -> Result<()> {
    apply_cr(
        cluster,
        r#"{"emulatedMode": true, "emulatedGpus": "A100-SXM4-40GB:1", "logLevel": "Normal"}"#,
    )?;
    let ds = wait_json(
        cluster,
        "the node plugin's DaemonSet",
        &["-n", NAMESPACE, "get", "daemonset", "das-kubelet-plugin"],
    )
    .await?;
    ensure!(
        env_of(&ds, "DAS_EMULATED_GPUS") == "A100-SXM4-40GB:1",
        "plugin emulates {:?}",
        env_of(&ds, "DAS_EMULATED_GPUS")
    );
    ensure!(
        env_of(&ds, "DAS_LOG_LEVEL") == "info",
        "plugin logs at {:?}",
        env_of(&ds, "DAS_LOG_LEVEL")
    );
    for deployment in ["das-controller", "das-webhook"] {
        wait_json(
            cluster,
            deployment,
            &["-n", NAMESPACE, "get", "deployment", deployment],
        )
        .await?;
    }
    for (kind, name) in [
        ("deviceclass", "mig.das.com"),
        ("crd", "allocationclaims.inference.redhat.com"),
        ("mutatingwebhookconfiguration", "das-webhook"),
        ("secret", "sh.helm.release.v1.das.v1"),
    ] {
        let args = if kind == "secret" {
            vec!["-n", NAMESPACE, "get", kind, name]
        } else {
            vec!["get", kind, name]
        };
        wait_json(cluster, &format!("{kind} {name}"), &args).await?;
    }
    let ns = json(cluster, &["get", "namespace", NAMESPACE])?;
    ensure!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged",
        "namespace labels: {}",
        ns["metadata"]["labels"]
    );

    // The Helm library's condition and the operator's three, with reasons.
    let cr = wait::until("the DASOperator's conditions", TIMEOUT, || async {
        let cr = json(cluster, &["get", "dasoperator", "cluster"])?;
        let ok = ["Deployed", "Available", "Progressing", "Degraded"]
            .iter()
            .all(|t| condition(&cr, t).is_some());
        Ok(ok.then_some(cr))
    })
    .await?;
    ensure!(
        condition(&cr, "Deployed").map(|c| c["status"] == "True") == Some(true),
        "Deployed: {:?}",
        condition(&cr, "Deployed")
    );
    ensure!(
        condition(&cr, "Degraded").map(|c| c["status"] == "False") == Some(true),
        "Degraded: {:?}",
        condition(&cr, "Degraded")
    );
    for t in ["Available", "Progressing"] {
        let c = condition(&cr, t).context(t)?;
        ensure!(
            c["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{t} has no reason: {c}"
        );
    }
    // The hollow kubelet reports the pods it is given as running and ready (it starts no
    // containers): the workloads become available and so does DAS, as far as the API shows.
    wait_condition(cluster, "Available", "True", TIMEOUT).await?;
    // The recorder posts events in the background: wait for the first condition's.
    wait::until("an event of a condition change", TIMEOUT, || async {
        let reasons = kubectl(
            cluster,
            &[
                "get",
                "events",
                "-A",
                "--field-selector=involvedObject.kind=DASOperator",
                "-o",
                "jsonpath={.items[*].reason}",
            ],
            None,
        )?;
        Ok((reasons.contains("Progressing") || reasons.contains("Available")).then_some(()))
    })
    .await
}

/// OpenShift's profile tables (openshift/api `config/v1` `TLSProfiles`), as das-webhook gets them.
const INTERMEDIATE_CIPHERS: &str = "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256,ECDHE-ECDSA-AES128-GCM-SHA256,ECDHE-RSA-AES128-GCM-SHA256,ECDHE-ECDSA-AES256-GCM-SHA384,ECDHE-RSA-AES256-GCM-SHA384,ECDHE-ECDSA-CHACHA20-POLY1305,ECDHE-RSA-CHACHA20-POLY1305";
const MODERN_CIPHERS: &str =
    "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256";

/// The webhook Deployment's TLS environment follows the APIServer's profile: unset
/// (Intermediate), Modern, Old (raised to TLS 1.2, with a Warning event), and the spec's
/// `webhook.tlsMinVersion` over it.
async fn the_cluster_tls_profile_reaches_the_webhook(cluster: &Cluster) -> Result<()> {
    let webhook_tls = |min: &'static str, ciphers: Option<&'static str>| async move {
        wait::until(
            &format!("das-webhook at {min}, cipher suites {ciphers:?}"),
            TIMEOUT,
            || async {
                let d = json(
                    cluster,
                    &["-n", NAMESPACE, "get", "deployment", "das-webhook"],
                )?;
                let got = (
                    env_of(&d, "DAS_WEBHOOK_TLS_MIN_VERSION"),
                    env_of(&d, "DAS_WEBHOOK_TLS_CIPHER_SUITES"),
                );
                Ok((got.0 == min && ciphers.is_none_or(|c| got.1 == c)).then_some(got))
            },
        )
        .await
    };
    // No APIServer object: OpenShift's default, Intermediate.
    webhook_tls("VersionTLS12", Some(INTERMEDIATE_CIPHERS)).await?;
    set_tls_profile(cluster, r#"{"type": "Modern", "modern": {}}"#)?;
    webhook_tls("VersionTLS13", Some(MODERN_CIPHERS)).await?;
    set_tls_profile(cluster, r#"{"type": "Old", "old": {}}"#)?;
    let (_, old) = webhook_tls("VersionTLS12", None).await?;
    ensure!(
        old.starts_with(MODERN_CIPHERS) && old.contains("DES-CBC3-SHA"),
        "Old's cipher suites not passed through: {old}"
    );
    wait::until("the event of TLS 1.0 raised", TIMEOUT, || async {
        let messages = kubectl(
            cluster,
            &[
                "get",
                "events",
                "-A",
                "--field-selector=involvedObject.kind=DASOperator,reason=WebhookTLSProfileAdjusted",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        )?;
        Ok(messages.contains("asks for VersionTLS10").then_some(()))
    })
    .await?;
    kubectl(
        cluster,
        &[
            "patch",
            "dasoperator",
            "cluster",
            "--type=merge",
            "-p",
            r#"{"spec":{"webhook":{"tlsMinVersion":"VersionTLS13"}}}"#,
        ],
        None,
    )?;
    webhook_tls("VersionTLS13", None).await?;
    Ok(())
}

/// The plugin's environment and identity come from the release the operator installed
/// (`status.deployedRelease.manifest`): started from them on n0, it publishes, and a pod with a
/// claim gets a slice, destroyed when the pod goes.
async fn the_plugin_as_configured_serves_a_claim(cluster: &mut Cluster) -> Result<()> {
    let cr = json(cluster, &["get", "dasoperator", "cluster"])?;
    let manifest = cr["status"]["deployedRelease"]["manifest"]
        .as_str()
        .context("status.deployedRelease.manifest")?;
    let mut rendered = Rendered::parse(manifest)?;
    // The stand-in pod that carries the plugin's node-bound token must not match the
    // DaemonSet's selector, or the DaemonSet controller would adopt and delete it.
    for o in &mut rendered.objects {
        if o["kind"] == "DaemonSet" {
            o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] =
                Value::from(STAND_IN_NAME);
        }
    }
    let plugin = DasBinary::Plugin.debug()?;
    install::start_plugin(cluster, &rendered, &plugin, "n0", "A100-SXM4-40GB:1").await?;
    das_e2e::das::wait_nodes_published(&cluster.client(), &["n0"]).await?;

    let c = cluster.client();
    create_template(&c, "one-1g", "1g.10gb", 1).await?;
    create_pod(&c, "user", "one-1g", Some("n0")).await?;
    wait_running(&c, "user").await?;
    let slices = live_slices(cluster, "n0")?;
    ensure!(
        slices.len() == 1 && slices[0].1 == "1g.10gb",
        "n0 holds {slices:?}, want one 1g.10gb"
    );
    delete_pod(&c, "user").await?;
    wait::until("the slice destroyed", TIMEOUT, || async {
        Ok(live_slices(cluster, "n0")?.is_empty().then_some(()))
    })
    .await?;
    cluster.stop_component("das-plugin-n0", true)
}

async fn log_level_change_rolls_every_component(cluster: &Cluster) -> Result<()> {
    let before = json(
        cluster,
        &["-n", NAMESPACE, "get", "daemonset", "das-kubelet-plugin"],
    )?["metadata"]["generation"]
        .as_i64()
        .unwrap_or(0);
    kubectl(
        cluster,
        &[
            "patch",
            "dasoperator",
            "cluster",
            "--type=merge",
            "-p",
            r#"{"spec":{"logLevel":"Debug"}}"#,
        ],
        None,
    )?;
    let debug = "info,das_driver=debug,das_controller=debug,das_webhook=debug,das_api=debug";
    for (kind, name) in [
        ("daemonset", "das-kubelet-plugin"),
        ("deployment", "das-controller"),
        ("deployment", "das-webhook"),
    ] {
        wait::until(
            &format!("{kind} {name} at log level Debug"),
            TIMEOUT,
            || async {
                let o = json(cluster, &["-n", NAMESPACE, "get", kind, name])?;
                Ok((env_of(&o, "DAS_LOG_LEVEL") == debug).then_some(()))
            },
        )
        .await?;
    }
    let after = json(
        cluster,
        &["-n", NAMESPACE, "get", "daemonset", "das-kubelet-plugin"],
    )?["metadata"]["generation"]
        .as_i64()
        .unwrap_or(0);
    ensure!(
        after > before,
        "the DaemonSet's template did not change (generation {before} -> {after})"
    );
    Ok(())
}

/// A spec the chart cannot install is Degraded with Helm's reason, and recovers once fixed:
/// `webhook.tlsMode: certManager` on a cluster without cert-manager (no Issuer kind).
async fn a_failed_upgrade_is_degraded_until_fixed(cluster: &Cluster) -> Result<()> {
    kubectl(
        cluster,
        &[
            "patch",
            "dasoperator",
            "cluster",
            "--type=merge",
            "-p",
            r#"{"spec":{"webhook":{"tlsMode":"certManager"}}}"#,
        ],
        None,
    )?;
    // Helm fails rendering (its dry run): the library calls that Irreconcilable; a failed
    // install or upgrade would be ReleaseFailed. Either way the message says what is missing.
    let c = wait_condition(cluster, "Degraded", "True", TIMEOUT).await?;
    ensure!(
        (c["reason"] == "Irreconcilable" || c["reason"] == "ReleaseFailed")
            && c["message"]
                .as_str()
                .unwrap_or_default()
                .contains("cert-manager.io"),
        "Degraded for the wrong reason: {c}"
    );
    kubectl(
        cluster,
        &[
            "patch",
            "dasoperator",
            "cluster",
            "--type=merge",
            "-p",
            r#"{"spec":{"webhook":{"tlsMode":"helm"}}}"#,
        ],
        None,
    )?;
    wait_condition(cluster, "Degraded", "False", TIMEOUT).await?;
    Ok(())
}

/// The Helm library watches what it installed: an admin's deletion is repaired.
async fn a_deleted_deployment_comes_back(cluster: &Cluster) -> Result<()> {
    let uid = |o: &Value| {
        o["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let old = uid(&json(
        cluster,
        &["-n", NAMESPACE, "get", "deployment", "das-controller"],
    )?);
    kubectl(
        cluster,
        &[
            "-n",
            NAMESPACE,
            "delete",
            "deployment",
            "das-controller",
            "--wait=true",
        ],
        None,
    )?;
    wait::until("das-controller recreated", TIMEOUT, || async {
        let o = json(
            cluster,
            &["-n", NAMESPACE, "get", "deployment", "das-controller"],
        )?;
        Ok((uid(&o) != old).then_some(()))
    })
    .await
}

async fn deleting_the_resource_uninstalls_das(cluster: &Cluster) -> Result<()> {
    das_e2e::operator::delete_and_wait_uninstalled(cluster, TIMEOUT).await?;
    for (kind, name) in [
        ("daemonset", "das-kubelet-plugin"),
        ("deployment", "das-controller"),
        ("deployment", "das-webhook"),
        ("secret", "sh.helm.release.v1.das.v1"),
    ] {
        let what = format!("{kind} {name} gone");
        das_e2e::operator::wait_gone(cluster, &what, &["-n", NAMESPACE, kind, name], TIMEOUT)
            .await?;
    }
    for (kind, name) in [
        ("deviceclass", "mig.das.com"),
        ("mutatingwebhookconfiguration", "das-webhook"),
    ] {
        let left = kubectl(
            cluster,
            &["get", kind, name, "--ignore-not-found", "-o", "name"],
            None,
        )?;
        ensure!(
            left.trim().is_empty(),
            "{kind} {name} survived the uninstall"
        );
    }
    json(
        cluster,
        &["get", "crd", "allocationclaims.inference.redhat.com"],
    )
    .context("the AllocationClaim CRD must survive the uninstall")?;
    Ok(())
}

/// Waits until `kubectl get` finds the object; returns it.
async fn wait_json(cluster: &Cluster, what: &str, args: &[&str]) -> Result<Value> {
    das_e2e::operator::wait_json(cluster, what, args, TIMEOUT).await
}
