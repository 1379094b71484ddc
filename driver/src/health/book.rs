//! The health of each GPU, as a pure state machine over what the monitor observes (health events,
//! the inventory, the live MIG instances) and the time: which GPUs and GPU instances are unhealthy,
//! why, since when, and when they count as recovered. The monitor ([`super::monitor`]) feeds it
//! and acts on its transitions.
//!
//! A GPU is unhealthy while it is **lost** (missing from the inventory) or after a **fatal
//! event** (a fatal XID, an uncorrectable ECC error): every device of it is tainted. A fatal XID
//! that names a live **GPU instance** ([`scope`]) makes only that instance unhealthy: the devices
//! whose placement overlaps the instance's placement are tainted, the GPU's other devices stay in
//! service. Either recovers once the GPU answers again and no fatal event came for it for the
//! quiet period; a fatal event during the quiet period starts it over.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use das_api::health_taints;

use super::xid;
use crate::gpu::{HealthEvent, MigInstance, Placement};

/// What the policy does with events, from the plugin's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// How long a GPU must answer without a fatal event before its taints go.
    pub quiet_period: Duration,
    /// XIDs the operator does not treat as fatal, besides the application errors.
    pub ignored_xids: BTreeSet<u32>,
    /// The effect of the taints: `NoSchedule`, or `NoExecute` to evict running pods.
    pub effect: TaintEffect,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            quiet_period: Duration::from_secs(300),
            ignored_xids: BTreeSet::new(),
            effect: TaintEffect::NoSchedule,
        }
    }
}

/// The effect of a device taint (`resource.k8s.io/v1` `DeviceTaint.effect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    /// New pods are not allocated the device; running ones stay.
    NoSchedule,
    /// Also evicts running pods whose claims do not tolerate the taint (the taint eviction
    /// controller of kube-controller-manager).
    NoExecute,
}

impl TaintEffect {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// Why a GPU, or a GPU instance, is unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// It does not answer (missing from the inventory).
    Lost,
    /// A fatal XID.
    Xid(u32),
    /// An uncorrectable ECC error.
    UncorrectableEcc,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Lost => write!(f, "the GPU does not answer (lost or removed)"),
            Cause::Xid(x) => write!(f, "XID {x} ({})", xid::describe(*x)),
            Cause::UncorrectableEcc => write!(f, "uncorrectable ECC error"),
        }
    }
}

/// A GPU instance a fatal XID was scoped to, as the backend listed it when the event came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    /// GPU-instance ID (NVML's `gpuInstanceId`).
    pub id: u32,
    /// GI profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// The memory slices it occupies: its devices are the published ones overlapping them.
    pub placement: Placement,
}

impl GpuInstance {
    fn of(i: &MigInstance) -> Self {
        Self {
            id: i.gi_id,
            profile: i.profile.clone(),
            placement: i.placement,
        }
    }
}

impl std::fmt::Display for GpuInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU instance {} ({} at memory slices {})",
            self.id, self.profile, self.placement
        )
    }
}

/// Which devices of its GPU an event concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every device of the GPU.
    Gpu,
    /// The devices whose placement overlaps this GPU instance's placement.
    Instance(GpuInstance),
}

/// Which devices `event` concerns, given `live`, the MIG instances on the node now.
///
/// NVML's `nvmlEventData_t` carries `gpuInstanceId` and `computeInstanceId` for an XID of a
/// MIG device, and the invalid id `0xFFFFFFFF` when the event is not instance-scoped (`nvml.h`,
/// `nvmlEventData_t`); NVIDIA's k8s-device-plugin (`internal/rm/health.go`) marks unhealthy only
/// the MIG device whose GI and CI ids match an event that names them, and every device of the GPU
/// otherwise (docs/reference/mig.md, "Health events"). DAS puts one compute instance in each GPU
/// instance, so the GI id alone names the device, and the devices to taint are those overlapping
/// its placement (docs/design.md §7, "Health").
///
/// So an XID is scoped to a GPU instance when it names one, is not about the whole GPU
/// ([`xid::is_gpu_wide`]), and a live instance on the event's GPU has that id (ids are reused
/// after a destroy, so only a live instance can be meant). Anything else concerns the whole GPU:
/// no id, a GPU-wide XID, an uncorrectable ECC error, or an id no live instance has (destroyed
/// since, or unreadable), since a fault must never go unreported.
pub fn scope(event: &HealthEvent, live: &[MigInstance]) -> Scope {
    let HealthEvent::Xid {
        gpu,
        xid,
        gpu_instance: Some(id),
    } = *event
    else {
        return Scope::Gpu;
    };
    if xid::is_gpu_wide(xid) {
        return Scope::Gpu;
    }
    live.iter()
        .find(|i| i.gpu_index == gpu && i.gi_id == id)
        .map_or(Scope::Gpu, |i| Scope::Instance(GpuInstance::of(i)))
}

/// One taint a device carries (`key` from [`das_api::health_taints`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTaint {
    /// Taint key, e.g. `mig.das.com/xid`.
    pub key: &'static str,
    /// Taint value, e.g. the XID.
    pub value: String,
    /// When the condition began (the taint's `timeAdded`), whole seconds.
    pub since: SystemTime,
}

/// A change of one GPU's, or GPU instance's, health the monitor acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The GPU became unhealthy, or is unhealthy for one more reason.
    Unhealthy {
        /// GPU index.
        gpu: u32,
        /// The new reason.
        cause: Cause,
    },
    /// A GPU instance became unhealthy, or is unhealthy for one more reason: only the devices
    /// overlapping its placement are.
    InstanceUnhealthy {
        /// GPU index.
        gpu: u32,
        /// The GPU instance.
        instance: GpuInstance,
        /// The new reason.
        cause: Cause,
    },
    /// A non-fatal XID: counted and reported, nothing else changes.
    NonFatalXid {
        /// GPU index.
        gpu: u32,
        /// The XID.
        xid: u32,
    },
    /// The GPU is healthy again (answers, and no fatal event for the quiet period).
    Recovered {
        /// GPU index.
        gpu: u32,
    },
    /// The devices of a GPU instance are healthy again (no fatal event on it for the quiet
    /// period).
    InstanceRecovered {
        /// GPU index.
        gpu: u32,
        /// The GPU instance.
        instance: GpuInstance,
    },
}

impl Transition {
    /// The GPU it is about.
    pub fn gpu(&self) -> u32 {
        match self {
            Transition::Unhealthy { gpu, .. }
            | Transition::InstanceUnhealthy { gpu, .. }
            | Transition::NonFatalXid { gpu, .. }
            | Transition::Recovered { gpu }
            | Transition::InstanceRecovered { gpu, .. } => *gpu,
        }
    }
}

/// The state of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GpuHealth {
    /// Lost, and whether it answers again.
    lost: Option<Lost>,
    /// The latest GPU-wide fatal event and the start of the fatal episode.
    fatal: Option<Fatal>,
    /// Fatal XIDs scoped to one GPU instance, by its placement: devices are published by
    /// placement, and a GI id is given to another instance once its own is destroyed.
    instances: BTreeMap<Placement, InstanceFatal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lost {
    /// First missing from the inventory at.
    since: SystemTime,
    /// Answering again since; `None` while missing.
    back_since: Option<SystemTime>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fatal {
    latest: Cause,
    at: SystemTime,
    since: SystemTime,
}

impl Fatal {
    /// The fatal state after `cause` at `now`, following `prev`, and whether `cause` is news (a
    /// repeat of the latest cause only restarts the quiet period; the episode keeps its start).
    fn after(prev: Option<Fatal>, cause: Cause, now: SystemTime) -> (Fatal, bool) {
        let since = prev.map_or(now, |f| f.since);
        let fatal = Fatal {
            latest: cause,
            at: now,
            since,
        };
        (fatal, prev.is_none_or(|f| f.latest != cause))
    }

    fn taint(self) -> GpuTaint {
        let (key, value) = match self.latest {
            Cause::Xid(x) => (health_taints::XID, x.to_string()),
            Cause::UncorrectableEcc => (health_taints::ECC, "uncorrectable".to_string()),
            Cause::Lost => unreachable!("a fatal event is never Lost"),
        };
        GpuTaint {
            key,
            value,
            since: self.since,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct InstanceFatal {
    instance: GpuInstance,
    fatal: Fatal,
}

impl GpuHealth {
    /// Unhealthy as a whole (lost or a GPU-wide fatal event).
    fn unhealthy(&self) -> bool {
        self.lost.is_some() || self.fatal.is_some()
    }

    fn missing(&self) -> bool {
        self.lost.is_some_and(|l| l.back_since.is_none())
    }

    /// The unhealthy GPU instances whose placement overlaps `placement`.
    fn instances_overlapping(&self, placement: Placement) -> impl Iterator<Item = &InstanceFatal> {
        self.instances
            .values()
            .filter(move |f| f.instance.placement.mask() & placement.mask() != 0)
    }
}

/// Every managed GPU's health.
#[derive(Debug, Clone)]
pub struct HealthBook {
    policy: HealthPolicy,
    gpus: BTreeMap<u32, GpuHealth>,
}

/// `t` truncated to whole seconds (the API stores `timeAdded` with second precision, so a taint
/// sent with sub-seconds would differ from the stored one on every comparison).
fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

impl HealthBook {
    /// Every GPU of `gpus` healthy.
    pub fn new(policy: HealthPolicy, gpus: impl IntoIterator<Item = u32>) -> Self {
        Self {
            policy,
            gpus: gpus
                .into_iter()
                .map(|g| (g, GpuHealth::default()))
                .collect(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &HealthPolicy {
        &self.policy
    }

    /// Records `event` at `now`. `live` are the MIG instances on the node now: they decide
    /// whether an XID that names a GPU instance concerns only that instance ([`scope`]).
    pub fn observe_event(
        &mut self,
        event: &HealthEvent,
        live: &[MigInstance],
        now: SystemTime,
    ) -> Option<Transition> {
        let gpu = event.gpu();
        let cause = match *event {
            HealthEvent::Xid { xid, .. } if !xid::is_fatal(xid, &self.policy.ignored_xids) => {
                return Some(Transition::NonFatalXid { gpu, xid });
            }
            HealthEvent::Xid { xid, .. } => Cause::Xid(xid),
            HealthEvent::UncorrectableEcc { .. } => Cause::UncorrectableEcc,
        };
        let h = self.gpus.get_mut(&gpu)?;
        let now = whole_seconds(now);
        match scope(event, live) {
            Scope::Gpu => {
                let (fatal, new) = Fatal::after(h.fatal, cause, now);
                h.fatal = Some(fatal);
                new.then_some(Transition::Unhealthy { gpu, cause })
            }
            Scope::Instance(instance) => {
                let prev = h.instances.get(&instance.placement).map(|f| f.fatal);
                let (fatal, new) = Fatal::after(prev, cause, now);
                h.instances.insert(
                    instance.placement,
                    InstanceFatal {
                        instance: instance.clone(),
                        fatal,
                    },
                );
                new.then_some(Transition::InstanceUnhealthy {
                    gpu,
                    instance,
                    cause,
                })
            }
        }
    }

    /// Records that the GPUs in `present` answer and every other managed GPU does not.
    pub fn observe_inventory(
        &mut self,
        present: &BTreeSet<u32>,
        now: SystemTime,
    ) -> Vec<Transition> {
        let now = whole_seconds(now);
        let mut out = Vec::new();
        for (&gpu, h) in &mut self.gpus {
            match (present.contains(&gpu), &mut h.lost) {
                (false, None) => {
                    h.lost = Some(Lost {
                        since: now,
                        back_since: None,
                    });
                    out.push(Transition::Unhealthy {
                        gpu,
                        cause: Cause::Lost,
                    });
                }
                // Missing again before it recovered: the quiet period starts over.
                (false, Some(l)) => l.back_since = None,
                (true, Some(l)) if l.back_since.is_none() => l.back_since = Some(now),
                (true, _) => {}
            }
        }
        out
    }

    /// GPUs and GPU instances that recover at `now`: the GPU answers, and neither a fatal event
    /// (of the GPU, or of the instance) nor the GPU's return is more recent than the quiet period.
    pub fn expire(&mut self, now: SystemTime) -> Vec<Transition> {
        let quiet = self.policy.quiet_period;
        let quiet_since = |t: SystemTime| now.duration_since(t).is_ok_and(|d| d >= quiet);
        let mut out = Vec::new();
        for (&gpu, h) in &mut self.gpus {
            // A missing GPU stays tainted as lost: nothing on it can be quiet yet.
            if h.missing() {
                continue;
            }
            let last = h.fatal.map(|f| f.at).max(h.lost.and_then(|l| l.back_since));
            if h.unhealthy() && last.is_some_and(quiet_since) {
                h.lost = None;
                h.fatal = None;
                out.push(Transition::Recovered { gpu });
            }
            h.instances.retain(|_, f| {
                let recovered = quiet_since(f.fatal.at);
                if recovered {
                    out.push(Transition::InstanceRecovered {
                        gpu,
                        instance: f.instance.clone(),
                    });
                }
                !recovered
            });
        }
        out
    }

    /// The taints every device of GPU `gpu` carries now for GPU-wide causes (none when healthy as
    /// a whole).
    pub fn taints(&self, gpu: u32) -> Vec<GpuTaint> {
        let Some(h) = self.gpus.get(&gpu) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // Answering again but not yet quiet: still tainted as lost.
        if let Some(l) = h.lost {
            out.push(GpuTaint {
                key: health_taints::GPU_LOST,
                value: "true".into(),
                since: l.since,
            });
        }
        out.extend(h.fatal.map(Fatal::taint));
        out
    }

    /// The taints the devices overlapping the unhealthy GPU instance at `placement` of GPU `gpu`
    /// carry for it (none when that instance is healthy).
    pub fn instance_taints(&self, gpu: u32, placement: Placement) -> Vec<GpuTaint> {
        self.gpus
            .get(&gpu)
            .and_then(|h| h.instances.get(&placement))
            .map(|f| f.fatal.taint())
            .into_iter()
            .collect()
    }

    /// The taints the device at `placement` of GPU `gpu` carries now: its GPU's, then those of
    /// every unhealthy GPU instance its placement overlaps, one per key (the first wins), so no
    /// device carries more than the three DAS keys (the API allows 4 on Kubernetes 1.34).
    pub fn device_taints(&self, gpu: u32, placement: Placement) -> Vec<GpuTaint> {
        let mut out = self.taints(gpu);
        let Some(h) = self.gpus.get(&gpu) else {
            return out;
        };
        for t in h.instances_overlapping(placement).map(|f| f.fatal.taint()) {
            if out.iter().all(|o| o.key != t.key) {
                out.push(t);
            }
        }
        out
    }

    /// Whether every device of GPU `gpu` is healthy: the GPU as a whole and each of its GPU
    /// instances.
    pub fn healthy(&self, gpu: u32) -> bool {
        self.gpus
            .get(&gpu)
            .is_none_or(|h| !h.unhealthy() && h.instances.is_empty())
    }

    /// Why GPU `gpu` as a whole is unhealthy, for the health stream and events; `None` when
    /// healthy.
    pub fn reason(&self, gpu: u32) -> Option<String> {
        let h = self.gpus.get(&gpu)?;
        if h.missing() {
            return Some(Cause::Lost.to_string());
        }
        if let Some(f) = h.fatal {
            return Some(format!(
                "{} (healthy after {} s without a fatal event)",
                f.latest,
                self.policy.quiet_period.as_secs()
            ));
        }
        h.lost.map(|_| {
            format!(
                "the GPU answers again after it was lost (healthy after {} s without a fatal event)",
                self.policy.quiet_period.as_secs()
            )
        })
    }

    /// Why the device at `placement` of GPU `gpu` is unhealthy: its GPU's reason, else that of
    /// the first unhealthy GPU instance its placement overlaps; `None` when healthy.
    pub fn device_reason(&self, gpu: u32, placement: Placement) -> Option<String> {
        if let Some(r) = self.reason(gpu) {
            return Some(r);
        }
        let f = self
            .gpus
            .get(&gpu)?
            .instances_overlapping(placement)
            .next()?;
        Some(format!(
            "{} on {} (healthy after {} s without a fatal event on it)",
            f.fatal.latest,
            f.instance,
            self.policy.quiet_period.as_secs()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn book() -> HealthBook {
        HealthBook::new(
            HealthPolicy {
                quiet_period: Duration::from_secs(60),
                ..HealthPolicy::default()
            },
            [0, 1],
        )
    }

    fn xid(gpu: u32, xid: u32) -> HealthEvent {
        HealthEvent::Xid {
            gpu,
            xid,
            gpu_instance: None,
        }
    }

    #[test]
    fn a_fatal_xid_taints_its_gpu_until_the_quiet_period_passes() {
        let mut b = book();
        assert_eq!(
            b.observe_event(&xid(0, 79), &[], at(100)),
            Some(Transition::Unhealthy {
                gpu: 0,
                cause: Cause::Xid(79)
            })
        );
        assert_eq!(
            b.taints(0),
            [GpuTaint {
                key: health_taints::XID,
                value: "79".into(),
                since: at(100)
            }]
        );
        assert!(b.taints(1).is_empty(), "the other GPU is untouched");
        // A second fatal XID restarts the quiet period; the taint keeps its start, shows the latest.
        assert_eq!(
            b.observe_event(&xid(0, 48), &[], at(130)),
            Some(Transition::Unhealthy {
                gpu: 0,
                cause: Cause::Xid(48)
            })
        );
        assert_eq!(
            b.observe_event(&xid(0, 48), &[], at(140)),
            None,
            "the same cause again"
        );
        assert!(b.expire(at(199)).is_empty());
        assert_eq!(b.taints(0)[0].value, "48");
        assert_eq!(b.taints(0)[0].since, at(100));
        assert_eq!(b.expire(at(200)), [Transition::Recovered { gpu: 0 }]);
        assert!(b.taints(0).is_empty() && b.reason(0).is_none());
    }

    #[test]
    fn application_and_ignored_xids_change_nothing() {
        let mut b = HealthBook::new(
            HealthPolicy {
                ignored_xids: BTreeSet::from([119]),
                ..HealthPolicy::default()
            },
            [0],
        );
        for x in [13, 31, 43, 45, 68, 119] {
            assert_eq!(
                b.observe_event(&xid(0, x), &[], at(1)),
                Some(Transition::NonFatalXid { gpu: 0, xid: x })
            );
        }
        assert!(b.healthy(0));
    }

    #[test]
    fn a_lost_gpu_is_tainted_until_it_answers_for_the_quiet_period() {
        let mut b = book();
        let only_1 = BTreeSet::from([1]);
        let both = BTreeSet::from([0, 1]);
        assert_eq!(
            b.observe_inventory(&only_1, at(10)),
            [Transition::Unhealthy {
                gpu: 0,
                cause: Cause::Lost
            }]
        );
        assert!(
            b.observe_inventory(&only_1, at(20)).is_empty(),
            "reported once"
        );
        assert_eq!(b.taints(0)[0].key, health_taints::GPU_LOST);
        assert!(b.expire(at(1000)).is_empty(), "a lost GPU never expires");
        assert!(b.observe_inventory(&both, at(1000)).is_empty());
        assert_eq!(
            b.taints(0)[0].key,
            health_taints::GPU_LOST,
            "still tainted while quiet"
        );
        assert_eq!(b.taints(0)[0].since, at(10));
        assert!(b.reason(0).unwrap().contains("answers again"));
        assert!(b.expire(at(1059)).is_empty());
        assert_eq!(b.expire(at(1060)), [Transition::Recovered { gpu: 0 }]);
        assert!(b.healthy(0) && b.healthy(1));
    }

    #[test]
    fn a_lost_gpu_with_a_fatal_xid_carries_both_taints() {
        let mut b = book();
        b.observe_event(&HealthEvent::UncorrectableEcc { gpu: 1 }, &[], at(5));
        b.observe_inventory(&BTreeSet::from([0]), at(6));
        let keys: Vec<_> = b.taints(1).iter().map(|t| t.key).collect();
        assert_eq!(keys, [health_taints::GPU_LOST, health_taints::ECC]);
        assert!(b.reason(1).unwrap().contains("does not answer"));
        // Events about GPUs the plugin does not manage are dropped.
        assert_eq!(b.observe_event(&xid(7, 79), &[], at(7)), None);
    }

    /// Instance `gi` of profile `profile` at memory slices `start..start + size` of GPU `gpu`.
    fn live(gpu: u32, gi: u32, profile: &str, start: u32, size: u32) -> MigInstance {
        MigInstance {
            gpu_index: gpu,
            gpu_uuid: format!("GPU-{gpu}"),
            gpu_minor: gpu,
            profile: profile.into(),
            profile_id: 0,
            placement: Placement { start, size },
            gi_id: gi,
            ci_id: 0,
            mig_uuid: format!("MIG-{gpu}-{gi}"),
            gi_cap_minor: 0,
            ci_cap_minor: 0,
            created_by_das: Some(true),
        }
    }

    /// On GPU 0: GPU instance 3 at memory slice 0 (X) and 5 at memory slice 1 (Y); on GPU 1,
    /// GPU instance 7 at memory slice 0.
    fn two_instances() -> Vec<MigInstance> {
        vec![
            live(0, 3, "1g.6gb", 0, 1),
            live(0, 5, "1g.6gb", 1, 1),
            live(1, 7, "1g.6gb", 0, 1),
        ]
    }

    fn xid_on(gpu: u32, xid: u32, gi: u32) -> HealthEvent {
        HealthEvent::Xid {
            gpu,
            xid,
            gpu_instance: Some(gi),
        }
    }

    fn p(start: u32, size: u32) -> Placement {
        Placement { start, size }
    }

    fn tainted(b: &HealthBook, gpu: u32, placement: Placement) -> bool {
        !b.device_taints(gpu, placement).is_empty()
    }

    #[test]
    fn an_xid_naming_a_gpu_instance_taints_only_the_devices_overlapping_its_placement() {
        let mut b = book();
        let x = GpuInstance {
            id: 3,
            profile: "1g.6gb".into(),
            placement: p(0, 1),
        };
        assert_eq!(
            b.observe_event(&xid_on(0, 94, 3), &two_instances(), at(100)),
            Some(Transition::InstanceUnhealthy {
                gpu: 0,
                instance: x.clone(),
                cause: Cause::Xid(94)
            })
        );
        // X's device, and the larger ones over its memory slice, are tainted ...
        for placement in [p(0, 1), p(0, 2), p(0, 4)] {
            assert_eq!(
                b.device_taints(0, placement),
                [GpuTaint {
                    key: health_taints::XID,
                    value: "94".into(),
                    since: at(100)
                }],
                "{placement}"
            );
        }
        // ... Y's device on the next memory slice, and the rest of the GPU, are not.
        for placement in [p(1, 1), p(2, 1), p(3, 1), p(2, 2)] {
            assert!(!tainted(&b, 0, placement), "{placement}");
        }
        assert!(b.taints(0).is_empty(), "nothing GPU-wide");
        assert!(!tainted(&b, 1, p(0, 1)), "the other GPU is untouched");
        assert!(!b.healthy(0) && b.healthy(1));
        assert!(b.reason(0).is_none());
        let why = b.device_reason(0, p(0, 2)).unwrap();
        assert!(
            why.contains("XID 94") && why.contains("GPU instance 3 (1g.6gb at memory slices 0:1)"),
            "{why}"
        );
        assert_eq!(b.device_reason(0, p(1, 1)), None);
        assert_eq!(b.instance_taints(0, p(0, 1)).len(), 1);

        // It recovers on its own quiet period.
        assert!(b.expire(at(159)).is_empty());
        assert_eq!(
            b.expire(at(160)),
            [Transition::InstanceRecovered {
                gpu: 0,
                instance: x
            }]
        );
        assert!(b.healthy(0) && !tainted(&b, 0, p(0, 1)));
    }

    #[test]
    fn an_xid_naming_no_gpu_instance_taints_the_whole_gpu() {
        let mut b = book();
        assert_eq!(
            b.observe_event(&xid(0, 94), &two_instances(), at(1)),
            Some(Transition::Unhealthy {
                gpu: 0,
                cause: Cause::Xid(94)
            })
        );
        for placement in [p(0, 1), p(1, 1), p(2, 2), p(0, 4)] {
            assert!(tainted(&b, 0, placement), "{placement}");
        }
        assert!(!tainted(&b, 1, p(0, 1)));
    }

    #[test]
    fn an_id_no_live_instance_has_falls_back_to_the_whole_gpu() {
        let mut b = book();
        // GI 7 lives on GPU 1, not GPU 0: ids are per GPU.
        for gi in [9, 7] {
            assert_eq!(
                b.observe_event(&xid_on(0, 94, gi), &two_instances(), at(1)),
                (gi == 9).then_some(Transition::Unhealthy {
                    gpu: 0,
                    cause: Cause::Xid(94)
                }),
                "GI {gi}"
            );
            assert!(
                tainted(&b, 0, p(1, 1)) && tainted(&b, 0, p(3, 1)),
                "GI {gi}"
            );
        }
        // The instances could not be read: the whole GPU too.
        assert_eq!(
            b.observe_event(&xid_on(1, 94, 7), &[], at(1)),
            Some(Transition::Unhealthy {
                gpu: 1,
                cause: Cause::Xid(94)
            })
        );
        assert!(tainted(&b, 1, p(3, 1)));
    }

    #[test]
    fn gpu_wide_errors_taint_the_whole_gpu_even_when_they_name_an_instance() {
        for event in [xid_on(0, 79, 3), xid_on(0, 95, 3), xid_on(0, 48, 3)] {
            assert_eq!(scope(&event, &two_instances()), Scope::Gpu, "{event:?}");
            let mut b = book();
            b.observe_event(&event, &two_instances(), at(1));
            assert!(tainted(&b, 0, p(3, 1)), "{event:?}");
        }
        assert_eq!(
            scope(&HealthEvent::UncorrectableEcc { gpu: 0 }, &two_instances()),
            Scope::Gpu
        );
    }

    #[test]
    fn a_device_carries_one_taint_per_key_when_its_gpu_and_an_instance_are_both_unhealthy() {
        let mut b = book();
        b.observe_event(&xid_on(0, 94, 3), &two_instances(), at(1));
        b.observe_event(&xid(0, 119), &[], at(2));
        b.observe_inventory(&BTreeSet::from([1]), at(3));
        let on_x: Vec<_> = b
            .device_taints(0, p(0, 1))
            .into_iter()
            .map(|t| (t.key, t.value))
            .collect();
        assert_eq!(
            on_x,
            [
                (health_taints::GPU_LOST, "true".to_string()),
                (health_taints::XID, "119".to_string())
            ],
            "the GPU's XID taint wins over the instance's"
        );
        // The GPU recovering leaves the instance's own quiet period running.
        b.observe_inventory(&BTreeSet::from([0, 1]), at(4));
        assert_eq!(
            b.expire(at(61)),
            [Transition::InstanceRecovered {
                gpu: 0,
                instance: GpuInstance {
                    id: 3,
                    profile: "1g.6gb".into(),
                    placement: p(0, 1)
                }
            }]
        );
        assert_eq!(b.expire(at(64)), [Transition::Recovered { gpu: 0 }]);
    }
}
