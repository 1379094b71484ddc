//! The ResourceSlice publisher of the node plugin: keeps this node's pool of `mig.das.com`
//! slices on the API server equal to the desired slices, the way the upstream Go controller
//! does (kubernetes/dynamic-resource-allocation `resourceslice/resourceslicecontroller.go`;
//! docs/reference/dra.md, "ResourceSlice publishing"; KEP-4815 for counter slices).
//!
//! - Pool: one per node, named after the node; `spec.nodeName` = the node; every slice carries
//!   `resourceSliceCount` = number of desired slices and the pool generation.
//! - Names: `<index hex, ≥5 digits>-mig.das.com-<node>` ([`plan::slice_name`]): deterministic,
//!   and sorted by name in the desired (priority) order, which the 1.36+ allocator follows.
//! - Generation: kept when no slice is new and at most one changes, otherwise bumped and every
//!   slice rewritten ([`plan::decide_generation`]).
//! - Obsolete slices (other pool, lower generation, foreign name, index beyond the count) are
//!   deleted first, with UID and resourceVersion preconditions.
//! - Nothing is written when the stored slices already match ([`plan::spec_key`]).
//! - Dropped fields: after each write the stored spec is compared with the sent one; a
//!   difference (a disabled feature gate, a canonicalized value) is logged once and adopted as
//!   the baseline ([`plan::Adopted`]), so the next publish does not update again.
//! - No silent overlap ([`super::gates`]): before slices with shared counters are published
//!   the first time (and again at most every 5 min), a dry-run create of one of them shows
//!   whether the API server keeps the counters (`DRAPartitionableDevices`), and every write is
//!   checked; while the server drops them the pool is published empty
//!   (devices withdrawn), a Warning event `SharedCountersDropped` on the Node names the gate,
//!   the gauge `das_kubelet_plugin_apiserver_feature_gate_off` is 1, and the probe is repeated
//!   with backoff until the devices can be republished. Dropped device taints
//!   (`DRADeviceTaints`) leave the devices published and post `DeviceTaintsDropped`.
//! - Owner: the Node (`controller: true`), so slices go with the Node.
//! - An empty desired list publishes one empty slice: "empty pool" differs from "no pool".
//!
//! [`Publisher::run`] republishes when someone else changes or deletes our slices (the kubelet
//! wipes a node's slices when it starts and 30 s after a plugin disconnects), when the desired
//! slices change, on a periodic resync, and when the withdrawn devices' next probe is due.
//!
//! The API calls go through [`PublishApi`] ([`KubePublishApi`] in the plugin), so that unit tests
//! can drive the publisher with chosen answers; its behaviour against a real API server is
//! covered by `e2e/tests/plugin_publisher.rs`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::gates::{self, CounterGuard, Notice, Offer, ProbeAnswer, Step};
use super::plan::{self, Adopted, Baseline, Plan, PlanInput};
use crate::metrics::Metrics;
use das_api::DRIVER_NAME;

/// The reporter of the publisher's Node events (the plugin's field manager, as for its other
/// events).
const EVENT_REPORTER: &str = "das-kubelet-plugin";

/// Longest a Node event post may take (best effort; the publish goes on without it).
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The API-server calls of [`Publisher`], behind a trait so unit tests can answer them (the
/// way `claims::api::ClaimApi` is for the request path). Errors are the client's.
#[tonic::async_trait]
pub trait PublishApi: Send + Sync + 'static {
    /// The ResourceSlices matching `field_selector`.
    async fn list(&self, field_selector: &str) -> Result<Vec<ResourceSlice>, kube::Error>;
    /// The Node `name`.
    async fn node(&self, name: &str) -> Result<Node, kube::Error>;
    /// Creates `slice` (with `dry_run`, only as the server would: nothing is stored) and returns
    /// what the server stored or would store.
    async fn create(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, kube::Error>;
    /// Replaces `slice` (by name) and returns what the server stored.
    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, kube::Error>;
    /// Deletes the slice `name` if it still has the `preconditions`.
    async fn delete(&self, name: &str, preconditions: Preconditions) -> Result<(), kube::Error>;
    /// Posts an event about the Node `node` (best effort: a failure is logged, not returned).
    async fn node_event(&self, node: &str, warning: bool, reason: &str, note: &str);
}

/// [`PublishApi`] over a kube client.
pub struct KubePublishApi {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    recorder: Recorder,
}

impl KubePublishApi {
    /// Calls through `client` (built with connect and read timeouts); events are reported as
    /// `das-kubelet-plugin` on `node`.
    pub fn new(client: Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: EVENT_REPORTER.into(),
            instance: Some(node.to_string()),
        };
        Self {
            slices: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
            recorder: Recorder::new(client, reporter),
        }
    }
}

#[tonic::async_trait]
impl PublishApi for KubePublishApi {
    async fn list(&self, field_selector: &str) -> Result<Vec<ResourceSlice>, kube::Error> {
        let lp = ListParams::default().fields(field_selector);
        Ok(self.slices.list(&lp).await?.items)
    }

    async fn node(&self, name: &str) -> Result<Node, kube::Error> {
        self.nodes.get(name).await
    }

    async fn create(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, kube::Error> {
        let pp = PostParams {
            dry_run,
            ..Default::default()
        };
        self.slices.create(&pp, slice).await
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, kube::Error> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        self.slices
            .replace(name, &PostParams::default(), slice)
            .await
    }

    async fn delete(&self, name: &str, preconditions: Preconditions) -> Result<(), kube::Error> {
        let dp = DeleteParams {
            preconditions: Some(preconditions),
            ..Default::default()
        };
        self.slices.delete(name, &dp).await.map(drop)
    }

    async fn node_event(&self, node: &str, warning: bool, reason: &str, note: &str) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        };
        let event = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            // The Events API caps the note at 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: reason.to_string(),
            secondary: None,
        };
        match tokio::time::timeout(EVENT_TIMEOUT, self.recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(reason, error = %e, "could not post an event"),
            Err(_) => warn!(reason, "posting an event timed out"),
        }
    }
}

/// Errors of one publish. Each names the node or slice and the cause.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The Node could not be read (its UID goes into the owner reference).
    #[error("looking up Node {node} for the ResourceSlice owner reference: {source}")]
    NodeLookup {
        /// Node name.
        node: String,
        /// API error.
        source: kube::Error,
    },
    /// The Node has no UID.
    #[error("Node {node} has no metadata.uid")]
    NodeWithoutUid {
        /// Node name.
        node: String,
    },
    /// Listing the node's slices failed.
    #[error("listing ResourceSlices with {selector}: {source}")]
    List {
        /// The field selector.
        selector: String,
        /// API error.
        source: kube::Error,
    },
    /// A desired slice selects nodes itself; this publisher manages node-local slices only.
    #[error(
        "desired slice #{index} of pool {pool} sets spec.{field}: only node-local slices \
         (spec.nodeName = the node) are published, because the publisher lists them by \
         spec.nodeName"
    )]
    NotNodeLocal {
        /// Index in the desired list.
        index: usize,
        /// Pool (node) name.
        pool: String,
        /// The offending field.
        field: &'static str,
    },
    /// Creating a slice failed.
    #[error("creating ResourceSlice {slice} (slice #{index} of pool {pool}): {source}")]
    Create {
        /// Slice name.
        slice: String,
        /// Index in the pool.
        index: usize,
        /// Pool name.
        pool: String,
        /// API error.
        source: kube::Error,
    },
    /// Updating a slice failed.
    #[error("updating ResourceSlice {slice} (slice #{index} of pool {pool}): {source}")]
    Update {
        /// Slice name.
        slice: String,
        /// Index in the pool.
        index: usize,
        /// Pool name.
        pool: String,
        /// API error.
        source: kube::Error,
    },
    /// Deleting an obsolete slice failed.
    #[error("deleting obsolete ResourceSlice {slice} ({reason}): {source}")]
    Delete {
        /// Slice name.
        slice: String,
        /// Why it is obsolete.
        reason: String,
        /// API error.
        source: kube::Error,
    },
}

/// What one publish did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// Slices created.
    pub created: usize,
    /// Slices updated.
    pub updated: usize,
    /// Obsolete slices deleted (a slice already gone counts too).
    pub deleted: usize,
    /// Desired slices already up to date (no write).
    pub unchanged: usize,
    /// Written slices the server stored differently from what was sent (see
    /// [`plan::Adopted`]).
    pub dropped_fields: usize,
    /// The node's devices are withdrawn: the API server drops shared counters
    /// (`DRAPartitionableDevices` off), so the pool was published empty ([`super::gates`]).
    pub withdrawn: bool,
    /// Pool generation after the publish.
    pub generation: i64,
    /// `resourceSliceCount` after the publish.
    pub slice_count: usize,
}

impl PublishStats {
    /// API writes done.
    pub fn writes(&self) -> usize {
        self.created + self.updated + self.deleted
    }
}

/// Counters over the life of a [`Publisher`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishTotals {
    /// Publishes that succeeded.
    pub publishes: u64,
    /// Publishes that failed.
    pub failures: u64,
    /// Slices created.
    pub created: u64,
    /// Slices updated.
    pub updated: u64,
    /// Slices deleted.
    pub deleted: u64,
}

/// Timers of [`Publisher::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    /// Delay between a foreign change of our slices and the republish; changes in that window
    /// are coalesced (upstream waits 30 s; DAS republishes sooner because a missing slice makes
    /// the whole pool unallocatable).
    pub debounce: Duration,
    /// Republish at least this often, even without events.
    pub resync: Duration,
    /// First retry delay after a failed publish; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
}

impl Default for RunConfig {
    /// 1 s debounce, 5 min resync, retries from 1 s to 60 s.
    fn default() -> Self {
        Self {
            debounce: Duration::from_secs(1),
            resync: Duration::from_secs(300),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// Publishes the ResourceSlices of one node's pool. See the module docs.
pub struct Publisher {
    api: Arc<dyn PublishApi>,
    /// Where the watch goes (see [`Publisher::with_watch_client`]); none: [`Publisher::run`]
    /// republishes on changes of the desired slices, resyncs and probes only.
    watch_api: Option<Api<ResourceSlice>>,
    node: String,
    /// UID given by the caller (never refreshed).
    given_uid: Option<String>,
    /// UID looked up from the Node (refreshed before creating slices).
    looked_up_uid: Option<String>,
    baseline: Baseline,
    /// Summaries of dropped-field differences (and a failed counter probe) already logged at
    /// warn level.
    warned: HashSet<String>,
    /// `name → resourceVersion` of our slices as the last publish left them; watch events that
    /// match are our own writes.
    known: BTreeMap<String, String>,
    totals: PublishTotals,
    /// Whether the API server keeps shared counters; when to probe again.
    guard: CounterGuard,
    /// Where the feature-gate gauge goes.
    metrics: Option<Arc<Metrics>>,
}

impl Publisher {
    /// A publisher for `node_name`'s pool. With `node_uid` `None` the Node's UID is looked up
    /// at the first publish (and again before creating slices, in case the Node was
    /// re-registered).
    pub fn new(client: Client, node_name: impl Into<String>, node_uid: Option<String>) -> Self {
        let node = node_name.into();
        let api = Arc::new(KubePublishApi::new(client.clone(), &node));
        let mut publisher = Self::with_api(api, node, node_uid);
        publisher.watch_api = Some(Api::all(client));
        publisher
    }

    /// A publisher whose calls go to `api`, without a watch (for tests; see [`PublishApi`]).
    pub fn with_api(
        api: Arc<dyn PublishApi>,
        node_name: impl Into<String>,
        node_uid: Option<String>,
    ) -> Self {
        Self {
            api,
            watch_api: None,
            node: node_name.into(),
            given_uid: node_uid,
            looked_up_uid: None,
            baseline: Baseline::new(),
            warned: HashSet::new(),
            known: BTreeMap::new(),
            totals: PublishTotals::default(),
            guard: CounterGuard::default(),
            metrics: None,
        }
    }

    /// Watches through `client` instead: one without a read timeout, since a quiet watch is not a
    /// hung call (the other calls keep the client given to [`Self::new`]).
    pub fn with_watch_client(mut self, client: Client) -> Self {
        self.watch_api = Some(Api::all(client));
        self
    }

    /// Sets `das_kubelet_plugin_apiserver_feature_gate_off` in `metrics` after each publish.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Probes again after `min` doubling to `max` while the API server drops shared counters
    /// (defaults [`gates::MIN_PROBE_RETRY`], [`gates::MAX_PROBE_RETRY`]).
    pub fn with_probe_retry(mut self, min: Duration, max: Duration) -> Self {
        self.guard = CounterGuard::new(min, max);
        self
    }

    /// Whether the node's devices are withdrawn because the API server drops shared counters.
    pub fn withdrawn(&self) -> bool {
        self.guard.withdrawn()
    }

    /// The node (and pool) name.
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// The field selector for this node's slices of our driver:
    /// `spec.driver=mig.das.com,spec.nodeName=<node>`.
    pub fn field_selector(&self) -> String {
        format!("spec.driver={DRIVER_NAME},spec.nodeName={}", self.node)
    }

    /// Counters since creation.
    pub fn totals(&self) -> &PublishTotals {
        &self.totals
    }

    /// Makes the server's slices of this node equal to `desired` (priority order: slice `i` is
    /// named with index `i`). `driver`, `pool` and `nodeName` of each spec are set here; specs
    /// must not use `nodeSelector`, `allNodes` or `perDeviceNodeSelection`.
    pub async fn publish(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<PublishStats, PublishError> {
        let result = self.publish_guarded(desired).await;
        self.set_gate_metrics();
        match &result {
            Ok(stats) => {
                self.totals.publishes += 1;
                self.totals.created += stats.created as u64;
                self.totals.updated += stats.updated as u64;
                self.totals.deleted += stats.deleted as u64;
            }
            Err(_) => {
                self.totals.failures += 1;
                self.known.clear();
            }
        }
        result
    }

    /// Deletes every slice of our driver on this node (for uninstall). Returns how many.
    pub async fn unpublish(&mut self) -> Result<usize, PublishError> {
        let existing = self.list().await?;
        let mut deleted = 0;
        for slice in &existing {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let d = plan::Deletion {
                name,
                uid: slice.metadata.uid.clone(),
                resource_version: slice.metadata.resource_version.clone(),
                reason: plan::ObsoleteReason::Unpublished,
            };
            self.delete(&d).await?;
            deleted += 1;
        }
        self.known.clear();
        self.baseline.clear();
        Ok(deleted)
    }

    /// Publishes `desired`, or the pool without devices while the API server drops shared
    /// counters ([`CounterGuard`]).
    async fn publish_guarded(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<PublishStats, PublishError> {
        let desired = complete_specs(&self.node, desired)?;
        let has_counters = desired
            .iter()
            .any(|s| gates::carries_counters(&plan::spec_key(s)));
        let offer = match self.guard.before_publish(has_counters, Instant::now()) {
            Step::Publish(offer) => offer,
            Step::Probe => {
                let answer = self.probe(&desired).await;
                let decision = self.guard.probed(answer, Instant::now());
                self.notify(decision.notice).await;
                decision.offer
            }
        };
        if offer == Offer::Withdrawn {
            return self.publish_withdrawn().await;
        }
        let (stats, written) = self.publish_once(desired).await?;
        let taints = self
            .guard
            .taints_written(written.taints, written.dropped.taints);
        self.notify(taints).await;
        let Some(decision) =
            self.guard
                .written(written.counters, written.dropped.counters, Instant::now())
        else {
            return Ok(stats);
        };
        // The server dropped the counters of what was just written: withdraw at once.
        self.notify(decision.notice).await;
        let withdrawn = self.publish_withdrawn().await?;
        Ok(PublishStats {
            created: stats.created + withdrawn.created,
            updated: stats.updated + withdrawn.updated,
            deleted: stats.deleted + withdrawn.deleted,
            dropped_fields: stats.dropped_fields + withdrawn.dropped_fields,
            ..withdrawn
        })
    }

    /// Publishes the pool as one empty slice: no device can be allocated from it, and the pool
    /// stays complete (count and generation as always).
    async fn publish_withdrawn(&mut self) -> Result<PublishStats, PublishError> {
        let empty = complete_specs(&self.node, Vec::new())?;
        let (mut stats, _) = self.publish_once(empty).await?;
        stats.withdrawn = true;
        Ok(stats)
    }

    /// Dry-run creates the first desired slice that carries counters (under a generated name,
    /// so it cannot collide with a stored slice) and compares what the server would store.
    async fn probe(&mut self, desired: &[ResourceSliceSpec]) -> ProbeAnswer {
        let Some(spec) = desired
            .iter()
            .find(|s| gates::carries_counters(&plan::spec_key(s)))
        else {
            return ProbeAnswer::Kept;
        };
        let slice = ResourceSlice {
            metadata: ObjectMeta {
                generate_name: Some(format!("{DRIVER_NAME}-counter-probe-")),
                ..Default::default()
            },
            spec: with_generation(spec, 1),
        };
        match self.api.create(&slice, true).await {
            Ok(stored) => {
                let sent = plan::spec_key(&slice.spec);
                if gates::dropped(&sent, &plan::spec_key(&stored.spec)).counters {
                    ProbeAnswer::Dropped
                } else {
                    debug!(node = %self.node, "the API server keeps shared counters (dry run)");
                    ProbeAnswer::Kept
                }
            }
            Err(e) => {
                let withdrawn = self.guard.withdrawn();
                if self.warned.insert("probe failed".into()) {
                    warn!(
                        node = %self.node, error = %e, withdrawn,
                        "could not check with a dry run whether the API server keeps shared \
                         counters: withdrawn devices stay withdrawn, other slices are written \
                         and what the server stored is checked"
                    );
                } else {
                    debug!(node = %self.node, error = %e, withdrawn, "counter probe failed again");
                }
                ProbeAnswer::Failed
            }
        }
    }

    /// Logs a notice and posts it as a Node event.
    async fn notify(&self, notice: Option<Notice>) {
        let Some(notice) = notice else { return };
        let note = notice.note(&self.node);
        let (node, gate, reason) = (&self.node, notice.gate(), notice.reason());
        match notice {
            Notice::CountersDropped { first: true, .. } | Notice::TaintsDropped => {
                warn!(%node, gate, reason, "{note}");
            }
            Notice::CountersDropped { first: false, .. } => {
                debug!(%node, gate, reason, "shared counters still dropped; devices stay withdrawn");
            }
            Notice::CountersKept | Notice::TaintsKept => info!(%node, gate, reason, "{note}"),
        }
        self.api
            .node_event(&self.node, notice.is_warning(), reason, &note)
            .await;
    }

    fn set_gate_metrics(&self) {
        if let Some(m) = &self.metrics {
            m.set_feature_gate_off(gates::PARTITIONABLE_DEVICES, self.guard.withdrawn());
            m.set_feature_gate_off(gates::DEVICE_TAINTS, self.guard.taints_dropped());
        }
    }

    /// Makes the server's slices equal to `desired` (completed specs).
    async fn publish_once(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<(PublishStats, Written), PublishError> {
        let existing = self.list().await?;
        let cached = self.looked_up_uid.is_some();
        let mut uid = self.node_uid(false).await?;
        let mut plan = self.plan(&uid, &desired, &existing);
        // Creating with a stale UID would let the garbage collector delete the new slices
        // (the Node was re-registered): check the cached UID before creating.
        if !plan.create.is_empty() && self.given_uid.is_none() && cached {
            let fresh = self.node_uid(true).await?;
            if fresh != uid {
                info!(node = %self.node, old = %uid, new = %fresh, "Node UID changed; re-planning");
                uid = fresh;
                plan = self.plan(&uid, &desired, &existing);
            }
        }
        self.known = existing
            .iter()
            .filter_map(|s| {
                Some((
                    s.metadata.name.clone()?,
                    s.metadata.resource_version.clone()?,
                ))
            })
            .collect();
        self.apply(&uid, &desired, plan).await
    }

    fn plan(&self, uid: &str, desired: &[ResourceSliceSpec], existing: &[ResourceSlice]) -> Plan {
        plan::plan(
            PlanInput {
                node: &self.node,
                node_uid: uid,
                desired,
                baseline: &self.baseline,
            },
            existing,
        )
    }

    async fn list(&self) -> Result<Vec<ResourceSlice>, PublishError> {
        let selector = self.field_selector();
        match self.api.list(&selector).await {
            Ok(items) => Ok(items),
            Err(source) => Err(PublishError::List { selector, source }),
        }
    }

    async fn node_uid(&mut self, refresh: bool) -> Result<String, PublishError> {
        if let Some(uid) = &self.given_uid {
            return Ok(uid.clone());
        }
        if let (Some(uid), false) = (&self.looked_up_uid, refresh) {
            return Ok(uid.clone());
        }
        let node = self
            .api
            .node(&self.node)
            .await
            .map_err(|source| PublishError::NodeLookup {
                node: self.node.clone(),
                source,
            })?;
        let uid = node
            .metadata
            .uid
            .ok_or_else(|| PublishError::NodeWithoutUid {
                node: self.node.clone(),
            })?;
        self.looked_up_uid = Some(uid.clone());
        Ok(uid)
    }

    async fn apply(
        &mut self,
        uid: &str,
        desired: &[ResourceSliceSpec],
        plan: Plan,
    ) -> Result<(PublishStats, Written), PublishError> {
        let mut written = Written::default();
        let mut stats = PublishStats {
            unchanged: plan.unchanged.len(),
            generation: plan.generation,
            slice_count: desired.len(),
            ..Default::default()
        };
        if plan.writes() > 0 {
            debug!(
                node = %self.node, generation = plan.generation, bumped = plan.bumped,
                delete = plan.delete.len(), update = plan.update.len(), create = plan.create.len(),
                "publishing ResourceSlices"
            );
        }
        for d in &plan.delete {
            self.delete(d).await?;
            self.known.remove(&d.name);
            stats.deleted += 1;
        }
        let width = plan::index_width(desired.len());
        for (index, existing) in plan.update {
            let mut slice = existing;
            slice.spec = with_generation(&desired[index], plan.generation);
            slice.metadata.owner_references = Some(vec![plan::node_owner(&self.node, uid)]);
            let stored = self.replace(index, &slice).await?;
            stats.dropped_fields += usize::from(self.check_stored(index, &slice.spec, &stored));
            written.add(&slice.spec, &stored.spec);
            stats.updated += 1;
        }
        for index in plan.create {
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(plan::slice_name(&self.node, index, width)),
                    owner_references: Some(vec![plan::node_owner(&self.node, uid)]),
                    ..Default::default()
                },
                spec: with_generation(&desired[index], plan.generation),
            };
            let stored = self.create(index, &slice).await?;
            stats.dropped_fields += usize::from(self.check_stored(index, &slice.spec, &stored));
            written.add(&slice.spec, &stored.spec);
            stats.created += 1;
        }
        self.baseline.retain(|i, _| *i < desired.len());
        Ok((stats, written))
    }

    async fn delete(&self, d: &plan::Deletion) -> Result<(), PublishError> {
        let preconditions = Preconditions {
            uid: d.uid.clone(),
            resource_version: d.resource_version.clone(),
        };
        match self.api.delete(&d.name, preconditions).await {
            Ok(_) => {
                info!(slice = %d.name, reason = %d.reason, "deleted obsolete ResourceSlice");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(source) => Err(PublishError::Delete {
                slice: d.name.clone(),
                reason: d.reason.to_string(),
                source,
            }),
        }
    }

    async fn replace(
        &mut self,
        index: usize,
        slice: &ResourceSlice,
    ) -> Result<ResourceSlice, PublishError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let stored = self
            .api
            .replace(slice)
            .await
            .map_err(|source| PublishError::Update {
                slice: name.clone(),
                index,
                pool: self.node.clone(),
                source,
            })?;
        self.remember(&stored);
        Ok(stored)
    }

    async fn create(
        &mut self,
        index: usize,
        slice: &ResourceSlice,
    ) -> Result<ResourceSlice, PublishError> {
        let stored =
            self.api
                .create(slice, false)
                .await
                .map_err(|source| PublishError::Create {
                    slice: slice.metadata.name.clone().unwrap_or_default(),
                    index,
                    pool: self.node.clone(),
                    source,
                })?;
        self.remember(&stored);
        Ok(stored)
    }

    fn remember(&mut self, stored: &ResourceSlice) {
        if let (Some(n), Some(rv)) = (&stored.metadata.name, &stored.metadata.resource_version) {
            self.known.insert(n.clone(), rv.clone());
        }
    }

    /// Compares what the server stored with what was sent; adopts and logs a difference.
    /// Returns whether there was one.
    fn check_stored(
        &mut self,
        index: usize,
        sent: &ResourceSliceSpec,
        stored: &ResourceSlice,
    ) -> bool {
        let sent_key = plan::spec_key(sent);
        let stored_key = plan::spec_key(&stored.spec);
        if sent_key == stored_key {
            self.baseline.remove(&index);
            return false;
        }
        let paths = plan::diff_paths(&sent_key, &stored_key, 8);
        let gates = plan::guess_disabled_features(&paths);
        let summary = format!("#{index}: {}", paths.join(", "));
        let slice = stored.metadata.name.as_deref().unwrap_or_default();
        if self.warned.insert(summary) {
            warn!(
                slice, index, pool = %self.node, fields = ?paths, likely_disabled_gates = ?gates,
                "the API server stored this ResourceSlice differently from what was sent \
                 (dropped fields or canonicalized values); adopting the stored version"
            );
        } else {
            debug!(slice, index, fields = ?paths, "stored ResourceSlice differs again; adopting");
        }
        self.baseline.insert(
            index,
            Adopted {
                sent: sent_key,
                stored: stored_key,
            },
        );
        true
    }

    /// The watch of this node's slices ([`Self::field_selector`]); without a watch client, a
    /// stream that never yields.
    fn watch(&self) -> BoxStream<'static, Result<Event<ResourceSlice>, watcher::Error>> {
        match &self.watch_api {
            Some(api) => {
                let wc = watcher::Config::default().fields(&self.field_selector());
                watcher::watcher(api.clone(), wc).default_backoff().boxed()
            }
            None => futures::stream::pending().boxed(),
        }
    }

    /// Whether a watch event is someone else's doing (not the result of our last publish).
    fn is_foreign(&self, event: &Event<ResourceSlice>) -> bool {
        let id = |s: &ResourceSlice| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.metadata.resource_version.clone().unwrap_or_default(),
            )
        };
        match event {
            Event::Apply(s) | Event::InitApply(s) => {
                let (name, rv) = id(s);
                self.known.get(&name) != Some(&rv)
            }
            Event::Delete(s) => self.known.contains_key(&id(s).0),
            Event::Init => false,
            Event::InitDone => true,
        }
    }

    /// Publishes `desired` now and whenever it changes, when someone else changes or deletes
    /// this node's slices (watched with the [`Self::field_selector`], republished after
    /// `config.debounce`), and every `config.resync`. Failed publishes are logged and retried
    /// with exponential backoff. Returns the publisher when `shutdown` is cancelled; the slices
    /// stay published (a restarting plugin should not empty the pool).
    pub async fn run(
        mut self,
        mut desired: watch::Receiver<Vec<ResourceSliceSpec>>,
        shutdown: CancellationToken,
        config: RunConfig,
    ) -> Self {
        let mut events = self.watch();
        let mut next = Instant::now();
        let mut backoff = config.min_backoff;
        let mut desired_open = true;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return self,
                _ = tokio::time::sleep_until(next) => {
                    let specs = desired.borrow_and_update().clone();
                    next = match self.publish(specs).await {
                        Ok(stats) => {
                            log_publish(&self.node, &stats);
                            backoff = config.min_backoff;
                            let resync = Instant::now() + config.resync;
                            // While the devices are withdrawn, the next probe may come sooner.
                            self.guard.next_probe().map_or(resync, |at| at.min(resync))
                        }
                        Err(e) => {
                            warn!(error = %e, retry_in = ?backoff, "publishing ResourceSlices failed");
                            let at = Instant::now() + backoff;
                            backoff = (backoff * 2).min(config.max_backoff);
                            at
                        }
                    };
                }
                changed = desired.changed(), if desired_open => match changed {
                    Ok(()) => next = Instant::now(),
                    Err(_) => desired_open = false,
                },
                event = events.next() => match event {
                    Some(Ok(ev)) if self.is_foreign(&ev) => {
                        debug!(event = %event_kind(&ev), "foreign ResourceSlice change");
                        next = next.min(Instant::now() + config.debounce);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => warn!(error = %e, "watching ResourceSlices"),
                    None => events = self.watch(),
                },
            }
        }
    }
}

/// What one publish wrote of the gated fields DAS acts on (shared counters, device taints), and
/// what the server dropped of them ([`gates::dropped`]).
#[derive(Debug, Default)]
struct Written {
    /// A written slice carried counters.
    counters: bool,
    /// A written slice carried taints.
    taints: bool,
    /// What the server dropped, over every written slice.
    dropped: gates::Dropped,
}

impl Written {
    fn add(&mut self, sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) {
        let (sent, stored) = (plan::spec_key(sent), plan::spec_key(stored));
        self.counters |= gates::carries_counters(&sent);
        self.taints |= gates::carries_taints(&sent);
        let dropped = gates::dropped(&sent, &stored);
        self.dropped.counters |= dropped.counters;
        self.dropped.taints |= dropped.taints;
    }
}

fn log_publish(node: &str, stats: &PublishStats) {
    if stats.writes() > 0 {
        info!(
            node,
            generation = stats.generation,
            slices = stats.slice_count,
            created = stats.created,
            updated = stats.updated,
            deleted = stats.deleted,
            dropped_fields = stats.dropped_fields,
            withdrawn = stats.withdrawn,
            "published ResourceSlices"
        );
    } else {
        debug!(
            node,
            generation = stats.generation,
            slices = stats.slice_count,
            "ResourceSlices up to date"
        );
    }
}

fn event_kind(ev: &Event<ResourceSlice>) -> &'static str {
    match ev {
        Event::Apply(_) => "apply",
        Event::Delete(_) => "delete",
        Event::Init => "init",
        Event::InitApply(_) => "init-apply",
        Event::InitDone => "init-done",
    }
}

/// The desired specs completed for `node`: `driver` = `mig.das.com`, `pool` = `{node, 0,
/// count}`, `nodeName` = node, empty `devices`/`sharedCounters` lists unset. An empty list
/// becomes one empty slice. Fails on specs that select nodes themselves.
pub fn complete_specs(
    node: &str,
    mut desired: Vec<ResourceSliceSpec>,
) -> Result<Vec<ResourceSliceSpec>, PublishError> {
    if desired.is_empty() {
        desired.push(ResourceSliceSpec::default());
    }
    let count = desired.len() as i64;
    for (index, spec) in desired.iter_mut().enumerate() {
        let field = if spec.node_selector.is_some() {
            Some("nodeSelector")
        } else if spec.all_nodes == Some(true) {
            Some("allNodes")
        } else if spec.per_device_node_selection == Some(true) {
            Some("perDeviceNodeSelection")
        } else {
            None
        };
        if let Some(field) = field {
            return Err(PublishError::NotNodeLocal {
                index,
                pool: node.to_string(),
                field,
            });
        }
        spec.all_nodes = None;
        spec.per_device_node_selection = None;
        // The server rejects `devices: []` next to `sharedCounters` ("only one of
        // `sharedCounters` or `devices` is allowed", 1.36) and omits empty lists anyway.
        spec.devices = spec.devices.take().filter(|d| !d.is_empty());
        spec.shared_counters = spec.shared_counters.take().filter(|c| !c.is_empty());
        spec.driver = DRIVER_NAME.to_string();
        spec.node_name = Some(node.to_string());
        spec.pool = ResourcePool {
            name: node.to_string(),
            generation: 0,
            resource_slice_count: count,
        };
    }
    Ok(desired)
}

fn with_generation(spec: &ResourceSliceSpec, generation: i64) -> ResourceSliceSpec {
    let mut spec = spec.clone();
    spec.pool.generation = generation;
    spec
}

#[cfg(test)]
mod tests;
