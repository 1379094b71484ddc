//! A simulator of the upstream DRA allocator over DAS's devices, and seeded request streams, for
//! tests and the packing benchmark.
//!
//! The allocator takes, for each request, the first listed device of the requested profile whose
//! shared counters still fit (docs/reference/dra.md, "How the scheduler picks devices"): the GPU's `memory-slice-<n>` counters
//! (value 1 each) and its resource counters. That is [`Occupancy::check_counters`]; a unit test in
//! `gpu::layout` shows the counters accept exactly what the hardware accepts, including the
//! per-profile maximum counts and the single `+me`.
//!
//! Whole GPUs take requests for [`das_api::WHOLE_GPU_PROFILE`]: the first free one in listed
//! order ([`super::with_whole_gpus`]: GPUs offered only whole, then switchable ones, each in
//! index order), as the allocator walks the devices of the whole-GPU class. Each consumes every
//! counter of its GPU. A GPU with MIG mode off or without MIG ([`FirstFit::with_whole_gpus`])
//! has no other device; a *switchable* GPU
//! (`--mig-mode-switching`, [`FirstFit::with_switchable_gpus`]) is listed both whole and as every
//! MIG placement, so its whole device fits only while none of its slices is allocated, and no
//! slice fits on it while it is held whole (the counters exclude each other; the plugin switches
//! the mode on prepare). [`WholeOrder::Reversed`] is an alternative policy for the simulation only:
//! the free whole GPU with the highest index first.

use das_api::WHOLE_GPU_PROFILE;

use crate::gpu::layout::Occupancy;

use super::{Candidate, GpuView, name_order, order_for_occupancy, publish_order};

/// Which published order the simulated allocator walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// DAS's default static order ([`publish_order`]).
    Das,
    /// DAS's order recomputed on the occupancy before every request ([`order_for_occupancy`]),
    /// as if the plugin republished after every allocation.
    DasAdaptive,
    /// Plain first-fit over device names ([`name_order`]).
    NameOrder,
}

/// The order in which a whole-GPU request tries the whole GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WholeOrder {
    /// DAS's published order: GPUs offered only whole, then switchable ones, each by GPU index
    /// ascending.
    #[default]
    Index,
    /// The reverse of [`Self::Index`] (not published; the benchmark's alternative: on GPUs of
    /// one kind, GPU index descending).
    Reversed,
}

/// A GPU that takes whole-GPU requests.
#[derive(Debug, Clone, Copy)]
struct WholeGpu {
    /// GPU index on the node.
    index: u32,
    /// Position among the views of a switchable GPU; `None` for a GPU with MIG mode off.
    view: Option<usize>,
    /// Allocated whole.
    held: bool,
}

/// The first-fit allocator over one node's devices.
#[derive(Debug, Clone)]
pub struct FirstFit<'a> {
    gpus: Vec<GpuView<'a>>,
    occ: Vec<Occupancy>,
    policy: Policy,
    order: Vec<Candidate>,
    /// GPUs that take whole-GPU requests, by index ascending.
    whole: Vec<WholeGpu>,
    whole_order: WholeOrder,
}

impl<'a> FirstFit<'a> {
    /// Empty GPUs, devices published in `policy`'s order.
    pub fn new(gpus: &[GpuView<'a>], policy: Policy) -> Self {
        let order = match policy {
            Policy::Das | Policy::DasAdaptive => publish_order(gpus),
            Policy::NameOrder => name_order(gpus),
        };
        Self {
            gpus: gpus.to_vec(),
            occ: gpus.iter().map(|g| Occupancy::empty(g.model)).collect(),
            policy,
            order,
            whole: Vec::new(),
            whole_order: WholeOrder::Index,
        }
    }

    /// Adds whole GPUs (MIG mode off, or no MIG) with indices `indices`, none of which may be the
    /// index of a GPU of the views: they take [`WHOLE_GPU_PROFILE`] requests.
    pub fn with_whole_gpus(mut self, indices: &[u32]) -> Self {
        for &index in indices {
            assert!(
                self.gpus.iter().all(|g| g.index != index),
                "a whole GPU is also a GPU with MIG on"
            );
            self.add_whole(index, None);
        }
        self
    }

    /// Makes the GPUs of the views with indices `indices` switchable: each also takes
    /// [`WHOLE_GPU_PROFILE`] requests while none of its slices is allocated, and no slice while
    /// it is held whole.
    pub fn with_switchable_gpus(mut self, indices: &[u32]) -> Self {
        for &index in indices {
            let view = self.gpus.iter().position(|g| g.index == index);
            assert!(
                view.is_some(),
                "a switchable GPU {index} that is not a view"
            );
            self.add_whole(index, view);
        }
        self
    }

    /// Whole-GPU requests try the whole GPUs in `order` (default [`WholeOrder::Index`]).
    pub fn with_whole_order(mut self, order: WholeOrder) -> Self {
        self.whole_order = order;
        self
    }

    fn add_whole(&mut self, index: u32, view: Option<usize>) {
        if self.whole.iter().all(|w| w.index != index) {
            self.whole.push(WholeGpu {
                index,
                view,
                held: false,
            });
            // As published: GPUs offered only whole first, then switchable ones.
            self.whole
                .sort_unstable_by_key(|w| (w.view.is_some(), w.index));
        }
    }

    /// Allocates the first whole GPU, in the whole order, that is not held and, if switchable,
    /// holds no slice; its index, or `None` when none is.
    pub(crate) fn allocate_whole(&mut self) -> Option<u32> {
        let occ = &self.occ;
        let free = |w: &&mut WholeGpu| !w.held && w.view.is_none_or(|v| occ[v].instances() == 0);
        let found = match self.whole_order {
            WholeOrder::Index => self.whole.iter_mut().find(free),
            WholeOrder::Reversed => self.whole.iter_mut().rev().find(free),
        }?;
        found.held = true;
        Some(found.index)
    }

    /// Whole GPUs allocated so far.
    pub fn whole_allocated(&self) -> usize {
        self.whole.iter().filter(|w| w.held).count()
    }

    /// Slices allocated so far.
    pub fn slices_allocated(&self) -> usize {
        self.occ.iter().map(|o| o.instances() as usize).sum()
    }

    /// Allocates the first fitting device of `profile` (a profile name); `None` if none fits.
    pub fn allocate(&mut self, profile: &str) -> Option<Candidate> {
        if self.policy == Policy::DasAdaptive {
            self.order = order_for_occupancy(&self.gpus, &self.occ);
        }
        let gpus = &self.gpus;
        let occ = &self.occ;
        let mut held = vec![false; gpus.len()];
        for w in &self.whole {
            if let (Some(v), true) = (w.view, w.held) {
                held[v] = true;
            }
        }
        let found = self.order.iter().copied().find(|c| {
            let model = gpus[c.gpu].model;
            !held[c.gpu]
                && model.profiles[c.profile].name == profile
                && occ[c.gpu].check_counters(model, c.profile, c.start).is_ok()
        })?;
        self.occ[found.gpu].add(self.gpus[found.gpu].model, found.profile, found.start);
        Some(found)
    }

    /// Allocates `requests` in order (profile names, or [`WHOLE_GPU_PROFILE`] for a whole GPU)
    /// and returns how many were placed before the first one that did not fit (all of them if
    /// none failed).
    pub fn placed_before_first_rejection<S: AsRef<str>>(&mut self, requests: &[S]) -> usize {
        requests
            .iter()
            .take_while(|r| match r.as_ref() {
                WHOLE_GPU_PROFILE => self.allocate_whole().is_some(),
                profile => self.allocate(profile).is_some(),
            })
            .count()
    }

    /// Current occupancy, one per GPU.
    pub fn occupancy(&self) -> &[Occupancy] {
        &self.occ
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny seeded PRNG, good enough for workloads.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2⁻³² for small `n`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Request mixes over a node's profiles: uniform, small-skewed and large-skewed, the synthetic
/// suites of the MIG packing literature (docs/benchmarks.md, "Placement policy: packing"). `+me` profiles are left out: one
/// per GPU, they would dominate every stream's first rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Every profile equally likely.
    Uniform,
    /// By compute slices 1g 50 %, 2g 20 %, 3g 15 %, 4g 10 %, larger 5 %, split evenly among the
    /// profiles of the same compute size.
    SmallHeavy,
}

/// `(profile name, weight)` for the node's distinct non-`+me` profiles, in first-seen order.
pub fn profile_weights(gpus: &[GpuView<'_>], mix: Mix) -> Vec<(String, u64)> {
    let mut profiles: Vec<(String, u32)> = Vec::new();
    for g in gpus {
        for p in &g.model.profiles {
            if !p.media_extension && !profiles.iter().any(|(n, _)| *n == p.name) {
                profiles.push((p.name.clone(), p.compute_slices));
            }
        }
    }
    let class_weight = |g: u32| -> u64 {
        match g {
            1 => 50,
            2 => 20,
            3 => 15,
            4 => 10,
            _ => 5,
        }
    };
    let same_class = |g: u32| profiles.iter().filter(|(_, h)| *h == g).count() as u64;
    profiles
        .iter()
        .map(|(name, g)| {
            let w = match mix {
                Mix::Uniform => 1,
                // Scaled by 60 (divisible by any class size up to 6) to keep integers.
                Mix::SmallHeavy => class_weight(*g) * 60 / same_class(*g),
            };
            (name.clone(), w)
        })
        .collect()
}

/// `weights` with whole-GPU requests ([`WHOLE_GPU_PROFILE`]) added at `percent` % of the
/// requests (0 < `percent` < 100): the mixed streams of a node whose GPUs are part MIG on, part
/// MIG off.
pub fn with_whole_gpu_share(weights: &[(String, u64)], percent: u64) -> Vec<(String, u64)> {
    assert!(0 < percent && percent < 100, "a share in 1..100 %");
    let slices: u64 = weights.iter().map(|(_, w)| w).sum();
    let mut out: Vec<(String, u64)> = weights
        .iter()
        .map(|(n, w)| (n.clone(), w * (100 - percent)))
        .collect();
    out.push((WHOLE_GPU_PROFILE.to_string(), slices * percent));
    out
}

/// `len` profile names drawn from `weights`.
pub fn request_stream(weights: &[(String, u64)], rng: &mut SplitMix64, len: usize) -> Vec<String> {
    let total: u64 = weights.iter().map(|(_, w)| w).sum();
    (0..len)
        .map(|_| {
            let mut x = rng.below(total);
            for (name, w) in weights {
                if x < *w {
                    return name.clone();
                }
                x -= w;
            }
            weights[weights.len() - 1].0.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests;
