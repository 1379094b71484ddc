//! Carve before bind (issue 34; KEP-5007 binding conditions), end to end through the real
//! scheduler and kubelet on the default version: with `--carve-before-bind` the plugin publishes
//! its MIG devices with the binding condition `mig.das.com/SliceReady`, carves the slice when the
//! scheduler allocates it (before the pod is bound), and a create that fails (a fault injected
//! through the emulated control file) writes `mig.das.com/SliceFailed`: the scheduler clears the
//! allocation and schedules the pod again, the pod runs on a slice carved on the next try, and
//! the failed carve leaves nothing behind. The prepare of the carved claim creates nothing; the
//! claim's entry carries both `SliceReady` and `Ready`; deleting the pod destroys the slice.
//! Without the flag the same fault leaves the pod bound to its node, Pending in
//! `ContainerCreating` (today's behaviour, documented). Installed from the chart with the
//! controller, a carved pod's AllocationClaim goes `staged` → `created` → `inUse`, and a pod
//! deleted while its slice is carved leaves nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, ensure};
use das_api::allocation::{AllocationClaim, AllocationState};
use das_e2e::das::{pool_devices, write_control};
use das_e2e::install::{self, Binaries};
use das_e2e::plugin::{cluster_with_configured_plugins, cluster_with_plugins, live_slices};
use das_e2e::wait::{self, TIMEOUT};
use das_e2e::workload::{
    NS, create_claim_pod, create_pod, create_template, delete_pod, http_get, wait_pod_event,
    wait_running,
};
use das_e2e::{Cluster, ClusterConfig, chart};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const NODE: &str = "n0";
const GPUS: &str = "H100-80GB:1";

#[tokio::test]
async fn a_failed_carve_reschedules_the_pod_and_leaves_nothing() {
    let flags: &[&str] = &["--carve-before-bind"];
    let (mut cluster, ports) = cluster_with_configured_plugins(&[(NODE, GPUS, flags)]).await;
    let r = scenario(&mut cluster, ports[NODE]).await;
    cluster.check(r);
}

/// The value of metric line `name` (with its labels) on the plugin's `/metrics`, 0 when absent.
async fn metric(port: u16, name: &str) -> Result<f64> {
    let text = http_get(port, "/metrics").await?.1;
    let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
    Ok(line
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

/// The condition types of the claim's DAS `status.devices` entries.
async fn conditions(c: &kube::Client, claim: &str) -> Result<Vec<String>> {
    let rc = Api::<ResourceClaim>::namespaced(c.clone(), NS)
        .get(claim)
        .await?;
    let devices = rc.status.and_then(|s| s.devices).unwrap_or_default();
    Ok(devices
        .into_iter()
        .filter(|d| d.driver == das_api::DRIVER_NAME)
        .flat_map(|d| d.conditions.unwrap_or_default())
        .map(|c| c.type_)
        .collect())
}

async fn scenario(cluster: &mut Cluster, port: u16) -> Result<()> {
    let c = cluster.client();
    // Every MIG device is published with the binding conditions.
    let devices = pool_devices(&c, NODE).await?;
    ensure!(!devices.is_empty(), "no device published");
    for d in &devices {
        ensure!(
            d.binding_conditions.as_deref() == Some(&["mig.das.com/SliceReady".to_string()][..])
                && d.binding_failure_conditions.as_deref()
                    == Some(&["mig.das.com/SliceFailed".to_string()][..]),
            "device {} without the binding conditions: {:?} {:?}",
            d.name,
            d.binding_conditions,
            d.binding_failure_conditions
        );
    }

    // The first create on the GPU fails: the carve says SliceFailed, the scheduler tries again.
    write_control(
        cluster.node(NODE),
        &json!({"createFaults": [{"gpu": 0, "count": 1, "kind": "Other"}]}),
    )?;
    create_claim_pod(
        &c,
        "carved",
        json!({"deviceClassName": das_api::profile_device_class("1g.10gb")}),
        None,
    )
    .await?;
    wait_running(&c, "carved").await?;
    let failed = metric(port, r#"das_kubelet_plugin_carves_total{result="failed"}"#).await?;
    let ok = metric(port, r#"das_kubelet_plugin_carves_total{result="ok"}"#).await?;
    ensure!(
        failed == 1.0 && ok == 1.0,
        "carves: {failed} failed, {ok} ok"
    );
    let slices = live_slices(cluster, NODE)?;
    ensure!(
        slices.len() == 1,
        "one slice expected (the failed carve leaves none): {slices:?}"
    );
    wait::until(
        "the claim's entry to say SliceReady and Ready",
        TIMEOUT,
        || async {
            let types = conditions(&c, "carved").await?;
            let both = types.iter().any(|t| t == "mig.das.com/SliceReady")
                && types.iter().any(|t| t == "Ready");
            Ok(both.then_some(()))
        },
    )
    .await?;
    let carved = metric(port, "das_kubelet_plugin_carved_slices").await?;
    ensure!(carved == 0.0, "{carved} carved slices not prepared");

    delete_pod(&c, "carved").await?;
    wait::until("the slice to be destroyed", TIMEOUT, || async {
        Ok(live_slices(cluster, NODE)?.is_empty().then_some(()))
    })
    .await
    .context("the carved and prepared slice stays")?;
    Ok(())
}

/// Today's behaviour, without carve before bind: the same fault, lasting, leaves the pod bound
/// to the node in `ContainerCreating` while the kubelet retries its prepare.
#[tokio::test]
async fn without_it_a_failed_create_leaves_the_pod_on_its_node() {
    let (cluster, _) = cluster_with_plugins(&[(NODE, GPUS)]).await;
    let r = async {
        let c = cluster.client();
        let devices = pool_devices(&c, NODE).await?;
        ensure!(
            devices.iter().all(|d| d.binding_conditions.is_none()),
            "binding conditions published without --carve-before-bind"
        );
        write_control(
            cluster.node(NODE),
            &json!({"createFaults": [{"gpu": 0, "count": 1000, "kind": "Other"}]}),
        )?;
        create_claim_pod(
            &c,
            "stuck",
            json!({"deviceClassName": das_api::profile_device_class("1g.10gb")}),
            None,
        )
        .await?;
        wait_pod_event(&c, "stuck", "FailedPrepareDynamicResources").await?;
        let pod = Api::<Pod>::namespaced(c.clone(), NS).get("stuck").await?;
        let spec = pod.spec.context("spec")?;
        let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
        ensure!(
            spec.node_name.as_deref() == Some(NODE) && phase == "Pending",
            "the pod is {phase} on {:?}",
            spec.node_name
        );
        delete_pod(&c, "stuck").await?;
        Ok(())
    }
    .await;
    cluster.check(r);
}

/// DAS installed from the chart with `carveBeforeBind.enabled` (plugin, controller, webhook):
/// a pod's AllocationClaim goes `staged` → `created` (carved, before the pod is bound) → `inUse`,
/// never back; a pod deleted while its slice is carved but before the kubelet prepares it
/// leaves nothing.
#[tokio::test]
async fn a_carved_pod_goes_staged_created_in_use_and_a_deleted_one_leaves_nothing() {
    let bins = Binaries::in_target_dir("debug", true).expect("DAS binaries");
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&[NODE]))
        .await
        .expect("cluster starts");
    let gpus = [(NODE.to_string(), GPUS.to_string())];
    let r = async {
        let rendered = chart::render_with(&["carveBeforeBind.enabled=true"])?;
        install::install_rendered(&mut cluster, &rendered, &gpus, &bins).await
    }
    .await;
    cluster.check(r.map(|_| ()));
    cluster.check(states_in_order(&cluster).await);
}

async fn states_in_order(cluster: &Cluster) -> Result<()> {
    let c = cluster.client();
    // Every state each AllocationClaim is written with, in order.
    let seen: Arc<Mutex<BTreeMap<String, Vec<AllocationState>>>> = Arc::default();
    let watch = {
        let (api, seen) = (
            Api::<AllocationClaim>::namespaced(c.clone(), NS),
            seen.clone(),
        );
        tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(a)) = stream.next().await {
                let (Some(name), Some(state)) =
                    (a.metadata.name.clone(), a.status.map(|s| s.state))
                else {
                    continue;
                };
                let mut seen = seen.lock().unwrap();
                let states = seen.entry(name).or_default();
                if states.last() != Some(&state) {
                    states.push(state);
                }
            }
        })
    };
    create_template(&c, "one", "1g.10gb", 1).await?;
    create_pod(&c, "ordered", "one", None).await?;
    wait_running(&c, "ordered").await?;
    let states = wait::until("the AllocationClaim inUse", TIMEOUT, || async {
        let seen = seen.lock().unwrap();
        let states = seen.values().next().cloned().unwrap_or_default();
        Ok((states.last() == Some(&AllocationState::InUse)).then_some(states))
    })
    .await?;
    use AllocationState::{Created, InUse, Staged};
    ensure!(
        states == [Staged, Created, InUse] || states == [Created, InUse],
        "states of a carved pod's AllocationClaim: {states:?}"
    );
    delete_pod(&c, "ordered").await?;

    // Deleted once its slice is carved, before the scheduler's next look binds it: the carve
    // is released (or, if the pod was bound meanwhile, unprepared); nothing is left.
    create_pod(&c, "gone", "one", None).await?;
    wait::until("the slice carved", TIMEOUT, || async {
        Ok((!live_slices(cluster, NODE)?.is_empty()).then_some(()))
    })
    .await?;
    delete_pod(&c, "gone").await?;
    wait::until("the carved slice destroyed", TIMEOUT, || async {
        Ok(live_slices(cluster, NODE)?.is_empty().then_some(()))
    })
    .await?;
    watch.abort();
    Ok(())
}
