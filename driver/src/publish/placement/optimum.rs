//! The offline optimum for the packing benchmark: knowing a whole request stream in advance, how
//! long a prefix of it can a node hold at once?
//!
//! Per GPU model the state space is tiny (at most 8 memory slices: every valid layout can be enumerated), so
//! each GPU is reduced to the instance-count vectors of its maximal valid layouts
//! ([`maximal_count_vectors`]). A multiset of requests fits the node iff one vector per GPU can
//! be chosen whose sum covers it. That is decided by dynamic programming over the GPUs: the set
//! of demands still open after GPUs `0..i`, where an open demand that is component-wise at least
//! another one is dropped (it cannot do better). Feasibility is monotone in the prefix length, so
//! the longest feasible prefix is found by binary search.
//!
//! Whole-GPU requests ([`WHOLE_GPU_PROFILE`]) are one more component of the demand. A GPU with MIG
//! mode off ([`Optimum::with_whole_gpus`]) holds one of them and nothing else, so those GPUs just
//! lower that component. A switchable GPU ([`Optimum::with_switchable_gpus`]) holds either one
//! whole-GPU request or a layout of slices, never both (the counters exclude each other): its
//! choices are its maximal vectors plus the unit vector of the whole-GPU component, and the same
//! search finds the best split of the GPUs into whole-held and MIG. A GPU with MIG on that is not
//! switchable holds no whole-GPU request.

use std::collections::HashSet;

use das_api::WHOLE_GPU_PROFILE;

use crate::gpu::layout::maximal_count_vectors;

use super::GpuView;

/// The node's GPUs reduced to their maximal layouts, over the node's distinct profile names and,
/// last, [`WHOLE_GPU_PROFILE`].
#[derive(Debug, Clone)]
pub struct Optimum {
    names: Vec<String>,
    gpus: Vec<GpuChoices>,
    /// Whole GPUs (MIG mode off) beside `gpus`.
    whole: usize,
}

#[derive(Debug, Clone)]
struct GpuChoices {
    /// GPU index on the node.
    index: u32,
    model: String,
    /// Instance counts per entry of [`Optimum::names`], one vector per maximal layout.
    vectors: Vec<Vec<u32>>,
}

impl Optimum {
    /// Prepares the search for a node with `gpus`.
    pub fn new(gpus: &[GpuView<'_>]) -> Self {
        let mut names: Vec<String> = Vec::new();
        for g in gpus {
            for p in &g.model.profiles {
                if !names.contains(&p.name) {
                    names.push(p.name.clone());
                }
            }
        }
        names.push(WHOLE_GPU_PROFILE.to_string());
        let mut cache: Vec<GpuChoices> = Vec::new();
        let mut out = Vec::new();
        for g in gpus {
            if let Some(done) = cache.iter().find(|c| c.model == g.model.name) {
                out.push(GpuChoices {
                    index: g.index,
                    ..done.clone()
                });
                continue;
            }
            let global = |local: Vec<u32>| -> Vec<u32> {
                let mut v = vec![0; names.len()];
                for (p, n) in g.model.profiles.iter().zip(local) {
                    v[names.iter().position(|x| *x == p.name).unwrap_or(0)] += n;
                }
                v
            };
            let choices = GpuChoices {
                index: g.index,
                model: g.model.name.clone(),
                vectors: maximal_count_vectors(g.model)
                    .into_iter()
                    .map(global)
                    .collect(),
            };
            cache.push(choices.clone());
            out.push(choices);
        }
        Self {
            names,
            gpus: out,
            whole: 0,
        }
    }

    /// The same node with `count` whole GPUs (MIG mode off) besides the GPUs with MIG on.
    pub fn with_whole_gpus(mut self, count: usize) -> Self {
        self.whole = count;
        self
    }

    /// The same node with the GPUs of indices `indices` switchable: each holds one whole-GPU
    /// request or slices.
    pub fn with_switchable_gpus(mut self, indices: &[u32]) -> Self {
        let whole = self.names.len() - 1;
        for &index in indices {
            let gpu = self.gpus.iter_mut().find(|g| g.index == index);
            let gpu = gpu.unwrap_or_else(|| panic!("a switchable GPU {index} that is not a view"));
            let mut unit = vec![0; self.names.len()];
            unit[whole] = 1;
            if !gpu.vectors.contains(&unit) {
                gpu.vectors.push(unit);
            }
        }
        self
    }

    /// Whether the node can hold all of `requests` (profile names, [`WHOLE_GPU_PROFILE`] for a
    /// whole GPU) at once. Unknown names never fit.
    pub fn feasible<S: AsRef<str>>(&self, requests: &[S]) -> bool {
        let mut demand = vec![0u32; self.names.len()];
        for r in requests {
            match self.names.iter().position(|n| n == r.as_ref()) {
                Some(i) => demand[i] += 1,
                None => return false,
            }
        }
        // The GPUs with MIG mode off take whole-GPU requests first: they can hold nothing else.
        let whole = self.names.len() - 1;
        demand[whole] = demand[whole].saturating_sub(self.whole as u32);
        let mut open = vec![demand];
        for gpu in &self.gpus {
            if open.iter().any(|d| d.iter().all(|&x| x == 0)) {
                return true;
            }
            let mut next: HashSet<Vec<u32>> = HashSet::new();
            for d in &open {
                next.insert(d.clone());
                for v in &gpu.vectors {
                    next.insert(d.iter().zip(v).map(|(a, b)| a.saturating_sub(*b)).collect());
                }
            }
            open = minimal(next);
        }
        open.iter().any(|d| d.iter().all(|&x| x == 0))
    }

    /// The longest prefix of `requests` the node can hold at once.
    pub fn longest_feasible_prefix<S: AsRef<str>>(&self, requests: &[S]) -> usize {
        self.longest_feasible_prefix_from(requests, 0)
    }

    /// Like [`Self::longest_feasible_prefix`], given that the first `known` requests fit (e.g.
    /// because an online policy placed them): searches upwards from there.
    pub fn longest_feasible_prefix_from<S: AsRef<str>>(
        &self,
        requests: &[S],
        known: usize,
    ) -> usize {
        let mut k = known.min(requests.len());
        while k < requests.len() && self.feasible(&requests[..=k]) {
            k += 1;
        }
        k
    }
}

/// The demands no other demand in `set` is component-wise at most.
fn minimal(set: HashSet<Vec<u32>>) -> Vec<Vec<u32>> {
    let mut all: Vec<Vec<u32>> = set.into_iter().collect();
    all.sort_by_key(|d| d.iter().sum::<u32>());
    let mut keep: Vec<Vec<u32>> = Vec::new();
    for d in all {
        if !keep.iter().any(|k| k.iter().zip(&d).all(|(a, b)| a <= b)) {
            keep.push(d);
        }
    }
    keep
}

#[cfg(test)]
mod tests;
