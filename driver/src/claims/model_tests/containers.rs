//! Containers in the model (issue 41): what a live container holds is the device nodes of the
//! instances its claim had when it started (the GPU's node, each instance's capability nodes at
//! its placement), whatever became of those instances since, and its runtime spec carries the
//! claim's CDI edits (variables and nodes), which the in-memory runtime reports to the orphan
//! rule. Pods may reserve a claim after its first prepare (the kubelet prepares a claim once, so
//! such a pod never reaches the plugin), and a claim's repair may fail while its pod runs.
//!
//! Invariants:
//! - N1: no instance is created at a placement whose capability nodes a live container of
//!   another claim still holds;
//! - N2: no GPU's MIG mode is switched while a live container of another claim holds any of its
//!   device nodes.
//!
//! Two composite steps drive the sequences that broke them before the fixes of issue 41:
//! [`Step::RepairRace`] (a repair that fails, then a force delete and another claim at the same
//! placement or the same GPU whole: the guard) and [`Step::JoinRace`] (a second pod that joins
//! a prepared claim and outlives the first: the orphan rule's container evidence).

use rand::Rng;

use super::{CALLER, Caller, Checked, Claim, Fault, Step, World, is_whole};
use crate::gpu::{FaultKind, GpuBackend};

/// A live container of a pod, as the model knows it.
#[derive(Clone, Debug)]
pub(super) struct ModelContainer {
    /// Its claim's UID.
    pub claim: String,
    /// Its pod's UID.
    pub pod: String,
    /// Its name in the in-memory runtime.
    pub name: String,
    /// The MIG UUIDs it can use (I4).
    pub migs: Vec<String>,
    /// The device nodes it holds: per device, its GPU and, for a MIG instance, the placement
    /// `(start, size)` its capability nodes reach (`None`: a whole GPU's node).
    pub holds: Vec<(u32, Option<(u32, u32)>)>,
}

/// What the container steps did.
#[derive(Debug, Default, Clone)]
pub(super) struct ContainerStats {
    pub joined: usize,
    pub repair_races: usize,
    pub join_races: usize,
    /// Prepares refused because a guard or a lingering claim still held the placement or GPU.
    pub held_off: usize,
}

impl ContainerStats {
    pub(super) fn add(&mut self, o: &ContainerStats) {
        self.joined += o.joined;
        self.repair_races += o.repair_races;
        self.join_races += o.join_races;
        self.held_off += o.held_off;
    }
}

/// The composite steps ran, and reached their end (a second claim was prepared, or held off).
pub(super) fn assert_exercised(total: &super::Stats) {
    let c = &total.containers;
    assert!(
        c.joined > 20 && c.repair_races > 10 && c.join_races > 10 && c.held_off > 5,
        "the container steps are exercised: {c:?}"
    );
}

/// The steps of this module, `k` in 0..4.
pub(super) fn step(rng: &mut impl Rng, slot: usize, k: u32) -> Step {
    match k {
        0 | 1 => Step::JoinPod { slot },
        2 => Step::RepairRace {
            slot,
            pick: rng.random(),
        },
        _ => Step::JoinRace { slot },
    }
}

/// The placement size of `profile` on GPU `gpu`'s model.
fn size_of(inventory: &[crate::gpu::GpuInfo], gpu: u32, profile: &str) -> u32 {
    inventory
        .iter()
        .find(|g| g.index == gpu)
        .and_then(|g| g.model.profile(profile).map(|(_, p)| p.placement_size))
        .unwrap_or(1)
}

impl Checked {
    /// The claim whose call creates or switches now (a prepare or a carve), if any.
    fn acting_claim() -> Option<String> {
        match CALLER.try_with(Clone::clone).ok() {
            Some(Caller::Prepare(uid)) => Some(uid),
            _ => None,
        }
    }

    /// N1, before a create of `profile` at `start` on GPU `gpu`.
    pub(super) fn check_held_nodes(&self, gpu: u32, profile: &str, start: u32) {
        let Ok(inventory) = self.inner.inventory() else {
            return;
        };
        let size = size_of(&inventory, gpu, profile);
        let me = Self::acting_claim();
        let held = self.held.lock().unwrap();
        for c in held
            .containers
            .iter()
            .filter(|c| Some(&c.claim) != me.as_ref())
        {
            let reaches = c.holds.iter().any(|(g, p)| {
                *g == gpu && p.is_some_and(|(s, z)| s < start + size && start < s + z)
            });
            if reaches {
                self.violations.lock().unwrap().push(format!(
                    "N1: {me:?} created {profile} at {start} on GPU {gpu}, whose capability nodes container {} of claim {} still holds",
                    c.name, c.claim
                ));
            }
        }
    }

    /// N2, before a switch of GPU `gpu`'s MIG mode.
    pub(super) fn check_switch_nodes(&self, gpu: u32) {
        let me = Self::acting_claim();
        let held = self.held.lock().unwrap();
        for c in held
            .containers
            .iter()
            .filter(|c| Some(&c.claim) != me.as_ref())
        {
            if c.holds.iter().any(|(g, _)| *g == gpu) {
                self.violations.lock().unwrap().push(format!(
                    "N2: {me:?} switched GPU {gpu}'s MIG mode while container {} of claim {} holds its device nodes",
                    c.name, c.claim
                ));
            }
        }
    }
}

impl World {
    /// A container of pod `pod` of `c` starts: it can use `migs`, holds the device nodes of
    /// `c`'s devices, and the runtime reports the pod and the container's runtime spec (the
    /// claim's CDI edits).
    pub(super) fn start_container(&self, c: &Claim, migs: &[String], pod: &str) {
        let holds = c
            .devices
            .iter()
            .map(|d| {
                let (gpu, profile, start) = d;
                if is_whole(d) {
                    (*gpu, None)
                } else {
                    (
                        *gpu,
                        Some((*start, size_of(&self.inventory, *gpu, profile))),
                    )
                }
            })
            .collect();
        let (env, nodes) = self.spec_edits(&c.claim.uid);
        let mut held = self.held.lock().unwrap();
        let name = format!("{pod}-{}", held.containers.len());
        held.containers.push(ModelContainer {
            claim: c.claim.uid.clone(),
            pod: pod.to_string(),
            name: name.clone(),
            migs: migs.to_vec(),
            holds,
        });
        self.runtime.pods.lock().unwrap().insert(pod.to_string());
        self.runtime.run_container(&name, &env, &nodes);
    }

    /// The containers of `c`'s pods matching `which` stop; the runtime forgets a pod once none
    /// of its containers is left.
    pub(super) fn stop_containers_where(&self, c: &Claim, which: impl Fn(&ModelContainer) -> bool) {
        let mut held = self.held.lock().unwrap();
        let (gone, kept): (Vec<_>, Vec<_>) = held
            .containers
            .drain(..)
            .partition(|m| m.claim == c.claim.uid && which(m));
        held.containers = kept;
        let mut pods = self.runtime.pods.lock().unwrap();
        for m in gone {
            self.runtime.stop_container(&m.name);
            if !held.containers.iter().any(|k| k.pod == m.pod) {
                pods.remove(&m.pod);
            }
        }
    }

    /// The environment entries and device node paths of claim `uid`'s CDI spec devices.
    fn spec_edits(&self, uid: &str) -> (Vec<String>, Vec<String>) {
        let path = crate::claims::cdi::spec_path(&self.dir.path().join("cdi"), uid);
        let Ok(spec) = crate::claims::cdi::read_spec(&path) else {
            return (Vec::new(), Vec::new());
        };
        let edits = || spec.devices.iter().map(|d| &d.container_edits);
        (
            edits().flat_map(|e| e.env.iter().cloned()).collect(),
            edits()
                .flat_map(|e| e.device_nodes.iter().map(|n| n.path.clone()))
                .collect(),
        )
    }

    /// [`Step::JoinPod`]: a second pod reserves the slot's prepared claim and starts; the
    /// kubelet does not prepare the claim again, so the plugin is not told.
    pub(super) fn join_pod(&mut self, slot: usize) -> bool {
        let Some(c) = self.slots[slot]
            .clone()
            .filter(|c| !c.terminating && self.bound(&c.claim.uid))
        else {
            return false;
        };
        let Some(migs) = c.held.clone() else {
            return false;
        };
        let pod = second_pod(&c.claim.uid);
        if self.runtime.pods.lock().unwrap().contains(&pod) {
            return false;
        }
        self.api.reserve_for(&c.claim, &[pod.as_str()]);
        self.start_container(&c, &migs, &pod);
        self.stats.containers.joined += 1;
        true
    }

    /// [`Step::JoinRace`]: a second pod joins the slot's claim; the claim is force-deleted and
    /// the kubelet forgets it; the first pod's containers stop, the second's linger; time passes
    /// beyond the orphan rule's delay; then a new claim is allocated the same placements and
    /// prepared. The orphan rule must keep the MIG instances while the second pod's container holds
    /// them (its record never heard of that pod).
    pub(super) async fn join_race(&mut self, slot: usize) {
        if !self.join_pod(slot) {
            return;
        }
        let Some(c) = self.slots[slot].clone() else {
            return;
        };
        self.stats.containers.join_races += 1;
        self.force_delete(slot);
        let pick = self.zombies.iter().position(|z| z.claim.uid == c.claim.uid);
        let Some(pick) = pick else { return };
        self.forget(pick, true);
        let first = super::pod_of(&c.claim.uid);
        self.stop_containers_where(&c, |m| m.pod == first);
        for _ in 0..3 {
            self.reap(89).await;
        }
        self.reuse(slot, &c, 0).await;
    }

    /// [`Step::RepairRace`]: the slot's prepared claim loses an instance, its repair fails (a
    /// create fault), the claim is force-deleted while its pod's containers still run, and a
    /// new claim is allocated the same placement (or, `pick` odd on the switchable GPU, that GPU
    /// whole) and prepared. The failed repair's record must keep guarding.
    pub(super) async fn repair_race(&mut self, slot: usize, pick: u32) {
        let Some(c) = self.slots[slot].clone().filter(|c| {
            c.held.is_some()
                && !c.terminating
                && self.bound(&c.claim.uid)
                && c.devices.iter().all(|d| !self.lost.contains(&d.0))
        }) else {
            return;
        };
        let Some((gpu, profile, start)) = c.devices.iter().find(|d| !is_whole(d)).cloned() else {
            return;
        };
        let live = self.live();
        let Some(at) = live
            .iter()
            .position(|s| s.gpu_index == gpu && s.profile == profile && s.placement.start == start)
        else {
            return;
        };
        self.stats.containers.repair_races += 1;
        self.tamper(at, false);
        self.fault(Fault::Create {
            gpu,
            kind: FaultKind::Other,
        });
        self.prepare(slot, false, false, 0).await;
        // The create fault is spent or still pending: either way, the next create works.
        self.emu.clear_faults();
        self.force_delete(slot);
        self.reuse(slot, &c, pick).await;
    }

    /// A new claim in `slot` (emptied by a force delete) allocated what `old` had (or, `pick`
    /// odd and `old` on the switchable GPU, that GPU whole) and prepared.
    async fn reuse(&mut self, slot: usize, old: &Claim, pick: u32) {
        let whole = pick % 2 == 1 && old.devices.iter().any(|d| d.0 == super::SWITCHABLE);
        let wanted: Vec<(u32, String, u32)> = if whole {
            vec![(super::SWITCHABLE, das_api::WHOLE_GPU_PROFILE.into(), 0)]
        } else {
            old.devices.clone()
        };
        if !self.allocate_exact(slot, &wanted) {
            return;
        }
        let before = self.stats.prepare_errors.get("placement_held").copied();
        let mig = self.stats.prepare_errors.get("mig_mode_switch").copied();
        self.prepare(slot, false, false, 0).await;
        if self.stats.prepare_errors.get("placement_held").copied() != before
            || self.stats.prepare_errors.get("mig_mode_switch").copied() != mig
        {
            self.stats.containers.held_off += 1;
        }
    }
}

/// The UID of the second pod that joins claim `uid`.
fn second_pod(uid: &str) -> String {
    format!("pod2-{uid}")
}

impl super::Held {
    /// The claim whose live container can use MIG UUID `mig`, if any (I4).
    pub(super) fn running_owner(&self, mig: &str) -> Option<String> {
        self.containers
            .iter()
            .find(|c| c.migs.iter().any(|m| m == mig))
            .map(|c| c.claim.clone())
    }
}

/// The model's own checks can fail: a create at a placement whose nodes another claim's
/// container holds breaks N1, and a switch of that GPU breaks N2.
#[test]
fn the_invariant_checks_catch_a_container_that_still_holds_the_nodes() {
    let rt = super::paused_runtime();
    rt.block_on(async {
        let w = World::new();
        w.held.lock().unwrap().containers.push(ModelContainer {
            claim: "old".into(),
            pod: "pod-old".into(),
            name: "pod-old-0".into(),
            migs: Vec::new(),
            holds: vec![(0, Some((0, 1)))],
        });
        let backend = Checked {
            inner: w.emu.clone(),
            held: w.held.clone(),
            violations: w.violations.clone(),
            modes: w.modes.clone(),
        };
        CALLER
            .scope(Caller::Prepare("new".into()), async {
                backend.create_instance(0, "1g.5gb", 0).unwrap();
                backend.check_switch_nodes(0);
            })
            .await;
        let v = w.violations.lock().unwrap().clone();
        assert!(v.iter().any(|v| v.starts_with("N1")), "{v:?}");
        assert!(v.iter().any(|v| v.starts_with("N2")), "{v:?}");
    });
}
