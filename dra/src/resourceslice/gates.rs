//! The API server's feature gates, as the publisher sees them in what the server stores (pure).
//!
//! On Kubernetes 1.34 and 1.35 the four gates below are alpha and off by default (beta and on
//! from 1.36); a server with a gate off silently drops that gate's fields when a ResourceSlice is
//! created, and when it is updated unless the stored slice already used them (kubernetes
//! `pkg/registry/resource/resourceslice/strategy.go`, `dropDisabledFields`; docs/reference/dra.md,
//! "ResourceSlice publishing"). The gated fields the publisher acts on cost different things:
//!
//! - **Shared counters** (`sharedCounters` of a slice, `consumesCounters` of a device;
//!   `DRAPartitionableDevices`): without them every device that shares a counter looks
//!   independent, so the scheduler hands out devices that overlap. The node's devices are
//!   withdrawn (the pool is published empty) until a probe shows the counters kept
//!   ([`CounterGuard`]).
//! - **Device taints** (`DRADeviceTaints`): an unhealthy device stays offered untainted;
//!   nothing overlaps. The devices stay published; a Node event says so
//!   ([`Notice::TaintsDropped`]).
//! - **Consumable capacity** (`allowMultipleAllocations` of a device, the `requestPolicy` of its
//!   capacities; `DRAConsumableCapacity`): a shareable device stored without them looks
//!   exclusive, and would be given whole to one claim. Once a write shows them dropped, every
//!   shareable device ([`Shareable`]) is left out of what is published
//!   ([`without_shareable_devices`]) until the publisher restarts; the other devices stay
//!   published, and a Node event says so ([`Notice::SharesDropped`]).
//! - **Binding conditions** (`bindingConditions`, `bindingFailureConditions` of a device;
//!   `DRADeviceBindingConditions`, KEP-5007): a scheduler whose gate is off never picks a device
//!   that has them, and a server that drops them would give the devices without them, so what
//!   they wait for would never be waited for. Once a write shows them dropped, the devices are
//!   published without them ([`strip_binding_conditions`]) until the publisher restarts, and a
//!   Node event says so ([`Notice::BindingConditionsDropped`]).
//!
//! The probe is a dry-run create of one of the node's counter slices: the server runs the
//! same field dropping on a dry run (`BeforeCreate` before the dry-run store) and returns what
//! it would store, and nothing is stored, so no device is ever offered without its counters.
//!
//! [`Guard`] (`gates/guard.rs`) is what the publisher calls, twice per attempt: it plans each
//! attempt of a publish from the desired slices and observes what the server kept. The
//! schedule of the counter probes is [`CounterGuard`]'s; `gates/fields.rs` reads the gated
//! fields of a spec, `gates/shares.rs` leaves the shareable devices out, `gates/binding.rs` the
//! binding conditions.

use std::time::Duration;

use tokio::time::Instant;

use super::Pool;

mod binding;
mod fields;
mod guard;
mod shares;

pub use binding::{strip_binding_conditions, without_binding_conditions};
pub use fields::{
    Dropped, carries_binding_conditions, carries_counters, carries_shares, carries_taints, dropped,
};
pub use guard::{Attempt, Guard, MAX_ATTEMPTS, Observation, Observed, Written};
pub use shares::{Shareable, allows_multiple_allocations, without_shareable_devices};

/// The feature gate of shared counters (KEP-4815; beta and on from 1.36).
pub const PARTITIONABLE_DEVICES: &str = "DRAPartitionableDevices";

/// The feature gate of device taints (KEP-5055; beta and on from 1.36).
pub const DEVICE_TAINTS: &str = "DRADeviceTaints";

/// The feature gate of consumable capacity, shareable devices (KEP-5075; beta and on from 1.36).
pub const CONSUMABLE_CAPACITY: &str = "DRAConsumableCapacity";

/// The feature gate of binding conditions (KEP-5007; beta and on from 1.36).
pub const DEVICE_BINDING_CONDITIONS: &str = "DRADeviceBindingConditions";

/// First wait before probing again after the server dropped the counters (doubles up to
/// [`MAX_PROBE_RETRY`]).
pub const MIN_PROBE_RETRY: Duration = Duration::from_secs(10);

/// Longest wait between probes while the counters are dropped: turning the gate on restarts
/// kube-apiserver, after which the devices come back within this time (or at once when the
/// plugin restarts). Also how often kept counters are checked again (an API server restarted
/// with the gate off keeps the counters of stored slices, but its scheduler may ignore them).
pub const MAX_PROBE_RETRY: Duration = Duration::from_secs(300);

/// What the server does with shared counters, as last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counters {
    /// Not seen yet: the next publish with counters probes first.
    Unknown,
    /// A probe or a write kept them: the node's devices are published.
    Kept,
    /// A probe or a write dropped them: the node's devices are withdrawn.
    Dropped,
}

/// What a publish writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// The desired slices, devices and counters.
    Full,
    /// The pool without devices: one empty slice.
    Withdrawn,
}

/// What to do before a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Dry-run create one counter slice and pass the answer to [`CounterGuard::probed`].
    Probe,
    /// Publish this, without probing.
    Publish(Offer),
}

/// The answer to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// The server would store the counters.
    Kept,
    /// The server would drop them.
    Dropped,
    /// No verdict: the dry run failed (the API server did not answer, or an admission webhook
    /// that does not support dry runs refused it).
    Failed,
}

/// Something users must see: a log line, a Node event ([`super::NodeEvents`]) and the gauge
/// ([`super::GateGauge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The server drops shared counters: the devices are withdrawn. `first` on the change from
    /// another state; `retry_in` until the next probe.
    CountersDropped {
        /// Whether the counters were not known dropped before.
        first: bool,
        /// Time to the next probe.
        retry_in: Duration,
    },
    /// The server keeps shared counters again: the devices are published again.
    CountersKept,
    /// The server dropped device taints (sent for an unhealthy device).
    TaintsDropped,
    /// The server keeps device taints again.
    TaintsKept,
    /// The server dropped consumable capacity (sent on the shareable devices): they are left
    /// out of what is published until the publisher restarts.
    SharesDropped,
    /// The server dropped binding conditions: the devices are published without them until
    /// the publisher restarts.
    BindingConditionsDropped,
}

impl Notice {
    /// The event's reason (`UpperCamelCase`, as Kubernetes event reasons are).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CountersDropped { .. } => "SharedCountersDropped",
            Self::CountersKept => "SharedCountersKept",
            Self::TaintsDropped => "DeviceTaintsDropped",
            Self::TaintsKept => "DeviceTaintsKept",
            Self::SharesDropped => "ConsumableCapacityDropped",
            Self::BindingConditionsDropped => "BindingConditionsDropped",
        }
    }

    /// Whether the event is a Warning (else Normal).
    pub fn is_warning(&self) -> bool {
        matches!(
            self,
            Self::CountersDropped { .. }
                | Self::TaintsDropped
                | Self::SharesDropped
                | Self::BindingConditionsDropped
        )
    }

    /// The feature gate it is about.
    pub fn gate(&self) -> &'static str {
        match self {
            Self::CountersDropped { .. } | Self::CountersKept => PARTITIONABLE_DEVICES,
            Self::TaintsDropped | Self::TaintsKept => DEVICE_TAINTS,
            Self::SharesDropped => CONSUMABLE_CAPACITY,
            Self::BindingConditionsDropped => DEVICE_BINDING_CONDITIONS,
        }
    }

    /// The event's note about `pool`, in terms of any driver: what happened, what the
    /// publisher did, what to do. A driver may word it its own way ([`super::NodeEvents::note`]).
    pub fn note(&self, pool: &Pool) -> String {
        let (node, driver) = (&pool.node, &pool.driver);
        match self {
            Self::CountersDropped { retry_in, .. } => format!(
                "kube-apiserver drops the shared counters (sharedCounters, consumesCounters) of \
                 node {node}'s {driver} ResourceSlices: the feature gate {PARTITIONABLE_DEVICES} \
                 is off there. Without the counters the scheduler would hand out overlapping \
                 devices, so the node's devices are withdrawn (its pool is published empty). \
                 Start kube-apiserver and kube-scheduler with \
                 --feature-gates={PARTITIONABLE_DEVICES}=true (Kubernetes 1.34 and 1.35); the \
                 node plugin checks again in {}s and republishes the devices by itself.",
                retry_in.as_secs()
            ),
            Self::CountersKept => format!(
                "kube-apiserver keeps the shared counters of node {node}'s {driver} \
                 ResourceSlices ({PARTITIONABLE_DEVICES} is on): the node's devices are \
                 published again. kube-scheduler must run with the gate on too."
            ),
            Self::TaintsDropped => format!(
                "kube-apiserver dropped the device taints of node {node}'s {driver} devices: the \
                 feature gate {DEVICE_TAINTS} is off there. The tainted devices stay offered \
                 untainted, so new pods may be placed on a failed device. Turn \
                 --feature-gates={DEVICE_TAINTS}=true on for kube-apiserver and kube-scheduler \
                 (and kube-controller-manager for NoExecute eviction)."
            ),
            Self::TaintsKept => format!(
                "kube-apiserver keeps the device taints of node {node}'s {driver} devices again \
                 ({DEVICE_TAINTS} is on)."
            ),
            Self::SharesDropped => format!(
                "kube-apiserver dropped allowMultipleAllocations or the capacity request \
                 policies of node {node}'s shareable {driver} devices: the feature gate \
                 {CONSUMABLE_CAPACITY} is off there. Stored without them a shareable device \
                 would be given whole to one claim, so the node's shareable devices are \
                 withdrawn; its other devices stay published. Turn \
                 --feature-gates={CONSUMABLE_CAPACITY}=true on for kube-apiserver and \
                 kube-scheduler, then restart the node plugin to publish them again."
            ),
            Self::BindingConditionsDropped => format!(
                "kube-apiserver dropped the binding conditions of node {node}'s {driver} \
                 devices: the feature gate {DEVICE_BINDING_CONDITIONS} is off there. The devices \
                 are published without them, so nothing waits for what they stand for. Turn \
                 --feature-gates={DEVICE_BINDING_CONDITIONS}=true on for kube-apiserver and \
                 kube-scheduler, then restart the node plugin."
            ),
        }
    }
}

/// What to publish after a probe or a write, and what to tell users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// What the publish writes.
    pub offer: Offer,
    /// What to tell users, if anything.
    pub notice: Option<Notice>,
}

/// The shared-counter half of [`Guard`]: decides when to probe whether the API server keeps
/// shared counters, and whether the node's devices are published or withdrawn ("no silent
/// overlap", docs/design.md §4):
///
/// - until the counters are known kept, a publish whose slices carry counters first probes with
///   a dry run; kept → the desired slices are published; dropped → the pool is published empty,
///   a Warning event names the gate, and the probe is repeated after [`MIN_PROBE_RETRY`]
///   doubling to [`MAX_PROBE_RETRY`] until it shows the counters kept;
/// - once kept, every real write is still checked ([`Self::written`]): a write that lost
///   counters (the gate turned off on a restarted API server) withdraws the devices at once;
///   and the probe is repeated when the last one is `max_retry` old (the next resync), since a
///   restarted API server keeps the counters of slices already stored (updates keep fields in
///   use) while a scheduler restarted with the gate off ignores them;
/// - a probe that fails gives no verdict: while dropped the devices stay withdrawn; otherwise
///   the desired slices are published and the writes are checked instead (a cluster whose
///   admission webhooks refuse dry runs still gets its devices).
#[derive(Debug, Clone)]
pub struct CounterGuard {
    counters: Counters,
    min_retry: Duration,
    max_retry: Duration,
    /// The last wait scheduled while dropped.
    retry: Duration,
    next_probe: Option<Instant>,
    /// When the counters were last seen kept.
    kept_at: Option<Instant>,
}

impl Default for CounterGuard {
    fn default() -> Self {
        Self::new(MIN_PROBE_RETRY, MAX_PROBE_RETRY)
    }
}

impl CounterGuard {
    /// A guard that probes again after `min_retry` doubling to `max_retry`.
    pub fn new(min_retry: Duration, max_retry: Duration) -> Self {
        Self {
            counters: Counters::Unknown,
            min_retry,
            max_retry: max_retry.max(min_retry),
            retry: min_retry,
            next_probe: None,
            kept_at: None,
        }
    }

    /// What the server was last seen doing with shared counters.
    #[cfg(test)]
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Whether the node's devices are withdrawn (counters dropped).
    pub fn withdrawn(&self) -> bool {
        self.counters == Counters::Dropped
    }

    /// When to probe again, while the devices are withdrawn.
    pub fn next_probe(&self) -> Option<Instant> {
        self.next_probe.filter(|_| self.withdrawn())
    }

    /// What to do before publishing slices that carry counters (`desired_has_counters`) or not,
    /// at `now`. Slices without counters (devices that share nothing) are published as they
    /// are: there is nothing to overlap.
    pub fn before_publish(&self, desired_has_counters: bool, now: Instant) -> Step {
        if !desired_has_counters {
            return Step::Publish(Offer::Full);
        }
        match self.counters {
            Counters::Kept if self.kept_at.is_none_or(|at| now >= at + self.max_retry) => {
                Step::Probe
            }
            Counters::Kept => Step::Publish(Offer::Full),
            Counters::Unknown => Step::Probe,
            Counters::Dropped if self.next_probe.is_none_or(|at| now >= at) => Step::Probe,
            Counters::Dropped => Step::Publish(Offer::Withdrawn),
        }
    }

    /// Takes a probe's answer at `now`.
    pub fn probed(&mut self, answer: ProbeAnswer, now: Instant) -> Decision {
        match (answer, self.counters) {
            (ProbeAnswer::Kept, _) => self.kept(now),
            (ProbeAnswer::Dropped, _) => self.dropped(now),
            (ProbeAnswer::Failed, Counters::Dropped) => {
                self.schedule(now, false);
                Decision {
                    offer: Offer::Withdrawn,
                    notice: None,
                }
            }
            (ProbeAnswer::Failed, Counters::Kept) => {
                // Check again at the next recheck, not at every publish.
                self.kept_at = Some(now);
                Decision {
                    offer: Offer::Full,
                    notice: None,
                }
            }
            (ProbeAnswer::Failed, Counters::Unknown) => Decision {
                offer: Offer::Full,
                notice: None,
            },
        }
    }

    /// Takes what a publish of [`Offer::Full`] wrote at `now`: whether any written slice carried
    /// counters, and whether the server dropped any. `Some` with [`Offer::Withdrawn`] when the
    /// devices must be withdrawn now.
    pub fn written(
        &mut self,
        wrote_counters: bool,
        dropped_counters: bool,
        now: Instant,
    ) -> Option<Decision> {
        if dropped_counters {
            return Some(self.dropped(now));
        }
        if wrote_counters && self.counters == Counters::Unknown {
            self.counters = Counters::Kept;
            self.kept_at = Some(now);
        }
        None
    }

    fn kept(&mut self, now: Instant) -> Decision {
        let was = self.counters;
        self.counters = Counters::Kept;
        self.kept_at = Some(now);
        self.next_probe = None;
        self.retry = self.min_retry;
        Decision {
            offer: Offer::Full,
            notice: (was == Counters::Dropped).then_some(Notice::CountersKept),
        }
    }

    fn dropped(&mut self, now: Instant) -> Decision {
        let first = self.counters != Counters::Dropped;
        self.counters = Counters::Dropped;
        self.schedule(now, first);
        Decision {
            offer: Offer::Withdrawn,
            notice: Some(Notice::CountersDropped {
                first,
                retry_in: self.retry,
            }),
        }
    }

    /// Schedules the next probe: [`Self::new`]'s `min_retry` after a change, else twice the
    /// last wait, at most `max_retry`.
    fn schedule(&mut self, now: Instant, first: bool) {
        self.retry = if first {
            self.min_retry
        } else {
            (self.retry * 2).min(self.max_retry)
        };
        self.next_probe = Some(now + self.retry);
    }
}

#[cfg(test)]
mod tests;
