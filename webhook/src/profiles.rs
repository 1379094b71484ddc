//! What the cluster offers: one DeviceClass `<profile>.mig.das.com` per profile, and the devices
//! DAS publishes (for how many slices of a profile one node can hold), listed from the API
//! server and cached for a short time; with `--translate-whole-gpus` also the DeviceClass
//! `gpu.das.com` and how many whole GPUs one node publishes.
//!
//! Memory: the cache holds only the answer ([`Offered`]: the profile names and one count per
//! profile). ResourceSlices are listed [`SLICE_PAGE_SIZE`] at a time, each page decoded straight
//! into the four attributes [`max_per_node`] reads ([`PlacementSummary`]) and dropped before the
//! next is asked for; no whole ResourceSlice is ever built. The cache's lock is taken only to
//! read or swap the answer, never across an API call.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Client;
use kube::Resource;
use kube::api::{Api, ListParams};
use kube::core::{ObjectList, Request};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::translate::{Offered, WholeGpus, offered_profile, offers};

/// ResourceSlices per list page. A DAS slice of 64 devices is about 50 kB of JSON (more with
/// managed fields): a page is a few MB of text at most, whatever the cluster's size.
pub const SLICE_PAGE_SIZE: u32 = 50;

/// Where [`Profiles`] gets what is offered: the API server ([`ApiSource`]), or a stand-in in
/// tests.
pub trait Source: Send + Sync {
    /// Lists what is offered now. [`Profiles`] holds none of its locks meanwhile.
    fn fetch(&self) -> impl Future<Output = Result<Offered>> + Send;
}

/// Cached [`Offered`]; refreshed when older than the TTL, and at most once per `min_refresh`
/// when a pod asks for a profile the cache does not know (a class just created).
///
/// An answer older than the TTL but younger than twice the TTL that knows every wanted profile
/// is served at once while a refresh runs in the background: with 200,000 published devices a
/// listing takes seconds, longer than an admission (or a 1 s readiness probe) should wait.
/// Only a call the cache cannot serve (no answer, an unknown profile, or an answer older than
/// twice the TTL) waits.
///
/// One refresh runs at a time: a caller that needs one while another runs waits for it and
/// takes its answer when that was fetched after the caller asked (so at most one listing is in
/// memory); a caller the cached answer serves never waits for a refresh.
pub struct Profiles<S = ApiSource> {
    source: S,
    /// Whether `nvidia.com/gpu` is translated (`--translate-whole-gpus`): when not, answers
    /// carry no [`Offered::whole_gpus`].
    whole_gpus: bool,
    ttl: Duration,
    min_refresh: Duration,
    /// The last answer. Locked only to read or replace it.
    cache: Mutex<Option<Cached>>,
    /// Held by the refresh in progress (not by readers of `cache`).
    refreshing: Arc<tokio::sync::Mutex<()>>,
}

/// Whether the cached answer serves a call.
enum Serves {
    /// Fresh enough: answer with it.
    Yes(Arc<Offered>),
    /// Past the TTL but within twice the TTL: answer with it and refresh in the background.
    Stale(Arc<Offered>),
    /// Wait for a refresh.
    No,
}

/// An answer and when it was fetched.
struct Cached {
    /// When its fetch started: it is at least as new as a call that asked before then.
    started: Instant,
    /// When its fetch ended: its age, for the TTL.
    at: Instant,
    offered: Arc<Offered>,
}

impl Profiles {
    /// Answers from the API server through `client`, cached for `ttl`; a profile the cache does
    /// not know refreshes it at most once a second.
    pub fn new(client: Client, ttl: Duration) -> Self {
        Self::with_source(ApiSource::new(client), ttl, Duration::from_secs(1).min(ttl))
    }
}

impl<S: Source + 'static> Profiles<S> {
    /// Answers from `source`, cached for `ttl`; a profile the cache does not know refreshes it
    /// at most once per `min_refresh`.
    pub fn with_source(source: S, ttl: Duration, min_refresh: Duration) -> Self {
        Self {
            source,
            whole_gpus: false,
            ttl,
            min_refresh,
            cache: Mutex::new(None),
            refreshing: Arc::default(),
        }
    }

    /// The same, translating `nvidia.com/gpu` into whole GPUs when `on`
    /// (`--translate-whole-gpus`).
    pub fn translating_whole_gpus(mut self, on: bool) -> Self {
        self.whole_gpus = on;
        self
    }

    /// Whether `nvidia.com/gpu` is translated.
    pub fn translates_whole_gpus(&self) -> bool {
        self.whole_gpus
    }

    /// A fresh answer from the source, without whole GPUs unless they are translated.
    async fn fetch(&self) -> Result<Offered> {
        let mut offered = self.source.fetch().await?;
        if !self.whole_gpus {
            offered.whole_gpus = None;
        }
        Ok(offered)
    }

    /// What is offered, such that every one of `wanted` ([`crate::translate::wanted`]) is known
    /// if the cluster offers it.
    pub async fn get(self: &Arc<Self>, wanted: &[String]) -> Result<Arc<Offered>> {
        let asked = Instant::now();
        match self.cached(wanted, None) {
            Serves::Yes(offered) => return Ok(offered),
            Serves::Stale(offered) => {
                self.refresh_in_background();
                return Ok(offered);
            }
            Serves::No => {}
        }
        let _refresh = self.refreshing.lock().await;
        // A refresh that ran while this call waited may have answered it.
        if let Serves::Yes(offered) = self.cached(wanted, Some(asked)) {
            return Ok(offered);
        }
        let started = Instant::now();
        let offered = Arc::new(self.fetch().await?);
        self.swap(started, offered.clone());
        Ok(offered)
    }

    /// Can the API server be reached and the classes be listed (readiness)?
    pub async fn check(self: &Arc<Self>) -> Result<()> {
        self.get(&[]).await.map(|_| ())
    }

    /// Starts a refresh on a task of its own unless one is running; its failure keeps the
    /// cached answer (a later call past twice the TTL then waits for a refresh of its own).
    fn refresh_in_background(self: &Arc<Self>) {
        let Ok(held) = self.refreshing.clone().try_lock_owned() else {
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            let _held = held;
            let started = Instant::now();
            match this.fetch().await {
                Ok(offered) => this.swap(started, Arc::new(offered)),
                Err(e) => {
                    tracing::warn!(error = %e, "refreshing the offered profiles failed; the cached answer stays")
                }
            }
        });
    }

    /// The cached answer if it serves a call for `wanted` (that asked at `asked`, when it
    /// waited for a refresh): fresh and knowing every wanted profile, or fresh and refreshed
    /// less than `min_refresh` ago, or fetched after the call asked.
    fn cached(&self, wanted: &[String], asked: Option<Instant>) -> Serves {
        let cache = self.cache.lock().expect("not poisoned");
        let Some(c) = cache.as_ref() else {
            return Serves::No;
        };
        let age = c.at.elapsed();
        let covers = || wanted.iter().all(|w| offers(&c.offered, w));
        let newer_than_the_call = asked.is_some_and(|a| c.started >= a);
        if newer_than_the_call || (age < self.ttl && (age < self.min_refresh || covers())) {
            Serves::Yes(c.offered.clone())
        } else if asked.is_none() && age < self.ttl * 2 && covers() {
            Serves::Stale(c.offered.clone())
        } else {
            Serves::No
        }
    }

    /// Replaces the cached answer.
    fn swap(&self, started: Instant, offered: Arc<Offered>) {
        let fresh = Cached {
            started,
            at: Instant::now(),
            offered,
        };
        // The old answer is dropped after the lock is released.
        let _old = self.cache.lock().expect("not poisoned").replace(fresh);
    }
}

/// The API server: DeviceClasses (one list) and the DAS driver's ResourceSlices (in pages).
pub struct ApiSource {
    client: Client,
    classes: Api<DeviceClass>,
    page_size: u32,
}

impl ApiSource {
    /// Lists through `client`, ResourceSlices [`SLICE_PAGE_SIZE`] at a time.
    pub fn new(client: Client) -> Self {
        Self {
            classes: Api::all(client.clone()),
            client,
            page_size: SLICE_PAGE_SIZE,
        }
    }

    /// The placements of every device of the DAS driver, listed `page_size` slices at a time;
    /// each page is folded into the summary and dropped before the next is asked for. A list
    /// whose continue token expired (410 Gone, after etcd compacted the revision it started
    /// from) starts over once.
    pub async fn placements(&self) -> Result<PlacementSummary> {
        let first = ListParams::default()
            .fields(&format!("spec.driver={}", das_api::DRIVER_NAME))
            .limit(self.page_size);
        let request = Request::new(ResourceSlice::url_path(&(), None));
        let mut started_over = false;
        let mut summary = PlacementSummary::default();
        let mut lp = first.clone();
        loop {
            let list = request
                .list(&lp)
                .map_err(|e| Error::ListSlices(kube::Error::BuildRequest(e)))?;
            let page: ObjectList<SlicePlacements> = match self.client.request(list).await {
                Ok(page) => page,
                Err(kube::Error::Api(e))
                    if e.code == 410 && lp.continue_token.is_some() && !started_over =>
                {
                    tracing::info!("ResourceSlice list expired between pages; listing again");
                    started_over = true;
                    summary = PlacementSummary::default();
                    lp = first.clone();
                    continue;
                }
                Err(e) => return Err(Error::ListSlices(e)),
            };
            summary.add_page(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => return Ok(summary),
            }
        }
    }
}

impl Source for ApiSource {
    async fn fetch(&self) -> Result<Offered> {
        let classes = self
            .classes
            .list(&ListParams::default())
            .await
            .map_err(Error::ListClasses)?;
        let mut profiles: Vec<String> = classes
            .items
            .iter()
            // A deprecated alias class is reached through its canonical name (with a warning).
            .filter(|c| !is_deprecated_alias(c))
            .filter_map(|c| offered_profile(c.metadata.name.as_deref()?))
            .collect();
        profiles.sort();
        let whole_gpu_class = classes
            .items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(das_api::DEVICE_CLASS_WHOLE_GPU));
        drop(classes);
        let placements = self.placements().await?;
        Ok(Offered {
            profiles,
            whole_gpus: Some(WholeGpus {
                class: whole_gpu_class,
                max_per_node: placements.max_whole_gpus_per_node(),
            }),
            max_per_node: placements.max_per_node(),
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

/// The part of a ResourceSlice's JSON that [`max_per_node`] reads: `spec.nodeName` and, of each
/// device, the attributes `type`, `profile`, `gpuIndex`, `placementStart` and `placementSize`.
/// Serde skips everything else without building it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlicePlacements {
    #[serde(default)]
    spec: SpecPlacements,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecPlacements {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    devices: Option<Vec<DevicePlacement>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct DevicePlacement {
    #[serde(default)]
    attributes: Option<PlacementAttributes>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct PlacementAttributes {
    #[serde(default, rename = "type")]
    type_: Option<Attribute>,
    #[serde(default)]
    profile: Option<Attribute>,
    #[serde(default, rename = "gpuIndex")]
    gpu_index: Option<Attribute>,
    #[serde(default, rename = "placementStart")]
    placement_start: Option<Attribute>,
    #[serde(default, rename = "placementSize")]
    placement_size: Option<Attribute>,
}

/// A device attribute's `int` and `string` (its `bool` and `version` are never read).
#[derive(Debug, Clone, Default, Deserialize)]
struct Attribute {
    #[serde(default)]
    int: Option<i64>,
    #[serde(default)]
    string: Option<String>,
}

/// What [`max_per_node`] needs of the published devices: for each GPU of each node, the profile
/// (as in class names) and placement of each device, about 24 bytes a device, and the GPUs
/// published whole (`type: gpu`, docs/design.md §7). Built from list pages ([`Self::add_page`])
/// or decoded slices ([`Self::add_slice`]); the same devices give the same summary however they
/// are split into pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementSummary {
    /// Profiles as in class names (NVIDIA's names, `+` → `.`); a device refers to one by index.
    profiles: Vec<String>,
    /// Node → GPU index → each device's placement, in listing order.
    nodes: HashMap<String, BTreeMap<i64, Vec<Placement>>>,
    /// Node → indices of its GPUs published as whole-GPU devices.
    whole_gpus: HashMap<String, BTreeSet<i64>>,
}

/// Where a device sits: memory slices `[start, end)`, and its profile (an index into
/// [`PlacementSummary::profiles`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Placement {
    profile: u32,
    end: i64,
    start: i64,
}

impl PlacementSummary {
    /// Adds the devices of one list page.
    pub fn add_page(&mut self, slices: impl IntoIterator<Item = SlicePlacements>) {
        for s in slices {
            let node = s.spec.node_name.unwrap_or_default();
            for d in s.spec.devices.into_iter().flatten() {
                let Some(a) = d.attributes else { continue };
                let int = |a: Option<Attribute>| a.and_then(|a| a.int);
                if a.type_.and_then(|t| t.string).as_deref() == Some(das_api::attributes::TYPE_GPU)
                {
                    if let Some(gpu) = int(a.gpu_index) {
                        self.add_whole_gpu(&node, gpu);
                    }
                    continue;
                }
                if let (Some(profile), Some(gpu), Some(start), Some(size)) = (
                    a.profile.and_then(|a| a.string),
                    int(a.gpu_index),
                    int(a.placement_start),
                    int(a.placement_size),
                ) {
                    self.add(&node, &profile, gpu, start, size);
                }
            }
        }
    }

    /// Adds the devices of a decoded ResourceSlice.
    pub fn add_slice(&mut self, s: &ResourceSlice) {
        let node = s.spec.node_name.as_deref().unwrap_or_default();
        for d in s.spec.devices.iter().flatten() {
            let Some(attrs) = d.attributes.as_ref() else {
                continue;
            };
            let int = |k: &str| attrs.get(k).and_then(|a| a.int);
            let kind = attrs.get(das_api::attributes::TYPE);
            if kind.and_then(|a| a.string.as_deref()) == Some(das_api::attributes::TYPE_GPU) {
                if let Some(gpu) = int("gpuIndex") {
                    self.add_whole_gpu(node, gpu);
                }
                continue;
            }
            if let (Some(profile), Some(gpu), Some(start), Some(size)) = (
                attrs.get("profile").and_then(|a| a.string.as_deref()),
                int("gpuIndex"),
                int("placementStart"),
                int("placementSize"),
            ) {
                self.add(node, profile, gpu, start, size);
            }
        }
    }

    /// Adds one device: `profile` (as NVML names it) at `size` memory slices from `start` on GPU
    /// `gpu` of `node`.
    fn add(&mut self, node: &str, profile: &str, gpu: i64, start: i64, size: i64) {
        let legacy = das_api::legacy_profile_name(profile);
        let id = match self.profiles.iter().position(|p| *p == legacy) {
            Some(i) => i,
            None => {
                self.profiles.push(legacy);
                self.profiles.len() - 1
            }
        };
        let id = u32::try_from(id).expect("fewer than 2^32 profiles");
        let gpus = match self.nodes.get_mut(node) {
            Some(g) => g,
            None => self.nodes.entry(node.to_string()).or_default(),
        };
        gpus.entry(gpu).or_default().push(Placement {
            profile: id,
            end: start.saturating_add(size),
            start,
        });
    }

    /// Adds whole GPU `gpu` of `node`.
    fn add_whole_gpu(&mut self, node: &str, gpu: i64) {
        match self.whole_gpus.get_mut(node) {
            Some(g) => g.insert(gpu),
            None => self
                .whole_gpus
                .entry(node.to_string())
                .or_default()
                .insert(gpu),
        };
    }

    /// Number of devices summarised (MIG placements and whole GPUs).
    pub fn devices(&self) -> usize {
        let placements: usize = self
            .nodes
            .values()
            .flat_map(|g| g.values())
            .map(Vec::len)
            .sum();
        placements + self.whole_gpus.values().map(BTreeSet::len).sum::<usize>()
    }

    /// The most whole GPUs one node publishes (the largest node); `None` when no node publishes
    /// one.
    pub fn max_whole_gpus_per_node(&self) -> Option<u32> {
        self.whole_gpus
            .values()
            .map(|g| u32::try_from(g.len()).unwrap_or(u32::MAX))
            .max()
    }

    /// The most slices of each profile one node can hold at once: per GPU, the most placements
    /// of the profile that do not overlap (earliest-ending first), summed over the node's GPUs;
    /// the largest node counts. Keys are profiles as in class names. An upper bound: a
    /// profile's own instance limit (a single `+me`) is not in the placements.
    pub fn max_per_node(mut self) -> BTreeMap<String, u32> {
        let mut out: BTreeMap<String, u32> = BTreeMap::new();
        let mut per_profile = vec![0u32; self.profiles.len()];
        for gpus in self.nodes.values_mut() {
            per_profile.fill(0);
            for placements in gpus.values_mut() {
                // By profile, then earliest-ending first (the field order).
                placements.sort_unstable();
                let mut last: Option<Placement> = None;
                for &p in placements.iter() {
                    let fits = match last {
                        Some(l) if l.profile == p.profile => p.start >= l.end,
                        _ => true,
                    };
                    if fits {
                        per_profile[p.profile as usize] += 1;
                        last = Some(p);
                    }
                }
            }
            for (id, &n) in per_profile.iter().enumerate().filter(|(_, n)| **n > 0) {
                let e = out.entry(self.profiles[id].clone()).or_default();
                *e = (*e).max(n);
            }
        }
        out
    }
}

/// The most slices of each profile one node can hold at once, from the devices DAS publishes
/// (attributes `profile`, `gpuIndex`, `placementStart`, `placementSize`); see
/// [`PlacementSummary::max_per_node`].
pub fn max_per_node(slices: &[ResourceSlice]) -> BTreeMap<String, u32> {
    let mut summary = PlacementSummary::default();
    for s in slices {
        summary.add_slice(s);
    }
    summary.max_per_node()
}

#[cfg(test)]
mod tests;
