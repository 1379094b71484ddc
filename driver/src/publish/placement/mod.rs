//! The placement policy: the order in which DAS publishes its devices (docs/design.md §5).
//!
//! The upstream DRA allocator has no scoring. It takes the first device that fits, trying pools,
//! slices (sorted by name from 1.36) and devices in listed order (docs/reference/dra.md, "How the scheduler picks devices"), so
//! the published order decides which placement a claim gets. A request for one profile only sees
//! that profile's devices, so what matters is, per profile, the order of its `(GPU, start)`
//! placements:
//!
//! - GPUs in index order, so one GPU fills up before the next is touched and whole GPUs stay
//!   free for 7g. A profile name that GPUs of several models offer (`1g.10gb` is 2 of 8 memory
//!   slices on A100-40GB, 1 of 8 on H100-80GB) is the exception: its devices are merged across
//!   the models, the k-th GPU of every model before the (k+1)-th of any, and within that by the
//!   damage below (`merge_models`);
//! - on a GPU, each profile's starts by the *damage* a placement does: the sum, over the other
//!   profiles' placements it overlaps, of `1 / (number of placements of that profile)` (losing
//!   the only 4g placement costs 1, losing one of seven 1g placements costs 1/7), plus 1 per free
//!   memory slice it strands (leaves unusable by any placement that still fits). Ties go to the
//!   higher start. On every 8-slice table this yields "small profiles from the high memory slices
//!   down, large ones from slice 0", so 4g/7g stay placeable as long as possible, with one
//!   refinement: plain 1g goes to 5 and 4 before 6, because 1g at 6 strands slice 7, which only
//!   1g.2×mem at 6, 3g at 4 and 7g can use. On the 4-slice A30 and the 12-unit RTX PRO grid it
//!   yields the same shape without hard-coding a grid. The packing benchmark measured the
//!   stranding term: on 8 × H100 with a small-heavy mix it raised the streams placed as well as
//!   the optimum from 41 % to 57 %.
//! - Across profiles (this matters only to claims that select by attributes, e.g. "any device
//!   with ≥ 20 GB") smaller profiles come first, so such a claim gets the smallest that fits.
//!
//! - Whole GPUs (`--whole-gpus`; docs/design.md §7, "Whole GPUs") by what else their GPU offers
//!   ([`with_whole_gpus`]). A GPU offered only whole (without MIG, like a T4 or an L4, or with MIG
//!   mode off and not switched) comes first, before every MIG placement, in index order: it can
//!   serve nothing but a whole GPU, so a request that takes whole GPUs (or selects by attributes
//!   across both kinds) uses it before it cuts into a GPU that could serve slices, and a MIG
//!   request never sees it. A switchable GPU (`--mig-mode-switching`) is listed both whole and as
//!   its MIG placements, its whole device after the MIG placements of its GPU and of every GPU
//!   with a lower index, and its counters let it hold one or the other: a whole-GPU request
//!   takes a GPU offered only whole first, then the lowest-index switchable GPU that holds
//!   nothing; slices first-fit on the GPUs not held whole. On alike GPUs which free GPU a
//!   whole-GPU request takes changes nothing (free GPUs are interchangeable); the packing
//!   benchmark's switching rows measured index order against the reverse and against the
//!   optimum split. On Kubernetes 1.34 a GPU's devices share its slice, so GPUs are walked in
//!   index order whatever their kind.
//!
//! [`order_for_occupancy`] recomputes the damage on the current occupancy (an optional
//! refinement that needs republishing after every allocation); [`name_order`] is the baseline
//! of plain first-fit over device names. `sim` simulates the allocator over an order and
//! `optimum` gives the offline optimum, for the packing benchmark (`benches/packing.rs`; both behind the `testing` feature).

// The allocator simulation and the offline optimum serve tests and the packing benchmark only.
#[cfg(any(test, feature = "testing"))]
pub mod optimum;
#[cfg(any(test, feature = "testing"))]
pub mod sim;

use std::cmp::Ordering;

use crate::gpu::layout::{Occupancy, slice_mask};
use crate::gpu::{GiProfile, GpuInfo, GpuModel};
use das_api::device_name;

/// One GPU as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct GpuView<'a> {
    /// GPU index on the node.
    pub index: u32,
    /// Its model.
    pub model: &'a GpuModel,
}

impl<'a> GpuView<'a> {
    /// Views of `models` as GPUs 0, 1, … in the order given (simulations without an
    /// inventory: the packing benchmarks).
    pub fn of_models(models: &[&'a GpuModel]) -> Vec<GpuView<'a>> {
        models
            .iter()
            .enumerate()
            .map(|(i, m)| GpuView {
                index: i as u32,
                model: m,
            })
            .collect()
    }

    /// Views of an inventory, in the order given.
    pub fn of(gpus: &'a [GpuInfo]) -> Vec<GpuView<'a>> {
        gpus.iter()
            .map(|g| GpuView {
                index: g.index,
                model: &g.model,
            })
            .collect()
    }
}

/// A device to publish: `profile` at memory slice `start` on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// Position of the GPU in the views passed to the policy.
    pub gpu: usize,
    /// GPU index on the node.
    pub gpu_index: u32,
    /// Profile index in the GPU model's [`GpuModel::profiles`].
    pub profile: usize,
    /// Placement start [memory slice].
    pub start: u32,
}

impl Candidate {
    /// The candidate's profile.
    pub(crate) fn profile_of<'m>(&self, gpus: &[GpuView<'m>]) -> &'m GiProfile {
        &gpus[self.gpu].model.profiles[self.profile]
    }
}

/// A device in the published order: a MIG placement, or a whole GPU (MIG mode off; docs/design.md
/// §7, "Whole GPUs").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listed {
    /// A MIG placement of the policy's order.
    Mig(Candidate),
    /// The whole-GPU device `gpu-<index>` of the GPU with index `gpu_index`.
    WholeGpu {
        /// GPU index on the node.
        gpu_index: u32,
    },
}

impl Listed {
    /// The GPU index of the device.
    pub fn gpu_index(&self) -> u32 {
        match self {
            Listed::Mig(c) => c.gpu_index,
            Listed::WholeGpu { gpu_index } => *gpu_index,
        }
    }
}

/// The MIG order `mig` (e.g. [`publish_order`]) with the whole GPUs `whole` (GPU indices) put in.
/// A whole GPU with no MIG placement in `mig` is offered only whole (no MIG, or MIG mode off):
/// those come first, in index order. A whole GPU that also has MIG placements (switchable)
/// comes right after the last device of every GPU with an index up to its own, so after its own
/// GPU's MIG placements; those in index order too. A whole-GPU request only sees whole GPUs
/// (its DeviceClass selects `type == "gpu"`): it takes a GPU that serves nothing else before
/// one that could serve slices, and the first free one of each kind. A MIG request never sees
/// them, so the MIG devices keep their order.
pub fn with_whole_gpus(mig: Vec<Candidate>, whole: &[u32]) -> Vec<Listed> {
    let mut whole = whole.to_vec();
    whole.sort_unstable();
    whole.dedup();
    let (switchable, only_whole): (Vec<u32>, Vec<u32>) = whole
        .into_iter()
        .partition(|&i| mig.iter().any(|c| c.gpu_index == i));
    let mut out: Vec<Listed> = only_whole
        .into_iter()
        .map(|gpu_index| Listed::WholeGpu { gpu_index })
        .collect();
    let front = out.len();
    out.extend(mig.into_iter().map(Listed::Mig));
    for gpu_index in switchable {
        let at = out[front..]
            .iter()
            .rposition(|l| l.gpu_index() <= gpu_index)
            .map_or(front, |i| front + i + 1);
        out.insert(at, Listed::WholeGpu { gpu_index });
    }
    out
}

/// DAS's default publishing order for an inventory (no occupancy): see the module docs.
pub(crate) fn publish_order(gpus: &[GpuView<'_>]) -> Vec<Candidate> {
    let empty: Vec<Occupancy> = gpus.iter().map(|g| Occupancy::empty(g.model)).collect();
    order_for_occupancy(gpus, &empty)
}

/// DAS's order with the damage computed on the current occupancy `occ` (one per GPU, same order
/// as `gpus`): placements that fit now come first on each GPU, ranked by the damage they do to the
/// placements still possible.
pub(crate) fn order_for_occupancy(gpus: &[GpuView<'_>], occ: &[Occupancy]) -> Vec<Candidate> {
    let mut out: Vec<Ranked> = Vec::new();
    for (pos, (g, o)) in gpus.iter().zip(occ).enumerate() {
        for profile in profiles_small_first(g.model) {
            let mut starts: Vec<(u32, Option<f64>)> = g.model.profiles[profile]
                .placement_starts
                .iter()
                .map(|&s| (s, damage(g.model, o, profile, s)))
                .collect();
            starts.sort_by(|a, b| rank(*a, *b));
            out.extend(starts.into_iter().map(|(start, damage)| Ranked {
                candidate: Candidate {
                    gpu: pos,
                    gpu_index: g.index,
                    profile,
                    start,
                },
                damage,
            }));
        }
    }
    merge_models(gpus, &mut out);
    out.into_iter().map(|r| r.candidate).collect()
}

/// A candidate with its damage on its GPU (`None`: does not fit).
#[derive(Debug, Clone, Copy)]
struct Ranked {
    candidate: Candidate,
    damage: Option<f64>,
}

/// For each profile name that GPUs of more than one model offer, reorders its devices across
/// GPUs; every other device keeps its place.
///
/// GPU-major order alone sends a shared name such as `1g.10gb` (2 of 8 memory slices on A100-40GB,
/// 1 of 8 on H100-80GB) to whichever model has the lower index until that GPU is full, which
/// strands the other model's own profiles on that GPU while the other model's GPU stays empty.
/// Instead its devices are merged:
///
/// - by rank within the model: the k-th GPU of every model before the (k+1)-th of any, so on each
///   model one GPU still fills before the next is touched (whole GPUs stay free for 7g);
/// - within a rank, by damage, the same measure that orders starts on one GPU: the next device is
///   the GPU head that blocks the least of its own GPU's other placements (on an empty A100-40GB
///   and H100-80GB: A100 6, H100 5, 4, A100 4, H100 6, 3, 2, 1, 0, A100 2, 0);
/// - ties by the smaller share of the GPU's memory slices, then by GPU order.
///
/// A merge never reorders one GPU's starts, and the name keeps the positions it had in the
/// GPU-major order, so what claims that select by attributes see across profiles is unchanged;
/// on a node of one model nothing changes. The packing benchmark (docs/benchmarks.md) measured
/// the alternatives: share of memory slices alone (cheapest GPU first) placed fewer slices than
/// GPU order on the 2 × A100 + 2 × H100 small-heavy row (90.4 % of the optimum against 91.9 %);
/// this merge 93.3 %.
fn merge_models(gpus: &[GpuView<'_>], order: &mut [Ranked]) {
    let ranks = ranks_within_model(gpus);
    let name = |r: &Ranked| r.candidate.profile_of(gpus).name.as_str();
    // Each profile name with the models that offer it.
    let mut offered: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in order.iter() {
        let model = gpus[r.candidate.gpu].model.name.as_str();
        match offered.iter_mut().find(|(n, _)| *n == name(r)) {
            Some((_, models)) if !models.contains(&model) => models.push(model),
            Some(_) => {}
            None => offered.push((name(r), vec![model])),
        }
    }
    let shared = offered
        .into_iter()
        .filter(|(_, models)| models.len() > 1)
        .map(|(n, _)| n);
    for profile in shared {
        let slots: Vec<usize> = (0..order.len())
            .filter(|&i| name(&order[i]) == profile)
            .collect();
        let merged = merge_by_rank_and_damage(gpus, &ranks, slots.iter().map(|&i| order[i]));
        for (slot, device) in slots.into_iter().zip(merged) {
            order[slot] = device;
        }
    }
}

/// Position of each GPU among the GPUs of its model (0 for the first of each model).
fn ranks_within_model(gpus: &[GpuView<'_>]) -> Vec<usize> {
    (0..gpus.len())
        .map(|g| {
            gpus[..g]
                .iter()
                .filter(|x| x.model.name == gpus[g].model.name)
                .count()
        })
        .collect()
}

/// Merges one profile's devices, given GPU by GPU in each GPU's order: rank by rank, taking
/// the head that [`merge_cmp`] puts first each time.
fn merge_by_rank_and_damage(
    gpus: &[GpuView<'_>],
    ranks: &[usize],
    devices: impl Iterator<Item = Ranked>,
) -> Vec<Ranked> {
    let mut queues: Vec<std::collections::VecDeque<Ranked>> = vec![Default::default(); gpus.len()];
    for d in devices {
        queues[d.candidate.gpu].push_back(d);
    }
    let mut out = Vec::new();
    for rank in 0..gpus.len() {
        while let Some(g) = (0..gpus.len())
            .filter(|&g| ranks[g] == rank)
            .filter_map(|g| queues[g].front().map(|head| (g, *head)))
            .min_by(|a, b| merge_cmp(gpus, &a.1, &b.1))
            .map(|(g, _)| g)
        {
            out.extend(queues[g].pop_front());
        }
    }
    out
}

/// Between two GPUs' next devices: fitting first, lower damage (within 1e-9), smaller share of
/// the GPU's memory slices, lower GPU position.
fn merge_cmp(gpus: &[GpuView<'_>], a: &Ranked, b: &Ranked) -> Ordering {
    let by_damage = match (a.damage, b.damage) {
        (Some(x), Some(y)) if (x - y).abs() > 1e-9 => x.total_cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        _ => Ordering::Equal,
    };
    // size_a / slices_a against size_b / slices_b, cross-multiplied to stay exact.
    let share = |x: &Ranked, y: &Ranked| {
        x.candidate.profile_of(gpus).placement_size * gpus[y.candidate.gpu].model.memory_slices
    };
    by_damage
        .then_with(|| share(a, b).cmp(&share(b, a)))
        .then_with(|| a.candidate.gpu.cmp(&b.candidate.gpu))
}

/// Plain first-fit baseline: every device sorted by device name (GPU and start ascending as
/// strings), as a driver that publishes in name order would.
pub(crate) fn name_order(gpus: &[GpuView<'_>]) -> Vec<Candidate> {
    let mut all: Vec<(String, Candidate)> = Vec::new();
    for (pos, g) in gpus.iter().enumerate() {
        for (profile, p) in g.model.profiles.iter().enumerate() {
            for &start in &p.placement_starts {
                let c = Candidate {
                    gpu: pos,
                    gpu_index: g.index,
                    profile,
                    start,
                };
                all.push((device_name(g.index, &p.name, start), c));
            }
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all.into_iter().map(|(_, c)| c).collect()
}

/// Profile indices from small to large: memory slices, compute slices, memory, name.
fn profiles_small_first(model: &GpuModel) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..model.profiles.len()).collect();
    idx.sort_by_key(|&i| {
        let p = &model.profiles[i];
        (
            p.placement_size,
            p.compute_slices,
            p.memory_mib,
            p.name.clone(),
        )
    });
    idx
}

/// Fitting placements first, by damage ascending, ties (within 1e-9) by higher start.
fn rank(a: (u32, Option<f64>), b: (u32, Option<f64>)) -> Ordering {
    match (a.1, b.1) {
        (Some(x), Some(y)) if (x - y).abs() > 1e-9 => x.total_cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        _ => b.0.cmp(&a.0),
    }
}

/// The damage of placing `profile` at `start` on a GPU with occupancy `occ`, or `None` when it
/// does not fit: over every other profile, the share of its still-possible placements this one
/// would block.
fn damage(model: &GpuModel, occ: &Occupancy, profile: usize, start: u32) -> Option<f64> {
    occ.check_counters(model, profile, start).ok()?;
    let mask = slice_mask(start, model.profiles[profile].placement_size);
    let mut total = 0.0;
    for (q, other) in model.profiles.iter().enumerate() {
        if q == profile {
            continue;
        }
        let possible: Vec<u32> = other
            .placement_starts
            .iter()
            .copied()
            .filter(|&t| occ.check_counters(model, q, t).is_ok())
            .collect();
        let blocked = possible
            .iter()
            .filter(|&&t| slice_mask(t, other.placement_size) & mask != 0)
            .count();
        if blocked > 0 {
            total += blocked as f64 / possible.len() as f64;
        }
    }
    let mut after = occ.clone();
    after.add(model, profile, start);
    let stranded = stranded_slices(model, &after).saturating_sub(stranded_slices(model, occ));
    Some(total + STRAND_WEIGHT * f64::from(stranded))
}

/// Damage per memory slice left free but unusable by any placement that still fits (as much as
/// losing a profile's only placement). 0.5 and 3 measured about the same; 0 clearly worse.
const STRAND_WEIGHT: f64 = 1.0;

/// Free memory slices that no placement fitting `occ` covers.
fn stranded_slices(model: &GpuModel, occ: &Occupancy) -> u32 {
    let all = slice_mask(0, model.memory_slices);
    let mut usable = 0u64;
    for (q, p) in model.profiles.iter().enumerate() {
        for &t in &p.placement_starts {
            if occ.check_counters(model, q, t).is_ok() {
                usable |= slice_mask(t, p.placement_size);
            }
        }
    }
    (all & !occ.used_slices() & !usable).count_ones()
}

#[cfg(test)]
mod tests;
