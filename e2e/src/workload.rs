//! Workloads on the test cluster, shared by the end-to-end tests of every component: pods that
//! ask for MIG slices through ResourceClaimTemplates (create, wait until running, delete), and
//! small probes (free ports, HTTP GET).

use std::net::TcpListener;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::wait;

/// The namespace the tests use.
pub const NS: &str = "default";

/// A free TCP port on 127.0.0.1 (free when asked; bind it soon).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET http://127.0.0.1:<port><path>` over HTTP/1.0: (status code, body).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_with_token(port, path, None).await
}

/// [`http_get`] with `token`, if any, as a bearer token (`Authorization: Bearer …`).
pub async fn http_get_with_token(
    port: u16,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("HTTP status line")?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Creates ResourceClaimTemplate `name` in [`NS`] asking for `count` slices of `profile`
/// (DeviceClass `<profile>.mig.das.com`), as request `mig`.
pub async fn create_template(client: &Client, name: &str, profile: &str, count: u32) -> Result<()> {
    create_class_template(client, name, &das_api::profile_device_class(profile), count).await
}

/// Creates ResourceClaimTemplate `name` in [`NS`] asking for `count` devices of DeviceClass
/// `class` (e.g. `gpu.das.com` for whole GPUs, `mig.das.com` for a slice of any profile), as
/// request `mig`.
pub async fn create_class_template(
    client: &Client,
    name: &str,
    class: &str,
    count: u32,
) -> Result<()> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": class,
            "allocationMode": "ExactCount", "count": count}}]}}}
    }))?;
    api.create(&PostParams::default(), &t)
        .await
        .with_context(|| format!("create template {name}"))?;
    Ok(())
}

/// Waits until pod `name` in [`NS`] runs; returns it.
pub async fn wait_running(client: &Client, name: &str) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait::until(
        &format!("pod {name} to run"),
        Duration::from_secs(90),
        || async {
            let p = api.get(name).await?;
            Ok(
                (p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .then_some(p),
            )
        },
    )
    .await
}

/// The ResourceClaim generated for pod `pod` in [`NS`] (its first pod-level claim).
pub async fn claim_of(client: &Client, pod: &str) -> Result<ResourceClaim> {
    let p = Api::<Pod>::namespaced(client.clone(), NS).get(pod).await?;
    let name = p
        .status
        .and_then(|s| s.resource_claim_statuses)
        .into_iter()
        .flatten()
        .find_map(|s| s.resource_claim_name)
        .context("pod has no generated claim")?;
    Ok(Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(&name)
        .await?)
}

/// Creates ResourceClaimTemplate `name` in [`NS`] asking for one `1g.10gb` slice (request
/// `mig`), with an opaque config for `driver` carrying `parameters` (docs/design.md §3, "device
/// configuration").
pub async fn create_config_template(
    client: &Client,
    name: &str,
    driver: &str,
    parameters: serde_json::Value,
) -> Result<()> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "mig", "exactly": {"deviceClassName": "1g.10gb.mig.das.com"}}],
            "config": [{"requests": ["mig"], "opaque": {"driver": driver, "parameters": parameters}}]
        }}}
    }))?;
    api.create(&PostParams::default(), &t)
        .await
        .with_context(|| format!("create template {name}"))?;
    Ok(())
}

/// Creates pod `name` in [`NS`] with one container `app` using a claim (`mig`) from
/// ResourceClaimTemplate `template`, pinned to `node` when given.
pub async fn create_pod(
    client: &Client,
    name: &str,
    template: &str,
    node: Option<&str>,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut spec = json!({
        "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "mig"}]}}],
        "terminationGracePeriodSeconds": 0
    });
    if let Some(n) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": n});
    }
    let pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )?;
    api.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("create pod {name}"))?;
    Ok(())
}

/// Creates ResourceClaim `name` in [`NS`] with one request `mig` of `exactly` (a
/// `DeviceRequest.exactly`: class, capacity requests), with opaque `config` for driver
/// `mig.das.com` when given, and pod `name` whose container `app` uses it.
pub async fn create_claim_pod(
    client: &Client,
    name: &str,
    exactly: serde_json::Value,
    config: Option<serde_json::Value>,
) -> Result<()> {
    let mut devices = json!({"requests": [{"name": "mig", "exactly": exactly}]});
    if let Some(parameters) = config {
        devices["config"] = json!([{"requests": ["mig"],
            "opaque": {"driver": das_api::DRIVER_NAME, "parameters": parameters}}]);
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices}
    }))?;
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .with_context(|| format!("create claim {name}"))?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "mig"}]}}],
            "terminationGracePeriodSeconds": 0
        }
    }))?;
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("create pod {name}"))?;
    Ok(())
}

/// Deletes pod `name` in [`NS`] at once (grace period 0) and waits until it is gone.
pub async fn delete_pod(client: &Client, name: &str) -> Result<()> {
    delete_pods(client, &[name]).await
}

/// Deletes pods `names` in [`NS`] at once (grace period 0), then waits until every one is gone.
pub async fn delete_pods(client: &Client, names: &[&str]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    for n in names {
        api.delete(n, &DeleteParams::default().grace_period(0))
            .await
            .with_context(|| format!("delete pod {n}"))?;
    }
    for n in names {
        wait::until(&format!("pod {n} to be gone"), wait::TIMEOUT, || async {
            Ok(api.get_opt(n).await?.is_none().then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// Waits for an Event with `reason` on Node `node` whose message contains `text`. Selected as
/// `kubectl describe node` selects a Node's events (by kind, name and the node's name as UID, the
/// kubelet's convention), so an event found here also shows there.
pub async fn wait_node_event(client: &Client, node: &str, reason: &str, text: &str) -> Result<()> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    wait::until(
        &format!("event {reason} on {node}"),
        wait::TIMEOUT,
        || async {
            let list = events
                .list(&kube::api::ListParams::default().fields(&format!(
                    "involvedObject.kind=Node,involvedObject.name={node},involvedObject.uid={node},reason={reason}"
                )))
                .await?;
            Ok(list
                .items
                .iter()
                .any(|e| e.message.as_deref().is_some_and(|m| m.contains(text)))
                .then_some(()))
        },
    )
    .await
}

/// Waits for an Event with `reason` on pod `pod` in [`NS`]; returns its message.
pub async fn wait_pod_event(client: &Client, pod: &str, reason: &str) -> Result<String> {
    wait_pod_event_containing(client, pod, reason, "").await
}

/// Waits for an Event with `reason` on pod `pod` in [`NS`] whose message contains `text`;
/// returns its message. For a prepare failure, whose first event may come from before the
/// plugin registered (`DRA driver mig.das.com is not registered`), with another message.
pub async fn wait_pod_event_containing(
    client: &Client,
    pod: &str,
    reason: &str,
    text: &str,
) -> Result<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), NS);
    wait::until(
        &format!("a {reason} event on {pod} saying {text:?}"),
        wait::TIMEOUT,
        || async {
            let lp = kube::api::ListParams::default().fields(&format!("involvedObject.name={pod}"));
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

/// The phase of pod `name` in [`NS`], or "" when it has none yet.
pub async fn phase(client: &Client, name: &str) -> Result<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    Ok(api
        .get(name)
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default())
}

/// Waits until the scheduler reports pod `name` in [`NS`] unschedulable (condition
/// `PodScheduled=False`, reason `Unschedulable`); returns the scheduler's message. Fails at once
/// when the pod is bound to a node instead.
pub async fn wait_unschedulable(client: &Client, name: &str) -> Result<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let outcome = wait::until(
        &format!("pod {name} to be unschedulable"),
        wait::TIMEOUT,
        || async {
            let p = api.get(name).await?;
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                return Ok(Some(Err(node)));
            }
            Ok(p.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
                .map(|c| Ok(c.message.unwrap_or_default())))
        },
    )
    .await?;
    outcome
        .map_err(|node| anyhow::anyhow!("pod {name} was bound to {node}, not left unschedulable"))
}

/// The health the kubelet shows for pod `name`'s DAS devices (its containers'
/// `allocatedResourcesStatus` entries of DAS's CDI devices, from the plugin's health stream,
/// KEP-4680): `Healthy`, `Unhealthy` or `Unknown`, one per device and container.
pub async fn device_health(client: &Client, name: &str) -> Result<Vec<String>> {
    let p = Api::<Pod>::namespaced(client.clone(), NS).get(name).await?;
    let ours = format!("{}=", das_api::CDI_KIND);
    Ok(p.status
        .and_then(|s| s.container_statuses)
        .into_iter()
        .flatten()
        .flat_map(|cs| cs.allocated_resources_status.into_iter().flatten())
        .flat_map(|r| r.resources.into_iter().flatten())
        .filter(|h| h.resource_id.starts_with(&ours))
        .filter_map(|h| h.health)
        .collect())
}

/// How pod `name` came out of scheduling, polled every 20 ms: `true` once bound to a node,
/// `false` once the scheduler says it is unschedulable.
///
/// # Errors
/// The API failed, or neither happened within `timeout`.
pub async fn bound_or_unschedulable(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<bool> {
    let t0 = std::time::Instant::now();
    loop {
        let p = pods.get(name).await?;
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            return Ok(true);
        }
        let unschedulable = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
        if unschedulable {
            return Ok(false);
        }
        if t0.elapsed() > timeout {
            anyhow::bail!("pod {name} neither bound nor unschedulable after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes every pod of [`NS`] at once and waits (2 min at most) until they and their claims
/// are gone (the claims deallocated).
///
/// # Errors
/// The API failed, or something was left after 2 minutes.
pub async fn delete_pods_and_claims(client: &Client) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await?;
    crate::wait::until(
        "every claim gone",
        std::time::Duration::from_secs(120),
        || async {
            let left = claims.list(&ListParams::default()).await?.items.len()
                + pods.list(&ListParams::default()).await?.items.len();
            Ok((left == 0).then_some(()))
        },
    )
    .await
}
