//! The publication guard (pure): one publish is a round of attempts, each planned from the
//! desired slices and the gates seen so far, and judged by what the server kept. See [`super`]
//! for the four gates and what each costs.
//!
//! The publisher loops over two calls, at most [`MAX_ATTEMPTS`] times: [`Guard::plan`] says
//! what to do next (dry-run create one slice, or write these slices), and [`Guard::observe`]
//! takes what came back (the probe's answer, or what the writes stored) and says what users
//! must be told and whether to try again. A round is, in order:
//!
//! 1. a probe, when the slices carry shared counters and their check is due ([`CounterGuard`]);
//! 2. a write: the desired slices, less what the server was seen dropping (shareable devices,
//!    binding conditions), or the pool without devices while it drops shared counters;
//! 3. when that write showed a gate off for the first time, another: the pool without devices
//!    (counters dropped), or the slices without the shareable devices or binding conditions;
//! 4. the pool without devices, should the write of step 3 have lost counters.
//!
//! Every write is observed, a withdrawn one too (it carries nothing gated, so it tells
//! nothing). The guard works on ResourceSlice specs and their field names only.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSliceSpec;
use tokio::time::Instant;

use super::{
    CONSUMABLE_CAPACITY, CounterGuard, DEVICE_BINDING_CONDITIONS, DEVICE_TAINTS, Dropped, Notice,
    Offer, PARTITIONABLE_DEVICES, ProbeAnswer, Shareable, Step, allows_multiple_allocations,
    carries_binding_conditions, carries_counters, carries_shares, carries_taints, dropped,
    strip_binding_conditions, without_shareable_devices,
};
use crate::resourceslice::plan::spec_key;

/// The most attempts of one publish: a probe, a write, a write again without what that write
/// showed dropped, and the pool without devices should that one lose counters.
pub const MAX_ATTEMPTS: usize = 4;

/// What to do next in a publish ([`Guard::plan`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    /// Dry-run create this slice (one of the desired slices that carries shared counters) and
    /// pass the answer to [`Guard::observe`] as [`Observed::Probe`] ([`ProbeAnswer::of`]).
    Probe(ResourceSliceSpec),
    /// Make the pool these slices and pass what the server stored to [`Guard::observe`] as
    /// [`Observed::Wrote`].
    Write {
        /// The slices, from the desired ones; empty when `withdrawn`.
        specs: Vec<ResourceSliceSpec>,
        /// The pool is published without devices (shared counters dropped): as one empty
        /// slice, so that it stays complete.
        withdrawn: bool,
    },
}

/// What an [`Attempt`] found.
#[derive(Debug)]
pub enum Observed {
    /// The probe's answer.
    Probe(ProbeAnswer),
    /// What the writes sent and the server stored.
    Wrote(Written),
}

/// What [`Guard::observe`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// What users must be told, in order: a Node event, a log line (and the gauges of
    /// [`Guard::gates_off`]).
    pub notices: Vec<Notice>,
    /// Plan another attempt of the same publish.
    pub again: bool,
}

/// What one write attempt sent of the gated fields the guard acts on, and what the server dropped of
/// them ([`dropped`]), over the slices it created or updated.
#[derive(Debug, Default)]
pub struct Written {
    /// A written slice carried shared counters.
    pub counters: bool,
    /// A written slice carried device taints.
    pub taints: bool,
    /// What the server dropped, over every written slice.
    pub dropped: Dropped,
}

impl Written {
    /// Adds one written slice: the spec `sent`, and the spec the server `stored`.
    pub fn add(&mut self, sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) {
        let (sent, stored) = (spec_key(sent), spec_key(stored));
        self.counters |= carries_counters(&sent);
        self.taints |= carries_taints(&sent);
        let d = dropped(&sent, &stored);
        self.dropped.counters |= d.counters;
        self.dropped.taints |= d.taints;
        self.dropped.shares |= d.shares;
        self.dropped.binding |= d.binding;
    }
}

impl ProbeAnswer {
    /// The answer of a dry-run create that `sent` a spec with shared counters and got back the
    /// spec the server would store.
    pub fn of(sent: &ResourceSliceSpec, stored: &ResourceSliceSpec) -> Self {
        if dropped(&spec_key(sent), &spec_key(stored)).counters {
            Self::Dropped
        } else {
            Self::Kept
        }
    }
}

/// Whether the server was seen dropping one gate's fields.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    dropped: bool,
}

impl Seen {
    /// For a gate that stays off once seen off (until the plugin restarts): whether a write
    /// that `dropped` the fields shows it off for the first time.
    fn latch(&mut self, dropped: bool) -> bool {
        let first = dropped && !self.dropped;
        self.dropped |= dropped;
        first
    }

    /// For a gate followed both ways: `Some(true)` when a write that `wrote` the fields lost
    /// them for the first time, `Some(false)` when one kept them after they were lost.
    fn follow(&mut self, wrote: bool, dropped: bool) -> Option<bool> {
        let change = if dropped {
            !self.dropped
        } else {
            wrote && self.dropped
        };
        change.then(|| {
            self.dropped = dropped;
            dropped
        })
    }
}

/// What the slices of the last write of a round carried that, if found dropped, are left out
/// of another write at once.
#[derive(Debug, Clone, Copy, Default)]
struct Carried {
    shares: bool,
    binding: bool,
}

impl Carried {
    fn of(specs: &[ResourceSliceSpec]) -> Self {
        let keys: Vec<_> = specs.iter().map(spec_key).collect();
        Self {
            shares: keys.iter().any(carries_shares),
            binding: keys.iter().any(carries_binding_conditions),
        }
    }
}

/// Where the guard is in a publish.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    /// Attempts planned.
    attempts: usize,
    /// The last attempt was planned and not observed: it failed, and the publish with it.
    open: bool,
    /// The last observation asked for another attempt.
    again: bool,
    /// What the last write carried.
    carried: Carried,
}

/// The publication guard: decides each attempt of a publish from the desired slices and what
/// the server was seen keeping, so that no device is offered in a way the scheduler would
/// misread ("no silent overlap", docs/design.md §4).
///
/// - Shared counters ([`PARTITIONABLE_DEVICES`]): probed on [`CounterGuard`]'s schedule; while
///   dropped the pool is published without devices.
/// - Device taints ([`DEVICE_TAINTS`]): followed both ways; the devices stay published.
/// - Consumable capacity ([`CONSUMABLE_CAPACITY`]) and binding conditions
///   ([`DEVICE_BINDING_CONDITIONS`]): once a write loses them, the shareable devices (as
///   [`Shareable`] tells them), or the binding conditions, are left out until the plugin
///   restarts, that publish included.
///
/// A publish is the attempts from a [`Self::plan`] until an [`Self::observe`] says not to try
/// again; a plan whose attempt was never observed (its write failed, and the publish with it)
/// is followed by a new publish.
#[derive(Debug, Clone)]
pub struct Guard {
    counters: CounterGuard,
    taints: Seen,
    shares: Seen,
    binding: Seen,
    round: Round,
    /// Which devices go once consumable capacity is seen dropped.
    shareable: Shareable,
}

impl Default for Guard {
    /// Probes on [`CounterGuard::default`]'s schedule; shareable devices are those that
    /// [`allows_multiple_allocations`].
    fn default() -> Self {
        Self {
            counters: CounterGuard::default(),
            taints: Seen::default(),
            shares: Seen::default(),
            binding: Seen::default(),
            round: Round::default(),
            shareable: allows_multiple_allocations,
        }
    }
}

impl Guard {
    /// A guard that probes shared counters again after `min_retry` doubling to `max_retry`
    /// while they are dropped ([`CounterGuard::new`]).
    pub fn new(min_retry: Duration, max_retry: Duration) -> Self {
        Self::default().with_probe_retry(min_retry, max_retry)
    }

    /// This guard, probing shared counters again after `min_retry` doubling to `max_retry`
    /// while they are dropped (before any publish: what was seen is forgotten).
    pub fn with_probe_retry(mut self, min_retry: Duration, max_retry: Duration) -> Self {
        self.counters = CounterGuard::new(min_retry, max_retry);
        self
    }

    /// This guard, leaving out the devices `shareable` tells once the server drops consumable
    /// capacity.
    pub fn with_shareable(mut self, shareable: Shareable) -> Self {
        self.shareable = shareable;
        self
    }

    /// The next attempt of a publish of `desired` (complete specs: driver, pool and node set,
    /// empty lists unset) at `now`. At most one probe, the first attempt.
    pub fn plan(&mut self, desired: &[ResourceSliceSpec], now: Instant) -> Attempt {
        if self.round.open || !self.round.again {
            self.round = Round::default();
        }
        let first = self.round.attempts == 0;
        self.round.attempts += 1;
        self.round.open = true;
        let mut specs = self.offered(desired.to_vec());
        let probe = specs.iter().position(|s| carries_counters(&spec_key(s)));
        let step = match self.counters.before_publish(probe.is_some(), now) {
            Step::Probe if !first => Step::Publish(if self.counters.withdrawn() {
                Offer::Withdrawn
            } else {
                Offer::Full
            }),
            step => step,
        };
        match (step, probe) {
            (Step::Probe, Some(i)) => Attempt::Probe(specs.swap_remove(i)),
            (Step::Publish(Offer::Withdrawn), _) => {
                self.round.carried = Carried::default();
                Attempt::Write {
                    specs: Vec::new(),
                    withdrawn: true,
                }
            }
            // `before_publish` probes only slices that carry counters.
            (Step::Publish(Offer::Full) | Step::Probe, _) => {
                self.round.carried = Carried::of(&specs);
                Attempt::Write {
                    specs,
                    withdrawn: false,
                }
            }
        }
    }

    /// Takes what the last planned attempt found, at `now`.
    pub fn observe(&mut self, seen: Observed, now: Instant) -> Observation {
        self.round.open = false;
        let (notices, again) = match seen {
            Observed::Probe(answer) => {
                let decision = self.counters.probed(answer, now);
                // A write follows every probe, of what the answer decided.
                (decision.notice.into_iter().collect(), true)
            }
            Observed::Wrote(written) => self.wrote(&written, now),
        };
        let again = again && self.round.attempts < MAX_ATTEMPTS;
        self.round.again = again;
        Observation { notices, again }
    }

    /// Whether the node's devices are withdrawn (shared counters dropped).
    pub fn withdrawn(&self) -> bool {
        self.counters.withdrawn()
    }

    /// When to probe again, while the devices are withdrawn.
    pub fn next_probe(&self) -> Option<Instant> {
        self.counters.next_probe()
    }

    /// Each gate (its name) and whether the server was last seen with it off, for the gauge
    /// ([`crate::resourceslice::GateGauge`]).
    pub fn gates_off(&self) -> [(&'static str, bool); 4] {
        [
            (PARTITIONABLE_DEVICES, self.withdrawn()),
            (DEVICE_TAINTS, self.taints.dropped),
            (CONSUMABLE_CAPACITY, self.shares.dropped),
            (DEVICE_BINDING_CONDITIONS, self.binding.dropped),
        ]
    }

    /// Whether the last write with taints lost them.
    #[cfg(test)]
    pub(super) fn taints_dropped(&self) -> bool {
        self.taints.dropped
    }

    /// Whether the shareable devices are left out: the server was seen dropping consumable
    /// capacity ([`without_shareable_devices`]).
    #[cfg(test)]
    pub(super) fn shares_dropped(&self) -> bool {
        self.shares.dropped
    }

    /// Whether the devices are published without binding conditions: the server was seen
    /// dropping them.
    #[cfg(test)]
    pub(super) fn binding_dropped(&self) -> bool {
        self.binding.dropped
    }

    /// Takes what a write did with device taints: whether any written slice carried taints,
    /// and whether the server dropped any. A notice on a change.
    pub(super) fn taints_written(&mut self, wrote: bool, dropped: bool) -> Option<Notice> {
        self.taints.follow(wrote, dropped).map(|dropped| {
            if dropped {
                Notice::TaintsDropped
            } else {
                Notice::TaintsKept
            }
        })
    }

    /// Takes whether a write lost consumable capacity. A notice the first time: from then on
    /// the shareable devices are left out, until the plugin restarts (a server whose gate is
    /// turned on again needs a restart, and so does the plugin to see it).
    pub(super) fn shares_written(&mut self, dropped: bool) -> Option<Notice> {
        self.shares.latch(dropped).then_some(Notice::SharesDropped)
    }

    /// Takes whether a write lost binding conditions. A notice the first time: from then on
    /// the devices are published without them, until the plugin restarts.
    pub(super) fn binding_written(&mut self, dropped: bool) -> Option<Notice> {
        self.binding
            .latch(dropped)
            .then_some(Notice::BindingConditionsDropped)
    }

    /// `desired` less what the server was seen dropping: the shareable devices, the binding
    /// conditions.
    fn offered(&self, desired: Vec<ResourceSliceSpec>) -> Vec<ResourceSliceSpec> {
        let mut specs = if self.shares.dropped {
            without_shareable_devices(desired, self.shareable)
        } else {
            desired
        };
        if self.binding.dropped {
            specs = strip_binding_conditions(specs);
        }
        for spec in &mut specs {
            // A slice left without devices beside its counter set: the server refuses
            // `devices: []` next to `sharedCounters`, and empty lists are unset anyway.
            spec.devices = spec.devices.take().filter(|d| !d.is_empty());
        }
        specs
    }

    /// Takes a write's outcome: the notices, in the order taints, consumable capacity, binding
    /// conditions, shared counters; another attempt when it lost counters (the pool without
    /// devices, at once) or, for the first time, what is left out from now on.
    fn wrote(&mut self, written: &Written, now: Instant) -> (Vec<Notice>, bool) {
        let taints = self.taints_written(written.taints, written.dropped.taints);
        let shares = self.shares_written(written.dropped.shares);
        let binding = self.binding_written(written.dropped.binding);
        let counters = self
            .counters
            .written(written.counters, written.dropped.counters, now);
        let carried = self.round.carried;
        let again = counters.is_some()
            || (shares.is_some() && carried.shares)
            || (binding.is_some() && carried.binding);
        let notices = [taints, shares, binding, counters.and_then(|d| d.notice)];
        (notices.into_iter().flatten().collect(), again)
    }
}

#[cfg(test)]
mod tests;
