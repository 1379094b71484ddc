//! [`Publisher`]: DAS's ResourceSlice publisher. The DRA layer's generic publisher
//! ([`dra_plugin::resourceslice::Publisher`]: pools, generations, `resourceSliceCount`, the
//! writes, the run loop with resyncs and probes, and the guard against dropped feature-gate
//! fields, docs/design.md §4) for the pool of driver `mig.das.com` on one node, with what DAS
//! adds:
//!
//! - Node events in DAS's words ([`super::notices`]), reported as `das-kubelet-plugin`;
//! - the gauge `das_kubelet_plugin_apiserver_feature_gate_off{gate}` ([`Metrics`]);
//! - DAS's shareable devices: `allowMultipleAllocations`, or attribute `type: mig-shared`/`gpu-shared`
//!   ([`shareable`]), left out while the API server drops consumable capacity;
//! - [`Publisher::run_with_facts`]: the plugin's loop, publishing the inventory's slices with
//!   the health monitor's facts ([`desired_slices`]).
//!
//! Its behaviour against a real API server is covered by `e2e/tests/plugin_publisher.rs`.

use std::sync::Arc;
use std::time::Duration;

use das_api::DRIVER_NAME;
use das_api::attributes as attr;
use dra_plugin::resourceslice::{self as rs, GateGauge, Pool};
use k8s_openapi::api::resource::v1::{Device, ResourceSliceSpec};
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::desired::{HealthFacts, desired_slices};
use super::notices::NodeNotices;
use super::{FirstPublish, PublishError, PublishStats, PublishTotals, RunConfig};
use crate::events::{EventSink, KubeEvents};
use crate::metrics::Metrics;

/// Publishes the ResourceSlices of one node's `mig.das.com` pool (see the module docs); the
/// calls of [`rs::Publisher`] under DAS's names.
pub struct Publisher {
    inner: rs::Publisher,
}

impl Publisher {
    /// A publisher for `node_name`'s pool, its Node events posted through `client` as
    /// `das-kubelet-plugin`. With `node_uid` `None` the Node's UID is looked up at the first
    /// publish (and again before creating slices, in case the Node was re-registered).
    pub fn new(client: Client, node_name: impl Into<String>, node_uid: Option<String>) -> Self {
        let pool = pool(node_name.into(), node_uid);
        let events = Arc::new(KubeEvents::new(client.clone(), &pool.node));
        Self::of(rs::Publisher::new(client, pool), events)
    }

    /// A publisher whose calls go to `api` and whose Node events go to `events`, without a
    /// watch (for tests).
    #[cfg(test)]
    pub(crate) fn with_api(
        api: Arc<dyn rs::PublishApi>,
        events: Arc<dyn EventSink>,
        node_name: impl Into<String>,
        node_uid: Option<String>,
    ) -> Self {
        let pool = pool(node_name.into(), node_uid);
        Self::of(rs::Publisher::with_api(api, pool), events)
    }

    fn of(inner: rs::Publisher, events: Arc<dyn EventSink>) -> Self {
        let inner = inner
            .with_events(Arc::new(NodeNotices { sink: events }))
            .with_shareable(shareable);
        Self { inner }
    }

    /// Watches through `client` instead: one without a read timeout, since a quiet watch is not a
    /// hung call (the other calls keep the client given to [`Self::new`]).
    pub fn with_watch_client(self, client: Client) -> Self {
        Self {
            inner: self.inner.with_watch_client(client),
        }
    }

    /// Sets `das_kubelet_plugin_apiserver_feature_gate_off` in `metrics` after each publish.
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: self.inner.with_gauge(metrics),
        }
    }

    /// Probes again after `min` doubling to `max` while the API server drops shared counters
    /// (defaults `dra_plugin::resourceslice::gates::{MIN_PROBE_RETRY, MAX_PROBE_RETRY}`: 10 s,
    /// 5 min).
    pub fn with_probe_retry(self, min: Duration, max: Duration) -> Self {
        Self {
            inner: self.inner.with_probe_retry(min, max),
        }
    }

    /// Whether the node's devices are withdrawn because the API server drops shared counters.
    pub fn withdrawn(&self) -> bool {
        self.inner.withdrawn()
    }

    /// The node (and pool) name.
    pub fn node_name(&self) -> &str {
        self.inner.node_name()
    }

    /// The field selector for this node's slices of our driver:
    /// `spec.driver=mig.das.com,spec.nodeName=<node>`.
    pub fn field_selector(&self) -> String {
        self.inner.field_selector()
    }

    /// Counters since creation.
    pub fn totals(&self) -> &PublishTotals {
        self.inner.totals()
    }

    /// Makes the server's slices of this node equal to `desired` (priority order: slice `i` is
    /// named with index `i`). `driver`, `pool` and `nodeName` of each spec are set here; specs
    /// must not use `nodeSelector`, `allNodes` or `perDeviceNodeSelection`.
    pub async fn publish(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<PublishStats, PublishError> {
        self.inner.publish(desired).await
    }

    /// [`Self::publish`], and on success the [`FirstPublish`] proof the kubelet plugin's
    /// `serve` requires ([`rs::Publisher::publish_first`]): the plugin registers only once its
    /// devices are published.
    ///
    /// # Errors
    /// [`Self::publish`]'s.
    pub async fn publish_first(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<(PublishStats, FirstPublish), PublishError> {
        self.inner.publish_first(desired).await
    }

    /// Deletes every slice of our driver on this node (for uninstall). Returns how many.
    pub async fn unpublish(&mut self) -> Result<usize, PublishError> {
        self.inner.unpublish().await
    }

    /// Publishes `desired` now and whenever it changes, when someone else changes or deletes
    /// this node's slices, and every `config.resync` ([`rs::Publisher::run`]). Returns the
    /// publisher when `shutdown` is cancelled; the slices stay published.
    pub async fn run(
        self,
        desired: watch::Receiver<Vec<ResourceSliceSpec>>,
        shutdown: CancellationToken,
        config: RunConfig,
    ) -> Self {
        Self {
            inner: self.inner.run(desired, shutdown, config).await,
        }
    }

    /// [`Self::run`] publishing [`desired_slices`]`(&base, facts)` for the latest `facts`: the
    /// plugin's loop, where `base` are the slices built from the inventory and the health
    /// monitor reports the facts (taints, withdrawn devices). This is the one place those facts
    /// become what is published.
    pub async fn run_with_facts(
        self,
        base: Vec<ResourceSliceSpec>,
        facts: watch::Receiver<HealthFacts>,
        shutdown: CancellationToken,
        config: RunConfig,
    ) -> Self {
        let desired = move |f: &HealthFacts| desired_slices(&base, f);
        Self {
            inner: self.inner.run_with(facts, desired, shutdown, config).await,
        }
    }
}

/// DAS's pool on `node`: driver `mig.das.com`.
fn pool(node: String, node_uid: Option<String>) -> Pool {
    Pool {
        node_uid,
        ..Pool::new(DRIVER_NAME, node)
    }
}

/// Whether `d` is one of DAS's shareable devices (docs/design.md §7, "Shared slices"):
/// `allowMultipleAllocations: true`, or attribute `type: mig-shared` or `gpu-shared` (which a device keeps even
/// where the flag was lost).
pub(crate) fn shareable(d: &Device) -> bool {
    rs::allows_multiple_allocations(d)
        || d.attributes
            .as_ref()
            .and_then(|a| a.get(attr::TYPE))
            .and_then(|t| t.string.as_deref())
            .is_some_and(attr::is_shared_type)
}

impl GateGauge for Metrics {
    fn set_gate_off(&self, gate: &'static str, off: bool) {
        self.set_feature_gate_off(gate, off);
    }
}

#[cfg(test)]
mod tests;
