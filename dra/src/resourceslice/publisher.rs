//! [`Publisher`]: keeps one node's pool published (see [`super`] for what it does).
//!
//! Parts, one file each under `publisher/`: `api` (the calls), `outcome` (what a publish did or
//! why it failed), `writes` (listing, planning and writing one publish), `run` (the loop that
//! keeps the pool published); this file holds the publisher, its loop over the attempts the
//! guard plans ([`super::gates::Guard`]: probe or write, then observe what the server kept), its
//! notices, and the completion of desired specs. Its behaviour against a real API server is
//! covered by the repository's `e2e/tests/plugin_publisher.rs`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::gates::{self, Attempt, Guard, Notice, Observed, ProbeAnswer, Shareable};
use super::plan::{self, Baseline};
use super::{FirstPublish, GateGauge, NodeEvents, Pool};

mod api;
mod outcome;
mod run;
mod writes;

pub use api::{KubePublishApi, PublishApi};
pub use outcome::{PublishError, PublishStats, PublishTotals};
pub use run::RunConfig;

/// Publishes the ResourceSlices of one node's pool ([`super`] says how).
pub struct Publisher {
    api: Arc<dyn PublishApi>,
    /// Where the watch goes (see [`Publisher::with_watch_client`]); none: [`Publisher::run`]
    /// republishes on changes of the desired slices, resyncs and probes only.
    watch_api: Option<Api<ResourceSlice>>,
    /// The driver and node; its UID, when given by the caller, is never refreshed.
    pool: Pool,
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
    /// What the API server was seen keeping of the gated fields: plans each publish's attempts.
    guard: Guard,
    /// Where notices go as Node events (else only to the log).
    events: Option<Arc<dyn NodeEvents>>,
    /// Where the feature-gate gauge goes.
    gauge: Option<Arc<dyn GateGauge>>,
}

impl Publisher {
    /// A publisher of `pool` through `client` (built with connect and read timeouts), watching
    /// the pool's slices through it too (see [`Self::with_watch_client`]).
    pub fn new(client: Client, pool: Pool) -> Self {
        let api = Arc::new(KubePublishApi::new(client.clone()));
        let mut publisher = Self::with_api(api, pool);
        publisher.watch_api = Some(Api::all(client));
        publisher
    }

    /// A publisher of `pool` whose calls go to `api`, without a watch (for tests; see
    /// [`PublishApi`]).
    pub fn with_api(api: Arc<dyn PublishApi>, pool: Pool) -> Self {
        Self {
            api,
            watch_api: None,
            pool,
            looked_up_uid: None,
            baseline: Baseline::new(),
            warned: HashSet::new(),
            known: BTreeMap::new(),
            totals: PublishTotals::default(),
            guard: Guard::default(),
            events: None,
            gauge: None,
        }
    }

    /// Watches through `client` instead: one without a read timeout, since a quiet watch is not a
    /// hung call (the other calls keep the client given to [`Self::new`]).
    pub fn with_watch_client(mut self, client: Client) -> Self {
        self.watch_api = Some(Api::all(client));
        self
    }

    /// Posts every [`Notice`] as an Event about the Node through `events` (besides the log).
    pub fn with_events(mut self, events: Arc<dyn NodeEvents>) -> Self {
        self.events = Some(events);
        self
    }

    /// Sets `gauge` for every feature gate after each publish ([`Guard::gates_off`]).
    pub fn with_gauge(mut self, gauge: Arc<dyn GateGauge>) -> Self {
        self.gauge = Some(gauge);
        self
    }

    /// Probes again after `min` doubling to `max` while the API server drops shared counters
    /// (defaults [`gates::MIN_PROBE_RETRY`], [`gates::MAX_PROBE_RETRY`]).
    pub fn with_probe_retry(mut self, min: Duration, max: Duration) -> Self {
        self.guard = self.guard.with_probe_retry(min, max);
        self
    }

    /// Leaves out the devices `shareable` tells (rather than those that
    /// [`gates::allows_multiple_allocations`]) once the API server drops consumable capacity.
    pub fn with_shareable(mut self, shareable: Shareable) -> Self {
        self.guard = self.guard.with_shareable(shareable);
        self
    }

    /// Whether the node's devices are withdrawn because the API server drops shared counters.
    pub fn withdrawn(&self) -> bool {
        self.guard.withdrawn()
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The node (and pool) name.
    pub fn node_name(&self) -> &str {
        &self.pool.node
    }

    /// The field selector of the pool's slices ([`Pool::field_selector`]):
    /// `spec.driver=<driver>,spec.nodeName=<node>`.
    pub fn field_selector(&self) -> String {
        self.pool.field_selector()
    }

    /// Counters since creation.
    pub fn totals(&self) -> &PublishTotals {
        &self.totals
    }

    /// Makes the server's slices of this node equal to `desired` (priority order: slice `i` is
    /// named with index `i`). `driver`, `pool` and `nodeName` of each spec are set here; specs
    /// must not use `nodeSelector`, `allNodes` or `perDeviceNodeSelection`. Runs in a span
    /// `publish` with the pool's `driver` and `pool` (the node), which every line it logs
    /// carries.
    #[tracing::instrument(name = "publish", level = "error", skip_all, fields(
        driver = %self.pool.driver,
        pool = %self.pool.node,
    ))]
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

    /// [`Self::publish`], and on success the [`FirstPublish`] proof that
    /// [`crate::kubeletplugin::serve`] requires: a plugin publishes with it before it serves the
    /// kubelet.
    ///
    /// # Errors
    /// [`Self::publish`]'s: the plugin must not serve yet.
    pub async fn publish_first(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<(PublishStats, FirstPublish), PublishError> {
        let stats = self.publish(desired).await?;
        Ok((stats, FirstPublish(())))
    }

    /// Deletes every slice of the driver on this node (for uninstall). Returns how many. Runs in
    /// a span `unpublish` with the pool's `driver` and `pool`.
    #[tracing::instrument(name = "unpublish", level = "error", skip_all, fields(
        driver = %self.pool.driver,
        pool = %self.pool.node,
    ))]
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

    /// Publishes `desired` as the guard plans it: a loop of at most [`gates::MAX_ATTEMPTS`]
    /// attempts, each a dry-run probe or a write, whose outcome the guard observes ([`Guard`]:
    /// the pool without devices while the API server drops shared counters, no shareable
    /// devices once it dropped consumable capacity, no binding conditions once it dropped them).
    async fn publish_guarded(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<PublishStats, PublishError> {
        let desired = complete_specs(&self.pool, desired)?;
        let mut stats: Option<PublishStats> = None;
        for _ in 0..gates::MAX_ATTEMPTS {
            let seen = match self.guard.plan(&desired, Instant::now()) {
                Attempt::Probe(spec) => Observed::Probe(self.probe(spec).await),
                Attempt::Write { specs, withdrawn } => {
                    // A withdrawn pool (no specs) is one empty slice, complete as always.
                    let specs = complete_specs(&self.pool, specs)?;
                    let (mut wrote, written) = self.publish_once(specs).await?;
                    wrote.withdrawn = withdrawn;
                    stats = Some(match stats {
                        Some(before) => then(before, wrote),
                        None => wrote,
                    });
                    Observed::Wrote(written)
                }
            };
            let observation = self.guard.observe(seen, Instant::now());
            for notice in observation.notices {
                self.notify(notice).await;
            }
            if !observation.again {
                break;
            }
        }
        // Every publish writes: the guard follows a probe with a write.
        Ok(stats.unwrap_or_default())
    }

    /// Dry-run creates `spec`, a desired slice that carries counters (under a generated name,
    /// so it cannot collide with a stored slice), and compares what the server would store.
    async fn probe(&mut self, spec: ResourceSliceSpec) -> ProbeAnswer {
        let slice = ResourceSlice {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-counter-probe-", self.pool.driver)),
                ..Default::default()
            },
            spec: with_generation(&spec, 1),
        };
        match self.api.create(&slice, true).await {
            Ok(stored) => {
                let answer = ProbeAnswer::of(&slice.spec, &stored.spec);
                if answer == ProbeAnswer::Kept {
                    debug!("the API server keeps shared counters (dry run)");
                }
                answer
            }
            Err(e) => {
                let withdrawn = self.guard.withdrawn();
                if self.warned.insert("probe failed".into()) {
                    warn!(
                        error = %e, withdrawn,
                        "could not check with a dry run whether the API server keeps shared \
                         counters: withdrawn devices stay withdrawn, other slices are written \
                         and what the server stored is checked"
                    );
                } else {
                    debug!(error = %e, withdrawn, "counter probe failed again");
                }
                ProbeAnswer::Failed
            }
        }
    }

    /// Logs a notice and posts it as a Node event.
    async fn notify(&self, notice: Notice) {
        let note = match &self.events {
            Some(events) => events.note(&notice, &self.pool),
            None => notice.note(&self.pool),
        };
        let (gate, reason) = (notice.gate(), notice.reason());
        match notice {
            Notice::CountersDropped { first: true, .. }
            | Notice::TaintsDropped
            | Notice::SharesDropped
            | Notice::BindingConditionsDropped => {
                warn!(gate, reason, "{note}");
            }
            Notice::CountersDropped { first: false, .. } => {
                debug!(
                    gate,
                    reason, "shared counters still dropped; devices stay withdrawn"
                );
            }
            Notice::CountersKept | Notice::TaintsKept => info!(gate, reason, "{note}"),
        }
        if let Some(events) = &self.events {
            events.post(&notice, note).await;
        }
    }

    fn set_gate_metrics(&self) {
        if let Some(gauge) = &self.gauge {
            for (gate, off) in self.guard.gates_off() {
                gauge.set_gate_off(gate, off);
            }
        }
    }
}

/// The desired specs completed for `pool`: `driver` = the pool's, `pool` = `{node, 0, count}`,
/// `nodeName` = node, empty `devices`/`sharedCounters` lists unset. An empty list becomes one
/// empty slice. Fails on specs that select nodes themselves.
pub(crate) fn complete_specs(
    pool: &Pool,
    mut desired: Vec<ResourceSliceSpec>,
) -> Result<Vec<ResourceSliceSpec>, PublishError> {
    let node = &pool.node;
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
        spec.driver = pool.driver.clone();
        spec.node_name = Some(node.to_string());
        spec.pool = ResourcePool {
            name: node.to_string(),
            generation: 0,
            resource_slice_count: count,
        };
    }
    Ok(desired)
}

/// The stats of a publish written in two steps: `first`'s writes added to `second`'s.
fn then(first: PublishStats, second: PublishStats) -> PublishStats {
    PublishStats {
        created: first.created + second.created,
        updated: first.updated + second.updated,
        deleted: first.deleted + second.deleted,
        dropped_fields: first.dropped_fields + second.dropped_fields,
        ..second
    }
}

fn with_generation(spec: &ResourceSliceSpec, generation: i64) -> ResourceSliceSpec {
    let mut spec = spec.clone();
    spec.pool.generation = generation;
    spec
}

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod tests;
