//! MIG instances no claim holds (made with `nvidia-smi`, or left over): where the monitor asks
//! for them ([`UnclaimedInstances`], implemented by the request path in `crate::claims`, which
//! knows what is claimed), and which of them have their overlapping devices withdrawn
//! ([`UnclaimedTracker`], pure).
//!
//! An instance is withdrawn once seen in two checks in a row, so an instance a prepare in flight
//! has just made (and not yet recorded) is not mistaken for a foreign one; at start-up, while no
//! prepare runs, the instances found are withdrawn at once.

use std::collections::{BTreeMap, BTreeSet};

use crate::gpu::{MigInstance, Placement};

/// Where the monitor learns which MIG instances no claim holds (`crate::claims::Preparer`, from
/// the GPUs and the checkpoint).
#[tonic::async_trait]
pub trait UnclaimedInstances: Send + Sync {
    /// The instances on the GPUs that answer that no claim holds.
    async fn unclaimed_instances(&self) -> Vec<MigInstance>;
}

/// An instance by (GPU index, GPU-instance id, placement start).
type InstanceKey = (u32, u32, u32);

fn instance_key(i: &MigInstance) -> InstanceKey {
    (i.gpu_index, i.gi_id, i.placement.start)
}

/// What changed in one check ([`UnclaimedTracker::check`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct UnclaimedChanges {
    /// Instances withdrawn from now on (seen in this check and the one before).
    pub appeared: Vec<MigInstance>,
    /// Withdrawn instances gone (or claimed): their devices are offered again.
    pub gone: Vec<MigInstance>,
}

impl UnclaimedChanges {
    /// Whether the withdrawn set changed.
    pub fn any(&self) -> bool {
        !self.appeared.is_empty() || !self.gone.is_empty()
    }
}

/// What the monitor knows of unclaimed instances.
#[derive(Debug, Default)]
pub(crate) struct UnclaimedTracker {
    /// Seen in the last check.
    seen: BTreeSet<InstanceKey>,
    /// Seen in two checks in a row (or at start-up, when nothing else runs): their overlapping
    /// devices are withdrawn.
    withdrawn: BTreeMap<InstanceKey, MigInstance>,
}

impl UnclaimedTracker {
    /// Withdraws `i` now, without waiting for a second check (found at start-up).
    pub(crate) fn withdraw_now(&mut self, i: MigInstance) {
        self.seen.insert(instance_key(&i));
        self.withdrawn.insert(instance_key(&i), i);
    }

    /// Records one check that found `now` unclaimed: withdraws those also seen in the check
    /// before, gives back those withdrawn and no longer found.
    pub fn check(&mut self, now: Vec<MigInstance>) -> UnclaimedChanges {
        let now: BTreeMap<InstanceKey, MigInstance> =
            now.into_iter().map(|i| (instance_key(&i), i)).collect();
        let confirmed: BTreeMap<InstanceKey, MigInstance> = now
            .iter()
            .filter(|(k, _)| self.seen.contains(k))
            .map(|(k, i)| (*k, i.clone()))
            .collect();
        let appeared = confirmed
            .iter()
            .filter(|(k, _)| !self.withdrawn.contains_key(k))
            .map(|(_, i)| i.clone())
            .collect();
        let gone = self
            .withdrawn
            .iter()
            .filter(|(k, _)| !confirmed.contains_key(k))
            .map(|(_, i)| i.clone())
            .collect();
        self.seen = now.into_keys().collect();
        self.withdrawn = confirmed;
        UnclaimedChanges { appeared, gone }
    }

    /// The placements of the withdrawn instances, by GPU index (what
    /// `crate::publish::desired::HealthFacts::withdrawn` holds).
    pub(crate) fn withdrawn_placements(&self) -> BTreeMap<u32, Vec<Placement>> {
        let mut held: BTreeMap<u32, Vec<Placement>> = BTreeMap::new();
        for i in self.withdrawn.values() {
            held.entry(i.gpu_index).or_default().push(i.placement);
        }
        held
    }
}
