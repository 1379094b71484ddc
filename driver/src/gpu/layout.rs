//! What occupies one GPU, and the two sets of rules that decide whether another slice fits:
//!
//! - the **hardware** rules NVML enforces (docs/reference/mig.md, "Memory slices and placements"): the placement start
//!   must be in the profile's list, memory slices must not overlap, a profile has a maximum
//!   instance count, at most one `+me` instance, at most `max_gpu_instances` GIs;
//! - the **counter** rules the Kubernetes allocator enforces on what DAS publishes: every
//!   `memory-slice-<n>` counter has value 1, and the summed resources of the allocated devices stay
//!   within the GPU's counter set ([`GpuModel::counter_totals`]).
//!
//! The counter totals are the most any hardware-valid layout consumes, so the counter rules never
//! reject a valid layout; a unit test checks that they never accept an invalid one either.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::model::{GpuModel, ResourceAmounts};

/// A placement of a GPU instance: memory slices `[start, start + size)` (NVML's
/// `nvmlGpuInstancePlacement_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl Placement {
    /// Bit mask of the memory slices this placement covers (bit `n` = memory slice `n`).
    pub fn mask(&self) -> u64 {
        slice_mask(self.start, self.size)
    }
}

impl fmt::Display for Placement {
    /// nvidia-smi style `start:size`, e.g. `6:2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}

/// Bit mask of memory slices `[start, start + size)`.
pub(crate) fn slice_mask(start: u32, size: u32) -> u64 {
    debug_assert!(start + size <= 64);
    if size == 0 {
        0
    } else {
        (u64::MAX >> (64 - size)) << start
    }
}

/// Why a slice cannot be added to a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// The start is not in the profile's placement list (NVML: `INVALID_ARGUMENT`).
    StartNotAllowed {
        /// The allowed starts.
        starts: Vec<u32>,
    },
    /// Memory slices already occupied (NVML: `INSUFFICIENT_RESOURCES`); bit mask of the overlap.
    Overlap(u64),
    /// The profile's maximum instance count is reached (NVML: `INSUFFICIENT_RESOURCES`).
    MaxInstances(u32),
    /// Another `+me` instance exists (NVML: `INSUFFICIENT_RESOURCES`).
    MediaExtensionInUse,
    /// The GPU holds its maximum number of GPU instances (NVML: `INSUFFICIENT_RESOURCES`).
    MaxGpuInstances(u32),
    /// A shared counter would be exceeded (allocator rule only).
    CounterExceeded(&'static str),
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::StartNotAllowed { starts } => {
                write!(f, "placement start not in the profile's list {starts:?}")
            }
            Conflict::Overlap(mask) => {
                write!(f, "memory slices {} already occupied", mask_list(*mask))
            }
            Conflict::MaxInstances(n) => {
                write!(f, "the profile's maximum of {n} instances is reached")
            }
            Conflict::MediaExtensionInUse => {
                f.write_str("another +me instance exists (one per GPU)")
            }
            Conflict::MaxGpuInstances(n) => {
                write!(f, "the GPU already holds its maximum of {n} GPU instances")
            }
            Conflict::CounterExceeded(c) => write!(f, "shared counter {c} would be exceeded"),
        }
    }
}

/// Memory slices of a mask as a list, e.g. `[0, 1]`.
pub(crate) fn mask_list(mask: u64) -> String {
    let slices: Vec<u32> = (0..64).filter(|i| mask & (1 << i) != 0).collect();
    format!("{slices:?}")
}

/// What occupies one GPU: memory-slice bit mask, instance counts per profile (indexed like
/// [`GpuModel::profiles`]), `+me` count, GI count and summed resources.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Occupancy {
    used: u64,
    counts: Vec<u32>,
    media: u32,
    instances: u32,
    consumed: ResourceAmounts,
}

impl Occupancy {
    /// An empty GPU of `model`.
    pub fn empty(model: &GpuModel) -> Self {
        Self {
            used: 0,
            counts: vec![0; model.profiles.len()],
            media: 0,
            instances: 0,
            consumed: ResourceAmounts::default(),
        }
    }

    /// Occupied memory slices (bit `n` = slice `n`).
    pub(crate) fn used_slices(&self) -> u64 {
        self.used
    }

    /// Instances of profile `profile` (index into [`GpuModel::profiles`]).
    pub fn count(&self, profile: usize) -> u32 {
        self.counts[profile]
    }

    /// Number of GPU instances.
    pub fn instances(&self) -> u32 {
        self.instances
    }

    /// Instance counts per profile.
    pub fn counts(&self) -> &[u32] {
        &self.counts
    }

    /// Summed resources of the instances.
    pub fn consumed(&self) -> ResourceAmounts {
        self.consumed
    }

    /// NVML's rules: can `profile` be created at `start`? Checked in NVML's order: argument,
    /// overlap, profile count, `+me`, GI count.
    pub(crate) fn check_hardware(
        &self,
        model: &GpuModel,
        profile: usize,
        start: u32,
    ) -> Result<(), Conflict> {
        let p = &model.profiles[profile];
        if !p.allows_start(start) {
            return Err(Conflict::StartNotAllowed {
                starts: p.placement_starts.clone(),
            });
        }
        let overlap = self.used & slice_mask(start, p.placement_size);
        if overlap != 0 {
            return Err(Conflict::Overlap(overlap));
        }
        if self.counts[profile] >= p.max_instances {
            return Err(Conflict::MaxInstances(p.max_instances));
        }
        if p.media_extension && self.media > 0 {
            return Err(Conflict::MediaExtensionInUse);
        }
        if self.instances >= model.max_gpu_instances {
            return Err(Conflict::MaxGpuInstances(model.max_gpu_instances));
        }
        Ok(())
    }

    /// The Kubernetes allocator's rules over DAS's counters: the `memory-slice-<n>` counters of
    /// the placement are free and the published resource counters
    /// ([`GpuModel::published_counters`]) stay within [`GpuModel::counter_totals`].
    /// `start` must be one of the profile's starts (DAS publishes only those).
    pub(crate) fn check_counters(
        &self,
        model: &GpuModel,
        profile: usize,
        start: u32,
    ) -> Result<(), Conflict> {
        match self.counter_conflict(model, profile, start, |n| model.publishes_counter(n)) {
            Some(c) => Err(c),
            None => Ok(()),
        }
    }

    /// [`Self::check_counters`] with the resource counters `kept` says are published.
    fn counter_conflict(
        &self,
        model: &GpuModel,
        profile: usize,
        start: u32,
        kept: impl Fn(&str) -> bool,
    ) -> Option<Conflict> {
        let p = &model.profiles[profile];
        let overlap = self.used & slice_mask(start, p.placement_size);
        if overlap != 0 {
            return Some(Conflict::Overlap(overlap));
        }
        self.consumed
            .plus(p.resources())
            .first_excess(&model.counter_totals, kept)
            .map(Conflict::CounterExceeded)
    }

    /// Records an instance of `profile` at `start` (no checks: check first).
    pub fn add(&mut self, model: &GpuModel, profile: usize, start: u32) {
        let p = &model.profiles[profile];
        self.used |= slice_mask(start, p.placement_size);
        self.counts[profile] += 1;
        self.media += u32::from(p.media_extension);
        self.instances += 1;
        self.consumed = self.consumed.plus(p.resources());
    }

    /// Removes an instance of `profile` at `start` recorded by [`Self::add`].
    pub fn remove(&mut self, model: &GpuModel, profile: usize, start: u32) {
        let p = &model.profiles[profile];
        self.used &= !slice_mask(start, p.placement_size);
        self.counts[profile] -= 1;
        self.media -= u32::from(p.media_extension);
        self.instances -= 1;
        self.consumed = self.consumed.minus(p.resources());
    }
}

/// Every `(profile index, start)` placement of a model, in profile then start order.
pub(crate) fn all_placements(model: &GpuModel) -> Vec<(usize, u32)> {
    model
        .profiles
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.placement_starts.iter().map(move |&s| (i, s)))
        .collect()
}

/// Most layouts [`max_consumption`] walks before it gives up on a table (the real 8-slice tables
/// have a few thousand).
pub(crate) const LAYOUT_BUDGET: usize = 1_000_000;

/// Calls `visit` once for every hardware-valid layout of `model` (every set of placements NVML
/// would accept together), the empty layout included, until `visit` returns `false`. Returns
/// whether the walk completed.
pub(crate) fn for_each_layout(model: &GpuModel, mut visit: impl FnMut(&Occupancy) -> bool) -> bool {
    let placements = all_placements(model);
    let mut occ = Occupancy::empty(model);
    walk_layouts(model, &placements, 0, &mut occ, &mut visit)
}

fn walk_layouts(
    model: &GpuModel,
    placements: &[(usize, u32)],
    from: usize,
    occ: &mut Occupancy,
    visit: &mut impl FnMut(&Occupancy) -> bool,
) -> bool {
    if !visit(occ) {
        return false;
    }
    for (i, &(profile, start)) in placements.iter().enumerate().skip(from) {
        if occ.check_hardware(model, profile, start).is_ok() {
            occ.add(model, profile, start);
            let go_on = walk_layouts(model, placements, i + 1, occ, visit);
            occ.remove(model, profile, start);
            if !go_on {
                return false;
            }
        }
    }
    true
}

/// The most any hardware-valid layout consumes of each resource: the GPU's counter totals.
/// Nothing the hardware accepts then exceeds a counter, and engines a layout cannot use up
/// (e.g. a second `+me` OFA) are not offered. `None` when the table has more than
/// [`LAYOUT_BUDGET`] layouts.
pub(crate) fn max_consumption(model: &GpuModel) -> Option<ResourceAmounts> {
    let mut max = ResourceAmounts::default();
    let mut seen = 0usize;
    let complete = for_each_layout(model, |occ| {
        max = max.max(occ.consumed());
        seen += 1;
        seen <= LAYOUT_BUDGET
    });
    complete.then_some(max)
}

/// The resource counters DAS must publish for `model` besides `memory-slice-<n>`: `memory`
/// always (quota tools such as Kueue charge it), and each other resource counter only if without
/// it the counter rules would accept a layout the hardware refuses. On the 8-slice tables one
/// engine counter is left (the one that keeps a second `+me` out); the rest follow from the
/// memory slices. Fewer counters make every scheduling attempt cheaper: the allocator validates
/// and converts each device's consumed counters on every node it filters (docs/benchmarks.md,
/// "Scheduler throughput"). Checked by walking every layout the reduced rules accept; `None`
/// when that walk passes [`LAYOUT_BUDGET`].
pub(crate) fn needed_counters(model: &GpuModel) -> Option<Vec<&'static str>> {
    let all: Vec<&'static str> = ResourceAmounts::default()
        .counters()
        .iter()
        .map(|(n, _)| *n)
        .collect();
    let mut keep = all.clone();
    for name in all
        .iter()
        .rev()
        .filter(|n| **n != das_api::counters::MEMORY)
    {
        let trial: Vec<&'static str> = keep.iter().copied().filter(|k| k != name).collect();
        match counters_exact(model, &trial) {
            Some(true) => keep = trial,
            Some(false) => {}
            None => return None,
        }
    }
    Some(keep)
}

/// Whether the counter rules with only `kept` resource counters accept hardware-valid layouts
/// only; `None` past [`LAYOUT_BUDGET`] accepted layouts.
fn counters_exact(model: &GpuModel, kept: &[&'static str]) -> Option<bool> {
    fn walk(
        m: &GpuModel,
        pl: &[(usize, u32)],
        from: usize,
        occ: &mut Occupancy,
        kept: &[&'static str],
        seen: &mut usize,
    ) -> Option<bool> {
        *seen += 1;
        if *seen > LAYOUT_BUDGET {
            return None;
        }
        for (i, &(p, s)) in pl.iter().enumerate().skip(from) {
            if occ
                .counter_conflict(m, p, s, |n| kept.contains(&n))
                .is_some()
            {
                continue;
            }
            if occ.check_hardware(m, p, s).is_err() {
                return Some(false);
            }
            occ.add(m, p, s);
            let r = walk(m, pl, i + 1, occ, kept, seen);
            occ.remove(m, p, s);
            if r != Some(true) {
                return r;
            }
        }
        Some(true)
    }
    let mut occ = Occupancy::empty(model);
    walk(model, &all_placements(model), 0, &mut occ, kept, &mut 0)
}

/// The instance-count vectors (indexed like [`GpuModel::profiles`]) of hardware-valid layouts
/// that no other valid layout dominates: every multiset of profiles one GPU can hold is below one
/// of them. Only the packing optimum (`publish::placement::optimum`, tests and benchmarks)
/// needs it.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn maximal_count_vectors(model: &GpuModel) -> Vec<Vec<u32>> {
    let mut all = std::collections::HashSet::new();
    for_each_layout(model, |occ| {
        all.insert(occ.counts().to_vec());
        true
    });
    let all: Vec<Vec<u32>> = all.into_iter().collect();
    let mut maximal: Vec<Vec<u32>> = all
        .iter()
        .filter(|v| !all.iter().any(|w| w != *v && dominates(w, v)))
        .cloned()
        .collect();
    maximal.sort();
    maximal
}

#[cfg(any(test, feature = "testing"))]
fn dominates(w: &[u32], v: &[u32]) -> bool {
    w.iter().zip(v).all(|(a, b)| a >= b)
}

#[cfg(test)]
mod tests;
