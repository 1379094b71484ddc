//! Shareable devices (docs/design.md §7, "Shared slices"; KEP-5075 consumable capacity) against
//! the real API server and scheduler of the default version: the slices das-driver builds with a
//! shared profile are accepted as built (`allowMultipleAllocations` and the request policies kept),
//! several claims land on one shareable device within its `shares`, a claim that needs more goes
//! to the next one, exclusive and shared use of a placement exclude each other through the
//! counters, and once every placement is taken a share that fits nowhere stays Pending with the
//! scheduler's reason while one that fits an existing shared device is still allocated (the
//! counters of a device in use are not charged again: kubernetes/kubernetes#139034, fixed in 1.37).
//!
//! The node runs a hollow kubelet but no DAS plugin: the slices are written here, and only the
//! allocations are checked (no prepare can run; the pods never start).

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use das_driver::gpu::emulated::emulated_inventory;
use das_driver::publish::resource_slices::{
    ResourceSliceLayout, SharePolicy, SharedProfiles, SliceOptions, desired_resource_slices,
};
use das_e2e::das::apply_device_classes;
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{NS, create_claim_pod, wait_unschedulable};
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

const NODE: &str = "n0";
const SHARED_CLASS: &str = "1g.10gb.shared.mig.das.com";

#[tokio::test]
async fn shares_of_one_slice_are_allocated_by_the_real_scheduler() {
    let cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    cluster.check(scenario(&cluster).await);
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    publish(&c).await?;
    apply_device_classes(&c, &["1g.10gb"]).await?;
    shared_class(&c).await?;

    // Two default shares (1 of 4 each) land on one device, the first in the policy's order.
    claim_pod(&c, "s1", SHARED_CLASS, None).await?;
    claim_pod(&c, "s2", SHARED_CLASS, None).await?;
    let s1 = allocated(&c, "s1").await?;
    let s2 = allocated(&c, "s2").await?;
    ensure!(
        s1.device == s2.device,
        "two shares on {} and {}",
        s1.device,
        s2.device
    );
    ensure!(
        s1.share_id.is_some() && s1.share_id != s2.share_id,
        "shares without distinct share IDs: {:?} {:?}",
        s1.share_id,
        s2.share_id
    );
    let consumed = s1.consumed_capacity.clone().unwrap_or_default();
    ensure!(
        consumed.get("shares").map(|q| q.0.as_str()) == Some("1")
            && consumed.get("memory").map(|q| q.0.as_str()) == Some("2304Mi"),
        "a default share consumed {consumed:?}"
    );
    // Three shares do not fit beside two on a device of four: the next shareable device.
    claim_pod(&c, "s3", SHARED_CLASS, Some(3)).await?;
    let s3 = allocated(&c, "s3").await?;
    ensure!(
        s3.device != s1.device,
        "three shares joined a device with two of four used"
    );

    // Exclusive slices take the five placements left, never one a share holds.
    let shared_at: BTreeSet<String> = [&s1.device, &s3.device]
        .iter()
        .map(|d| d.trim_end_matches("-shared").to_string())
        .collect();
    for i in 0..5 {
        let name = format!("e{i}");
        claim_pod(&c, &name, "1g.10gb.mig.das.com", None).await?;
        let e = allocated(&c, &name).await?;
        ensure!(
            !shared_at.contains(&e.device),
            "exclusive {name} got {}, a placement shared claims hold",
            e.device
        );
    }
    // Every placement is taken: a share that fits an existing shared device is still allocated
    // (its counters are not charged again) ...
    claim_pod(&c, "s4", SHARED_CLASS, None).await?;
    ensure!(
        allocated(&c, "s4").await?.device == s1.device,
        "s4 did not join s1's device"
    );
    // ... one that fits none stays Pending, and so does another exclusive slice.
    claim_pod(&c, "s5", SHARED_CLASS, Some(2)).await?;
    let why = wait_unschedulable(&c, "s5").await?;
    ensure!(why.contains("cannot allocate all claims"), "s5: {why}");
    claim_pod(&c, "e5", "1g.10gb.mig.das.com", None).await?;
    wait_unschedulable(&c, "e5").await?;
    Ok(())
}

/// Writes the pool of [`NODE`] (one H100 80GB, `1g.10gb` shareable) as the plugin would, and
/// checks that the API server kept the fields consumable capacity adds.
async fn publish(c: &Client) -> Result<()> {
    let gpus = emulated_inventory("H100-80GB:1", NODE)?;
    let options = SliceOptions {
        layout: ResourceSliceLayout::SeparateCounterSlices,
        shared: SharedProfiles {
            selectors: vec!["1g.10gb".into()],
            policy: SharePolicy::default(),
            ..Default::default()
        },
    };
    let api: Api<ResourceSlice> = Api::all(c.clone());
    for d in desired_resource_slices(NODE, &gpus, options)? {
        let name = format!("{}-{NODE}", d.name_prefix());
        let mut s = d.slice;
        s.metadata.name = Some(name);
        s.spec.pool.generation = 1;
        api.create(&PostParams::default(), &s).await?;
    }
    let stored = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .find(|d| d.name == "gpu-0-mig-1g-10gb-0-shared")
        .context("the shareable device was not stored")?;
    ensure!(
        stored.allow_multiple_allocations == Some(true)
            && stored
                .capacity
                .as_ref()
                .is_some_and(|c| c["shares"].request_policy.is_some()),
        "the API server dropped consumable capacity fields: {stored:?}"
    );
    Ok(())
}

/// The class of the shareable `1g.10gb` devices (the chart renders it the same way).
async fn shared_class(c: &Client) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": SHARED_CLASS},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'mig.das.com' && device.attributes['mig.das.com'].type == 'mig-shared' && device.attributes['mig.das.com'].profile == '1g.10gb'"}}]}
    }))?;
    Api::<DeviceClass>::all(c.clone())
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

/// A ResourceClaim `name` for one device of `class` (asking for `shares` when given) and a pod
/// `name` that uses it.
async fn claim_pod(c: &Client, name: &str, class: &str, shares: Option<u32>) -> Result<()> {
    let mut exactly = json!({"deviceClassName": class});
    if let Some(n) = shares {
        exactly["capacity"] = json!({"requests": {"shares": n.to_string()}});
    }
    create_claim_pod(c, name, exactly, None).await
}

/// The allocation result of claim `name` once the scheduler has allocated it.
async fn allocated(c: &Client, name: &str) -> Result<DeviceRequestAllocationResult> {
    let api: Api<ResourceClaim> = Api::namespaced(c.clone(), NS);
    wait::until(&format!("claim {name} allocated"), TIMEOUT, || async {
        let rc = api.get(name).await?;
        Ok(rc
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results?.into_iter().next()))
    })
    .await
}
