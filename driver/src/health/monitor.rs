//! The health monitor task: waits for the backend's health events, re-reads the inventory, feeds
//! the [`HealthBook`], and acts on its transitions.
//!
//! An XID that names a GPU instance is matched against the GPU's live MIG instances when it comes
//! ([`HealthMonitor::observe`]); the book decides whether it concerns that instance or the whole
//! GPU ([`super::book::scope`]).
//!
//! On a transition it (1) republishes the node's ResourceSlices with every device of an
//! unhealthy GPU, and every device overlapping an unhealthy GPU instance, tainted
//! ([`set_device_taints`]); (2) posts an Event on the Node naming the GPU (and GPU instance) and
//! the cause; (3) sets `das_kubelet_plugin_gpu_healthy` and counts XIDs; (4) wakes the kubelet's
//! health stream, which reports those devices `Unhealthy` with the reason (pods see it in
//! `status.containerStatuses[].allocatedResourcesStatus`).
//!
//! With every inventory check it also asks which MIG instances no claim holds (made with
//! `nvidia-smi`, or left over): an instance seen in two checks in a row has every device that
//! overlaps it withdrawn from the ResourceSlices ([`withdraw_overlapping`]) until it is gone, so
//! the scheduler never allocates a placement no prepare can create; a Node event names it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::book::{GpuTaint, HealthBook, TaintEffect, Transition};
use crate::blocking::BlockingCalls;
use crate::claims::{
    ClaimApi, DeviceHealthReport, DeviceRef, EventKind, EventTarget, HealthSource,
};
use crate::gpu::{GpuBackend, GpuInfo, HealthEvent, MigInstance, Placement};
use crate::metrics::Metrics;
use crate::publish::resource_slices::{set_device_taints, withdraw_overlapping};

/// How long one wait for health events lasts before the monitor looks at the inventory and the
/// quiet periods again.
pub const EVENT_WAIT: Duration = Duration::from_secs(1);
/// How often the inventory is read again (a GPU that fell off the bus leaves it).
pub const INVENTORY_INTERVAL: Duration = Duration::from_secs(5);

/// What the monitor publishes through: the node's desired ResourceSlice specs without taints,
/// and the publisher's input.
pub struct Publishing {
    /// The specs as built from the inventory (no taints).
    pub specs: Vec<ResourceSliceSpec>,
    /// The publisher's desired specs.
    pub desired: watch::Sender<Vec<ResourceSliceSpec>>,
}

/// The MIG instances no claim holds, from the GPUs and the checkpoint (the [`Preparer`] of
/// `crate::claims`).
#[tonic::async_trait]
pub trait UnclaimedInstances: Send + Sync {
    /// The instances on the GPUs that answer that no claim holds.
    async fn unclaimed_instances(&self) -> Vec<MigInstance>;
}

/// The preparer's unclaimed instances, from each GPU's instance list as the backend last knew it
/// ([`GpuBackend::cached_instances_on`]): on real GPUs NVML is read again only every
/// `INSTANCE_REFRESH` (60 s) or after a health event or a failed create or destroy, not at every
/// 5 s check; DAS's own creates and destroys show at once. So an instance made with `nvidia-smi`
/// is withdrawn within about 65 s instead of 10 s (docs/design.md §7, "Start-up").
#[tonic::async_trait]
impl UnclaimedInstances for crate::claims::Preparer {
    async fn unclaimed_instances(&self) -> Vec<MigInstance> {
        let mut out = Vec::new();
        for gpu in self.backend.gpu_indices() {
            let backend = self.backend.clone();
            let Ok(Ok(live)) = self
                .blocking
                .run(move || backend.cached_instances_on(gpu))
                .await
            else {
                continue;
            };
            out.extend(
                self.checkpoint
                    .read(|cp| crate::claims::plan::unclaimed(&live, cp)),
            );
        }
        out
    }
}

/// An instance by (GPU index, GPU-instance id, placement start).
type InstanceKey = (u32, u32, u32);

fn instance_key(i: &MigInstance) -> InstanceKey {
    (i.gpu_index, i.gi_id, i.placement.start)
}

/// What the monitor knows of unclaimed instances.
#[derive(Default)]
struct Unclaimed {
    /// Seen in the last check.
    seen: BTreeSet<InstanceKey>,
    /// Seen in two checks in a row (or at start-up, when nothing else runs): their overlapping
    /// devices are withdrawn.
    withdrawn: BTreeMap<InstanceKey, MigInstance>,
}

/// The monitor of one node's GPUs. Also the kubelet's [`HealthSource`].
pub struct HealthMonitor {
    book: Mutex<HealthBook>,
    backend: Arc<dyn GpuBackend>,
    blocking: BlockingCalls,
    node: String,
    gpus: BTreeMap<u32, String>,
    devices: HashMap<String, DeviceRef>,
    publishing: Publishing,
    api: Arc<dyn ClaimApi>,
    metrics: Arc<Metrics>,
    changes: watch::Sender<u64>,
    instances: Option<Arc<dyn UnclaimedInstances>>,
    unclaimed: Mutex<Unclaimed>,
}

impl HealthMonitor {
    /// A monitor of the GPUs of `inventory` (the devices the node publishes) with `book`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        book: HealthBook,
        backend: Arc<dyn GpuBackend>,
        blocking: BlockingCalls,
        node: &str,
        inventory: &[GpuInfo],
        publishing: Publishing,
        api: Arc<dyn ClaimApi>,
        metrics: Arc<Metrics>,
    ) -> Self {
        for g in inventory {
            metrics.set_gpu_healthy(g.index, true);
        }
        Self {
            book: Mutex::new(book),
            backend,
            blocking,
            node: node.to_string(),
            gpus: inventory
                .iter()
                .map(|g| (g.index, g.uuid.clone()))
                .collect(),
            devices: crate::claims::device_index(inventory),
            publishing,
            api,
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
            u.seen.insert(instance_key(&i));
            u.withdrawn.insert(instance_key(&i), i);
        }
        self
    }

    fn book(&self) -> MutexGuard<'_, HealthBook> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs until `stop`: waits for events ([`EVENT_WAIT`] at a time), reads the inventory every
    /// [`INVENTORY_INTERVAL`], expires quiet periods, and acts on transitions.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut inventory_due = tokio::time::Instant::now();
        loop {
            let backend = self.backend.clone();
            let events = tokio::select! {
                r = self.blocking.run(move || backend.wait_health_events(EVENT_WAIT)) => r,
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
                self.republish();
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
            let backend = self.backend.clone();
            match self.blocking.run(move || backend.instances_on(gpu)).await {
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
    pub fn observe_events(&self, events: &[HealthEvent], live: &[MigInstance]) -> Vec<Transition> {
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
        let backend = self.backend.clone();
        match self.blocking.run(move || backend.inventory()).await {
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
    pub async fn check_unclaimed(&self) -> bool {
        let Some(source) = &self.instances else {
            return false;
        };
        let now: BTreeMap<InstanceKey, MigInstance> = source
            .unclaimed_instances()
            .await
            .into_iter()
            .map(|i| (instance_key(&i), i))
            .collect();
        let (appeared, gone) = {
            let mut u = self.unclaimed.lock().unwrap_or_else(|p| p.into_inner());
            let confirmed: BTreeMap<InstanceKey, MigInstance> = now
                .iter()
                .filter(|(k, _)| u.seen.contains(k))
                .map(|(k, i)| (*k, i.clone()))
                .collect();
            let appeared: Vec<MigInstance> = confirmed
                .iter()
                .filter(|(k, _)| !u.withdrawn.contains_key(k))
                .map(|(_, i)| i.clone())
                .collect();
            let gone: Vec<MigInstance> = u
                .withdrawn
                .iter()
                .filter(|(k, _)| !confirmed.contains_key(k))
                .map(|(_, i)| i.clone())
                .collect();
            u.seen = now.keys().copied().collect();
            u.withdrawn = confirmed;
            (appeared, gone)
        };
        for i in &appeared {
            self.report_unclaimed(i, true).await;
        }
        for i in &gone {
            self.report_unclaimed(i, false).await;
        }
        !appeared.is_empty() || !gone.is_empty()
    }

    async fn report_unclaimed(&self, i: &MigInstance, appeared: bool) {
        let what = format!(
            "GPU {} ({}) MIG instance {} at memory slice {} ({})",
            i.gpu_index, i.gpu_uuid, i.profile, i.placement.start, i.mig_uuid
        );
        if appeared {
            tracing::warn!(gpu = i.gpu_index, profile = %i.profile, start = i.placement.start, mig = %i.mig_uuid,
                "a MIG instance no claim holds: the devices overlapping it are withdrawn until it is gone");
            self.api
                .warn(
                    &EventTarget::Node,
                    "UnclaimedMigInstance",
                    format!(
                        "{what} is held by no claim (created outside DAS, e.g. with nvidia-smi): the devices overlapping it are not offered until it is gone. Destroy it, or restart the plugin with --reclaim-foreign-slices."
                    ),
                )
                .await;
        } else {
            tracing::info!(gpu = i.gpu_index, start = i.placement.start, mig = %i.mig_uuid,
                "the unclaimed MIG instance is gone: its devices are offered again");
            self.api
                .event(
                    &EventTarget::Node,
                    EventKind::Normal,
                    "UnclaimedMigInstanceGone",
                    format!("{what} is gone: the devices overlapping it are offered again."),
                )
                .await;
        }
    }

    /// Republishes, posts events, sets gauges and wakes the health stream.
    pub async fn act(&self, transitions: &[Transition]) {
        self.republish();
        for t in transitions {
            self.report(t).await;
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// Sends the current specs ([`Self::specs`]) to the publisher.
    pub fn republish(&self) {
        self.publishing.desired.send_replace(self.specs());
    }

    /// The specs to publish now: taints of unhealthy GPUs and GPU instances, devices overlapping
    /// unclaimed instances withdrawn.
    pub fn specs(&self) -> Vec<ResourceSliceSpec> {
        let mut specs = self.publishing.specs.clone();
        {
            let book = self.book();
            let effect = book.policy().effect;
            set_device_taints(&mut specs, |gpu, placement| {
                book.device_taints(gpu, placement)
                    .into_iter()
                    .map(|t| device_taint(t, effect))
                    .collect()
            });
        }
        let held: BTreeMap<u32, Vec<Placement>> = {
            let u = self.unclaimed.lock().unwrap_or_else(|p| p.into_inner());
            let mut held: BTreeMap<u32, Vec<Placement>> = BTreeMap::new();
            for i in u.withdrawn.values() {
                held.entry(i.gpu_index).or_default().push(i.placement);
            }
            held
        };
        withdraw_overlapping(&mut specs, &held);
        specs
    }

    async fn report(&self, t: &Transition) {
        // Any change of a GPU or of one of its GPU instances may change whether all its devices
        // are healthy; a non-fatal XID changes nothing (and may be about a GPU not managed here).
        if !matches!(t, Transition::NonFatalXid { .. }) {
            let healthy = self.book().healthy(t.gpu());
            self.metrics.set_gpu_healthy(t.gpu(), healthy);
        }
        match t {
            Transition::Unhealthy { gpu, cause } => {
                let taints = self.book().taints(*gpu);
                let (list, quiet) = self.taint_list(&taints);
                let note = format!(
                    "{}: {cause}. Its MIG devices are tainted {list} until it answers without a fatal error for {quiet} s.",
                    self.gpu_name(*gpu)
                );
                tracing::error!(gpu, %cause, taints = %list, "GPU unhealthy");
                self.warn_unhealthy(note).await;
            }
            Transition::InstanceUnhealthy {
                gpu,
                instance,
                cause,
            } => {
                let taints = self.book().instance_taints(*gpu, instance.placement);
                let (list, quiet) = self.taint_list(&taints);
                let note = format!(
                    "{}, {instance}: {cause}. The MIG devices overlapping its placement are tainted {list} until no fatal error comes from it for {quiet} s; the GPU's other devices stay in service.",
                    self.gpu_name(*gpu)
                );
                tracing::error!(gpu, gi = instance.id, placement = %instance.placement, %cause,
                    taints = %list, "GPU instance unhealthy");
                self.warn_unhealthy(note).await;
            }
            Transition::NonFatalXid { gpu, xid } => {
                tracing::warn!(gpu, xid, "non-fatal XID (an application error)");
                self.api
                    .warn(
                        &EventTarget::Node,
                        "GpuXid",
                        format!(
                            "{}: XID {xid} ({}), an application error: the GPU stays in service.",
                            self.gpu_name(*gpu),
                            super::xid::describe(*xid)
                        ),
                    )
                    .await;
            }
            Transition::Recovered { gpu } => {
                tracing::info!(gpu, "GPU healthy again; taints removed");
                let note = format!(
                    "{}: healthy again; the taints on its MIG devices are removed.",
                    self.gpu_name(*gpu)
                );
                self.report_recovered(note).await;
            }
            Transition::InstanceRecovered { gpu, instance } => {
                tracing::info!(gpu, gi = instance.id, placement = %instance.placement,
                    "GPU instance healthy again; taints removed");
                let note = format!(
                    "{}, {instance}: healthy again; the taints on the MIG devices overlapping it are removed.",
                    self.gpu_name(*gpu)
                );
                self.report_recovered(note).await;
            }
        }
    }

    /// `taints` as `key=value:effect, …`, and the quiet period in seconds, for events.
    fn taint_list(&self, taints: &[GpuTaint]) -> (String, u64) {
        let book = self.book();
        let effect = book.policy().effect;
        let list: Vec<String> = taints
            .iter()
            .map(|t| format!("{}={}:{}", t.key, t.value, effect.as_str()))
            .collect();
        (list.join(", "), book.policy().quiet_period.as_secs())
    }

    async fn warn_unhealthy(&self, note: String) {
        self.api
            .warn(&EventTarget::Node, "GpuUnhealthy", note)
            .await;
    }

    async fn report_recovered(&self, note: String) {
        self.api
            .event(&EventTarget::Node, EventKind::Normal, "GpuRecovered", note)
            .await;
    }

    /// `GPU <index> (<UUID>)`, for events.
    fn gpu_name(&self, gpu: u32) -> String {
        match self.gpus.get(&gpu) {
            Some(uuid) => format!("GPU {gpu} ({uuid})"),
            None => format!("GPU {gpu}"),
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
mod tests {
    use super::*;
    use crate::claims::testing::{MemoryApi, NODE};
    use crate::gpu::EmulatedBackend;
    use crate::health::book::{HealthPolicy, TaintEffect};
    use crate::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};
    use das_api::health_taints;

    struct Setup {
        monitor: HealthMonitor,
        emu: Arc<EmulatedBackend>,
        api: Arc<MemoryApi>,
        metrics: Arc<Metrics>,
        desired: watch::Receiver<Vec<ResourceSliceSpec>>,
        _dir: tempfile::TempDir,
    }

    fn setup(effect: TaintEffect) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let emu = Arc::new(EmulatedBackend::open("A30:2", NODE, dir.path()).unwrap());
        let inventory = emu.inventory().unwrap();
        let specs: Vec<ResourceSliceSpec> =
            desired_resource_slices(NODE, &inventory, ResourceSliceLayout::SeparateCounterSlices)
                .unwrap()
                .into_iter()
                .map(|d| d.slice.spec)
                .collect();
        let (tx, desired) = watch::channel(specs.clone());
        let api = Arc::new(MemoryApi::default());
        let metrics = Arc::new(Metrics::new());
        let policy = HealthPolicy {
            quiet_period: Duration::ZERO,
            effect,
            ..HealthPolicy::default()
        };
        let monitor = HealthMonitor::new(
            HealthBook::new(policy, inventory.iter().map(|g| g.index)),
            emu.clone(),
            BlockingCalls::Threads,
            NODE,
            &inventory,
            Publishing { specs, desired: tx },
            api.clone(),
            metrics.clone(),
        );
        Setup {
            monitor,
            emu,
            api,
            metrics,
            desired,
            _dir: dir,
        }
    }

    /// Taints of the published devices, by device name (untainted ones left out).
    fn published_taints(s: &Setup) -> BTreeMap<String, Vec<(String, String, String)>> {
        s.desired
            .borrow()
            .iter()
            .flat_map(|spec| spec.devices.iter().flatten())
            .filter_map(|d| {
                let t = d.taints.as_ref()?;
                Some((
                    d.name.clone(),
                    t.iter()
                        .map(|t| {
                            (
                                t.key.clone(),
                                t.value.clone().unwrap_or_default(),
                                t.effect.clone(),
                            )
                        })
                        .collect(),
                ))
            })
            .collect()
    }

    fn events(s: &Setup) -> Vec<String> {
        s.api
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }

    #[tokio::test]
    async fn a_fatal_xid_taints_its_gpu_reports_it_and_recovery_clears_it() {
        let s = setup(TaintEffect::NoSchedule);
        let mut changes = s.monitor.changes().unwrap();
        let t = s
            .monitor
            .observe(&[HealthEvent::Xid {
                gpu: 0,
                xid: 79,
                gpu_instance: None,
            }])
            .await;
        s.monitor.act(&t).await;
        assert!(changes.has_changed().unwrap(), "the health stream is woken");
        changes.mark_unchanged();
        let taints = published_taints(&s);
        assert!(!taints.is_empty());
        for (device, t) in &taints {
            assert!(device.starts_with("gpu-0-"), "{device}");
            assert_eq!(
                t,
                &[(health_taints::XID.into(), "79".into(), "NoSchedule".into())]
            );
        }
        let health = s.monitor.device_health().await;
        for h in &health {
            assert_eq!(h.healthy, h.device.starts_with("gpu-1-"), "{}", h.device);
            if !h.healthy {
                assert!(
                    h.message.contains("XID 79 (GPU has fallen off the bus)"),
                    "{}",
                    h.message
                );
            }
        }
        assert_eq!(events(&s), ["GpuUnhealthy"]);
        let note = s.api.events.lock().unwrap()[0].1.clone();
        assert!(
            note.contains("GPU 0 (GPU-") && note.contains("mig.das.com/xid=79:NoSchedule"),
            "{note}"
        );
        let text = s.metrics.probe.encode();
        assert!(
            text.contains(r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"das_kubelet_plugin_gpu_healthy{gpu="1"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"xid_events_total{gpu="0",xid="79",fatal="true"} 1"#),
            "{text}"
        );

        // Quiet period 0: the next expiry recovers it.
        let t = s.monitor.book().expire(SystemTime::now());
        assert_eq!(t, [Transition::Recovered { gpu: 0 }]);
        s.monitor.act(&t).await;
        assert!(published_taints(&s).is_empty());
        assert!(s.monitor.device_health().await.iter().all(|h| h.healthy));
        assert_eq!(events(&s), ["GpuUnhealthy", "GpuRecovered"]);
    }

    #[tokio::test]
    async fn a_non_fatal_xid_changes_nothing_but_a_metric_and_an_event() {
        let s = setup(TaintEffect::NoSchedule);
        let t = s
            .monitor
            .observe(&[HealthEvent::Xid {
                gpu: 1,
                xid: 13,
                gpu_instance: Some(2),
            }])
            .await;
        assert_eq!(t, [Transition::NonFatalXid { gpu: 1, xid: 13 }]);
        s.monitor.act(&t).await;
        assert!(published_taints(&s).is_empty());
        assert!(s.monitor.device_health().await.iter().all(|h| h.healthy));
        assert_eq!(events(&s), ["GpuXid"]);
        assert!(
            s.metrics
                .probe
                .encode()
                .contains(r#"xid_events_total{gpu="1",xid="13",fatal="false"} 1"#)
        );
    }

    #[tokio::test]
    async fn a_lost_gpu_is_tainted_no_execute_when_asked_and_clears_once_back() {
        let s = setup(TaintEffect::NoExecute);
        s.emu.set_gpu_lost(1, true);
        let t = s.monitor.check_inventory().await;
        assert_eq!(
            t,
            [Transition::Unhealthy {
                gpu: 1,
                cause: crate::health::Cause::Lost
            }]
        );
        s.monitor.act(&t).await;
        let taints = published_taints(&s);
        assert!(taints.keys().all(|d| d.starts_with("gpu-1-")) && !taints.is_empty());
        assert!(taints.values().all(|t| t
            == &[(
                health_taints::GPU_LOST.into(),
                "true".into(),
                "NoExecute".into()
            )]));
        assert!(
            s.monitor.book().expire(SystemTime::now()).is_empty(),
            "not while lost"
        );
        s.emu.set_gpu_lost(1, false);
        assert!(s.monitor.check_inventory().await.is_empty());
        let t = s.monitor.book().expire(SystemTime::now());
        assert_eq!(t, [Transition::Recovered { gpu: 1 }]);
        s.monitor.act(&t).await;
        assert!(published_taints(&s).is_empty());
    }

    struct Fixed(Mutex<Vec<MigInstance>>);

    #[tonic::async_trait]
    impl UnclaimedInstances for Fixed {
        async fn unclaimed_instances(&self) -> Vec<MigInstance> {
            self.0.lock().unwrap().clone()
        }
    }

    fn device_names(s: &Setup) -> Vec<String> {
        s.desired
            .borrow()
            .iter()
            .flat_map(|spec| spec.devices.iter().flatten())
            .map(|d| d.name.clone())
            .collect()
    }

    /// `s` with its monitor asking `source` (and `at_start` withdrawn).
    fn with_source(s: Setup, source: Arc<Fixed>, at_start: Vec<MigInstance>) -> Setup {
        Setup {
            monitor: s.monitor.with_unclaimed_instances(source, at_start),
            ..s
        }
    }

    #[tokio::test]
    async fn an_unclaimed_instance_seen_twice_withdraws_its_devices_until_it_is_gone() {
        let s = setup(TaintEffect::NoSchedule);
        let foreign = s.emu.create_foreign_instance(1, "1g.6gb", 0).unwrap();
        let source = Arc::new(Fixed(Mutex::new(vec![foreign])));
        let s = with_source(s, source.clone(), Vec::new());
        let all = device_names(&s);
        assert!(!s.monitor.check_unclaimed().await, "once is not enough");
        assert!(s.monitor.check_unclaimed().await, "twice in a row is");
        s.monitor.republish();
        let left = device_names(&s);
        assert!(
            !left.contains(&"gpu-1-mig-1g-6gb-0".to_string()),
            "{left:?}"
        );
        assert!(left.contains(&"gpu-1-mig-1g-6gb-1".to_string()));
        assert!(left.contains(&"gpu-0-mig-1g-6gb-0".to_string()));
        assert_eq!(events(&s), ["UnclaimedMigInstance"]);
        assert!(
            !s.monitor.check_unclaimed().await,
            "no change while it stays"
        );

        source.0.lock().unwrap().clear();
        assert!(s.monitor.check_unclaimed().await);
        s.monitor.republish();
        assert_eq!(device_names(&s), all);
        assert_eq!(
            events(&s),
            ["UnclaimedMigInstance", "UnclaimedMigInstanceGone"]
        );
    }

    #[tokio::test]
    async fn instances_found_at_start_are_withdrawn_at_once() {
        let s = setup(TaintEffect::NoSchedule);
        let foreign = s.emu.create_foreign_instance(0, "4g.24gb", 0).unwrap();
        let source = Arc::new(Fixed(Mutex::new(vec![foreign.clone()])));
        let s = with_source(s, source, vec![foreign]);
        let specs = s.monitor.specs();
        let names: Vec<&str> = specs
            .iter()
            .flat_map(|x| x.devices.iter().flatten())
            .map(|d| d.name.as_str())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with("gpu-0-")), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("gpu-1-")));
        assert!(!s.monitor.check_unclaimed().await, "already withdrawn");
    }

    /// Device names of `s`'s GPU 0 whose placement overlaps `placement`.
    fn gpu0_devices_overlapping(s: &Setup, placement: Placement) -> BTreeSet<String> {
        let inventory = s.emu.inventory().unwrap();
        crate::claims::device_index(&inventory)
            .into_iter()
            .filter(|(_, d)| {
                let p = Placement {
                    start: d.start,
                    size: d.size,
                };
                d.gpu_index == 0 && p.mask() & placement.mask() != 0
            })
            .map(|(name, _)| name)
            .collect()
    }

    fn xid_on(gpu: u32, xid: u32, gpu_instance: u32) -> HealthEvent {
        HealthEvent::Xid {
            gpu,
            xid,
            gpu_instance: Some(gpu_instance),
        }
    }

    #[tokio::test]
    async fn an_xid_naming_a_gpu_instance_taints_and_reports_only_its_devices() {
        let s = setup(TaintEffect::NoSchedule);
        let x = s.emu.create_instance(0, "1g.6gb", 0).unwrap();
        let y = s.emu.create_instance(0, "1g.6gb", 1).unwrap();
        let t = s.monitor.observe(&[xid_on(0, 94, x.gi_id)]).await;
        assert!(
            matches!(&t[..], [Transition::InstanceUnhealthy { gpu: 0, instance, cause: crate::health::Cause::Xid(94) }]
                if instance.id == x.gi_id && instance.placement == x.placement),
            "{t:?}"
        );
        s.monitor.act(&t).await;

        let x_devices = gpu0_devices_overlapping(&s, x.placement);
        for d in [
            "gpu-0-mig-1g-6gb-0",
            "gpu-0-mig-2g-12gb-0",
            "gpu-0-mig-4g-24gb-0",
        ] {
            assert!(x_devices.contains(d), "{d} overlaps X: {x_devices:?}");
        }
        let taints = published_taints(&s);
        assert_eq!(taints.keys().cloned().collect::<BTreeSet<_>>(), x_devices);
        assert!(
            taints
                .values()
                .all(|t| t == &[(health_taints::XID.into(), "94".into(), "NoSchedule".into())])
        );
        let y_device = format!("gpu-0-mig-1g-6gb-{}", y.placement.start);
        assert!(!taints.contains_key(&y_device), "Y's slice is untouched");

        let unhealthy: BTreeSet<String> = s
            .monitor
            .device_health()
            .await
            .into_iter()
            .filter(|h| !h.healthy)
            .inspect(|h| assert!(h.message.contains("GPU instance"), "{}", h.message))
            .map(|h| h.device)
            .collect();
        assert_eq!(unhealthy, x_devices);
        assert_eq!(events(&s), ["GpuUnhealthy"]);
        let note = s.api.events.lock().unwrap()[0].1.clone();
        assert!(
            note.contains(&format!(
                "GPU instance {} (1g.6gb at memory slices 0:1)",
                x.gi_id
            )) && note.contains("mig.das.com/xid=94:NoSchedule")
                && note.contains("other devices stay in service"),
            "{note}"
        );
        let gauge = r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 0"#;
        assert!(s.metrics.probe.encode().contains(gauge));

        // Quiet period 0: the next expiry recovers the instance.
        let t = s.monitor.book().expire(SystemTime::now());
        assert!(
            matches!(&t[..], [Transition::InstanceRecovered { gpu: 0, .. }]),
            "{t:?}"
        );
        s.monitor.act(&t).await;
        assert!(published_taints(&s).is_empty());
        assert_eq!(events(&s), ["GpuUnhealthy", "GpuRecovered"]);
        let gauge = r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 1"#;
        assert!(s.metrics.probe.encode().contains(gauge));
    }

    /// The pods kube-controller-manager's device taint eviction controller evicts: those whose
    /// claim is allocated a device carrying a `NoExecute` taint (no claim here tolerates one).
    /// `pods`: (pod, the device its claim is allocated).
    fn evicted<'a>(s: &Setup, pods: &[(&'a str, &str)]) -> Vec<&'a str> {
        let taints = published_taints(s);
        pods.iter()
            .filter(|(_, device)| {
                taints
                    .get(*device)
                    .is_some_and(|ts| ts.iter().any(|(_, _, effect)| effect == "NoExecute"))
            })
            .map(|(pod, _)| *pod)
            .collect()
    }

    #[tokio::test]
    async fn under_evict_on_fatal_only_the_pods_of_the_gpu_instances_claim_are_evicted() {
        let s = setup(TaintEffect::NoExecute);
        let x = s.emu.create_instance(0, "1g.6gb", 0).unwrap();
        s.emu.create_instance(0, "1g.6gb", 1).unwrap();
        let pods = [
            ("victim", "gpu-0-mig-1g-6gb-0"),
            ("bystander", "gpu-0-mig-1g-6gb-1"),
            ("elsewhere", "gpu-1-mig-1g-6gb-0"),
        ];
        // Raised through the emulated backend's event injection, as a running plugin gets it.
        s.emu.raise_health_event(xid_on(0, 94, x.gi_id));
        let raised = s.emu.wait_health_events(Duration::from_millis(10)).unwrap();
        let t = s.monitor.observe(&raised).await;
        s.monitor.act(&t).await;
        assert_eq!(evicted(&s, &pods), ["victim"]);

        // A GPU-wide fatal XID on the same GPU reaches the bystander too.
        let t = s.monitor.observe(&[xid_on(0, 79, x.gi_id)]).await;
        s.monitor.act(&t).await;
        assert_eq!(evicted(&s, &pods), ["victim", "bystander"]);
    }

    /// Issue 30 item 5: on real GPUs the unclaimed-instance check reads NVML's instance lists
    /// once per `INSTANCE_REFRESH`, not at every check, and an instance made with `nvidia-smi`
    /// is still withdrawn: one check after the next re-read.
    #[tokio::test]
    async fn on_nvml_the_unclaimed_check_reads_the_instances_once_per_refresh_period() {
        use crate::gpu::nvml::{FakeGpuSpec, FakeNvml, INSTANCE_REFRESH, NvmlBackend, NvmlOptions};
        let dir = tempfile::tempdir().unwrap();
        let (base, offset) = (
            std::time::Instant::now(),
            Arc::new(Mutex::new(Duration::ZERO)),
        );
        let now = offset.clone();
        let model = crate::gpu::find_model("A100-SXM4-40GB").unwrap().unwrap();
        let profiles = model.profiles.len() as u64;
        let nvml = Arc::new(
            NvmlBackend::new(
                FakeNvml::new(vec![FakeGpuSpec::mig(model, true)]),
                NvmlOptions {
                    proc_root: "/nonexistent-proc".into(),
                    enable_mig_mode: false,
                },
            )
            .unwrap()
            .with_clock(Arc::new(move || base + *now.lock().unwrap())),
        );
        let api = Arc::new(MemoryApi::default());
        let preparer = Arc::new(crate::claims::testing::preparer(
            dir.path(),
            nvml.clone(),
            api.clone(),
            BlockingCalls::Threads,
        ));
        let inventory = nvml.inventory().unwrap();
        let specs: Vec<ResourceSliceSpec> =
            desired_resource_slices(NODE, &inventory, ResourceSliceLayout::SeparateCounterSlices)
                .unwrap()
                .into_iter()
                .map(|d| d.slice.spec)
                .collect();
        let (tx, _desired) = watch::channel(specs.clone());
        let monitor = HealthMonitor::new(
            HealthBook::new(HealthPolicy::default(), inventory.iter().map(|g| g.index)),
            nvml.clone(),
            BlockingCalls::Threads,
            NODE,
            &inventory,
            Publishing { specs, desired: tx },
            api.clone(),
            Arc::new(Metrics::new()),
        )
        .with_unclaimed_instances(preparer, Vec::new());
        let reads = || nvml.api().call_counts()["nvmlDeviceGetGpuInstances"] / profiles;

        let mut withdrawn_at = None;
        for check in 0..14 {
            let t = INVENTORY_INTERVAL * check;
            if check == 1 {
                // An administrator makes a 1g.5gb at 0 with nvidia-smi.
                nvml.api()
                    .admin_create(0, 19, Placement { start: 0, size: 1 });
            }
            if monitor.check_unclaimed().await {
                withdrawn_at.get_or_insert(t);
            }
            *offset.lock().unwrap() += INVENTORY_INTERVAL;
        }
        assert_eq!(
            withdrawn_at,
            Some(INSTANCE_REFRESH + INVENTORY_INTERVAL),
            "seen at the re-read, withdrawn at the check after"
        );
        assert_eq!(reads(), 2, "14 checks, NVML read at 0 s and 60 s");
        let reasons: Vec<String> = api
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|(r, _)| r.clone())
            .collect();
        assert_eq!(reasons, ["UnclaimedMigInstance"]);
    }

    #[tokio::test]
    async fn an_xid_naming_no_live_gpu_instance_taints_the_whole_gpu() {
        let s = setup(TaintEffect::NoSchedule);
        let x = s.emu.create_instance(0, "1g.6gb", 0).unwrap();
        let t = s.monitor.observe(&[xid_on(0, 94, x.gi_id + 1)]).await;
        assert_eq!(
            t,
            [Transition::Unhealthy {
                gpu: 0,
                cause: crate::health::Cause::Xid(94)
            }]
        );
        s.monitor.act(&t).await;
        let all_gpu0 = gpu0_devices_overlapping(&s, Placement { start: 0, size: 8 });
        let tainted: BTreeSet<String> = published_taints(&s).into_keys().collect();
        assert_eq!(tainted, all_gpu0);
    }
}
