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

use crate::install::{self, Binaries};
use crate::wait;
use crate::{Cluster, ClusterConfig, chart, das};

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

/// The namespaces the tests and the benchmark of shared slices across tenants use.
pub const TENANTS: [&str; 2] = ["team-a", "team-b"];
/// A namespace das-webhook does not see ([`install_sharing`] excludes it).
pub const BYPASS: &str = "bypass";
/// The shared class [`install_sharing`] renders.
pub const SHARED_1G_10GB: &str = "1g.10gb.shared.mig.das.com";

/// A local cluster with node `node` (emulated `gpus`) and DAS installed from the chart with
/// `1g.10gb` shared, [`BYPASS`] excluded from das-webhook, and the `--set`s `extra`; the
/// namespaces [`TENANTS`] and [`BYPASS`] created. The cluster comes back with the set-up's
/// result, so a failure still shows the components' logs ([`Cluster::check`]).
pub async fn install_sharing(node: &str, gpus: &str, extra: &[&str]) -> (Cluster, Result<()>) {
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[node]))
        .await
        .expect("cluster starts");
    let setup = async {
        let excluded = format!(
            "webhook.excludedNamespaces={{kube-system,kube-public,kube-node-lease,{BYPASS}}}"
        );
        let mut sets = vec!["sharing.profiles={1g.10gb}", excluded.as_str()];
        sets.extend_from_slice(extra);
        let rendered = chart::render_with(&sets)?;
        let bins = Binaries::in_target_dir("debug", true)?;
        let nodes = [(node.to_string(), gpus.to_string())];
        install::install_rendered(&mut cluster, &rendered, &nodes, &bins).await?;
        das::wait_pool_complete(&cluster.client(), node).await?;
        for ns in TENANTS.iter().chain([&BYPASS]) {
            create_namespace(&cluster.client(), ns).await?;
        }
        Ok(())
    };
    let r = setup.await;
    (cluster, r)
}

/// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`) to the node plugin's process of `cluster`.
pub fn signal_plugin(cluster: &Cluster, signal: i32) -> Result<()> {
    let pid = cluster
        .pids()
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("das-kubelet-plugin"))
        })
        .context("the node plugin's process")?;
    let pid = i32::try_from(pid)?;
    // SAFETY: kill(2) on a child process of ours; no memory is involved.
    anyhow::ensure!(unsafe { libc::kill(pid, signal) } == 0, "kill {pid}");
    Ok(())
}

/// What [`carve_race`] came to.
#[derive(Debug, Clone)]
pub struct Race {
    /// The device the scheduler first allocated both claims.
    pub first: String,
    /// Each claim's device once both pods run, as [`TENANTS`].
    pub devices: [String; 2],
    /// From the plugin's resumption until both pods ran.
    pub took: Duration,
    /// From the plugin's resumption until the refused claim's second allocation (its
    /// `allocationTimestamp`), in seconds.
    pub allocated_again_after: Option<f64>,
}

/// Two namespaces' shares meet at a node with carve before bind on ([`install_sharing`] with
/// `carveBeforeBind.enabled=true`): with the plugin frozen (nothing carved, no attribute
/// published), pods `<TENANTS[i]>/<names[i]>` with a share each are allocated one free device;
/// then the plugin resumes, one carve is refused, and the scheduler allocates that claim again.
/// Returns once both pods run (`within`), leaving them running; the plugin runs again even when
/// this fails.
pub async fn carve_race(cluster: &Cluster, names: [&str; 2], within: Duration) -> Result<Race> {
    signal_plugin(cluster, libc::SIGSTOP)?;
    let r = race_frozen(cluster, names, within).await;
    let _ = signal_plugin(cluster, libc::SIGCONT);
    r
}

async fn race_frozen(cluster: &Cluster, names: [&str; 2], within: Duration) -> Result<Race> {
    let c = cluster.client();
    for (ns, name) in TENANTS.iter().zip(names) {
        create_share_pod(&c, ns, name, SHARED_1G_10GB, None).await?;
    }
    let a = allocated_in(&c, TENANTS[0], names[0]).await?;
    let b = allocated_in(&c, TENANTS[1], names[1]).await?;
    anyhow::ensure!(
        a.device == b.device,
        "the race did not happen: {} and {}",
        a.device,
        b.device
    );
    let t0 = tokio::time::Instant::now();
    let resumed = k8s_openapi::jiff::Timestamp::now();
    signal_plugin(cluster, libc::SIGCONT)?;
    for (ns, name) in TENANTS.iter().zip(names) {
        wait_running_within(&c, ns, name, within).await?;
    }
    let took = t0.elapsed();
    let mut devices = Vec::new();
    let mut again = None;
    for (ns, name) in TENANTS.iter().zip(names) {
        let rc = Api::<ResourceClaim>::namespaced(c.clone(), ns)
            .get(name)
            .await?;
        let device = first_result(&rc).context("allocated")?.device;
        if device != a.device {
            again = rc
                .status
                .and_then(|s| s.allocation)
                .and_then(|al| al.allocation_timestamp)
                .and_then(|t| (t.0 - resumed).total(k8s_openapi::jiff::Unit::Second).ok());
        }
        devices.push(device);
    }
    Ok(Race {
        first: a.device,
        devices: [devices[0].clone(), devices[1].clone()],
        took,
        allocated_again_after: again,
    })
}
