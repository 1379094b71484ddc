//! Least privilege, enforced, against the real API server: each escalation the operator's and
//! the node plugin's identities could try is refused (docs/openshift.md, "What the operator may
//! do"; docs/design.md §7, "Device status").
//!
//! - The operator's service account, bound exactly as the bundle binds it (deploy/olm/rbac,
//!   `das_e2e::operator::grant_bundle_rbac`), creates and binds the chart's roles without
//!   `escalate` or `bind`, manages its own namespace and DAS's admission policies; but it is
//!   refused a ClusterRoleBinding to cluster-admin, a ClusterRole or a rule it does not hold,
//!   another's ClusterRole, namespace, webhook configuration or admission policy, another
//!   namespace's Secrets and RoleBindings there.
//! - The node plugin of n0 (its token bound to a stand-in pod on n0, as a DaemonSet pod's
//!   projected token is) writes `status.devices` of its own claims; the chart's
//!   ValidatingAdmissionPolicy `das-resourceclaim-status-own-node` refuses it the status of a
//!   claim allocated from another pool, another driver's entry, an entry of another pool, removing
//!   another driver's entry, deallocating, changing `reservedFor`, and any write with a token that
//!   names no node. Shown with `DRAResourceClaimGranularStatusAuthorization` off, so the policy
//!   is the only guard, as on 1.34 and 1.35; on the default 1.37 server, where that
//!   authorization refuses most of this first, the policy still refuses what it cannot see (an
//!   entry or an allocation of another pool on a claim allocated to n0).

use anyhow::{Context, Result, bail, ensure};
use das_e2e::chart::{self, NAMESPACE, Rendered};
use das_e2e::install::{self, PLUGIN_SA};
use das_e2e::{Cluster, ClusterConfig, kubeconfig, wait};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, core::DynamicObject, discovery::ApiResource};
use serde_json::{Value, json};

const DRIVER: &str = das_e2e::das::DRIVER;

/// `r` is the API server's refusal `code` with `want` in its message.
fn refused<T>(what: &str, r: kube::Result<T>, code: u16, want: &str) -> Result<()> {
    match r {
        Err(kube::Error::Api(s)) if s.code == code && s.message.contains(want) => Ok(()),
        Err(e) => bail!("{what}: want {code} with {want:?}, got {e}"),
        Ok(_) => bail!("{what}: allowed"),
    }
}

// ---------------------------------------------------------------------------------------------
// The operator

#[tokio::test]
async fn the_operators_role_refuses_each_escalation() {
    let cluster = Cluster::start(ClusterConfig::with_nodes(&[]))
        .await
        .expect("cluster starts");
    cluster.check(operator_escalations(&cluster).await);
}

async fn operator_escalations(cluster: &Cluster) -> Result<()> {
    let op_kc = das_e2e::operator::grant_bundle_rbac(cluster).await?;
    let op = kubeconfig::client(&op_kc).await?;
    let admin = cluster.client();
    let pp = PostParams::default();
    let merge = |v: Value| Patch::Merge(v);

    // What the chart renders with its optional roles on: the operator creates and binds every
    // ClusterRole, Role and binding itself (it holds their rules; no escalate, no bind), and
    // the admission policies.
    let rendered =
        chart::render_with(&["openshift.scc.enabled=true", "metrics.authentication=true"])?;
    let access: Vec<&Value> = rendered
        .objects
        .iter()
        .filter(|o| {
            let kind = o["kind"].as_str().unwrap_or_default();
            kind.contains("Role")
                || kind.starts_with("ValidatingAdmissionPolicy")
                || kind == "ServiceAccount"
        })
        .collect();
    ensure!(
        access.len() > 12,
        "the chart rendered only {} access objects",
        access.len()
    );
    chart::apply(&op_kc, access.iter().copied())
        .context("the operator creates the chart's roles, bindings and policies")?;
    chart::apply(&op_kc, access.iter().copied()).context("...and applies them again (update)")?;

    // cluster-admin is not the operator's to give.
    let to_admin: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "das-operator-is-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "das-operator", "namespace": NAMESPACE}]
    }))?;
    refused(
        "a ClusterRoleBinding to cluster-admin",
        Api::<ClusterRoleBinding>::all(op.clone())
            .create(&pp, &to_admin)
            .await,
        403,
        "is attempting to grant RBAC permissions not currently held",
    )?;
    // Nor a ClusterRole with a rule it does not hold: Secrets everywhere.
    let secrets_rule = json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]});
    let reader: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "das-secret-reader"}, "rules": [secrets_rule]
    }))?;
    refused(
        "a ClusterRole reading every Secret",
        Api::<ClusterRole>::all(op.clone())
            .create(&pp, &reader)
            .await,
        403,
        "not currently held",
    )?;
    // ...nor such a rule added to a ClusterRole of DAS's.
    let mut plugin_role = Api::<ClusterRole>::all(op.clone())
        .get("das-kubelet-plugin")
        .await?;
    plugin_role
        .rules
        .get_or_insert_with(Vec::new)
        .push(serde_json::from_value(secrets_rule)?);
    refused(
        "a rule added to das-kubelet-plugin",
        Api::<ClusterRole>::all(op.clone())
            .replace("das-kubelet-plugin", &pp, &plugin_role)
            .await,
        403,
        "not currently held",
    )?;
    // Another's ClusterRole is not the operator's to change or delete.
    let label = || merge(json!({"metadata": {"labels": {"das-test": "x"}}}));
    refused(
        "patching ClusterRole view",
        Api::<ClusterRole>::all(op.clone())
            .patch("view", &PatchParams::default(), &label())
            .await,
        403,
        "cannot patch resource \"clusterroles\"",
    )?;
    refused(
        "deleting ClusterRole view",
        Api::<ClusterRole>::all(op.clone())
            .delete("view", &DeleteParams::default())
            .await,
        403,
        "cannot delete resource \"clusterroles\"",
    )?;

    // Its own namespace: labelled (Pod Security); any other: no.
    let namespaces = Api::<Namespace>::all(op.clone());
    namespaces
        .patch(NAMESPACE, &PatchParams::default(), &label())
        .await
        .context("the operator labels its own namespace")?;
    refused(
        "patching namespace default",
        namespaces
            .patch("default", &PatchParams::default(), &label())
            .await,
        403,
        "cannot patch resource \"namespaces\"",
    )?;
    refused(
        "creating a namespace",
        namespaces
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": "das-elsewhere"}}))?,
            )
            .await,
        403,
        "cannot create resource \"namespaces\"",
    )?;
    // Its Role is its namespace's only: no Secrets or RoleBindings elsewhere.
    refused(
        "listing Secrets of kube-system",
        Api::<Secret>::namespaced(op.clone(), "kube-system")
            .list(&Default::default())
            .await,
        403,
        "cannot list resource \"secrets\"",
    )?;
    let admin_here: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "das-operator-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "das-operator", "namespace": NAMESPACE}]
    }))?;
    refused(
        "a RoleBinding to admin in default",
        Api::<RoleBinding>::namespaced(op.clone(), "default")
            .create(&pp, &admin_here)
            .await,
        403,
        "cannot create resource \"rolebindings\"",
    )?;

    // Admission: DAS's own policy is the operator's to change; another's policy or webhook
    // configuration is not.
    let policies = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
        ),
        "validatingadmissionpolicies",
    );
    let webhooks = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
        ),
        "mutatingwebhookconfigurations",
    );
    let as_op = |r: &ApiResource| Api::<DynamicObject>::all_with(op.clone(), r);
    as_op(&policies)
        .patch(
            "das-resourceslices-own-node",
            &PatchParams::default(),
            &label(),
        )
        .await
        .context("the operator changes DAS's ResourceSlice policy")?;
    chart::apply(
        &cluster.kubeconfig,
        [
            &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": "someone-elses-policy"},
                "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"]}]},
                    "validations": [{"expression": "true"}]}}),
            &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "someone-elses-webhook"}, "webhooks": []}),
        ],
    )?;
    for (r, name, plural) in [
        (
            &policies,
            "someone-elses-policy",
            "validatingadmissionpolicies",
        ),
        (
            &webhooks,
            "someone-elses-webhook",
            "mutatingwebhookconfigurations",
        ),
    ] {
        refused(
            &format!("patching {name}"),
            as_op(r)
                .patch(name, &PatchParams::default(), &label())
                .await,
            403,
            &format!("cannot patch resource \"{plural}\""),
        )?;
        refused(
            &format!("deleting {name}"),
            as_op(r).delete(name, &DeleteParams::default()).await,
            403,
            &format!("cannot delete resource \"{plural}\""),
        )?;
        Api::<DynamicObject>::all_with(admin.clone(), r)
            .get(name)
            .await
            .with_context(|| format!("{name} is still there"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The node plugin and claim status

/// A claim in `default` allocated with `results` (driver, pool, device) to `node`, one request
/// per result; its status holds `devices` (written by the admin, as another driver would).
async fn allocated_claim(
    admin: &Client,
    name: &str,
    node: &str,
    results: &[(&str, &str, &str)],
) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "default");
    let requests: Vec<Value> = (0..results.len())
        .map(|i| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "mig.das.com"}}))
        .collect();
    let rc = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}}
    }))?;
    claims.create(&PostParams::default(), &rc).await?;
    let results: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, (driver, pool, device))| {
            json!({"request": format!("r{i}"), "driver": driver, "pool": pool, "device": device})
        })
        .collect();
    let alloc = json!({"status": {"allocation": {
        "devices": {"results": results},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    }}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&alloc))
        .await
        .with_context(|| format!("allocate {name}"))?;
    Ok(())
}

/// A merge patch of claim `name`'s status, as `api`'s identity.
async fn merge_status(
    api: &Api<ResourceClaim>,
    name: &str,
    body: Value,
) -> kube::Result<ResourceClaim> {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await
}

/// A `status.devices` entry with a Ready condition and, like a carve, SliceReady.
fn entry(driver: &str, pool: &str, device: &str) -> Value {
    let cond = |t: &str| {
        json!({"type": t, "status": "True", "reason": "SliceCreated", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    json!({"driver": driver, "pool": pool, "device": device,
        "conditions": [cond("Ready"), cond("mig.das.com/SliceReady")],
        "data": {"migUUID": "MIG-x", "gpuUUID": "GPU-x", "profile": "1g.10gb",
            "placement": {"start": 0, "size": 1}}})
}

/// The plugin's server-side apply of `status.devices` (field manager das-kubelet-plugin).
async fn apply_devices(
    claims: &Api<ResourceClaim>,
    name: &str,
    devices: Vec<Value>,
) -> kube::Result<ResourceClaim> {
    let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name}, "status": {"devices": devices}});
    claims
        .patch_status(
            name,
            &PatchParams::apply("das-kubelet-plugin").force(),
            &Patch::Apply(&body),
        )
        .await
}

/// The chart's access objects on the cluster, and n0's plugin identity (node-bound token).
async fn plugin_on_n0(cluster: &Cluster) -> Result<(Rendered, Api<ResourceClaim>)> {
    let rendered = install::render()?;
    install::apply_access(cluster, &rendered).await?;
    let pod = install::stand_in_pod(&cluster.client(), &rendered, "n0").await?;
    let n0 =
        kubeconfig::client(&install::identity(cluster, PLUGIN_SA, Some(&pod), "n0").await?).await?;
    Ok((rendered, Api::namespaced(n0, "default")))
}

/// Waits until the policy answers (the API server loads it through an informer): a write to
/// `name`, a claim of another pool, is refused with the policy's message.
async fn wait_policy_active(n0: &Api<ResourceClaim>, name: &str) -> Result<String> {
    let last = std::sync::Mutex::new(String::new());
    wait::until(
        "the claim status policy to be active",
        wait::TIMEOUT,
        || async {
            let dry = PatchParams {
                dry_run: true,
                ..PatchParams::apply("das-kubelet-plugin").force()
            };
            let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "status": {"devices": [entry(DRIVER, "n1", "d0")]}});
            match n0.patch_status(name, &dry, &Patch::Apply(&body)).await {
                Err(kube::Error::Api(s))
                    if s.code == 422 && s.message.contains("das-resourceclaim-status-own-node") =>
                {
                    Ok(Some(s.message))
                }
                other => {
                    *last.lock().expect("last") = format!("{other:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .with_context(|| format!("the last answer: {}", last.lock().expect("last")))
}

#[tokio::test]
async fn the_claim_status_policy_alone_keeps_a_node_plugin_to_its_own_claims() {
    let mut cfg = ClusterConfig::with_nodes(&["n0"]);
    // As on 1.34 and 1.35: the API server does not authorize status.devices per driver and node.
    cfg.feature_gates = vec!["DRAResourceClaimGranularStatusAuthorization=false".into()];
    let cluster = Cluster::start(cfg).await.expect("cluster starts");
    cluster.check(policy_alone(&cluster).await);
}

async fn policy_alone(cluster: &Cluster) -> Result<()> {
    let admin = cluster.client();
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "default");
    let (_rendered, n0) = plugin_on_n0(cluster).await?;
    allocated_claim(
        &admin,
        "on-n0",
        "n0",
        &[
            (DRIVER, "n0", "d0"),
            ("gpu.example.com", "n0", "d1"),
            (DRIVER, "n1", "d2"),
        ],
    )
    .await?;
    allocated_claim(&admin, "on-n1", "n1", &[(DRIVER, "n1", "d0")]).await?;
    let denied = wait_policy_active(&n0, "on-n1").await?;
    ensure!(
        denied.contains("may only write the status of ResourceClaims allocated from its own pool (n0); default/on-n1 is allocated from mig.das.com pool n1"),
        "{denied}"
    );

    // Its own claim's entry, with the binding condition of a carve: written, rewritten,
    // removed, written again.
    apply_devices(&n0, "on-n0", vec![entry(DRIVER, "n0", "d0")])
        .await
        .context("n0's plugin writes its entry of a claim allocated from its pool")?;
    let mut again = entry(DRIVER, "n0", "d0");
    again["data"]["migUUID"] = json!("MIG-y");
    apply_devices(&n0, "on-n0", vec![again])
        .await
        .context("...changes it")?;
    apply_devices(&n0, "on-n0", vec![])
        .await
        .context("...removes it")?;
    // A failed carve's entry: the binding failure condition alone, no data.
    let failed = json!({"driver": DRIVER, "pool": "n0", "device": "d0", "conditions": [{
        "type": "mig.das.com/SliceFailed", "status": "True", "reason": "CarveFailed",
        "message": "no free placement", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    apply_devices(&n0, "on-n0", vec![failed])
        .await
        .context("...writes a failed carve")?;
    apply_devices(&n0, "on-n0", vec![entry(DRIVER, "n0", "d0")])
        .await
        .context("...writes it again")?;

    // Another pool's claim (the other node's).
    refused(
        "n0 writes the status of a claim of n1",
        apply_devices(&n0, "on-n1", vec![entry(DRIVER, "n1", "d0")]).await,
        422,
        "allocated from its own pool (n0); default/on-n1 is allocated from mig.das.com pool n1",
    )?;
    // Another driver's entry, and an entry of another pool, in its own claim.
    refused(
        "n0 writes another driver's entry",
        apply_devices(
            &n0,
            "on-n0",
            vec![
                entry(DRIVER, "n0", "d0"),
                entry("gpu.example.com", "n0", "d1"),
            ],
        )
        .await,
        422,
        "may only add, change or remove status.devices entries of driver mig.das.com in pool n0, not gpu.example.com pool n0 device d1",
    )?;
    refused(
        "n0 writes an entry of pool n1",
        apply_devices(
            &n0,
            "on-n0",
            vec![entry(DRIVER, "n0", "d0"), entry(DRIVER, "n1", "d2")],
        )
        .await,
        422,
        "not mig.das.com pool n1 device d2",
    )?;
    // Removing another driver's entry (a merge patch replaces the whole list).
    let other = PatchParams::apply("gpu-example-driver").force();
    let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "on-n0"}, "status": {"devices": [entry("gpu.example.com", "n0", "d1")]}});
    claims
        .patch_status("on-n0", &other, &Patch::Apply(&body))
        .await?;
    refused(
        "n0 removes another driver's entry",
        merge_status(
            &n0,
            "on-n0",
            json!({"status": {"devices": [entry(DRIVER, "n0", "d0")]}}),
        )
        .await,
        422,
        "not gpu.example.com pool n0 device d1",
    )?;
    // Anything but status.devices: deallocating (the scheduler would place the pod anew),
    // reserving the claim for a pod.
    refused(
        "n0 deallocates its claim",
        merge_status(&n0, "on-n0", json!({"status": {"allocation": null}})).await,
        422,
        "not status.allocation",
    )?;
    refused(
        "n0 reserves its claim for a pod",
        merge_status(
            &n0,
            "on-n0",
            json!({"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u-1"}]}}),
        )
        .await,
        422,
        "not status.reservedFor",
    )?;
    let rc = claims.get("on-n0").await?;
    let status = rc.status.context("status")?;
    ensure!(
        status.allocation.is_some() && status.reserved_for.is_none(),
        "the claim changed: {status:?}"
    );
    ensure!(
        status.devices.map(|d| d.len()) == Some(2),
        "the claim's entries changed"
    );

    // A plugin token that names no node writes nothing.
    let unbound =
        kubeconfig::client(&install::identity(cluster, PLUGIN_SA, None, "unbound").await?).await?;
    refused(
        "a plugin token without a node",
        apply_devices(
            &Api::namespaced(unbound, "default"),
            "on-n0",
            vec![entry(DRIVER, "n0", "d0")],
        )
        .await,
        422,
        "token names no node",
    )?;
    Ok(())
}

#[tokio::test]
async fn the_claim_status_policy_adds_the_pool_to_the_api_servers_own_check() {
    let cluster = Cluster::start(ClusterConfig::with_nodes(&["n0"]))
        .await
        .expect("cluster starts");
    cluster.check(policy_with_granular_authorization(&cluster).await);
}

/// On 1.36+ the API server authorizes status.devices by the claim's node selector and the
/// entry's driver; a claim whose node selector names n0 passes it whatever its pools. The policy
/// refuses what is not n0's pool.
async fn policy_with_granular_authorization(cluster: &Cluster) -> Result<()> {
    let admin = cluster.client();
    let (_rendered, n0) = plugin_on_n0(cluster).await?;
    allocated_claim(
        &admin,
        "on-n0",
        "n0",
        &[(DRIVER, "n0", "d0"), (DRIVER, "n1", "d2")],
    )
    .await?;
    allocated_claim(&admin, "n0-selector-pool-n1", "n0", &[(DRIVER, "n1", "d0")]).await?;
    wait_policy_active(&n0, "n0-selector-pool-n1").await?;
    apply_devices(&n0, "on-n0", vec![entry(DRIVER, "n0", "d0")])
        .await
        .context("n0's plugin writes its entry")?;
    refused(
        "n0 writes the status of a claim of pool n1 selected onto n0",
        apply_devices(&n0, "n0-selector-pool-n1", vec![entry(DRIVER, "n1", "d0")]).await,
        422,
        "default/n0-selector-pool-n1 is allocated from mig.das.com pool n1",
    )?;
    refused(
        "n0 writes an entry of pool n1",
        apply_devices(
            &n0,
            "on-n0",
            vec![entry(DRIVER, "n0", "d0"), entry(DRIVER, "n1", "d2")],
        )
        .await,
        422,
        "not mig.das.com pool n1 device d2",
    )?;
    // What the API server authorizes itself comes first: deallocating needs
    // resourceclaims/binding.
    refused(
        "n0 deallocates its claim",
        merge_status(&n0, "on-n0", json!({"status": {"allocation": null}})).await,
        422,
        "requires resource=\"resourceclaims/binding\"",
    )?;
    Ok(())
}
