//! The ResourceSlice publisher (`das_driver::publish`) against a real 1.36 API server and
//! scheduler: counter-only and counter-consuming slices pass validation with `spec.nodeName`,
//! names/generation/count/owner are right, an identical republish writes nothing, one changed
//! slice keeps the generation, an added slice bumps it, fields the server drops are adopted, the
//! scheduler allocates from the pool, the run loop recreates a slice deleted under it and
//! shrinks the pool when the desired slices shrink.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use das_api::DRIVER_NAME;
use das_driver::publish::{PublishStats, Publisher, RunConfig};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::NS;
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceSlice, ResourceSliceSpec,
};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODE: &str = "n0";

#[tokio::test]
async fn publisher_reconciles_the_pool_and_the_scheduler_allocates_from_it() {
    let cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    cluster.check(scenario(&cluster).await);
}

/// A spec from JSON (driver, pool and nodeName are the publisher's to set).
fn spec(v: Value) -> ResourceSliceSpec {
    serde_json::from_value(v).expect("valid ResourceSliceSpec")
}

/// Slice 0: one GPU's counter set, no devices (1.35+ layout).
fn counters() -> ResourceSliceSpec {
    spec(json!({
        "driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 1},
        "sharedCounters": [{"name": "gpu-0-counter-set", "counters": {
            "memory": {"value": "40Gi"},
            "memory-slice-0": {"value": "1"},
            "memory-slice-1": {"value": "1"}
        }}]
    }))
}

/// A device-only slice with one MIG device consuming memory slices `[start, start+size)`.
fn mig_device(start: u32, size: u32) -> ResourceSliceSpec {
    let mut consumed = serde_json::Map::new();
    consumed.insert(
        "memory".into(),
        json!({"value": format!("{}Gi", 20 * size)}),
    );
    for s in start..start + size {
        consumed.insert(format!("memory-slice-{s}"), json!({"value": "1"}));
    }
    spec(json!({
        "driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 1},
        "devices": [{
            "name": format!("gpu-0-mig-{size}g-{start}"),
            "attributes": {"type": {"string": "mig"}, "placementStart": {"int": start}},
            "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": consumed}]
        }]
    }))
}

/// A device-only slice with one plain device.
fn plain_device(name: &str, color: &str) -> ResourceSliceSpec {
    spec(json!({
        "driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 1},
        "devices": [{"name": name, "attributes": {"type": {"string": "plain"}, "color": {"string": color}}}]
    }))
}

async fn our_slices(client: &Client) -> Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let lp =
        ListParams::default().fields(&format!("spec.driver={DRIVER_NAME},spec.nodeName={NODE}"));
    let mut items = api.list(&lp).await?.items;
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(items)
}

fn names(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .map(|s| s.metadata.name.clone().unwrap_or_default())
        .collect()
}

fn versions(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .map(|s| s.metadata.resource_version.clone().unwrap_or_default())
        .collect()
}

fn expected_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{i:05x}-{DRIVER_NAME}-{NODE}"))
        .collect()
}

/// Every slice has pool `{NODE, generation, count}`, nodeName NODE and the Node as controller.
fn check_pool(slices: &[ResourceSlice], generation: i64, node_uid: &str) -> Result<()> {
    ensure!(
        names(slices) == expected_names(slices.len()),
        "names {:?}",
        names(slices)
    );
    for s in slices {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let pool = &s.spec.pool;
        ensure!(
            (
                pool.name.as_str(),
                pool.generation,
                pool.resource_slice_count
            ) == (NODE, generation, slices.len() as i64),
            "{name}: pool {pool:?}, want generation {generation}, count {}",
            slices.len()
        );
        ensure!(
            s.spec.node_name.as_deref() == Some(NODE),
            "{name}: nodeName"
        );
        let owners = s.metadata.owner_references.clone().unwrap_or_default();
        ensure!(
            owners.len() == 1
                && owners[0].kind == "Node"
                && owners[0].api_version == "v1"
                && owners[0].name == NODE
                && owners[0].uid == node_uid
                && owners[0].controller == Some(true),
            "{name}: owner references {owners:?}"
        );
    }
    Ok(())
}

fn expect_stats(what: &str, got: &PublishStats, want: (usize, usize, usize, usize)) -> Result<()> {
    let have = (got.created, got.updated, got.deleted, got.unchanged);
    ensure!(
        have == want,
        "{what}: (created, updated, deleted, unchanged) = {have:?}, want {want:?}; {got:?}"
    );
    Ok(())
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let node_uid = Api::<Node>::all(client.clone())
        .get(NODE)
        .await?
        .metadata
        .uid
        .context("node uid")?;
    let mut publisher = Publisher::new(client.clone(), NODE, None);

    // 1. Three slices: a counter-only slice, a device consuming its counters, a plain device.
    //    The 1.36 API server accepts the counter-only slice with spec.nodeName set.
    let mut desired = vec![counters(), mig_device(0, 1), plain_device("plain-0", "red")];
    let t = Instant::now();
    let stats = publisher.publish(desired.clone()).await?;
    eprintln!(
        "first publish of 3 slices: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    expect_stats("first publish", &stats, (3, 0, 0, 0))?;
    ensure!(
        stats.generation == 1 && stats.dropped_fields == 0,
        "{stats:?}"
    );
    let slices = our_slices(&client).await?;
    check_pool(&slices, 1, &node_uid)?;
    ensure!(
        slices[0].spec.devices.is_none() && slices[0].spec.shared_counters.is_some(),
        "slice 0 is counter-only: {:?}",
        slices[0].spec
    );

    // What 1.36 validation says about counter slices (dry-run creates, nothing stored).
    counter_slice_validation(&client).await?;

    // 2. The same again: no writes, resourceVersions unchanged.
    let t = Instant::now();
    let stats = publisher.publish(desired.clone()).await?;
    eprintln!("no-op publish: {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    expect_stats("identical republish", &stats, (0, 0, 0, 3))?;
    let again = our_slices(&client).await?;
    ensure!(
        versions(&again) == versions(&slices),
        "a no-op publish wrote"
    );

    // 3. One slice changes: one update, generation kept.
    desired[2] = plain_device("plain-0", "blue");
    let stats = publisher.publish(desired.clone()).await?;
    expect_stats("one change", &stats, (0, 1, 0, 2))?;
    ensure!(stats.generation == 1, "{stats:?}");
    let changed = our_slices(&client).await?;
    check_pool(&changed, 1, &node_uid)?;
    ensure!(
        versions(&changed)[..2] == versions(&slices)[..2]
            && versions(&changed)[2] != versions(&slices)[2],
        "only slice 2 should be rewritten"
    );

    // 4. A slice is added: generation bumped, all four carry count 4.
    desired.push(plain_device("plain-1", "green"));
    let stats = publisher.publish(desired.clone()).await?;
    expect_stats("one added", &stats, (1, 3, 0, 0))?;
    ensure!(stats.generation == 2, "{stats:?}");
    check_pool(&our_slices(&client).await?, 2, &node_uid)?;

    // 5. A field the server drops (DRANodeAllocatableResources is alpha and off in 1.36): the
    //    stored version is adopted, the next publish writes nothing.
    let mut dropped = plain_device("plain-1", "green");
    dropped.devices.as_mut().context("devices")?[0].node_allocatable_resource_mappings = Some(
        serde_json::from_value(json!({"memory": {"allocationMultiplier": "1Gi"}}))?,
    );
    desired[3] = dropped;
    let stats = publisher.publish(desired.clone()).await?;
    eprintln!("publish with a dropped field: {stats:?}");
    ensure!(stats.updated == 1 && stats.dropped_fields == 1, "{stats:?}");
    let stats = publisher.publish(desired.clone()).await?;
    expect_stats("republish after dropped fields", &stats, (0, 0, 0, 4))?;

    // 6. The scheduler allocates a device of the pool (the counter-consuming one matches the
    //    selector), so the pool is complete and valid for the allocator.
    allocate_from_pool(&client).await?;

    // 7. The run loop: a slice deleted under it comes back; shrinking the desired list deletes
    //    the extras.
    let (tx, rx) = watch::channel(desired.clone());
    let stop = CancellationToken::new();
    let config = RunConfig {
        debounce: Duration::from_millis(500),
        ..RunConfig::default()
    };
    let task = tokio::spawn(publisher.run(rx, stop.clone(), config));
    let slices_api: Api<ResourceSlice> = Api::all(client.clone());
    let victim = expected_names(4)[1].clone();
    let old_uid = slices_api.get(&victim).await?.metadata.uid;
    slices_api.delete(&victim, &DeleteParams::default()).await?;
    let t = Instant::now();
    wait::until("the deleted slice to be recreated", TIMEOUT, || async {
        let s = slices_api.get_opt(&victim).await?;
        Ok(s.filter(|s| s.metadata.uid != old_uid).map(|_| ()))
    })
    .await?;
    eprintln!(
        "deleted slice recreated by the run loop after {:.2} s (debounce 0.5 s)",
        t.elapsed().as_secs_f64()
    );
    let recreated = wait::until("the pool to be complete again", TIMEOUT, || async {
        let s = our_slices(&client).await?;
        Ok((s.len() == 4 && s.iter().all(|x| x.spec.pool.generation == 3)).then_some(s))
    })
    .await?;
    check_pool(&recreated, 3, &node_uid)?;

    tx.send(vec![counters()])?;
    let shrunk = wait::until("the pool to shrink to one slice", TIMEOUT, || async {
        let s = our_slices(&client).await?;
        Ok((s.len() == 1 && s[0].spec.pool.resource_slice_count == 1).then_some(s))
    })
    .await?;
    check_pool(&shrunk, shrunk[0].spec.pool.generation, &node_uid)?;
    // Our own writes do not trigger more writes: the pool stays as it is.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        versions(&our_slices(&client).await?) == versions(&shrunk),
        "the run loop kept writing after the shrink"
    );

    stop.cancel();
    let mut publisher = task.await?;
    let totals = publisher.totals().clone();
    eprintln!("run loop totals: {totals:?}");
    // Exact write counts: 4 creates and 5 updates before the loop; the recreate is 1 create and
    // 3 updates (generation bump); the shrink is 3 deletes and 1 update (generation kept).
    ensure!(
        (
            totals.failures,
            totals.created,
            totals.updated,
            totals.deleted
        ) == (0, 5, 9, 3),
        "{totals:?}"
    );

    // 8. An empty desired list publishes an empty pool: one slice without devices or counters.
    //    `devices: Some(vec![])` is sent as absent (the server rejects `devices: []` next to
    //    counters, and omits it anyway).
    let stats = publisher.publish(vec![]).await?;
    expect_stats("empty pool", &stats, (0, 1, 0, 0))?;
    let mut counters_with_empty_devices = counters();
    counters_with_empty_devices.devices = Some(vec![]);
    let stats = publisher.publish(vec![counters_with_empty_devices]).await?;
    expect_stats("counters with devices: []", &stats, (0, 1, 0, 0))?;
    let empty = our_slices(&client).await?;
    ensure!(
        empty.len() == 1
            && empty[0].spec.devices.is_none()
            && empty[0].spec.shared_counters.is_some(),
        "{empty:?}"
    );

    // 9. Unpublish removes the pool.
    ensure!(publisher.unpublish().await? == 1);
    ensure!(our_slices(&client).await?.is_empty());
    Ok(())
}

async fn allocate_from_pool(client: &Client) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER_NAME}'")}}]}
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "mig"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER_NAME,
            "selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER_NAME}'].type == 'mig'")}}]
        }}]}}
    }))?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims.create(&PostParams::default(), &claim).await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "mig-user"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "mig"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]}}]
        }
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod).await?;

    let allocated = wait::until("the claim to be allocated", TIMEOUT, || async {
        let c = claims.get("mig").await?;
        Ok(c.status.and_then(|s| s.allocation))
    })
    .await?;
    let results = allocated
        .devices
        .and_then(|d| d.results)
        .unwrap_or_default();
    let got: Vec<(&str, &str, &str)> = results
        .iter()
        .map(|r| (r.driver.as_str(), r.pool.as_str(), r.device.as_str()))
        .collect();
    ensure!(
        got == vec![(DRIVER_NAME, NODE, "gpu-0-mig-1g-0")],
        "allocation results {got:?}"
    );
    let bound = wait::until("the pod to be bound", TIMEOUT, || async {
        Ok(pods.get("mig-user").await?.spec.and_then(|s| s.node_name))
    })
    .await?;
    ensure!(bound == NODE, "pod bound to {bound}");
    Ok(())
}

/// Dry-run creates of hand-made slices, to pin down 1.36 validation of counter slices:
/// a counter-only slice needs a node selection like any slice (`nodeName` here), and counters
/// and devices may not share a slice (KEP-4815, 1.35+). Also an empty `devices: []` next to
/// `sharedCounters` counts as "devices set" (docs/reference/dra.md, "ResourceSlice limits").
async fn counter_slice_validation(client: &Client) -> Result<()> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let counter_set = json!([{"name": "cs", "counters": {"memory": {"value": "1Gi"}}}]);
    let cases = [
        (
            "counter-only with nodeName",
            json!({"nodeName": NODE, "sharedCounters": counter_set}),
            true,
        ),
        (
            "counter-only without node selection",
            json!({"sharedCounters": counter_set}),
            false,
        ),
        (
            "counter-only with allNodes",
            json!({"allNodes": true, "sharedCounters": counter_set}),
            true,
        ),
        (
            "counters and devices in one slice",
            json!({"nodeName": NODE, "sharedCounters": counter_set,
                   "devices": [{"name": "d", "consumesCounters": [{"counterSet": "cs", "counters": {"memory": {"value": "1Gi"}}}]}]}),
            false,
        ),
        (
            "counters with an empty devices list",
            json!({"nodeName": NODE, "sharedCounters": counter_set, "devices": []}),
            false,
        ),
        ("empty slice (empty pool)", json!({"nodeName": NODE}), true),
    ];
    for (i, (what, extra, accepted)) in cases.into_iter().enumerate() {
        let mut spec = json!({"driver": "facts.das.test",
                              "pool": {"name": format!("facts-{i}"), "generation": 1, "resourceSliceCount": 1}});
        spec.as_object_mut()
            .context("spec object")?
            .extend(extra.as_object().context("extra object")?.clone());
        let slice: ResourceSlice = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("facts-{i}")}, "spec": spec
        }))?;
        let result = api.create(&dry, &slice).await;
        let outcome = match &result {
            Ok(_) => "accepted".to_string(),
            Err(e) => format!("rejected: {e}"),
        };
        eprintln!("1.36 validation, {what}: {outcome}");
        ensure!(result.is_ok() == accepted, "{what}: {outcome}");
    }
    Ok(())
}
