//! The invariants of a converged cluster ([`check_invariants`]), checked against the emulated
//! GPUs' state, the plugins' checkpoints and CDI specs, and the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use das_api::allocation::AllocationClaim;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::cluster::NodeInfo;
use crate::das::{PluginDirs, emulated_state, load_specs};
use crate::workload::NS;

/// Polls [`check_invariants`] until they hold or `limit` passes; the violations of the last
/// check on failure.
pub async fn converge(
    client: &Client,
    nodes: &[NodeInfo],
    limit: Duration,
) -> Result<(), Vec<String>> {
    let t0 = Instant::now();
    loop {
        let v = match check_invariants(client, nodes).await {
            Ok(v) => v,
            Err(e) => vec![format!("checking failed: {e:#}")],
        };
        if v.is_empty() {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(v);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A published device: node, GPU index, placement start and size.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Placed {
    node: String,
    gpu: i64,
    start: i64,
    size: i64,
}

fn int_attr(d: &k8s_openapi::api::resource::v1::Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

/// Every published device of our driver: (node, device name) → where it is.
async fn published(client: &Client) -> Result<BTreeMap<(String, String), Placed>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.driver={}", das_api::DRIVER_NAME));
    let mut out = BTreeMap::new();
    for s in api.list(&lp).await?.items {
        let node = s.spec.node_name.clone().unwrap_or_default();
        for d in s.spec.devices.iter().flatten() {
            let (Some(gpu), Some(start), Some(size)) = (
                int_attr(d, "gpuIndex"),
                int_attr(d, "placementStart"),
                int_attr(d, "placementSize"),
            ) else {
                continue;
            };
            out.insert(
                (node.clone(), d.name.clone()),
                Placed {
                    node: node.clone(),
                    gpu,
                    start,
                    size,
                },
            );
        }
    }
    Ok(out)
}

/// The invariants of a converged cluster (empty when they all hold):
/// 1. no live slice without an allocated claim (a DAS-created slice whose placement no
///    allocated claim on that node holds);
/// 2. no allocated claim reserved by a running pod without its slice;
/// 3. no overlapping slices on a GPU;
/// 4. no AllocationClaim without its claim and device allocated;
/// 5. every pod Running, or Pending with the scheduler's reason (none stuck after scheduling);
/// 6. no CDI spec of a claim that is gone or not allocated on that node;
/// 7. plugin checkpoints consistent: no half-done or releasing record, every prepared MIG
///    device's slice live;
/// 8. no slice on a GPU a prepared claim holds whole;
/// 9. every GPU's MIG mode is what is prepared on it: on while a slice exists on it or a record
///    holds one, off while a prepared claim holds it whole, and no change left pending a reset
///    ([`mig_mode_violations`]).
pub async fn check_invariants(client: &Client, nodes: &[NodeInfo]) -> Result<Vec<String>> {
    let seen = Seen::read(client).await?;
    let mut v = Vec::new();
    for node in nodes {
        v.extend(node_violations(&seen, node)?);
    }
    v.extend(allocation_claim_violations(&seen));
    v.extend(pod_violations(&seen.pods));
    Ok(v)
}

/// What the API server has, read once per check.
struct Seen {
    /// Every published device of our driver.
    devices: BTreeMap<(String, String), Placed>,
    claims: Vec<ResourceClaim>,
    pods: Vec<Pod>,
    allocs: Vec<AllocationClaim>,
    /// Allocated devices of our driver: (node, device) → the UIDs of the claims holding it
    /// (one, or every share of a shareable device).
    allocated: BTreeMap<(String, String), BTreeSet<String>>,
    /// The UIDs of the running pods.
    running: BTreeSet<String>,
}

impl Seen {
    async fn read(client: &Client) -> Result<Self> {
        let devices = published(client).await?;
        let claims: Vec<ResourceClaim> = Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let pods: Vec<Pod> = Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let allocs: Vec<AllocationClaim> = Api::<AllocationClaim>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let mut allocated: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for c in &claims {
            let uid = c.metadata.uid.clone().unwrap_or_default();
            for r in das_api::claim_status::our_results(c) {
                allocated
                    .entry((r.pool.clone(), r.device.clone()))
                    .or_default()
                    .insert(uid.clone());
            }
        }
        let running: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        Ok(Seen {
            devices,
            claims,
            pods,
            allocs,
            allocated,
            running,
        })
    }
}

/// A live slice on a node: where it is published, its MIG UUID, whether DAS created it.
type Live = (Placed, String, bool);

/// Invariants 1, 3, 2, 6, 7, 8 and 9 on `node`.
fn node_violations(seen: &Seen, node: &NodeInfo) -> Result<Vec<String>> {
    let state = emulated_state(node)?;
    let mut v = Vec::new();
    let live = live_slices(seen, node, &state, &mut v);
    v.extend(overlaps(&node.name, &live));
    v.extend(unserved_claims(seen, &node.name, &live));
    let dirs = PluginDirs::of(node);
    v.extend(stale_specs(seen, &node.name, &load_specs(&dirs.cdi)?));
    let cp: Value = match std::fs::read(dirs.state.join("checkpoint.json")) {
        Ok(b) => serde_json::from_slice(&b).context("checkpoint")?,
        Err(_) => json!({"claims": {}}),
    };
    v.extend(checkpoint_violations(&node.name, &cp, &live));
    // 8 and 9.
    v.extend(mig_mode_violations(&node.name, &state, &cp));
    Ok(v)
}

/// The live slices of `node`'s emulated GPUs (`state`), each a published device; 1 (and a
/// slice that is no published device) into `v`.
fn live_slices(seen: &Seen, node: &NodeInfo, state: &Value, v: &mut Vec<String>) -> Vec<Live> {
    let mut live = Vec::new();
    for g in state["gpus"].as_array().into_iter().flatten() {
        let gpu = g["index"].as_i64().unwrap_or_default();
        for i in g["instances"].as_array().into_iter().flatten() {
            let start = i["start"].as_i64().unwrap_or_default();
            let profile = i["profile"].as_str().unwrap_or_default();
            // The device of that placement, as the plugin names and publishes it.
            let device = format!("gpu-{gpu}-mig-{}-{start}", profile.replace(['.', '+'], "-"));
            let dev = seen.devices.get_key_value(&(node.name.clone(), device));
            let Some(((_, name), placed)) = dev else {
                v.push(format!(
                    "{}: slice {profile} at {start} on GPU {gpu} is no published device",
                    node.name
                ));
                continue;
            };
            let mig = i["migUuid"].as_str().unwrap_or_default().to_string();
            let ours = i["createdByDas"].as_bool().unwrap_or(true);
            // The placement's exclusive device, or its shareable twin, is allocated.
            let held = |d: String| seen.allocated.contains_key(&(node.name.clone(), d));
            if ours && !held(name.clone()) && !held(format!("{name}-shared")) {
                v.push(format!(
                    "1: {}: live slice {mig} ({name}) without an allocated claim",
                    node.name
                ));
            }
            live.push((placed.clone(), mig, ours));
        }
    }
    live
}

/// 3: slices that overlap on a GPU.
fn overlaps(node: &str, live: &[Live]) -> Vec<String> {
    let mut v = Vec::new();
    for (i, (a, ma, _)) in live.iter().enumerate() {
        for (b, mb, _) in &live[i + 1..] {
            if a.gpu == b.gpu && a.start < b.start + b.size && b.start < a.start + a.size {
                v.push(format!(
                    "3: {node}: slices {ma} and {mb} overlap on GPU {}",
                    a.gpu
                ));
            }
        }
    }
    v
}

/// 2: claims reserved by a running pod whose slice on `node` is not live.
fn unserved_claims(seen: &Seen, node: &str, live: &[Live]) -> Vec<String> {
    let mut v = Vec::new();
    for c in &seen.claims {
        let reserved_running = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .any(|r| seen.running.contains(&r.uid));
        if !reserved_running {
            continue;
        }
        for ((n, d), uids) in &seen.allocated {
            let held = c.metadata.uid.as_ref().is_some_and(|u| uids.contains(u));
            if n != node || !held {
                continue;
            }
            let Some(p) = seen.devices.get(&(n.clone(), d.clone())) else {
                continue;
            };
            if !live
                .iter()
                .any(|(l, _, _)| l.gpu == p.gpu && l.start == p.start)
            {
                v.push(format!(
                    "2: {node}: claim {} runs without its slice {d}",
                    c.metadata.name.clone().unwrap_or_default()
                ));
            }
        }
    }
    v
}

/// 6: CDI specs (`specs`, of `node`) of claims not allocated there.
fn stale_specs(seen: &Seen, node: &str, specs: &[Value]) -> Vec<String> {
    let on_node: BTreeSet<&String> = seen
        .allocated
        .iter()
        .filter(|((n, _), _)| n == node)
        .flat_map(|(_, uids)| uids)
        .collect();
    let mut v = Vec::new();
    for spec in specs {
        let name = spec["devices"][0]["name"].as_str().unwrap_or_default();
        let uid: String = name.chars().take(36).collect();
        if !on_node.contains(&uid) {
            v.push(format!(
                "6: {node}: CDI spec of claim {uid}, which is not allocated here"
            ));
        }
    }
    v
}

/// 7: records of checkpoint `cp` that are not at rest, or name a slice that is not live.
fn checkpoint_violations(node: &str, cp: &Value, live: &[Live]) -> Vec<String> {
    let migs: BTreeSet<&str> = live.iter().map(|(_, m, _)| m.as_str()).collect();
    let mut v = Vec::new();
    for (uid, r) in cp["claims"].as_object().into_iter().flatten() {
        match r["state"].as_str() {
            Some("PrepareCompleted") => {
                for d in r["devices"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|d| !is_whole(d))
                {
                    // Version 2 records the instance; version 1 had the fields flat.
                    let m = d["instance"]["migUUID"]
                        .as_str()
                        .or_else(|| d["migUUID"].as_str())
                        .unwrap_or_default();
                    if !migs.contains(m) {
                        v.push(format!(
                            "7: {node}: claim {uid} records {m}, which is not live"
                        ));
                    }
                }
            }
            other => v.push(format!(
                "7: {node}: claim {uid} is {other:?} with nothing in flight"
            )),
        }
    }
    v
}

/// 4: AllocationClaims without their claim and device allocated.
fn allocation_claim_violations(seen: &Seen) -> Vec<String> {
    let mut v = Vec::new();
    for a in &seen.allocs {
        let r = &a.spec.resource_claim_ref;
        let ok = seen
            .allocated
            .get(&(a.spec.pool.clone(), a.spec.device.clone()))
            .is_some_and(|uids| uids.contains(&r.uid));
        if !ok {
            v.push(format!(
                "4: AllocationClaim {} without a live allocation of {}",
                a.metadata.name.clone().unwrap_or_default(),
                a.spec.device
            ));
        }
    }
    v
}

/// 5: the workload's pods neither running nor pending with the scheduler's reason.
fn pod_violations(pods: &[Pod]) -> Vec<String> {
    let mut v = Vec::new();
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() || p.metadata.namespace.as_deref() != Some(NS) {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let status = p.status.clone().unwrap_or_default();
        let phase = status.phase.as_deref().unwrap_or("");
        if phase == "Running" {
            continue;
        }
        let stated = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.message.is_some());
        if !stated {
            v.push(format!(
                "5: pod {name} is {phase:?} without a scheduler reason"
            ));
        }
    }
    v
}

/// Whether a checkpoint device is a whole GPU (kind `gpu`, profile `gpu`, no instance).
fn is_whole(d: &Value) -> bool {
    d["kind"].as_str() == Some(das_api::attributes::TYPE_GPU)
        || d["profile"].as_str() == Some(das_api::WHOLE_GPU_PROFILE)
}

/// Invariants 8 and 9 on node `node`, from its emulated GPUs' `state` (`migEnabled`, absent when
/// on; `migPending`, present while a change waits for a reset; `instances`) and its plugin's
/// checkpoint `cp`.
pub fn mig_mode_violations(node: &str, state: &Value, cp: &Value) -> Vec<String> {
    let mut v = Vec::new();
    let records: Vec<(&String, &Value)> = cp["claims"].as_object().into_iter().flatten().collect();
    for g in state["gpus"].as_array().into_iter().flatten() {
        let gpu = g["index"].as_u64().unwrap_or_default();
        let mig_on = g["migEnabled"].as_bool().unwrap_or(true);
        let slices = g["instances"].as_array().map_or(0, Vec::len);
        let on_gpu = |d: &&Value| d["gpuIndex"].as_u64() == Some(gpu);
        let mut whole = Vec::new();
        let mut recorded = Vec::new();
        for (uid, r) in &records {
            for d in r["devices"].as_array().into_iter().flatten().filter(on_gpu) {
                if is_whole(d) && r["state"].as_str() == Some("PrepareCompleted") {
                    whole.push(uid.as_str());
                } else if !is_whole(d) && !d["instance"].is_null() {
                    recorded.push(uid.as_str());
                }
            }
        }
        if let Some(uid) = whole.first()
            && slices > 0
        {
            v.push(format!(
                "8: {node}: {slices} slice(s) on GPU {gpu}, which claim {uid} holds whole"
            ));
        }
        if !mig_on && (slices > 0 || !recorded.is_empty()) {
            v.push(format!(
                "9: {node}: GPU {gpu} has MIG mode off with {slices} slice(s) on it, recorded by {recorded:?}"
            ));
        }
        if let Some(uid) = whole.first().filter(|_| mig_on) {
            v.push(format!(
                "9: {node}: GPU {gpu} has MIG mode on while claim {uid} holds it whole"
            ));
        }
        if let Some(pending) = g["migPending"].as_bool() {
            v.push(format!(
                "9: {node}: GPU {gpu} has a change to MIG mode {} pending a reset",
                if pending { "on" } else { "off" }
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::mig_mode_violations;

    fn whole_record(state: &str) -> serde_json::Value {
        json!({"state": state, "devices": [{"kind": "gpu", "gpuIndex": 1, "profile": "gpu",
            "placementStart": 0, "placementSize": 8}]})
    }

    #[test]
    fn a_gpu_in_the_mode_of_what_it_holds_is_fine() {
        let state = json!({"gpus": [
            {"index": 0, "instances": [{"profile": "1g.10gb", "start": 0}]},
            {"index": 1, "migEnabled": false, "instances": []},
        ]});
        let cp = json!({"claims": {
            "a": {"state": "PrepareCompleted", "devices": [{"gpuIndex": 0, "profile": "1g.10gb",
                "instance": {"giId": 1, "ciId": 0, "migUUID": "MIG-a"}}]},
            "b": whole_record("PrepareCompleted"),
        }});
        assert_eq!(mig_mode_violations("n1", &state, &cp), Vec::<String>::new());
        // Nothing prepared: either mode is fine.
        assert!(mig_mode_violations("n1", &state, &json!({})).is_empty());
    }

    #[test]
    fn a_slice_under_a_whole_gpu_a_wrong_mode_and_a_pending_change_are_caught() {
        let state = json!({"gpus": [
            {"index": 0, "migEnabled": false, "instances": []},
            {"index": 1, "migPending": false, "instances": [{"profile": "1g.10gb", "start": 0}]},
        ]});
        let cp = json!({"claims": {
            "a": {"state": "Releasing", "devices": [{"gpuIndex": 0, "profile": "1g.10gb",
                "instance": {"giId": 1, "ciId": 0, "migUUID": "MIG-a"}}]},
            "b": whole_record("PrepareCompleted"),
        }});
        let v = mig_mode_violations("n1", &state, &cp);
        for want in [
            "8: n1: 1 slice(s) on GPU 1, which claim b holds whole",
            "9: n1: GPU 0 has MIG mode off with 0 slice(s) on it, recorded by [\"a\"]",
            "9: n1: GPU 1 has MIG mode on while claim b holds it whole",
            "9: n1: GPU 1 has a change to MIG mode off pending a reset",
        ] {
            assert!(v.iter().any(|x| x == want), "{want} not in {v:#?}");
        }
        // A whole GPU not yet prepared holds nothing.
        let cp = json!({"claims": {"b": whole_record("PrepareStarted")}});
        let state = json!({"gpus": [{"index": 1, "instances": []}]});
        assert!(mig_mode_violations("n1", &state, &cp).is_empty());
    }
}
