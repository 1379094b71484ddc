//! The health monitor task: waits for the backend's health events, re-reads the inventory, feeds
//! the [`HealthBook`], and acts on its transitions.
//!
//! An XID that names a GPU instance is matched against the GPU's live MIG instances when it comes
//! ([`HealthMonitor::observe`]); the book decides whether it concerns that instance or the whole
//! GPU ([`super::book::scope`]).
//!
//! On a transition it (1) reports the new [`HealthFacts`] (every device of an unhealthy GPU, and
//! every device overlapping an unhealthy GPU instance, tainted) to the publisher, which turns
//! them into ResourceSlices ([`crate::publish::desired`]); (2) posts an Event on the Node naming
//! the GPU (and GPU instance) and the cause (`notices`); (3) sets
//! `das_kubelet_plugin_gpu_healthy` and counts XIDs; (4) wakes the kubelet's health stream,
//! which reports those devices `Unhealthy` with the reason (pods see it in
//! `status.containerStatuses[].allocatedResourcesStatus`).
//!
//! With every inventory check it also asks which MIG instances no claim holds
//! ([`super::unclaimed`]): an instance seen in two checks in a row has every device that overlaps
//! it withdrawn (a fact it reports as well) until it is gone, so the scheduler never allocates a
//! placement no prepare can create; a Node event names it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::book::{GpuTaint, HealthBook, TaintEffect, Transition};
use super::unclaimed::{UnclaimedInstances, UnclaimedTracker};
use crate::events::EventSink;
use crate::gpu::{GpuCalls, GpuInfo, HealthEvent, MigInstance, Placement};
use crate::metrics::Metrics;
use crate::publish::desired::HealthFacts;
use crate::publish::devices::{DeviceRef, device_index};
use dra_plugin::{DeviceHealthReport, HealthSource};

mod notices;

/// How long one wait for health events lasts before the monitor looks at the inventory and the
/// quiet periods again.
pub const EVENT_WAIT: Duration = Duration::from_secs(1);
/// How often the inventory is read again (a GPU that fell off the bus leaves it).
pub const INVENTORY_INTERVAL: Duration = Duration::from_secs(5);

/// The monitor of one node's GPUs. Also the kubelet's [`HealthSource`].
pub struct HealthMonitor {
    book: Mutex<HealthBook>,
    gpus: GpuCalls,
    node: String,
    /// GPU UUIDs by index, for events.
    uuids: BTreeMap<u32, String>,
    devices: HashMap<String, DeviceRef>,
    /// Where the facts go (the publisher's input).
    facts: watch::Sender<HealthFacts>,
    events: Arc<dyn EventSink>,
    metrics: Arc<Metrics>,
    changes: watch::Sender<u64>,
    instances: Option<Arc<dyn UnclaimedInstances>>,
    unclaimed: Mutex<UnclaimedTracker>,
}

impl HealthMonitor {
    /// A monitor of the GPUs of `inventory` (the devices the node publishes) with `book`,
    /// calling the backend through `gpus`. It sends what publication needs to know to `facts`
    /// ([`Self::send_facts`]) and posts Node events to `events`.
    pub fn new(
        book: HealthBook,
        gpus: GpuCalls,
        node: &str,
        inventory: &[GpuInfo],
        facts: watch::Sender<HealthFacts>,
        events: Arc<dyn EventSink>,
        metrics: Arc<Metrics>,
    ) -> Self {
        for g in inventory {
            metrics.set_gpu_healthy(g.index, true);
        }
        Self {
            book: Mutex::new(book),
            gpus,
            node: node.to_string(),
            uuids: inventory
                .iter()
                .map(|g| (g.index, g.uuid.clone()))
                .collect(),
            devices: device_index(inventory),
            facts,
            events,
            metrics,
            changes: watch::channel(0).0,
            instances: None,
            unclaimed: Mutex::default(),
        }
    }

    /// Also withdraws the devices that overlap unclaimed instances, asking `source` at every
    /// inventory check; `at_start` are withdrawn at once (found by start-up reconciliation, while
    /// no prepare runs, so no instance of a prepare in flight can be among them).
    pub fn with_unclaimed_instances(
        mut self,
        source: Arc<dyn UnclaimedInstances>,
        at_start: Vec<MigInstance>,
    ) -> Self {
        self.instances = Some(source);
        let u = self.unclaimed.get_mut().unwrap_or_else(|p| p.into_inner());
        for i in at_start {
            u.withdraw_now(i);
        }
        self
    }

    fn book(&self) -> MutexGuard<'_, HealthBook> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unclaimed(&self) -> MutexGuard<'_, UnclaimedTracker> {
        self.unclaimed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs until `stop`: waits for events ([`EVENT_WAIT`] at a time), reads the inventory every
    /// [`INVENTORY_INTERVAL`], expires quiet periods, and acts on transitions.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut inventory_due = tokio::time::Instant::now();
        loop {
            let events = tokio::select! {
                r = self.gpus.run(|b| b.wait_health_events(EVENT_WAIT)) => r,
                _ = stop.cancelled() => return,
            };
            let mut transitions = match events {
                Ok(Ok(events)) => self.observe(&events).await,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "waiting for GPU health events failed");
                    tokio::time::sleep(EVENT_WAIT).await;
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the GPU health event task failed");
                    Vec::new()
                }
            };
            let mut withdrawn_changed = false;
            if tokio::time::Instant::now() >= inventory_due {
                inventory_due = tokio::time::Instant::now() + INVENTORY_INTERVAL;
                transitions.extend(self.check_inventory().await);
                withdrawn_changed = self.check_unclaimed().await;
            }
            transitions.extend(self.book().expire(SystemTime::now()));
            if !transitions.is_empty() {
                self.act(&transitions).await;
            } else if withdrawn_changed {
                self.send_facts();
            }
        }
    }

    /// Feeds `events` to the book, with the live MIG instances of the GPUs whose events name a
    /// GPU instance; counts XIDs.
    pub async fn observe(&self, events: &[HealthEvent]) -> Vec<Transition> {
        let live = self.live_instances(events).await;
        self.observe_events(events, &live)
    }

    /// The MIG instances on each GPU an event of `events` names a GPU instance of, read now: the
    /// id means something only against the instances that exist when the event comes. A GPU whose
    /// instances cannot be read contributes none, so its events count for the whole GPU.
    async fn live_instances(&self, events: &[HealthEvent]) -> Vec<MigInstance> {
        let gpus: BTreeSet<u32> = events
            .iter()
            .filter(|e| e.gpu_instance().is_some())
            .map(HealthEvent::gpu)
            .collect();
        let mut live = Vec::new();
        for gpu in gpus {
            match self.gpus.run(move |b| b.instances_on(gpu)).await {
                Ok(Ok(instances)) => live.extend(instances),
                Ok(Err(e)) => tracing::warn!(gpu, error = %e,
                    "cannot list the GPU's MIG instances: its XIDs count for the whole GPU"),
                Err(e) => tracing::warn!(gpu, error = %e,
                    "the MIG instance listing task failed: the GPU's XIDs count for the whole GPU"),
            }
        }
        live
    }

    /// Feeds `events` to the book, `live` being the MIG instances on the node now; counts XIDs.
    pub(crate) fn observe_events(
        &self,
        events: &[HealthEvent],
        live: &[MigInstance],
    ) -> Vec<Transition> {
        let now = SystemTime::now();
        let mut book = self.book();
        let mut out = Vec::new();
        for e in events {
            let t = book.observe_event(e, live, now);
            if let HealthEvent::Xid { gpu, xid, .. } = *e {
                let fatal = !matches!(t, Some(Transition::NonFatalXid { .. }));
                self.metrics.xid_seen(gpu, xid, fatal);
            }
            tracing::info!(event = ?e, transition = ?t, "GPU health event");
            out.extend(t);
        }
        out
    }

    /// Reads the inventory and feeds which GPUs answer to the book.
    async fn check_inventory(&self) -> Vec<Transition> {
        match self.gpus.run(|b| b.inventory()).await {
            Ok(Ok(gpus)) => {
                let present: BTreeSet<u32> = gpus.iter().map(|g| g.index).collect();
                self.book().observe_inventory(&present, SystemTime::now())
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the GPU inventory failed");
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(error = %e, "the GPU inventory task failed");
                Vec::new()
            }
        }
    }

    /// Asks which instances no claim holds; withdraws the devices of those seen twice in a row and
    /// gives back those of instances gone (with a Node event for each). Whether the withdrawn set
    /// changed.
    pub(crate) async fn check_unclaimed(&self) -> bool {
        let Some(source) = &self.instances else {
            return false;
        };
        let now = source.unclaimed_instances().await;
        let changes = self.unclaimed().check(now);
        for i in &changes.appeared {
            self.report_unclaimed(i, true).await;
        }
        for i in &changes.gone {
            self.report_unclaimed(i, false).await;
        }
        changes.any()
    }

    /// Reports the facts, posts events, sets gauges and wakes the health stream.
    pub(crate) async fn act(&self, transitions: &[Transition]) {
        self.send_facts();
        for t in transitions {
            self.report(t).await;
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// Sends the current facts ([`Self::facts`]) to the publisher.
    pub fn send_facts(&self) {
        let now = self.facts();
        // `serves_only` (GPUs whose MIG mode switch failed) and `share_namespaces` are the
        // request path's: kept.
        self.facts.send_modify(|f| {
            f.taints = now.taints;
            f.withdrawn = now.withdrawn;
        });
    }

    /// What publication needs to know now: the taints of every device on an unhealthy GPU or
    /// overlapping an unhealthy GPU instance (by GPU and placement), and the placements of the
    /// unclaimed instances whose overlapping devices are withdrawn (`serves_only` and
    /// `share_namespaces` are left empty: the request path reports them).
    pub fn facts(&self) -> HealthFacts {
        let mut taints = BTreeMap::new();
        {
            let book = self.book();
            let effect = book.policy().effect;
            for d in self.devices.values() {
                let placement = Placement {
                    start: d.start,
                    size: d.size,
                };
                let t = book.device_taints(d.gpu_index, placement);
                if !t.is_empty() {
                    let t = t.into_iter().map(|t| device_taint(t, effect)).collect();
                    taints.insert((d.gpu_index, placement), t);
                }
            }
        }
        HealthFacts {
            taints,
            withdrawn: self.unclaimed().withdrawn_placements(),
            // The request path's, as `serves_only`.
            ..HealthFacts::default()
        }
    }
}

/// `t` as an API device taint with `effect`.
fn device_taint(t: GpuTaint, effect: TaintEffect) -> DeviceTaint {
    DeviceTaint {
        key: t.key.to_string(),
        value: Some(t.value),
        effect: effect.as_str().to_string(),
        time_added: Some(Time(
            k8s_openapi::jiff::Timestamp::try_from(t.since)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        )),
    }
}

#[tonic::async_trait]
impl HealthSource for HealthMonitor {
    /// Every published device: healthy, or unhealthy with the reason of its GPU or of the
    /// unhealthy GPU instance its placement overlaps.
    async fn device_health(&self) -> Vec<DeviceHealthReport> {
        let book = self.book();
        let mut reports: Vec<DeviceHealthReport> = self
            .devices
            .iter()
            .map(|(name, at)| {
                let placement = Placement {
                    start: at.start,
                    size: at.size,
                };
                let reason = book.device_reason(at.gpu_index, placement);
                DeviceHealthReport {
                    pool: self.node.clone(),
                    device: name.clone(),
                    healthy: reason.is_none(),
                    message: reason
                        .map(|r| format!("GPU {} ({}): {r}", at.gpu_index, at.gpu_uuid))
                        .unwrap_or_default(),
                }
            })
            .collect();
        reports.sort_by(|a, b| a.device.cmp(&b.device));
        reports
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }
}

#[cfg(test)]
mod tests;
