//! DAS on the test cluster: how the node plugin is started for a hollow node, the DeviceClasses
//! it needs, and what a container would see (CDI resolution as a container runtime does it).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceSlice};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::Value;

use crate::binaries::DasBinary;
use crate::chart;
use crate::cluster::NodeInfo;
pub use crate::container_view::{ContainerView, MIG_UUID_ENV_PREFIX};
use crate::paths::workspace_root;
use crate::wait;

/// The DRA driver name (docs/design.md §3).
pub const DRIVER: &str = "mig.das.com";

/// Files of the plugin of one node, under the node's kubelet root dir.
pub struct PluginDirs {
    pub cdi: PathBuf,
    pub state: PathBuf,
}

impl PluginDirs {
    pub fn of(node: &NodeInfo) -> Self {
        Self {
            cdi: node.root_dir.join("cdi"),
            state: node.root_dir.join("das"),
        }
    }
}

/// Flags for `das-kubelet-plugin` on `node` with emulated `gpus` (e.g. `H100-80GB:2`), pointed at
/// the hollow kubelet's directories, with the admin kubeconfig: for tests of the plugin's
/// behaviour. `install::start_plugin` starts it as the Helm chart configures it instead (the
/// chart's environment and service-account identity).
pub fn plugin_args(
    node: &NodeInfo,
    gpus: &str,
    kubeconfig: &Path,
    metrics_port: u16,
) -> Vec<String> {
    let dirs = PluginDirs::of(node);
    let mut args = vec![
        format!("--node-name={}", node.name),
        format!("--kubelet-registry-dir={}", node.registry_dir().display()),
        format!("--kubelet-plugins-dir={}", node.plugins_dir().display()),
        format!("--cdi-dir={}", dirs.cdi.display()),
        format!("--state-dir={}", dirs.state.display()),
        format!("--emulated-gpus={gpus}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--metrics-address=127.0.0.1:{metrics_port}"),
        "--log-level=info,das_driver=debug,dra_plugin=debug".into(),
    ];
    // A real runtime injects device nodes: give it the emulated GPUs' stand-ins.
    if let Some(files) = node.runtime_files() {
        args.push(format!(
            "--emulated-device-dir={}",
            files.device_dir().display()
        ));
    }
    args
}

/// The distinct `profile` attributes of every published device of our driver.
pub async fn published_profiles(client: &Client) -> Result<Vec<String>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.driver={DRIVER}"));
    let mut profiles: Vec<String> = api
        .list(&lp)
        .await?
        .items
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| d.attributes.as_ref()?.get("profile")?.string.clone())
        .collect();
    profiles.sort();
    profiles.dedup();
    Ok(profiles)
}

/// Waits until each of `nodes` has at least one ResourceSlice of the DAS driver (any node when
/// `nodes` is empty): the plugins have published something. See [`wait_pool_complete`] for one
/// node's whole pool.
pub async fn wait_nodes_published(client: &Client, nodes: &[&str]) -> Result<()> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    wait::until(
        &format!("ResourceSlices of {nodes:?}"),
        wait::TIMEOUT,
        || async {
            let lp = ListParams::default().fields(&format!("spec.driver={DRIVER}"));
            let slices = api.list(&lp).await?.items;
            let on = |n: &str| {
                slices
                    .iter()
                    .any(|s| s.spec.node_name.as_deref() == Some(n))
            };
            let done = if nodes.is_empty() {
                !slices.is_empty()
            } else {
                nodes.iter().all(|n| on(n))
            };
            Ok(done.then_some(()))
        },
    )
    .await
}

/// Waits until the DAS pool of `node` is complete: every ResourceSlice of its newest generation
/// is there (as many as `resourceSliceCount` says). Returns those slices.
pub async fn wait_pool_complete(client: &Client, node: &str) -> Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    wait::until(
        &format!("the complete pool of ResourceSlices of {node}"),
        wait::TIMEOUT,
        || async {
            let lp =
                ListParams::default().fields(&format!("spec.driver={DRIVER},spec.nodeName={node}"));
            let slices = api.list(&lp).await?.items;
            let Some(newest) = slices.iter().map(|s| s.spec.pool.generation).max() else {
                return Ok(None);
            };
            let current: Vec<_> = slices
                .into_iter()
                .filter(|s| s.spec.pool.generation == newest)
                .collect();
            let complete = current
                .first()
                .is_some_and(|s| s.spec.pool.resource_slice_count as usize == current.len());
            Ok(complete.then_some(current))
        },
    )
    .await
}

/// Creates (server-side apply) the Helm chart's DeviceClass for every slice and the chart's
/// DeviceClasses of `profiles` (`<profile>.mig.das.com`, `+` → `-`), exactly as rendered.
///
/// # Errors
/// Helm is not built (`make helm`), a profile has no DeviceClass in the chart, or the API server
/// refuses one.
pub async fn apply_device_classes(client: &Client, profiles: &[&str]) -> Result<()> {
    let rendered = chart::render()?;
    let api: Api<DeviceClass> = Api::all(client.clone());
    let pp = PatchParams::apply("das-e2e").force();
    let names = std::iter::once(DRIVER.to_string())
        .chain(profiles.iter().map(|p| das_api::profile_device_class(p)));
    for name in names {
        let body = rendered.get("DeviceClass", &name)?;
        api.patch(&name, &pp, &Patch::Apply(body))
            .await
            .with_context(|| format!("apply DeviceClass {name}"))?;
    }
    Ok(())
}

/// Applies the DeviceClasses of the shareable devices of `profiles` (`<profile>.shared.mig.das.com`,
/// with their `sharing.strategy: MPS` config) as the chart renders them with
/// `sharing.profiles` listing `profiles` (docs/design.md §7, "Shared slices").
pub async fn apply_shared_device_classes(client: &Client, profiles: &[&str]) -> Result<()> {
    let set = format!("sharing.profiles={{{}}}", profiles.join(","));
    // Memory slices of whole GPUs (`gpu`) come with whole GPUs only.
    let rendered = if profiles.contains(&das_api::WHOLE_GPU_PROFILE) {
        chart::render_with(&[&set, "wholeGpus.enabled=true"])?
    } else {
        chart::render_with(&[&set])?
    };
    let api: Api<DeviceClass> = Api::all(client.clone());
    let pp = PatchParams::apply("das-e2e").force();
    for name in profiles
        .iter()
        .map(|p| das_api::shared_profile_device_class(p))
    {
        let body = rendered.get("DeviceClass", &name)?;
        api.patch(&name, &pp, &Patch::Apply(body))
            .await
            .with_context(|| format!("apply DeviceClass {name}"))?;
    }
    Ok(())
}

/// Resolves container `container` of pod `pod_uid` on `node`: the CDI device IDs the kubelet
/// passed (recorded by the hollow kubelet) are looked up in the spec files of the plugin's CDI
/// dir, and their edits (the spec's, then the device's) applied in order, as a CDI-enabled
/// runtime does: environment merged by key, last one wins; device nodes by path.
///
/// # Errors
/// A device ID in no spec, or two edits setting one variable to different values: a runtime
/// would keep only the last, so the container would not see what its devices meant to give it.
pub fn container_view(node: &NodeInfo, pod_uid: &str, container: &str) -> Result<ContainerView> {
    let rec_path = node
        .cdi_records_dir()
        .join(format!("{pod_uid}_{container}.json"));
    let rec: Value = serde_json::from_slice(
        &std::fs::read(&rec_path).with_context(|| format!("read {}", rec_path.display()))?,
    )?;
    let ids: Vec<String> = serde_json::from_value(rec["cdiDevices"].clone())?;
    let specs = load_specs(&PluginDirs::of(node).cdi)?;
    resolve_cdi_devices(&specs, &ids)
        .with_context(|| format!("container {container} of pod {pod_uid}"))
}

/// The CDI device IDs (`<kind>=<name>`) of every device in `specs` whose name starts with one
/// of `claim_uids` (DAS names its devices `<claimUID>-<device>`).
pub fn claim_device_ids(specs: &[Value], claim_uids: &[String]) -> Vec<String> {
    specs
        .iter()
        .flat_map(|s| {
            let kind = s["kind"].as_str().unwrap_or_default();
            s["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d["name"].as_str())
                .filter(|n| claim_uids.iter().any(|u| n.starts_with(u.as_str())))
                .map(move |n| format!("{kind}={n}"))
        })
        .collect()
}

/// Applies the edits of CDI devices `ids` from `specs` (the spec's, then the device's, in
/// order) as a CDI-enabled runtime does: environment merged by key, last one wins; device
/// nodes by path.
///
/// # Errors
/// A device ID in no spec, or two edits setting one variable to different values.
pub fn resolve_cdi_devices(specs: &[Value], ids: &[String]) -> Result<ContainerView> {
    let mut view = ContainerView {
        cdi_devices: ids.to_vec(),
        ..Default::default()
    };
    for id in ids {
        let Some((kind, name)) = id.split_once('=') else {
            bail!("malformed CDI device ID {id}")
        };
        let (spec, device) = specs
            .iter()
            .filter(|s| s["kind"] == kind)
            .flat_map(|s| {
                s["devices"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |d| (s, d))
            })
            .find(|(_, d)| d["name"] == name)
            .with_context(|| format!("CDI device {id} is in no spec file"))?;
        for edits in [&spec["containerEdits"], &device["containerEdits"]] {
            for e in edits["env"].as_array().into_iter().flatten() {
                let (k, v) = e
                    .as_str()
                    .unwrap_or_default()
                    .split_once('=')
                    .unwrap_or_default();
                if let Some(old) = view.env.insert(k.to_string(), v.to_string())
                    && old != v
                {
                    bail!(
                        "CDI devices set {k} to {old:?} and {v:?}; a runtime keeps only the last"
                    );
                }
            }
            for n in edits["deviceNodes"].as_array().into_iter().flatten() {
                let path = n["path"].as_str().unwrap_or_default().to_string();
                if !view.device_nodes.contains(&path) {
                    view.device_nodes.push(path);
                }
            }
            // A mount of the same container path replaces the earlier one.
            for m in edits["mounts"].as_array().into_iter().flatten() {
                let at = m["containerPath"].as_str().unwrap_or_default();
                let from = m["hostPath"].as_str().unwrap_or_default();
                view.mounts.insert(at.to_string(), from.to_string());
            }
        }
    }
    Ok(view)
}

/// Every CDI spec (`*.json`) in `dir`.
pub fn load_specs(dir: &Path) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            out.push(
                serde_json::from_slice(&std::fs::read(&p)?)
                    .with_context(|| format!("parse {}", p.display()))?,
            );
        }
    }
    Ok(out)
}

/// The emulated GPUs' state file of the plugin on `node` (see `driver/src/gpu/emulated.rs`).
pub fn emulated_state(node: &NodeInfo) -> Result<Value> {
    let p = PluginDirs::of(node)
        .state
        .join("emulated")
        .join("emulated-gpus.json");
    Ok(serde_json::from_slice(
        &std::fs::read(&p).with_context(|| format!("read {}", p.display()))?,
    )?)
}

/// Every device DAS publishes in `node`'s pool, as published now.
pub async fn pool_devices(client: &Client, node: &str) -> Result<Vec<Device>> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER}")))
        .await?;
    Ok(slices
        .items
        .into_iter()
        .filter(|s| s.spec.pool.name == node)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect())
}

/// Writes the emulated-GPU control file of the plugin on `node` (atomically): faults, latency,
/// lost GPUs and health events (docs/emulated-mode.md).
pub fn write_control(node: &NodeInfo, control: &Value) -> Result<()> {
    let dir = PluginDirs::of(node).state.join("emulated");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("control.json");
    let tmp = dir.join("control.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(control)?)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// Installs the AllocationClaim CRD exactly as shipped (`deploy/helm/das/files/allocationclaims.yaml`,
/// written by `crdgen` and checked against the type by a test) and waits until it is served.
pub async fn install_allocation_claim_crd(client: &Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let path = workspace_root().join("deploy/helm/das/files/allocationclaims.yaml");
    let yaml =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&yaml).with_context(|| format!("parse {}", path.display()))?;
    let name = crd.metadata.name.clone().context("CRD name")?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("das-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("apply the AllocationClaim CRD")?;
    wait::until(
        "the AllocationClaim CRD to be established",
        std::time::Duration::from_secs(30),
        || async {
            let c = api.get(&name).await?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        },
    )
    .await
}

/// Flags for `das-controller` on the test cluster (no leader election: one replica).
pub fn controller_args(kubeconfig: &Path, metrics_port: u16) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--metrics-address=127.0.0.1:{metrics_port}"),
        "--leader-elect=false".into(),
    ]
}

/// The scheduler configuration that packs DAS slices onto fewer nodes, as docs/operations.md
/// shows it: `docs/examples/scheduler/packing.yaml`.
pub const PACKING_SCHEDULER_CONFIG: &str = "docs/examples/scheduler/packing.yaml";

/// The `profiles` of [`PACKING_SCHEDULER_CONFIG`] (a JSON list), for
/// [`crate::ClusterConfig::scheduler_profiles`], so tests and benchmarks run the file users copy.
/// Errors: the file is missing, is not YAML, or has no `profiles` list.
pub fn packing_scheduler_profiles() -> Result<Value> {
    let path = workspace_root().join(PACKING_SCHEDULER_CONFIG);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut config: Value =
        serde_yaml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    match config.get_mut("profiles").map(Value::take) {
        Some(profiles @ Value::Array(_)) => Ok(profiles),
        _ => bail!("{} has no `profiles` list", path.display()),
    }
}

/// The node counts a scale benchmark measures: `DAS_BENCH_NODES` (comma-separated), else
/// `default` (e.g. `"125,1000"`).
///
/// # Errors
/// A count that is not a number.
pub fn bench_node_counts(default: &str) -> Result<Vec<usize>> {
    std::env::var("DAS_BENCH_NODES")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|n| n.trim().parse().context("DAS_BENCH_NODES: node counts"))
        .collect()
}

/// `template` (ResourceSlices as JSON text, printed for node `template_node`) copied for `nodes`
/// nodes named `node-0000`, `node-0001`, …: what that many nodes would publish.
pub fn slices_for_nodes(template: &[String], template_node: &str, nodes: usize) -> Vec<String> {
    (0..nodes)
        .flat_map(|i| {
            let node = format!("node-{i:04}");
            template
                .iter()
                .map(move |t| t.replace(template_node, &node))
        })
        .collect()
}

/// The JSON text of a `ResourceSliceList` holding `items` (each one slice's JSON), as the API
/// server answers a list.
pub fn slice_list_text(items: &[String]) -> String {
    format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSliceList","metadata":{{"resourceVersion":"1"}},"items":[{}]}}"#,
        items.join(",")
    )
}

/// The number of devices in `slices` (ResourceSlices as JSON text).
///
/// # Errors
/// A text that is not a ResourceSlice.
pub fn devices_in(slices: &[String]) -> Result<usize> {
    slices.iter().try_fold(0, |n, text| {
        let s: ResourceSlice = serde_json::from_str(text).context("a ResourceSlice")?;
        Ok(n + s.spec.devices.as_ref().map_or(0, Vec::len))
    })
}

/// The ResourceSlices das-kubelet-plugin publishes on a node with emulated GPUs `gpus` (e.g.
/// `H100-80GB:8`), in the layout of Kubernetes 1.35 and later, as the API server returns them:
/// from `das-kubelet-plugin --print-resource-slices` (the release build if there is one, else
/// the debug build), with the names of docs/design.md §3 and the metadata the API server adds
/// (UID, resourceVersion, creation time, the Node owner, the plugin's managed-fields entry).
/// For memory and scale measurements without a cluster (`benches/controller_slice_memory.rs`,
/// `benches/webhook_slice_memory.rs`).
pub fn printed_resource_slices(gpus: &str, node: &str) -> Result<Vec<Value>> {
    let plugin = DasBinary::Plugin
        .in_target_dir("release")
        .or_else(|_| DasBinary::Plugin.in_target_dir("debug"))?;
    let out = std::process::Command::new(&plugin)
        .args(["--emulated-gpus", gpus, "--node-name", node])
        .arg("--print-resource-slices")
        .output()
        .with_context(|| format!("run {}", plugin.display()))?;
    if !out.status.success() {
        bail!(
            "{} --print-resource-slices: {}",
            plugin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let list: Value = serde_json::from_slice(&out.stdout).context("printed slices")?;
    let items = list["items"].as_array().context("a List")?;
    Ok(items
        .iter()
        .enumerate()
        .map(|(index, s)| {
            let mut s = s.clone();
            s["metadata"] = serde_json::json!({
                "name": format!("{index:05x}-{DRIVER}-{node}"),
                "uid": format!("00000000-0000-4000-8000-{index:012x}"),
                "resourceVersion": "1000000",
                "generation": 1,
                "creationTimestamp": "2026-11-25T00:00:00Z",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                    "uid": "00000000-0000-4000-8000-ffffffffffff", "controller": true}],
                "managedFields": [{"manager": "das-kubelet-plugin", "operation": "Update",
                    "apiVersion": "resource.k8s.io/v1", "time": "2026-11-25T00:00:00Z",
                    "fieldsType": "FieldsV1", "fieldsV1": {
                        "f:metadata": {"f:ownerReferences": {".": {},
                            "k:{\"uid\":\"00000000-0000-4000-8000-ffffffffffff\"}": {}}},
                        "f:spec": {"f:devices": {}, "f:driver": {}, "f:nodeName": {},
                            "f:pool": {".": {}, "f:generation": {}, "f:name": {},
                                "f:resourceSliceCount": {}},
                            "f:sharedCounters": {}}}}]
            });
            s
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing configuration scores NodeResourcesFit `MostAllocated` over cpu and memory,
    /// which pods asking through ResourceClaims do count against (a DRA extended resource they do
    /// not request would be skipped by the scorer).
    #[test]
    fn packing_config_scores_most_allocated_over_cpu_and_memory() {
        let profiles = packing_scheduler_profiles().unwrap();
        let fit = profiles[0]["pluginConfig"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "NodeResourcesFit")
            .expect("NodeResourcesFit args");
        let strategy = &fit["args"]["scoringStrategy"];
        assert_eq!(strategy["type"], "MostAllocated");
        let names: Vec<&str> = strategy["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(names, ["cpu", "memory"]);
    }
}
