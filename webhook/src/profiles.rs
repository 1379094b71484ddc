//! What the cluster offers: one DeviceClass `<profile>.mig.das.com` per profile, and the devices
//! DAS publishes (for how many slices of a profile one node can hold), listed from the API
//! server and cached for a short time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::Mutex;

use crate::translate::{Offered, offered_profile, resolve_profile};

/// Cached [`Offered`]; refreshed when older than the TTL, and at most once per `min_refresh`
/// when a pod asks for a profile the cache does not know (a class just created).
pub struct Profiles {
    classes: Api<DeviceClass>,
    slices: Api<ResourceSlice>,
    ttl: Duration,
    min_refresh: Duration,
    cache: Mutex<Option<(Instant, Arc<Offered>)>>,
}

impl Profiles {
    pub fn new(client: Client, ttl: Duration) -> Self {
        Self {
            classes: Api::all(client.clone()),
            slices: Api::all(client),
            ttl,
            min_refresh: Duration::from_secs(1).min(ttl),
            cache: Mutex::new(None),
        }
    }

    /// What is offered, such that every one of `wanted` is known if the cluster offers it.
    pub async fn get(&self, wanted: &[String]) -> Result<Arc<Offered>> {
        let mut cache = self.cache.lock().await;
        if let Some((at, offered)) = cache.as_ref() {
            let fresh = at.elapsed() < self.ttl;
            let covers = wanted
                .iter()
                .all(|w| resolve_profile(w, &offered.profiles).is_some());
            if fresh && (covers || at.elapsed() < self.min_refresh) {
                return Ok(offered.clone());
            }
        }
        let offered = Arc::new(self.list().await?);
        *cache = Some((Instant::now(), offered.clone()));
        Ok(offered)
    }

    /// Can the API server be reached and the classes be listed (readiness)?
    pub async fn check(&self) -> Result<()> {
        self.get(&[]).await.map(|_| ())
    }

    async fn list(&self) -> Result<Offered> {
        let classes = self.classes.list(&ListParams::default()).await?;
        let mut profiles: Vec<String> = classes
            .items
            .iter()
            // A deprecated alias class is reached through its canonical name (with a warning).
            .filter(|c| !is_deprecated_alias(c))
            .filter_map(|c| offered_profile(c.metadata.name.as_deref()?))
            .collect();
        profiles.sort();
        let lp = ListParams::default().fields(&format!("spec.driver={}", das_api::DRIVER_NAME));
        let slices = self.slices.list(&lp).await?.items;
        Ok(Offered {
            profiles,
            max_per_node: max_per_node(&slices),
        })
    }
}

/// Label the chart puts on the DeviceClasses of the pre-0.3 spelling (`1g.10gb-me.mig.das.com`):
/// the canonical class they stand for.
pub const DEPRECATED_ALIAS_LABEL: &str = "mig.das.com/deprecated-alias-of";

/// Whether `class` is a deprecated alias of another DAS class.
pub fn is_deprecated_alias(class: &DeviceClass) -> bool {
    class
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DEPRECATED_ALIAS_LABEL))
}

/// The most slices of each profile one node can hold at once, from the devices DAS publishes
/// (attributes `profile`, `gpuIndex`, `placementStart`, `placementSize`): per GPU, the most
/// placements of the profile that do not overlap (earliest-ending first), summed over the node's
/// GPUs; the largest node counts. Keys are profiles as in class names (NVIDIA's names, `+` → `.`). An upper
/// bound: a profile's own instance limit (a single `+me`) is not in the placements.
pub fn max_per_node(slices: &[ResourceSlice]) -> BTreeMap<String, u32> {
    // (node, profile, gpu) → placements (start, end).
    let mut placements: BTreeMap<(String, String, i64), Vec<(i64, i64)>> = BTreeMap::new();
    for s in slices {
        let node = s.spec.node_name.clone().unwrap_or_default();
        for d in s.spec.devices.iter().flatten() {
            let Some(attrs) = d.attributes.as_ref() else {
                continue;
            };
            let int = |k: &str| attrs.get(k).and_then(|a| a.int);
            let (Some(profile), Some(gpu), Some(start), Some(size)) = (
                attrs.get("profile").and_then(|a| a.string.clone()),
                int("gpuIndex"),
                int("placementStart"),
                int("placementSize"),
            ) else {
                continue;
            };
            placements
                .entry((node.clone(), das_api::legacy_profile_name(&profile), gpu))
                .or_default()
                .push((start, start + size));
        }
    }
    let mut per_node: BTreeMap<(String, String), u32> = BTreeMap::new();
    for ((node, profile, _), mut v) in placements {
        v.sort_by_key(|&(start, end)| (end, start));
        let mut end_of_last = i64::MIN;
        let mut n = 0;
        for (start, end) in v {
            if start >= end_of_last {
                n += 1;
                end_of_last = end;
            }
        }
        *per_node.entry((node, profile)).or_default() += n;
    }
    let mut out: BTreeMap<String, u32> = BTreeMap::new();
    for ((_, profile), n) in per_node {
        let e = out.entry(profile).or_default();
        *e = (*e).max(n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn device(gpu: i64, profile: &str, start: i64, size: i64) -> serde_json::Value {
        json!({"name": format!("gpu-{gpu}-{profile}-{start}"), "attributes": {
            "profile": {"string": profile}, "gpuIndex": {"int": gpu},
            "placementStart": {"int": start}, "placementSize": {"int": size}}})
    }

    fn slice(node: &str, devices: Vec<serde_json::Value>) -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-x")},
            "spec": {"driver": "mig.das.com", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices}
        }))
        .unwrap()
    }

    #[test]
    fn capacity_is_the_most_non_overlapping_placements_per_gpu_summed_per_node() {
        // n0: two GPUs with 1g.10gb at 0..7 (size 1) and 2g.20gb at 0, 2, 4 (size 2).
        let mut d = Vec::new();
        for gpu in 0..2 {
            for start in 0..7 {
                d.push(device(gpu, "1g.10gb", start, 1));
            }
            for start in [0, 2, 4] {
                d.push(device(gpu, "2g.20gb", start, 2));
            }
            d.push(device(gpu, "1g.10gb+me", 0, 1));
        }
        // n1: one GPU, a 4g at 0 (size 4) and 4 (size 4 but overlapping 3..7 variant).
        let n1 = vec![device(0, "4g.40gb", 0, 4), device(0, "4g.40gb", 3, 4)];
        let m = max_per_node(&[slice("n0", d), slice("n1", n1)]);
        assert_eq!(m["1g.10gb"], 14);
        assert_eq!(m["2g.20gb"], 6);
        assert_eq!(m["1g.10gb.me"], 2, "keyed by NVIDIA's name");
        assert_eq!(m["4g.40gb"], 1);
    }
}
