//! Shares are a tenant's own (docs/design.md §7, "Shares are a tenant's own"; §8, "Shared
//! slices at admission"), against the real API server, scheduler and controller-manager of the
//! default version, with DAS installed from the chart (`sharing.profiles={1g.10gb}`: the
//! node plugin on an emulated H100 80GB with the stand-in MPS daemon, das-webhook registered
//! with the chart's MutatingWebhookConfiguration, das-controller):
//!
//! - das-webhook adds the namespace selector to claims for a shared class (created directly or
//!   by kube-controller-manager from a template), and the real scheduler evaluates it: a share
//!   of another namespace is steered to another slice, a share of the same namespace joins;
//! - the node plugin publishes `shareNamespace` once a share is recorded and drops it once the
//!   last one is gone (how fast: `cargo bench -p das-e2e --bench share_namespace`);
//! - a claim the webhook never saw (a namespace it excludes), allocated the slice another
//!   namespace holds, fails its prepare with the message, and the slice, its daemon and the
//!   records are untouched;
//! - with carve before bind, two namespaces' claims allocated one device before the attribute
//!   existed (the plugin frozen meanwhile) end on two slices: the carve of one is refused, its
//!   `SliceFailed` has the scheduler allocate it again, and the attribute steers it away.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use das_api::share_namespace_selector;
use das_driver::mps::stand_in::Record;
use das_e2e::Cluster;
use das_e2e::das::{self, PluginDirs};
use das_e2e::plugin::live_slices;
use das_e2e::tenants::{
    BYPASS, SHARED_1G_10GB as SHARED, allocated_in, carve_race, create_pod_in, create_share_pod,
    delete_pods_in, first_result, install_sharing, pod_event_in, selectors, share_namespace,
    wait_running_in, wait_share_namespace,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";

#[tokio::test]
async fn a_share_of_another_namespace_is_steered_away_or_refused() {
    let (cluster, ready) = install_sharing(NODE, GPUS, &[]).await;
    if ready.is_err() {
        return cluster.check(ready);
    }
    cluster.check(steered_and_refused(&cluster).await);
}

/// The MIG UUID the plugin reported for claim `<ns>/<name>` (its `status.devices` data).
async fn prepared(c: &Client, ns: &str, name: &str) -> Result<String> {
    let rc = Api::<ResourceClaim>::namespaced(c.clone(), ns)
        .get(name)
        .await?;
    let entry = rc
        .status
        .and_then(|s| s.devices)
        .and_then(|d| d.into_iter().next())
        .with_context(|| format!("{ns}/{name} has no status.devices"))?;
    let data = entry.data.context("no data")?.0;
    Ok(data["migUUID"].as_str().unwrap_or_default().to_string())
}

async fn steered_and_refused(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    // team-a's first share: the webhook adds its selector; the plugin publishes its namespace.
    let rc = create_share_pod(&c, "team-a", "a1", SHARED, None).await?;
    ensure!(
        selectors(&rc) == [share_namespace_selector("team-a")],
        "the claim was admitted without its namespace selector: {:?}",
        selectors(&rc)
    );
    let a1 = allocated_in(&c, "team-a", "a1").await?;
    wait_share_namespace(&c, NODE, &a1.device, Some("team-a")).await?;
    wait_running_in(&c, "team-a", "a1").await?;
    let mig_a1 = prepared(&c, "team-a", "a1").await?;

    // team-b's share: the scheduler is steered to another slice.
    create_share_pod(&c, "team-b", "b1", SHARED, None).await?;
    let b1 = allocated_in(&c, "team-b", "b1").await?;
    ensure!(
        b1.device != a1.device,
        "team-b's share got team-a's slice {}",
        a1.device
    );
    wait_running_in(&c, "team-b", "b1").await?;
    let mig_b1 = prepared(&c, "team-b", "b1").await?;
    ensure!(mig_b1 != mig_a1, "one MIG instance for two namespaces");
    // team-a's second share joins team-a's slice.
    create_share_pod(&c, "team-a", "a2", SHARED, None).await?;
    ensure!(allocated_in(&c, "team-a", "a2").await?.device == a1.device);
    wait_running_in(&c, "team-a", "a2").await?;
    ensure!(prepared(&c, "team-a", "a2").await? == mig_a1);
    // A claim kube-controller-manager makes from a template is steered the same way.
    from_template(&c, "team-b", "b2").await?;
    let b2 = wait_running_in(&c, "team-b", "b2").await?;
    let b2_claim = generated_claim(&c, "team-b", &b2).await?;
    ensure!(
        selectors(&b2_claim) == [share_namespace_selector("team-b")],
        "a claim from a template: {:?}",
        selectors(&b2_claim)
    );
    let b2_device = first_result(&b2_claim).context("b2 allocated")?.device;
    ensure!(
        b2_device == b1.device,
        "team-b's second share got {b2_device}, not team-b's slice {}",
        b1.device
    );

    refused_without_the_selector(cluster, &a1.device, &mig_a1).await?;

    // The last share of team-a's slice leaves: the device serves nobody again.
    delete_pods_in(&c, "team-a", &["a1", "a2"]).await?;
    wait_share_namespace(&c, NODE, &a1.device, None).await?;
    ensure!(share_namespace(&c, NODE, &b1.device).await?.as_deref() == Some("team-b"));
    Ok(())
}

/// A claim of [`BYPASS`] (no webhook, so no namespace selector) pinned by a selector of its
/// own to team-a's shareable `device`: allocated it, its prepare fails with the message, and
/// team-a's slice `mig`, its daemon and the records stay as they were.
async fn refused_without_the_selector(cluster: &Cluster, device: &str, mig: &str) -> Result<()> {
    let c = cluster.client();
    let before = live_slices(cluster, NODE)?;
    let dirs = PluginDirs::of(cluster.node(NODE));
    let records_before = records(&dirs)?;
    let daemon = slice_daemon(&dirs, mig)?;
    let start = das::pool_devices(&c, NODE)
        .await?
        .into_iter()
        .find(|d| d.name == device)
        .and_then(|d| d.attributes?.get(das_api::attributes::PLACEMENT_START)?.int)
        .context("the shared device's placement")?;
    let pin = format!("device.attributes['mig.das.com'].placementStart == {start}");
    let rc = create_share_pod(&c, BYPASS, "x1", SHARED, Some(&pin)).await?;
    ensure!(selectors(&rc) == [pin.clone()], "{:?}", selectors(&rc));
    ensure!(allocated_in(&c, BYPASS, "x1").await?.device == device);
    let msg = pod_event_in(
        &c,
        BYPASS,
        "x1",
        "FailedPrepareDynamicResources",
        "serves namespace",
    )
    .await?;
    for part in [
        "serves namespace team-a",
        "claim team-a/a",
        "namespace bypass may not join",
        "delete the pod",
    ] {
        ensure!(msg.contains(part), "{part:?} missing: {msg}");
    }
    ensure!(
        live_slices(cluster, NODE)? == before,
        "the refusal changed the slices"
    );
    ensure!(
        records(&dirs)? == records_before,
        "the refusal changed the records"
    );
    ensure!(
        slice_daemon(&dirs, mig)? == daemon,
        "the slice's daemon changed"
    );
    delete_pods_in(&c, BYPASS, &["x1"]).await
}

/// The claims the node's checkpoint records, by UID, with their records.
fn records(dirs: &PluginDirs) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(dirs.state.join("checkpoint.json"))?;
    let cp: serde_json::Value = serde_json::from_str(&text)?;
    Ok(cp["claims"].clone())
}

/// The MPS daemon runs of the slice `mig` (the stand-in's record of every start and command).
fn slice_daemon(dirs: &PluginDirs, mig: &str) -> Result<Vec<(u32, Vec<String>)>> {
    let root = dirs.state.join("mps");
    for e in std::fs::read_dir(&root)?.flatten() {
        let Some(record) = Record::read(&e.path().join("log")) else {
            continue;
        };
        if record.runs.iter().any(|r| r.visible_devices == mig) {
            return Ok(record
                .runs
                .into_iter()
                .map(|r| (r.pid, r.commands))
                .collect());
        }
    }
    anyhow::bail!("no MPS daemon of {mig} under {}", root.display())
}

/// ResourceClaimTemplate `<ns>/<pod>` asking for one share of [`SHARED`], and pod `<ns>/<pod>`
/// using a claim from it.
async fn from_template(c: &Client, ns: &str, pod: &str) -> Result<()> {
    let t: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": pod, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "mig",
            "exactly": {"deviceClassName": SHARED}}]}}}
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &t)
        .await?;
    let spec = json!({
        "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": pod}],
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"claims": [{"name": "mig"}]}}],
        "terminationGracePeriodSeconds": 0
    });
    create_pod_in(c, ns, pod, spec).await
}

/// The claim kube-controller-manager generated for `pod`.
async fn generated_claim(c: &Client, ns: &str, pod: &Pod) -> Result<ResourceClaim> {
    let name = pod
        .status
        .clone()
        .and_then(|s| s.resource_claim_statuses)
        .into_iter()
        .flatten()
        .find_map(|s| s.resource_claim_name)
        .context("no generated claim")?;
    Ok(Api::<ResourceClaim>::namespaced(c.clone(), ns)
        .get(&name)
        .await?)
}

#[tokio::test]
async fn with_carve_before_bind_a_refused_share_is_allocated_again_elsewhere() {
    let (cluster, ready) = install_sharing(NODE, GPUS, &["carveBeforeBind.enabled=true"]).await;
    if ready.is_err() {
        return cluster.check(ready);
    }
    cluster.check(refused_carve(&cluster).await);
}

async fn refused_carve(cluster: &Cluster) -> Result<()> {
    // Both claims are allocated one device while the plugin is frozen; one carve wins, the
    // other is refused (SliceFailed), allocated again and steered away.
    let race = carve_race(cluster, ["a1", "b1"], Duration::from_secs(120)).await?;
    let [a, b] = &race.devices;
    ensure!(a != b, "two namespaces share {a} after carving: {race:?}");
    ensure!(
        a == &race.first || b == &race.first,
        "neither kept the slice both were allocated: {race:?}"
    );
    let log = std::fs::read_to_string(cluster.log_of(&das_e2e::plugin::plugin_name(NODE)))?;
    ensure!(
        log.lines()
            .any(|l| l.contains("carve before bind failed") && l.contains("serves namespace")),
        "no refused carve in the plugin's log"
    );
    Ok(())
}
