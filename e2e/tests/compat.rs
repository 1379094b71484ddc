//! The compatibility subset: what DAS must do on every Kubernetes version the README lists as
//! tested. `make compat` runs it on each older version (`.local/k8s/<version>/k8s`, the
//! control plane started with `DRAPartitionableDevices` on before 1.36, as the README tells
//! users); `make e2e` runs it with the rest of the suite on the default version.
//!
//! On two nodes with DAS installed from the chart (plugin, controller, webhook):
//! - the ResourceSlices are in the layout this API server wants (counter sets with the devices on
//!   1.34, in their own slices from 1.35), and every counter a device consumes is published;
//! - every example pod runs with its slices: a ResourceClaimTemplate pod, a 3-slice claim, a
//!   Deployment, and a legacy `nvidia.com/mig-*` pod through the webhook;
//! - where the kubelet watches device health (1.36+), their containers show their devices
//!   Healthy, streamed over the newest health service the kubelet knows;
//! - deleting them destroys every MIG instance and every CDI spec;
//! - with `sharing.profiles` listing `1g.10gb`, shareable devices (`…-shared`) are published
//!   only to servers that have consumable capacity without the recount bug (1.36.2+, 1.37);
//!   on older ones none is, and the plugin's log says why (docs/design.md §7, "Shared slices");
//! - with `carveBeforeBind.enabled`, MIG devices carry the binding conditions only on 1.36+ (so
//!   every example's slice there is carved before its pod is bound); on 1.34–1.35 none does,
//!   pods run as before, and the plugin's log says why (docs/design.md §7, "Carve before bind").

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use das_api::DRIVER_NAME;
use das_e2e::install::{self, Binaries};
use das_e2e::plugin::live_slices;
use das_e2e::{Cluster, ClusterConfig, chart, das, examples, wait};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;

const NODES: [(&str, &str); 2] = [("n0", "A100-SXM4-40GB:2"), ("n1", "H100-80GB:2")];

#[tokio::test]
async fn das_serves_the_examples_on_this_kubernetes_version() {
    let bins = Binaries::in_target_dir("debug", true).expect("DAS binaries");
    let mut cluster = Cluster::start(ClusterConfig::with_nodes(&["n0", "n1"]))
        .await
        .expect("cluster starts");
    let gpus: Vec<(String, String)> = NODES
        .iter()
        .map(|(n, g)| (n.to_string(), g.to_string()))
        .collect();
    let rendered = chart::render_with(&[
        "sharing.profiles={1g.5gb,1g.10gb}",
        "carveBeforeBind.enabled=true",
    ])
    .expect("chart renders");
    let r = install::install_rendered(&mut cluster, &rendered, &gpus, &bins).await;
    cluster.check(r.map(|_| ()));
    cluster.check(slices_in_the_servers_layout(&cluster).await);
    cluster.check(shareable_devices_only_where_safe(&cluster).await);
    cluster.check(binding_conditions_only_where_served(&cluster).await);
    // No whole GPUs: the whole-GPU example is left out; shares where the server has them.
    let serves = serves(&cluster).await.expect("the server's version");
    cluster.check(examples::apply_and_check(&cluster, serves).await);
    cluster.check(device_health_reaches_the_pods(&cluster).await);
    cluster.check(deleting_the_examples_destroys_every_slice(&cluster, serves).await);
}

/// 1.34 wants each counter set in the slice of the devices that consume it; 1.35 and later
/// want counter sets in slices of their own (KEP-4815). Either way every counter set a device
/// names must be published in its pool.
async fn slices_in_the_servers_layout(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let version = client.apiserver_version().await?;
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .with_context(|| format!("server minor version {:?}", version.minor))?;
    let slices = Api::<ResourceSlice>::all(client)
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
        .await?
        .items;
    for (node, _) in NODES {
        let pool: Vec<&ResourceSlice> =
            slices.iter().filter(|s| s.spec.pool.name == node).collect();
        ensure!(!pool.is_empty(), "{node} published no slices");
        let mut sets = BTreeSet::new();
        let mut consumed = BTreeSet::new();
        for s in &pool {
            let counters = s.spec.shared_counters.as_deref().unwrap_or_default();
            let devices = s.spec.devices.as_deref().unwrap_or_default();
            let name = s.metadata.name.as_deref().unwrap_or_default();
            if !counters.is_empty() {
                let devices_beside_counters = minor < 35;
                let has_devices = !devices.is_empty();
                ensure!(
                    devices_beside_counters == has_devices,
                    "v1.{minor}: slice {name} holds {} counter sets and {} devices",
                    counters.len(),
                    devices.len()
                );
            }
            sets.extend(counters.iter().map(|c| c.name.clone()));
            for d in devices {
                for c in d.consumes_counters.as_deref().unwrap_or_default() {
                    consumed.insert(c.counter_set.clone());
                }
            }
        }
        ensure!(
            !consumed.is_empty() && consumed.is_subset(&sets),
            "{node}: devices consume {consumed:?}, the pool publishes {sets:?}"
        );
    }
    Ok(())
}

/// What the examples may use here: no whole GPUs (the chart's default), shared `1g.5gb` slices
/// where the server has consumable capacity without the recount bug.
async fn serves(cluster: &Cluster) -> Result<examples::Serves> {
    let info = cluster.client().apiserver_version().await?;
    let v = das_driver::publish::resource_slices::ServerVersion::from_info(&info);
    Ok(examples::Serves {
        whole_gpus: false,
        shares: das_driver::publish::resource_slices::shares_supported(v.major, v.minor, v.patch)
            .is_ok(),
    })
}

/// Shareable devices are published on 1.36.2+ and 1.37, and on older servers none is and each
/// plugin's log says why.
async fn shareable_devices_only_where_safe(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let info = client.apiserver_version().await?;
    let v = das_driver::publish::resource_slices::ServerVersion::from_info(&info);
    let supported =
        das_driver::publish::resource_slices::shares_supported(v.major, v.minor, v.patch).is_ok();
    let shared: Vec<String> = Api::<ResourceSlice>::all(client)
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.name.ends_with("-shared"))
        .map(|d| d.name)
        .collect();
    ensure!(
        supported != shared.is_empty(),
        "{}: shareable devices {shared:?}",
        info.git_version
    );
    if !supported {
        for (node, _) in NODES {
            let log = std::fs::read_to_string(cluster.log_of(&format!("das-plugin-{node}")))?;
            ensure!(
                log.contains("no shareable devices are published"),
                "{node}'s plugin does not say why nothing is shareable on {}",
                info.git_version
            );
        }
    }
    Ok(())
}

/// MIG devices carry binding conditions on 1.36 and newer; on older servers none does and each
/// plugin's log says why.
async fn binding_conditions_only_where_served(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let info = client.apiserver_version().await?;
    let v = das_driver::publish::resource_slices::ServerVersion::from_info(&info);
    let served = das_driver::publish::binding::binding_supported(v).is_ok();
    let devices: Vec<_> = Api::<ResourceSlice>::all(client)
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.name.contains("-mig-"))
        .collect();
    let with = devices
        .iter()
        .filter(|d| d.binding_conditions.is_some())
        .count();
    let want = if served { devices.len() } else { 0 };
    ensure!(
        with == want && !devices.is_empty(),
        "{}: {with} of {} MIG devices carry binding conditions",
        info.git_version,
        devices.len()
    );
    if !served {
        for (node, _) in NODES {
            let log = std::fs::read_to_string(cluster.log_of(&format!("das-plugin-{node}")))?;
            ensure!(
                log.contains("carve before bind is off"),
                "{node}'s plugin does not say why it does not carve on {}",
                info.git_version
            );
        }
    }
    Ok(())
}

/// Where the kubelet watches device health (`ResourceHealthStatus`: beta and on from 1.36, alpha
/// and off before), the running examples' containers show their DAS devices Healthy, streamed
/// by the plugin: over `v1alpha1.DRAResourceHealth` on 1.36, over `v1` on 1.37 (which prefers
/// it). Each plugin's log names the service the kubelet opened.
async fn device_health_reaches_the_pods(cluster: &Cluster) -> Result<()> {
    let client = cluster.client();
    let info = client.apiserver_version().await?;
    let v = das_driver::publish::resource_slices::ServerVersion::from_info(&info);
    let service = match v.minor {
        ..36 => return Ok(()),
        36 => "v1alpha1.DRAResourceHealth",
        _ => "v1.DRAResourceHealth",
    };
    let pods = Api::<Pod>::all(client);
    let healthy = wait::until(
        "a DAS device Healthy in a running example's status",
        examples::TIMEOUT,
        || async {
            let count = pods
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
                .flatten()
                .flat_map(|cs| cs.allocated_resources_status.iter().flatten())
                .flat_map(|r| r.resources.iter().flatten())
                .filter(|h| {
                    h.resource_id.starts_with("das.com/") && h.health.as_deref() == Some("Healthy")
                })
                .count();
            Ok((count > 0).then_some(count))
        },
    )
    .await?;
    let mut watched = false;
    for (node, _) in NODES {
        let log = std::fs::read_to_string(cluster.log_of(&format!("das-plugin-{node}")))?;
        watched |= log
            .lines()
            .any(|l| l.contains("the kubelet watches device health") && l.contains(service));
    }
    ensure!(
        watched,
        "{healthy} devices Healthy, but no plugin says the kubelet opened {service} on {}",
        info.git_version
    );
    Ok(())
}

async fn deleting_the_examples_destroys_every_slice(
    cluster: &Cluster,
    serves: examples::Serves,
) -> Result<()> {
    let mut delete = vec!["delete".to_string(), "--wait=false".into()];
    delete.extend(examples::file_args(serves)?);
    let delete: Vec<&str> = delete.iter().map(String::as_str).collect();
    chart::kubectl(&cluster.kubeconfig, &delete, None)?;
    for (node, _) in NODES {
        wait::until(
            &format!("every MIG instance on {node} to be destroyed"),
            examples::TIMEOUT,
            || async { Ok(live_slices(cluster, node)?.is_empty().then_some(())) },
        )
        .await?;
        let cdi = das::PluginDirs::of(cluster.node(node)).cdi;
        wait::until(
            &format!("every CDI spec on {node} to be deleted"),
            examples::TIMEOUT,
            || async { Ok(das::load_specs(&cdi)?.is_empty().then_some(())) },
        )
        .await?;
    }
    Ok(())
}
