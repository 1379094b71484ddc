//! Pods on a real-runtime node ([`crate::runtime`]) running the probe image, and what their
//! containers report (`kubectl logs` of the probe) checked against the claims' CDI specs: what
//! the runtime tests (`runtime_node`, `real_install`) share.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{LogParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::Cluster;
use crate::das::{self, ContainerView, PluginDirs};
use crate::runtime::{self, PROBE_IMAGE};
use crate::wait::{self, TIMEOUT};
use crate::workload::NS;

/// Pod `name` on `node` with one probe container `app` holding one 1g.10gb slice (claim template
/// `one-1g`), ready and checked; returns the pod and the slice's MIG UUID.
pub async fn one_slice_pod(cluster: &Cluster, node: &str, name: &str) -> Result<(Pod, String)> {
    let c = cluster.client();
    let pod = create_one_slice_pod(&c, node, name).await?;
    let uuid = check_container(cluster, node, &pod, "app", 1)
        .await?
        .mig_uuids()
        .remove(0);
    Ok((pod, uuid))
}

/// Creates pod `name` on `node` with one probe container `app` holding one 1g.10gb slice (claim
/// template `one-1g`) and waits until it is ready; returns the pod.
pub async fn create_one_slice_pod(c: &Client, node: &str, name: &str) -> Result<Pod> {
    create(
        c,
        node,
        name,
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-1g"}],
            "containers": [probe("app", &["gpu"])],
        }),
    )
    .await?;
    wait_ready(c, name).await
}

/// A probe container named `name` using pod claims `claims`.
pub fn probe(name: &str, claims: &[&str]) -> Value {
    let claims: Vec<Value> = claims.iter().map(|c| json!({"name": c})).collect();
    json!({
        "name": name, "image": PROBE_IMAGE, "imagePullPolicy": "Never",
        "resources": {"claims": claims}
    })
}

pub async fn create(c: &Client, node: &str, name: &str, spec: Value) -> Result<()> {
    create_with(c, node, name, spec, &PostParams::default()).await
}

/// [`create`] with `params` (a dry run goes through admission, webhooks included, and stores
/// nothing).
pub async fn create_with(
    c: &Client,
    node: &str,
    name: &str,
    mut spec: Value,
    params: &PostParams,
) -> Result<()> {
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = json!([{"key": runtime::TAINT_KEY, "operator": "Exists"}]);
    spec["terminationGracePeriodSeconds"] = json!(0);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec
    }))?;
    Api::<Pod>::namespaced(c.clone(), NS)
        .create(params, &pod)
        .await
        .with_context(|| format!("create pod {name}"))?;
    Ok(())
}

/// Waits until every container of pod `name` is ready; returns the pod.
pub async fn wait_ready(c: &Client, name: &str) -> Result<Pod> {
    wait_pod(c, name, "ready", |s| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await
}

/// Waits until pod `name`'s status passes `done`; returns the pod.
pub async fn wait_pod(
    c: &Client,
    name: &str,
    what: &str,
    done: impl Fn(&PodStatus) -> bool,
) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(c.clone(), NS);
    wait::until(&format!("pod {name} {what}"), TIMEOUT, || async {
        let p = api.get(name).await?;
        Ok(p.status.as_ref().is_some_and(&done).then_some(p))
    })
    .await
}

/// What container `container` of `pod` reported, checked against the CDI specs of the claims
/// it uses: exactly `slices` MIG UUIDs, exactly the specs' device nodes (and no other GPU's),
/// `NVIDIA_VISIBLE_DEVICES=void`, and exactly the specs' driver files, each with the content
/// of the host file the spec names.
pub async fn check_container(
    cluster: &Cluster,
    node: &str,
    pod: &Pod,
    container: &str,
    slices: usize,
) -> Result<ContainerView> {
    let c = cluster.client();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let log = Api::<Pod>::namespaced(c.clone(), NS)
        .logs(
            &name,
            &LogParams {
                container: Some(container.into()),
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("kubectl logs {name} -c {container}"))?;
    let seen = runtime::probe_view(&log)?;
    let claims = container_claims(&c, pod, container).await?;
    let expected = expected_view(cluster, node, &claims)?;
    ensure!(
        seen.mig_uuids().len() == slices,
        "{name}/{container}: {slices} slice(s) expected, saw {:?}",
        seen.mig_uuids()
    );
    ensure!(
        seen.mig_uuids() == expected.mig_uuids(),
        "{name}/{container}: saw MIG UUIDs {:?}, its claims' CDI specs give {:?}",
        seen.mig_uuids(),
        expected.mig_uuids()
    );
    let nvidia = |v: &ContainerView| -> BTreeSet<String> {
        v.device_nodes
            .iter()
            .filter(|p| p.starts_with("/dev/nvidia"))
            .cloned()
            .collect()
    };
    ensure!(
        nvidia(&seen) == nvidia(&expected),
        "{name}/{container}: saw device nodes {:?}, its claims' CDI specs give {:?}",
        nvidia(&seen),
        nvidia(&expected)
    );
    ensure!(
        seen.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("void"),
        "{name}/{container}: NVIDIA_VISIBLE_DEVICES is {:?}",
        seen.env.get("NVIDIA_VISIBLE_DEVICES")
    );
    check_driver_files(&seen, &expected).with_context(|| format!("{name}/{container}"))?;
    Ok(seen)
}

/// The container got exactly the driver files its specs mount (below `/usr/local/nvidia`; an
/// MPS device's pipe and shm directories are mounted elsewhere), each with the first line of the
/// host file the spec names.
fn check_driver_files(seen: &ContainerView, expected: &ContainerView) -> Result<()> {
    let driver: Vec<(&String, &String)> = expected
        .mounts
        .iter()
        .filter(|(at, _)| at.starts_with("/usr/local/nvidia/"))
        .collect();
    let want: BTreeSet<&String> = driver.iter().map(|(at, _)| *at).collect();
    let got: BTreeSet<&String> = seen.files.keys().collect();
    ensure!(
        want == got,
        "driver files: the specs mount {want:?}, the container has {got:?}"
    );
    for (at, host) in driver {
        let content = std::fs::read_to_string(host).with_context(|| format!("read {host}"))?;
        let first = content.lines().next().unwrap_or_default();
        ensure!(
            seen.files[at] == first,
            "{at}: the container reads {:?}, the host file {host} says {first:?}",
            seen.files[at]
        );
    }
    Ok(())
}

/// The view the CDI specs of `claim_uids` give: their devices' variables and device nodes.
pub fn expected_view(
    cluster: &Cluster,
    node: &str,
    claim_uids: &[String],
) -> Result<ContainerView> {
    let specs = das::load_specs(&PluginDirs::of(cluster.node(node)).cdi)?;
    das::resolve_cdi_devices(&specs, &das::claim_device_ids(&specs, claim_uids))
}

/// UIDs of the ResourceClaims container `container` of `pod` uses.
pub async fn container_claims(c: &Client, pod: &Pod, container: &str) -> Result<Vec<String>> {
    let spec = pod.spec.as_ref().context("pod spec")?;
    let ctr = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|x| x.name == container)
        .with_context(|| format!("no container {container}"))?;
    let names: Vec<String> = ctr
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.clone())
        .unwrap_or_default();
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), NS);
    let mut uids = Vec::new();
    for pod_claim in spec.resource_claims.iter().flatten() {
        if !names.contains(&pod_claim.name) {
            continue;
        }
        let claim_name = match &pod_claim.resource_claim_name {
            Some(n) => n.clone(),
            None => statuses
                .iter()
                .find(|s| s.name == pod_claim.name)
                .and_then(|s| s.resource_claim_name.clone())
                .with_context(|| format!("no generated claim for {}", pod_claim.name))?,
        };
        uids.push(
            claims
                .get(&claim_name)
                .await?
                .metadata
                .uid
                .unwrap_or_default(),
        );
    }
    if uids.is_empty() {
        bail!("container {container} uses no claim");
    }
    Ok(uids)
}

/// UIDs of every claim of `pod`.
pub async fn pod_claims(c: &Client, pod: &Pod) -> Result<Vec<String>> {
    let first = pod.spec.as_ref().context("pod spec")?.containers[0]
        .name
        .clone();
    container_claims(c, pod, &first).await
}
