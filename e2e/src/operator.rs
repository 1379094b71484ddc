//! The DAS operator's cluster test (tests/operator.rs): `kubectl` on the DASOperator and what
//! it installs, and a stand-in for OpenShift's cluster TLS security profile.
//!
//! The local cluster is not OpenShift. The operator follows the cluster's TLS security profile
//! wherever the API serves `apiservers.config.openshift.io` (its `--tls-profile=auto`), so the
//! test serves it: [`install_apiserver_crd`] installs a minimal CRD of OpenShift's `APIServer`
//! (only the field the operator reads, `spec.tlsSecurityProfile`, and that one loosely), and
//! [`set_tls_profile`] writes the object named `cluster` as an admin would.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::chart::NAMESPACE;
use crate::paths::{local_bin, workspace_root};
use crate::{Cluster, chart, install, wait};

/// The minimal CRD of OpenShift's `config.openshift.io/v1` `APIServer`.
const APISERVER_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "apiservers.config.openshift.io"},
  "spec": {
    "group": "config.openshift.io",
    "scope": "Cluster",
    "names": {"kind": "APIServer", "listKind": "APIServerList", "plural": "apiservers", "singular": "apiserver"},
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {
        "type": "object",
        "properties": {
          "spec": {"type": "object", "properties": {
            "tlsSecurityProfile": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
          }},
          "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
      }}
    }]
  }
}"#;

/// The DASOperator CRD of the bundle.
pub const CRD: &str = "deploy/olm/crd/operator.das.com_dasoperators.yaml";

/// Installs the DASOperator CRD ([`CRD`], as OLM installs the bundle's) and waits until it is
/// served.
///
/// # Errors
/// kubectl failing, or the CRD not established within a minute.
pub fn install_crd(cluster: &Cluster) -> Result<()> {
    chart::apply_path(&cluster.kubeconfig, &workspace_root().join(CRD))?;
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/dasoperators.operator.das.com",
        ],
        None,
    )?;
    Ok(())
}

/// Installs [`APISERVER_CRD`] and waits until it is served.
///
/// # Errors
/// kubectl failing, or the CRD not established within a minute.
pub fn install_apiserver_crd(cluster: &Cluster) -> Result<()> {
    kubectl(cluster, &["apply", "-f", "-"], Some(APISERVER_CRD))?;
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/apiservers.config.openshift.io",
        ],
        None,
    )?;
    Ok(())
}

/// Writes the APIServer `cluster` with `profile` as its `spec.tlsSecurityProfile` (JSON, e.g.
/// `{"type": "Modern", "modern": {}}`).
///
/// # Errors
/// kubectl failing.
pub fn set_tls_profile(cluster: &Cluster, profile: &str) -> Result<String> {
    let apiserver = format!(
        r#"{{"apiVersion": "config.openshift.io/v1", "kind": "APIServer", "metadata": {{"name": "cluster"}}, "spec": {{"tlsSecurityProfile": {profile}}}}}"#
    );
    kubectl(cluster, &["apply", "-f", "-"], Some(&apiserver))
}

/// Starts `.local/bin/das-operator` on the cluster as OLM would run it: under its own service
/// account with exactly the bundle's RBAC (deploy/olm/rbac, the CSV's clusterPermissions and
/// permissions), the AllocationClaim CRD installed beforehand (OLM installs the bundle's CRDs),
/// `--install-crds=false` and `--leader-elect`, installing into das-system.
///
/// # Errors
/// `.local/bin/das-operator` missing (`make operator`), kubectl failing, or the process not
/// starting.
pub async fn start(cluster: &mut Cluster) -> Result<()> {
    start_with(cluster, &[]).await
}

/// [`start`] with `extra` flags of the operator, e.g. `--chart=DIR` ([`chart_with_defaults`]).
///
/// # Errors
/// As [`start`].
pub async fn start_with(cluster: &mut Cluster, extra: &[String]) -> Result<()> {
    let bin: PathBuf = local_bin().join("das-operator");
    ensure!(
        bin.exists(),
        "{} is missing: run `make operator`",
        bin.display()
    );
    let kubeconfig = grant_bundle_rbac(cluster).await?;
    let env = [("KUBECONFIG".to_string(), kubeconfig.display().to_string())];
    let mut args = vec![
        format!("--namespace={NAMESPACE}"),
        "--install-crds=false".into(),
        "--metrics-bind-address=0".into(),
        "--health-probe-bind-address=0".into(),
        "--openshift=false".into(),
        // As the CSV's Deployment runs it: the Lease is held under the bundle's Role.
        "--leader-elect".into(),
    ];
    args.extend_from_slice(extra);
    cluster.spawn_program_with_env("das-operator", &bin, args, &env)
}

/// The operator's identity as OLM sets it up from the bundle: the install namespace
/// ([`NAMESPACE`], the operator's own), the AllocationClaim CRD, the service account
/// `das-operator` bound to the ClusterRole of `deploy/olm/rbac/cluster-role.yaml` and, in the
/// namespace, to the Role of `role.yaml` (what OLM does with install mode OwnNamespace).
/// Returns the path of a kubeconfig with that service account's token.
///
/// # Errors
/// kubectl failing, or the TokenRequest refused.
pub async fn grant_bundle_rbac(cluster: &Cluster) -> Result<PathBuf> {
    let root = workspace_root();
    kubectl(cluster, &["create", "namespace", NAMESPACE], None)?;
    chart::apply_path(
        &cluster.kubeconfig,
        &root.join("deploy/helm/das/files/allocationclaims.yaml"),
    )?;
    chart::apply_path(
        &cluster.kubeconfig,
        &root.join("deploy/olm/rbac/cluster-role.yaml"),
    )?;
    let role = root.join("deploy/olm/rbac/role.yaml");
    let role = role.to_str().context("path")?;
    kubectl(cluster, &["-n", NAMESPACE, "apply", "-f", role], None)?;
    let sa = format!("{NAMESPACE}:das-operator");
    for args in [
        vec!["-n", NAMESPACE, "create", "serviceaccount", "das-operator"],
        vec![
            "create",
            "clusterrolebinding",
            "das-operator",
            "--clusterrole=das-operator",
            "--serviceaccount",
            &sa,
        ],
        vec![
            "-n",
            NAMESPACE,
            "create",
            "rolebinding",
            "das-operator",
            "--role=das-operator",
            "--serviceaccount",
            &sa,
        ],
    ] {
        kubectl(cluster, &args, None)?;
    }
    install::identity(cluster, "das-operator", None, "operator").await
}

/// A copy of the chart in the cluster's directory whose `values.yaml` has `defaults` merged in
/// (maps key by key, anything else replaced), for the operator's `--chart`: what a DASOperator
/// cannot set (the kubelet's root dir, the controller's tolerations...) becomes the chart's
/// default, as a distribution's build of the chart would carry it. Returns its directory.
///
/// # Errors
/// The chart unreadable or the copy unwritable.
pub fn chart_with_defaults(cluster: &Cluster, defaults: &Value) -> Result<PathBuf> {
    let dir = cluster.dir.join("operator-chart");
    copy_dir(&chart::chart_dir(), &dir)?;
    let file = dir.join("values.yaml");
    let mut values: Value = serde_yaml::from_str(&std::fs::read_to_string(&file)?)?;
    merge(&mut values, defaults);
    std::fs::write(&file, serde_yaml::to_string(&values)?)?;
    Ok(dir)
}

fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Waits until the DASOperator `cluster` has condition `t` with status `status`; returns it.
///
/// # Errors
/// Not so within `timeout`.
pub async fn wait_condition(
    cluster: &Cluster,
    t: &str,
    status: &str,
    timeout: std::time::Duration,
) -> Result<Value> {
    wait::until(&format!("{t}={status}"), timeout, || async {
        let cr = json(cluster, &["get", "dasoperator", "cluster"])?;
        Ok(condition(&cr, t).filter(|c| c["status"] == status).cloned())
    })
    .await
}

/// Creates or updates the DASOperator `cluster` with `spec` (JSON).
///
/// # Errors
/// kubectl failing (the CRD refusing the spec).
pub fn apply_cr(cluster: &Cluster, spec: &str) -> Result<String> {
    let cr = format!(
        r#"{{"apiVersion": "operator.das.com/v1alpha1", "kind": "DASOperator", "metadata": {{"name": "cluster"}}, "spec": {spec}}}"#
    );
    kubectl(cluster, &["apply", "-f", "-"], Some(&cr))
}

/// `kubectl` against the cluster.
///
/// # Errors
/// kubectl failing, with its stderr.
pub fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> Result<String> {
    chart::kubectl(&cluster.kubeconfig, args, stdin)
}

/// Waits until `kubectl get <args> --ignore-not-found -o name` finds nothing (`what` names the
/// wait in its error).
///
/// # Errors
/// kubectl failing, or the object still there after `timeout`.
pub async fn wait_gone(
    cluster: &Cluster,
    what: &str,
    args: &[&str],
    timeout: std::time::Duration,
) -> Result<()> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["--ignore-not-found", "-o", "name"]);
    wait::until(what, timeout, || async {
        Ok(kubectl(cluster, &all, None)?
            .trim()
            .is_empty()
            .then_some(()))
    })
    .await
}

/// Deletes the `DASOperator` and waits until it is gone, that is until its finalizer has
/// uninstalled the release.
///
/// # Errors
/// kubectl failing, or the resource still there after `timeout`.
pub async fn delete_and_wait_uninstalled(
    cluster: &Cluster,
    timeout: std::time::Duration,
) -> Result<()> {
    kubectl(
        cluster,
        &["delete", "dasoperator", "cluster", "--wait=false"],
        None,
    )?;
    wait_gone(
        cluster,
        "the DASOperator uninstalled and gone",
        &["dasoperator"],
        timeout,
    )
    .await
}

/// `kubectl ... -o json`, parsed.
///
/// # Errors
/// kubectl failing, or output that is not JSON.
pub fn json(cluster: &Cluster, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    Ok(serde_json::from_str(&kubectl(cluster, &all, None)?)?)
}

/// Waits until `kubectl get` finds the object; returns it.
///
/// # Errors
/// Not found within `timeout`.
pub async fn wait_json(
    cluster: &Cluster,
    what: &str,
    args: &[&str],
    timeout: std::time::Duration,
) -> Result<Value> {
    wait::until(what, timeout, || async { Ok(Some(json(cluster, args)?)) }).await
}

/// The first container's environment variable `name` of a workload ("" when absent).
#[must_use]
pub fn env_of(workload: &Value, name: &str) -> String {
    workload["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The condition of type `t` in a resource's `status.conditions`.
#[must_use]
pub fn condition<'a>(cr: &'a Value, t: &str) -> Option<&'a Value> {
    cr["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}
