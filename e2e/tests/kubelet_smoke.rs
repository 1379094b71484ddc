//! The DRA path end to end, without the DAS driver: a DeviceClass and a ResourceSlice made by the
//! test, a pod with a ResourceClaimTemplate, the real scheduler allocating the device, the real
//! kubelet DRA manager failing to prepare it while no plugin is registered, then calling a
//! minimal gRPC plugin once one registers, and unpreparing when the pod goes.

use std::time::Duration;

use anyhow::{Context, Result};
use das_e2e::test_plugin::{Call, TestPlugin};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::NS;
use das_e2e::{Cluster, ClusterConfig};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::json;

const DRIVER: &str = "smoke.das.test";
const NODE: &str = "n0";

async fn create<K>(api: &Api<K>, obj: serde_json::Value) -> Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj)?;
    Ok(api.create(&PostParams::default(), &obj).await?)
}

async fn claim_of_pod(client: &Client, pod: &str) -> Result<Option<ResourceClaim>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let p = pods.get(pod).await?;
    let Some(name) = p
        .status
        .and_then(|s| s.resource_claim_statuses)
        .and_then(|v| v.into_iter().next())
        .and_then(|s| s.resource_claim_name)
    else {
        return Ok(None);
    };
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    Ok(claims.get_opt(&name).await?)
}

#[tokio::test]
async fn dra_path_reaches_the_kubelet_and_a_registered_plugin() {
    let cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    for (what, t) in cluster.timings() {
        eprintln!("cluster start: {what} after {:.1}s", t.as_secs_f64());
    }
    cluster.check(scenario(&cluster).await);

    // Teardown leaves no component behind.
    let pids = cluster.pids();
    assert_eq!(
        pids.len(),
        5,
        "etcd, apiserver, controller-manager, scheduler, one kubelet"
    );
    drop(cluster);
    let alive: Vec<u32> = pids
        .into_iter()
        .filter(|p| das_e2e::process::alive(*p as i32))
        .collect();
    assert!(alive.is_empty(), "processes left after teardown: {alive:?}");
}

async fn scenario(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();

    // The resource.k8s.io/v1 API is served (DRA GA since 1.34).
    let discovery = kube::discovery::group(&client, "resource.k8s.io").await?;
    assert!(
        discovery.versions().any(|v| v == "v1"),
        "resource.k8s.io/v1 not served: {:?}",
        discovery.versions().collect::<Vec<_>>()
    );

    create(
        &Api::<DeviceClass>::all(client.clone()),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}
        }),
    )
    .await?;
    create(
        &Api::<ResourceSlice>::all(client.clone()),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n0-smoke"},
            "spec": {
                "driver": DRIVER, "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev-0", "attributes": {"model": {"string": "smoke"}}}]
            }
        }),
    )
    .await?;
    create(&Api::<ResourceClaimTemplate>::namespaced(client.clone(), NS), json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-device"},
        "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": DRIVER}}]}}}
    }))
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    create(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "smoke"},
            "spec": {
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-device"}],
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "dev"}]}}]
            }
        }),
    )
    .await?;

    // The real scheduler allocates the only device and binds the pod to its node.
    let claim = wait::until("the pod's claim to be allocated", TIMEOUT, || async {
        Ok(claim_of_pod(&client, "smoke")
            .await?
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some())))
    })
    .await?;
    let results = claim
        .status
        .clone()
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap_or_default();
    assert_eq!(results.len(), 1);
    assert_eq!(
        (
            results[0].driver.as_str(),
            results[0].pool.as_str(),
            results[0].device.as_str()
        ),
        (DRIVER, NODE, "dev-0")
    );
    let pod = pods.get("smoke").await?;
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(NODE));

    // No plugin yet: the kubelet's DRA manager tries and reports it.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let ev = wait::until(
        "a FailedPrepareDynamicResources event on the pod",
        TIMEOUT,
        || async {
            let lp = ListParams::default().fields("involvedObject.name=smoke");
            Ok(events
                .list(&lp)
                .await?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources")))
        },
    )
    .await?;
    let msg = ev.message.unwrap_or_default();
    assert!(
        msg.contains(DRIVER),
        "event should name the missing driver: {msg}"
    );

    // A plugin registers: the kubelet calls NodePrepareResources for the claim and the pod runs
    // with the plugin's CDI device.
    let node = cluster.node(NODE);
    let plugin = TestPlugin::start(
        client.clone(),
        DRIVER,
        "smoke.das.test/dev",
        &node.registry_dir(),
        &node.plugins_dir(),
    )
    .await?;
    let claim_uid = claim.metadata.uid.clone().context("claim uid")?;
    wait::until("the pod to run", Duration::from_secs(90), || async {
        let p = pods.get("smoke").await?;
        Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    let calls = plugin.calls();
    assert!(
        calls.contains(&Call::Registered {
            ok: true,
            error: String::new()
        }),
        "calls: {calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, Call::Prepare { claim_uid: u, .. } if *u == claim_uid)),
        "NodePrepareResources not called for claim {claim_uid}: {calls:?}"
    );
    let pod_uid = pods.get("smoke").await?.metadata.uid.context("pod uid")?;
    let record = std::fs::read(node.cdi_records_dir().join(format!("{pod_uid}_app.json")))?;
    let record: serde_json::Value = serde_json::from_slice(&record)?;
    assert_eq!(
        record["cdiDevices"],
        json!([format!("smoke.das.test/dev={claim_uid}-dev-0")])
    );

    // Pod deleted: the kubelet unprepares the claim and the generated claim goes away.
    pods.delete("smoke", &DeleteParams::default().grace_period(0))
        .await?;
    wait::until("NodeUnprepareResources for the claim", TIMEOUT, || async {
        Ok(plugin
            .calls()
            .contains(&Call::Unprepare {
                claim_uid: claim_uid.clone(),
            })
            .then_some(()))
    })
    .await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let claim_name = claim.metadata.name.clone().unwrap();
    wait::until("the generated claim to be deleted", TIMEOUT, || async {
        Ok(claims.get_opt(&claim_name).await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}
