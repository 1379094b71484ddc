//! Workloads in namespaces of their own, for the tests of shared slices across tenants
//! (docs/design.md §7, "Shares are a tenant's own"): a namespace, a ResourceClaim asking for a
//! share of a shared class and a pod using it (as admitted: das-webhook may have added its
//! namespace selector), the claim's allocation, pod events, and the `shareNamespace` attribute
//! a node publishes on a shareable device. [`crate::workload`] does the same in `default`.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::das;
use crate::wait;

/// Creates namespace `ns` (an existing one is fine).
pub async fn create_namespace(c: &Client, ns: &str) -> Result<()> {
    let n: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
    }))?;
    match Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &n)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("create namespace {ns}")),
    }
}

/// Creates ResourceClaim `<ns>/<name>` asking for one share of shared class `class` (request
/// `mig`), with the CEL `selector` of its own when given; returns the claim as admitted.
pub async fn create_share_claim(
    c: &Client,
    ns: &str,
    name: &str,
    class: &str,
    selector: Option<&str>,
) -> Result<ResourceClaim> {
    let mut exactly = json!({"deviceClassName": class,
        "capacity": {"requests": {"shares": "1"}}});
    if let Some(s) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": s}}]);
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}
    }))?;
    Api::<ResourceClaim>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &claim)
        .await
        .with_context(|| format!("create claim {ns}/{name}"))
}

/// The spec of a pod whose one container `app` (pause) uses ResourceClaim `claim` as `mig`.
pub fn pause_pod_spec(claim: &str) -> Value {
    json!({
        "resourceClaims": [{"name": "mig", "resourceClaimName": claim}],
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"claims": [{"name": "mig"}]}}],
        "terminationGracePeriodSeconds": 0
    })
}

/// Creates pod `<ns>/<name>` with `spec`.
pub async fn create_pod_in(c: &Client, ns: &str, name: &str, spec: Value) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": spec
    }))?;
    Api::<Pod>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("create pod {ns}/{name}"))?;
    Ok(())
}

/// [`create_share_claim`] and a pause pod of the same name using it.
pub async fn create_share_pod(
    c: &Client,
    ns: &str,
    name: &str,
    class: &str,
    selector: Option<&str>,
) -> Result<ResourceClaim> {
    let claim = create_share_claim(c, ns, name, class, selector).await?;
    create_pod_in(c, ns, name, pause_pod_spec(name)).await?;
    Ok(claim)
}

/// Waits until pod `<ns>/<name>` runs; returns it.
pub async fn wait_running_in(c: &Client, ns: &str, name: &str) -> Result<Pod> {
    wait_running_within(c, ns, name, wait::TIMEOUT).await
}

/// [`wait_running_in`] with the limit `within`.
pub async fn wait_running_within(
    c: &Client,
    ns: &str,
    name: &str,
    within: Duration,
) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    wait::until(&format!("pod {ns}/{name} to run"), within, || async {
        let p = api.get(name).await?;
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        Ok(running.then_some(p))
    })
    .await
}

/// The first allocation result of ResourceClaim `<ns>/<name>` once it is allocated.
pub async fn allocated_in(
    c: &Client,
    ns: &str,
    name: &str,
) -> Result<DeviceRequestAllocationResult> {
    let api: Api<ResourceClaim> = Api::namespaced(c.clone(), ns);
    wait::until(
        &format!("claim {ns}/{name} allocated"),
        wait::TIMEOUT,
        || async { Ok(first_result(&api.get(name).await?)) },
    )
    .await
}

/// The first allocation result of `rc`, if it is allocated.
pub fn first_result(rc: &ResourceClaim) -> Option<DeviceRequestAllocationResult> {
    rc.status
        .clone()?
        .allocation?
        .devices?
        .results?
        .into_iter()
        .next()
}

/// The CEL expressions of the selectors of `rc`'s first request (`exactly`).
pub fn selectors(rc: &ResourceClaim) -> Vec<String> {
    rc.spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .and_then(|r| r.first())
        .and_then(|r| r.exactly.as_ref())
        .and_then(|e| e.selectors.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| s.cel.map(|c| c.expression))
        .collect()
}

/// Waits for an Event with `reason` on pod `<ns>/<pod>` whose message contains `text`; returns
/// its message.
pub async fn pod_event_in(
    c: &Client,
    ns: &str,
    pod: &str,
    reason: &str,
    text: &str,
) -> Result<String> {
    let events: Api<Event> = Api::namespaced(c.clone(), ns);
    wait::until(
        &format!("a {reason} event on {ns}/{pod} saying {text:?}"),
        wait::TIMEOUT,
        || async {
            let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
            Ok(events
                .list(&lp)
                .await?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.message)
                .find(|m| m.contains(text)))
        },
    )
    .await
}

/// Deletes pods `<ns>/<names>` at once (grace period 0) and waits until they are gone.
pub async fn delete_pods_in(c: &Client, ns: &str, names: &[&str]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    for n in names {
        api.delete(n, &DeleteParams::default().grace_period(0))
            .await
            .with_context(|| format!("delete pod {ns}/{n}"))?;
    }
    for n in names {
        wait::until(
            &format!("pod {ns}/{n} to be gone"),
            wait::TIMEOUT,
            || async { Ok(api.get_opt(n).await?.is_none().then_some(())) },
        )
        .await?;
    }
    Ok(())
}

/// The `shareNamespace` attribute node `node` publishes on device `device` now (`None`: the
/// device carries none, or is not published).
pub async fn share_namespace(c: &Client, node: &str, device: &str) -> Result<Option<String>> {
    let devices = das::pool_devices(c, node).await?;
    Ok(devices
        .into_iter()
        .find(|d| d.name == device)
        .and_then(|d| {
            d.attributes?
                .remove(das_api::attributes::SHARE_NAMESPACE)?
                .string
        }))
}

/// Waits until node `node` publishes `want` as device `device`'s `shareNamespace` (`None`:
/// none); polls every 20 ms, so the time it returns at is within that of the publication.
pub async fn wait_share_namespace(
    c: &Client,
    node: &str,
    device: &str,
    want: Option<&str>,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + wait::TIMEOUT;
    loop {
        let now = share_namespace(c, node, device).await?;
        if now.as_deref() == want {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("{node} publishes shareNamespace {now:?} on {device}, not {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
