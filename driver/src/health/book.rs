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
    pub(crate) fn observe_event(
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
    pub(crate) fn observe_inventory(
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
    pub(crate) fn instance_taints(&self, gpu: u32, placement: Placement) -> Vec<GpuTaint> {
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
    pub(crate) fn device_taints(&self, gpu: u32, placement: Placement) -> Vec<GpuTaint> {
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
    pub(crate) fn device_reason(&self, gpu: u32, placement: Placement) -> Option<String> {
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
mod tests;
