//! The health of each GPU, as a pure state machine over what the monitor observes (health events,
//! the inventory) and the time: which GPUs are unhealthy, why, since when, and when they count
//! as recovered. The monitor ([`super::monitor`]) feeds it and acts on its transitions.
//!
//! A GPU is unhealthy while it is **lost** (missing from the inventory) or after a **fatal
//! event** (a fatal XID, an uncorrectable ECC error). It recovers once it answers again and no
//! fatal event came for the quiet period; a fatal event during the quiet period starts it over.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use das_api::health_taints;

use super::xid;
use crate::gpu::HealthEvent;

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

/// Why a GPU is unhealthy.
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

/// One taint every device of a GPU carries (`key` from [`das_api::health_taints`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTaint {
    /// Taint key, e.g. `mig.das.com/xid`.
    pub key: &'static str,
    /// Taint value, e.g. the XID.
    pub value: String,
    /// When the condition began (the taint's `timeAdded`), whole seconds.
    pub since: SystemTime,
}

/// A change of one GPU's health the monitor acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The GPU became unhealthy, or is unhealthy for one more reason.
    Unhealthy {
        /// GPU index.
        gpu: u32,
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
}

/// The state of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GpuHealth {
    /// Lost, and whether it answers again.
    lost: Option<Lost>,
    /// The latest fatal event and the start of the fatal episode.
    fatal: Option<Fatal>,
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

impl GpuHealth {
    fn unhealthy(&self) -> bool {
        self.lost.is_some() || self.fatal.is_some()
    }

    fn missing(&self) -> bool {
        self.lost.is_some_and(|l| l.back_since.is_none())
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

    /// Records `event` at `now`.
    pub fn observe_event(&mut self, event: &HealthEvent, now: SystemTime) -> Option<Transition> {
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
        let since = h.fatal.map_or(now, |f| f.since);
        let new = h.fatal.is_none_or(|f| f.latest != cause);
        h.fatal = Some(Fatal {
            latest: cause,
            at: now,
            since,
        });
        new.then_some(Transition::Unhealthy { gpu, cause })
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

    /// GPUs that recover at `now`: they answer, and neither a fatal event nor their return is
    /// more recent than the quiet period.
    pub fn expire(&mut self, now: SystemTime) -> Vec<Transition> {
        let quiet = self.policy.quiet_period;
        let mut out = Vec::new();
        for (&gpu, h) in &mut self.gpus {
            if !h.unhealthy() || h.missing() {
                continue;
            }
            let last = h.fatal.map(|f| f.at).max(h.lost.and_then(|l| l.back_since));
            if last.is_some_and(|t| now.duration_since(t).is_ok_and(|d| d >= quiet)) {
                *h = GpuHealth::default();
                out.push(Transition::Recovered { gpu });
            }
        }
        out
    }

    /// The taints every device of GPU `gpu` carries now (none when healthy).
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
        if let Some(f) = h.fatal {
            let (key, value) = match f.latest {
                Cause::Xid(x) => (health_taints::XID, x.to_string()),
                Cause::UncorrectableEcc => (health_taints::ECC, "uncorrectable".to_string()),
                Cause::Lost => unreachable!("a fatal event is never Lost"),
            };
            out.push(GpuTaint {
                key,
                value,
                since: f.since,
            });
        }
        out
    }

    /// Every unhealthy GPU's taints.
    pub fn all_taints(&self) -> BTreeMap<u32, Vec<GpuTaint>> {
        self.gpus
            .keys()
            .map(|&g| (g, self.taints(g)))
            .filter(|(_, t)| !t.is_empty())
            .collect()
    }

    /// Why GPU `gpu` is unhealthy, for the health stream and events; `None` when healthy.
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
            b.observe_event(&xid(0, 79), at(100)),
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
            b.observe_event(&xid(0, 48), at(130)),
            Some(Transition::Unhealthy {
                gpu: 0,
                cause: Cause::Xid(48)
            })
        );
        assert_eq!(
            b.observe_event(&xid(0, 48), at(140)),
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
                b.observe_event(&xid(0, x), at(1)),
                Some(Transition::NonFatalXid { gpu: 0, xid: x })
            );
        }
        assert!(b.all_taints().is_empty());
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
        assert!(b.all_taints().is_empty());
    }

    #[test]
    fn a_lost_gpu_with_a_fatal_xid_carries_both_taints() {
        let mut b = book();
        b.observe_event(&HealthEvent::UncorrectableEcc { gpu: 1 }, at(5));
        b.observe_inventory(&BTreeSet::from([0]), at(6));
        let keys: Vec<_> = b.taints(1).iter().map(|t| t.key).collect();
        assert_eq!(keys, [health_taints::GPU_LOST, health_taints::ECC]);
        assert!(b.reason(1).unwrap().contains("does not answer"));
        // Events about GPUs the plugin does not manage are dropped.
        assert_eq!(b.observe_event(&xid(7, 79), at(7)), None);
    }
}
