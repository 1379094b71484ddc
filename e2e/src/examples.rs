//! docs/examples on a cluster with DAS installed from the chart ([`crate::install::install`] with
//! the webhook and the controller): every example pod runs with exactly its slices, the legacy
//! pod through the webhook, the whole-GPU pod (when the chart serves whole GPUs, as `make demo`
//! installs it) with a whole H100 whose MIG mode DAS switched off, the two shares of one slice
//! (when the chart shares `1g.5gb` and the server has consumable capacity, as `make demo` on the
//! default version) on one slice with their own MPS limits, and no component was refused by the
//! chart's RBAC. The chart's test (the demo's cluster) and the compatibility subset
//! (`e2e/tests/compat.rs`, every supported Kubernetes, without whole GPUs) share it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use das_api::allocation::{AllocationClaim, AllocationState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

use crate::{Cluster, chart, wait};

/// Longer than [`wait::TIMEOUT`]: one wait covers every example pod on two nodes coming up at
/// once, the webhook's translation and the controller's AllocationClaims.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// The example pods with MIG slices (`kubectl apply -f docs/examples`): one-slice,
/// multi-slice, the inference Deployment's two replicas, legacy-slice, and mps-a and mps-b.
pub const PODS: usize = 7;

/// Their ResourceClaims: one per pod but for mps-a and mps-b, which share one
/// (`06-mps.yaml`, MPS on its slice).
const CLAIMS: usize = 6;

/// Their MIG slices: one-slice (1) + multi-slice (3) + inference Deployment (2 × 1) +
/// legacy-slice (1) + the MPS claim's (1).
const SLICES: usize = 8;

/// The claim of the MPS example, shared by its two pods.
const MPS_CLAIM: &str = "mps-1g-5gb";

/// The example that needs the chart's whole GPUs (`wholeGpus.enabled`, the DeviceClass
/// `gpu.das.com`): pod [`WHOLE_GPU_POD`] gets a whole GPU.
pub const WHOLE_GPU_EXAMPLE: &str = "05-whole-gpu.yaml";
pub const WHOLE_GPU_POD: &str = "whole-gpu";

/// The example of two claims sharing one slice (`sharing.profiles` listing `1g.5gb`, a server
/// with consumable capacity: docs/design.md §7, "Shared slices"): pods and claims
/// [`SHARE_PODS`], one slice.
pub const SHARES_EXAMPLE: &str = "07-shared-slice.yaml";
pub const SHARE_PODS: [&str; 2] = ["share-small", "share-large"];

/// The example of two claims sharing an L4 by memory (`make demo`'s node n2;
/// docs/design.md §7, "Memory slices of a whole GPU"): never applied here, as no cluster of
/// these tests has an L4 (`e2e/tests/plugin_memory_slices.rs` runs docs/examples/memory-slices/,
/// the same without the L4 selector).
pub const MEMORY_SLICES_EXAMPLE: &str = "08-memory-slices.yaml";

/// What the cluster serves beyond exclusive slices, and so which examples apply.
#[derive(Debug, Clone, Copy, Default)]
pub struct Serves {
    /// Whole GPUs ([`WHOLE_GPU_EXAMPLE`]).
    pub whole_gpus: bool,
    /// Shared slices of `1g.5gb` ([`SHARES_EXAMPLE`]).
    pub shares: bool,
}

/// The files `kubectl apply -f docs/examples/` applies (the folder's YAML files, not its
/// subfolders), in name order; without [`WHOLE_GPU_EXAMPLE`] or [`SHARES_EXAMPLE`] unless the
/// cluster `serves` them, and never [`MEMORY_SLICES_EXAMPLE`].
pub fn files(serves: Serves) -> Result<Vec<PathBuf>> {
    let whole_gpus = serves.whole_gpus;
    let dir = crate::paths::workspace_root().join("docs/examples");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let wanted = (whole_gpus || name != WHOLE_GPU_EXAMPLE)
            && (serves.shares || name != SHARES_EXAMPLE)
            && name != MEMORY_SLICES_EXAMPLE;
        if p.is_file() && name.ends_with(".yaml") && wanted {
            out.push(p);
        }
    }
    out.sort();
    if whole_gpus && !out.iter().any(|p| p.ends_with(WHOLE_GPU_EXAMPLE)) {
        bail!("docs/examples/{WHOLE_GPU_EXAMPLE} is missing");
    }
    Ok(out)
}

/// `-f <file>` for each of [`files`], for `kubectl apply` or `delete`.
pub fn file_args(serves: Serves) -> Result<Vec<String>> {
    Ok(files(serves)?
        .iter()
        .flat_map(|p| ["-f".to_string(), p.display().to_string()])
        .collect())
}

/// Applies docs/examples, waits for the pods, and checks what each got. With `whole_gpus` (DAS
/// installed with [`chart::WHOLE_GPUS_SWITCHING`] on nodes n0 with A100s and n1 with H100s, as
/// `make demo` runs it) the whole-GPU example too: its pod holds a whole GPU of n1, beside the
/// slices, and that GPU's MIG mode is off.
pub async fn apply_and_check(cluster: &Cluster, serves: Serves) -> Result<()> {
    let mut apply = vec!["apply".to_string()];
    apply.extend(file_args(serves)?);
    let apply: Vec<&str> = apply.iter().map(String::as_str).collect();
    chart::kubectl(&cluster.kubeconfig, &apply, None)?;
    let expected = Expected::of(serves);
    let running = all_pods_running(cluster, expected.pods).await?;
    legacy_pod_translated(&running)?;
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client().clone(), "default");
    devices_reported(cluster, serves, &claims, &expected).await?;
    cdi_specs_checked(cluster, serves, &claims, &expected).await?;
    nothing_refused(cluster)
}

/// How many pods, claims and devices the applied examples make.
struct Expected {
    pods: usize,
    claims: usize,
    devices: usize,
}

impl Expected {
    fn of(serves: Serves) -> Self {
        let whole = usize::from(serves.whole_gpus);
        // Each share is a claim with one device result (and one AllocationClaim); both hold one
        // slice.
        let shares = if serves.shares { SHARE_PODS.len() } else { 0 };
        Expected {
            pods: PODS + whole + shares,
            claims: CLAIMS + whole + shares,
            devices: SLICES + whole + shares,
        }
    }
}

/// Waits until the `default` namespace has `count` pods, all running; returns them.
async fn all_pods_running(cluster: &Cluster, count: usize) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().clone(), "default");
    wait::until("every example pod to run", TIMEOUT, || async {
        let list = pods.list(&Default::default()).await?.items;
        let running = list
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        Ok((list.len() == count && running == count).then_some(list))
    })
    .await
}

/// The legacy pod was translated by the webhook into a claim of the 1g.5gb class.
fn legacy_pod_translated(running: &[Pod]) -> Result<()> {
    let legacy = running
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("legacy-slice"))
        .context("legacy-slice")?;
    let claims = legacy
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default();
    ensure!(
        claims.len() == 1
            && claims[0].resource_claim_template_name.as_deref() == Some("das-mig-1g-5gb-x1"),
        "legacy pod not translated: {claims:?}"
    );
    Ok(())
}

/// Every device was prepared by a plugin running under the chart's RBAC: its status is on the
/// claim (resourceclaims/status + the 1.36 associated-node verbs), and the controller (chart
/// RBAC too) mirrors it as inUse; with whole GPUs, the whole GPU sits beside the slices.
async fn devices_reported(
    cluster: &Cluster,
    serves: Serves,
    all_claims: &Api<ResourceClaim>,
    expected: &Expected,
) -> Result<()> {
    let devices = expected.devices;
    wait::until(
        "every claim's devices reported by the plugin",
        TIMEOUT,
        || async {
            let list = all_claims.list(&Default::default()).await?.items;
            let reported: usize = list
                .iter()
                .map(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.devices.as_ref())
                        .map_or(0, Vec::len)
                })
                .sum();
            Ok((list.len() == expected.claims && reported == devices).then_some(()))
        },
    )
    .await?;
    let allocs: Api<AllocationClaim> = Api::namespaced(cluster.client().clone(), "default");
    wait::until("an AllocationClaim inUse per device", TIMEOUT, || async {
        let list = allocs.list(&Default::default()).await?.items;
        let in_use = list
            .iter()
            .filter(|a| {
                a.status
                    .as_ref()
                    .is_some_and(|s| s.state == AllocationState::InUse)
            })
            .count();
        Ok((list.len() == devices && in_use == devices).then_some(()))
    })
    .await?;
    if serves.whole_gpus {
        whole_gpu_beside_the_slices(cluster, &allocs).await?;
    }
    Ok(())
}

/// Emulated GPUs from the chart: CDI specs carry the MIG UUIDs but no device nodes, so a real
/// runtime on a node without NVIDIA devices would start the containers. One spec per claim; the
/// MPS example's and the shares' as their examples say.
async fn cdi_specs_checked(
    cluster: &Cluster,
    serves: Serves,
    all_claims: &Api<ResourceClaim>,
    expected: &Expected,
) -> Result<()> {
    let mut specs = Vec::new();
    for node in ["n0", "n1"] {
        specs.extend(crate::das::load_specs(
            &crate::das::PluginDirs::of(cluster.node(node)).cdi,
        )?);
    }
    ensure!(
        specs.len() == expected.claims,
        "{} CDI specs for {} claims",
        specs.len(),
        expected.claims
    );
    mps_example_shares_one_slice(&specs, all_claims).await?;
    if serves.shares {
        shares_hold_one_slice(&specs, all_claims).await?;
    }
    for spec in &specs {
        ensure!(
            spec["containerEdits"]["deviceNodes"].is_null(),
            "device nodes in {spec}"
        );
        for device in spec["devices"].as_array().into_iter().flatten() {
            let edits = &device["containerEdits"];
            ensure!(edits["deviceNodes"].is_null(), "device nodes in {spec}");
            let env = edits["env"].to_string();
            ensure!(
                env.contains("=MIG-") || (serves.whole_gpus && env.contains("DAS_GPU_UUID_")),
                "no MIG UUID (nor a whole GPU's UUID) in {spec}"
            );
        }
    }
    Ok(())
}

/// Nothing a component tried was refused: the chart's RBAC covers every call they make (a
/// missing verb shows up as a logged 403 even where the component recovers).
fn nothing_refused(cluster: &Cluster) -> Result<()> {
    for name in [
        "das-plugin-n0",
        "das-plugin-n1",
        "das-controller",
        "das-webhook",
    ] {
        let log = std::fs::read_to_string(cluster.log_of(name))?;
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
            .collect();
        ensure!(refused.is_empty(), "{name} was refused: {refused:#?}");
    }
    Ok(())
}

/// The MPS example's two pods hold one claim, whose CDI spec gives its containers the MPS
/// daemon's pipe directory (docs/design.md §7, "MPS on a slice").
async fn mps_example_shares_one_slice(
    specs: &[serde_json::Value],
    claims: &Api<ResourceClaim>,
) -> Result<()> {
    let claim = claims.get(MPS_CLAIM).await?;
    let reserved = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map_or(0, Vec::len);
    ensure!(
        reserved == 2,
        "{MPS_CLAIM} is reserved for {reserved} pods, not 2"
    );
    let uid = claim.metadata.uid.clone().context("claim UID")?;
    let ids = crate::das::claim_device_ids(specs, std::slice::from_ref(&uid));
    let view = crate::das::resolve_cdi_devices(specs, &ids)?;
    ensure!(
        view.env.get("CUDA_MPS_PIPE_DIRECTORY").map(String::as_str) == Some("/tmp/nvidia-mps"),
        "{MPS_CLAIM}'s CDI devices give no MPS pipe directory: {:?}",
        view.env
    );
    Ok(())
}

/// The two shares of [`SHARES_EXAMPLE`] hold one device, with distinct shareIDs, and each
/// claim's CDI devices give the slice's one MIG UUID, the MPS pipe directory and the share's own
/// active thread percentage (1 and 2 of 4 shares: 25 and 50). das-webhook gave each claim the
/// selector that keeps the slice in the claims' namespace, and the node publishes that namespace
/// on the device (docs/design.md §7, "Shares are a tenant's own").
async fn shares_hold_one_slice(
    specs: &[serde_json::Value],
    claims: &Api<ResourceClaim>,
) -> Result<()> {
    let mut seen = Vec::new();
    for (name, percent) in SHARE_PODS.iter().zip(["25", "50"]) {
        let claim = claims.get(name).await?;
        let selectors = crate::tenants::selectors(&claim);
        ensure!(
            selectors == [das_api::share_namespace_selector("default")],
            "{name} was admitted without das-webhook's namespace selector: {selectors:?}"
        );
        let result = das_api::claim_status::our_results(&claim)
            .next()
            .cloned()
            .with_context(|| format!("{name} is not allocated"))?;
        let uid = claim.metadata.uid.clone().context("claim UID")?;
        let ids = crate::das::claim_device_ids(specs, std::slice::from_ref(&uid));
        let view = crate::das::resolve_cdi_devices(specs, &ids)?;
        let env = |k: &str| view.env.get(k).map(String::as_str);
        ensure!(
            env("CUDA_MPS_PIPE_DIRECTORY") == Some("/tmp/nvidia-mps")
                && env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == Some(percent),
            "{name}'s CDI devices lack its share's MPS limits: {:?}",
            view.env
        );
        seen.push((result, view.mig_uuids()));
    }
    let [(a, migs_a), (b, migs_b)] = seen.as_slice() else {
        bail!("two shares expected");
    };
    ensure!(
        a.device == b.device && a.share_id.is_some() && a.share_id != b.share_id,
        "the shares are not two shares of one device: {a:?} {b:?}"
    );
    ensure!(
        migs_a.len() == 1 && migs_a == migs_b,
        "the shares got different slices: {migs_a:?} {migs_b:?}"
    );
    let client = claims.clone().into_client();
    crate::tenants::wait_share_namespace(&client, &a.pool, &a.device, Some("default")).await
}

/// The whole-GPU pod holds a whole H100 of n1 (its AllocationClaim: profile `gpu`, every memory
/// slice), and the emulated GPU's MIG mode is off: DAS switched it for the pod.
async fn whole_gpu_beside_the_slices(
    cluster: &Cluster,
    allocs: &Api<AllocationClaim>,
) -> Result<()> {
    let list = allocs.list(&Default::default()).await?.items;
    let held: Vec<&AllocationClaim> = list
        .iter()
        .filter(|a| a.spec.pod_ref.as_ref().map(|p| p.name.as_str()) == Some(WHOLE_GPU_POD))
        .collect();
    let [a] = held.as_slice() else {
        bail!("{WHOLE_GPU_POD} has {} AllocationClaims", held.len());
    };
    let spec = &a.spec;
    ensure!(
        spec.profile == das_api::WHOLE_GPU_PROFILE
            && spec.nodename == "n1"
            && spec.mig_placement.start == 0
            && spec.mig_placement.size == 8,
        "{WHOLE_GPU_POD} does not hold a whole H100 of n1: {spec:?}"
    );
    let state = crate::das::emulated_state(cluster.node("n1"))?;
    let gpu = state["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["uuid"] == spec.gpu_uuid.as_str())
        .with_context(|| format!("no GPU {} in n1's emulated state {state}", spec.gpu_uuid))?;
    ensure!(
        gpu["migEnabled"] == false,
        "DAS did not switch MIG mode off for {WHOLE_GPU_POD}: {gpu}"
    );
    Ok(())
}
