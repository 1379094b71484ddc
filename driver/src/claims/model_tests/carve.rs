//! Carve before bind in the model (issue 34; docs/design.md §7, "Carve before bind"): one in four
//! claims the scheduler allocates carry binding conditions on their MIG results; the plugin's
//! watch carves them ([`Step::Carve`], now or in the background), the scheduler binds a claim
//! once `SliceReady` lands and allocates it anew (same UID, maybe elsewhere) once
//! `SliceFailed` does, and a claim deallocated or deleted before its prepare
//! ([`Step::Deallocate`]) has its carved MIG instances released by the watch. Invariants:
//! - C1 a `Carved` record's instances are live at its allocated placements when no call is in
//!   flight (unless its GPU is lost or someone else destroyed them);
//! - C2 a prepare of a claim carved for its allocation creates nothing;
//! - C3 no carved MIG instance survives its claim's deallocation once the watch's release ran (with
//!   the API server answering);
//! - C4 a restart keeps a carved claim the API server still allocates here as recorded.

use std::collections::{BTreeMap, BTreeSet};

use tokio::task::JoinHandle;

use super::{CALLER, Caller, Checked, Claim, NODE, SLICED, Step, World, is_whole};
use crate::claims::carve::{self, OnClaimSeen};
use crate::claims::checkpoint::{ClaimRecord, PrepareState};
use crate::claims::handler::ClaimRef;
use crate::claims::plan;
use crate::claims::preparer::carve::Carved;

tokio::task_local! {
    /// Set while the watch's carve runs (its creates are not a prepare's, for C2).
    static CARVING: ();
}

/// The scheduler's view of the claims allocated with binding conditions.
#[derive(Default)]
pub(super) struct CarveModel {
    /// UID → whether the scheduler bound the pod (it saw `SliceReady`).
    waits: BTreeMap<String, bool>,
    /// Claims no longer allocated as carved: the watch releases their carved records.
    to_release: Vec<ClaimRef>,
}

/// What the carve steps did.
#[derive(Debug, Default, Clone)]
pub(super) struct CarveStats {
    pub carved: usize,
    pub failed: usize,
    pub reallocated: usize,
    pub released: usize,
    pub prepared_carved: usize,
    pub kept_at_restart: usize,
}

impl CarveStats {
    pub(super) fn add(&mut self, o: &CarveStats) {
        self.carved += o.carved;
        self.failed += o.failed;
        self.reallocated += o.reallocated;
        self.released += o.released;
        self.prepared_carved += o.prepared_carved;
        self.kept_at_restart += o.kept_at_restart;
    }
}

pub(super) fn assert_exercised(total: &super::Stats) {
    let c = &total.carve;
    assert!(
        c.carved > 50 && c.failed > 0 && c.reallocated > 0,
        "carves succeed and fail: {c:?}"
    );
    assert!(
        c.released > 0 && c.prepared_carved > 20 && c.kept_at_restart > 0,
        "carved claims are released, prepared and kept at restarts: {c:?}"
    );
}

impl Checked {
    /// Counts a create per claim for C2: a prepare's, not a carve's.
    pub(super) fn count_create(&self) {
        if CARVING.try_with(|_| ()).is_ok() {
            return;
        }
        if let Ok(Caller::Prepare(uid)) = CALLER.try_with(Clone::clone) {
            *self.held.lock().unwrap().creates.entry(uid).or_default() += 1;
        }
    }
}

impl World {
    /// After [`Step::Allocate`] filled `slot`: one claim in four waits for its carve (its MIG
    /// results carry the binding conditions, as the scheduler copies them from devices published
    /// with `--carve-before-bind`; whole GPUs are published without).
    pub(super) fn maybe_wait_for_carve(&mut self, slot: usize, picks: &[u32], before: u64) {
        let Some(c) = self.slots[slot].clone() else {
            return;
        };
        let fresh = self.next_uid != before;
        if !fresh || (picks[0] >> 28) & 3 != 0 || c.devices.iter().all(is_whole) {
            return;
        }
        self.wait_for_carve(&c);
    }

    fn wait_for_carve(&mut self, c: &Claim) {
        self.api.change(&c.claim, |rc| {
            let allocation = rc.status.as_mut().and_then(|s| s.allocation.as_mut());
            let results = allocation
                .and_then(|a| a.devices.as_mut())
                .and_then(|d| d.results.as_mut());
            for r in results.into_iter().flatten() {
                if !r.device.starts_with("gpu-") || r.device.contains("-mig-") {
                    r.binding_conditions = Some(vec![carve::SLICE_READY.into()]);
                    r.binding_failure_conditions = Some(vec![carve::SLICE_FAILED.into()]);
                }
            }
        });
        self.carve.waits.insert(c.claim.uid.clone(), false);
    }

    /// Whether the kubelet may see the claim (its pod is bound): no binding conditions, or the
    /// scheduler saw `SliceReady`.
    pub(super) fn bound(&self, uid: &str) -> bool {
        self.carve.waits.get(uid).is_none_or(|b| *b)
    }

    /// The scheduler reads the carves' answers: binds on `SliceReady`, allocates anew on
    /// `SliceFailed`.
    pub(super) fn schedule(&mut self) {
        for slot in 0..self.slots.len() {
            let Some(c) = self.slots[slot].clone() else {
                continue;
            };
            if self.bound(&c.claim.uid) {
                continue;
            }
            let answer = self.api.carves.lock().unwrap().get(&c.claim.uid).cloned();
            match answer {
                Some(carve::CarveOutcome::Ready) => {
                    self.carve.waits.insert(c.claim.uid.clone(), true);
                }
                Some(carve::CarveOutcome::Failed(_)) => {
                    self.allocate_anew(slot, c.claim.uid.len() as u32 + self.next_uid as u32)
                }
                None => {}
            }
        }
    }

    /// The scheduler clears the slot's allocation and allocates the same claim (UID) again at
    /// other free placements (`pick`), or leaves it pending (deleted, in the model) when none
    /// is free.
    fn allocate_anew(&mut self, slot: usize, pick: u32) {
        let Some(old) = self.slots[slot].take() else {
            return;
        };
        self.stats.carve.reallocated += 1;
        self.api.carves.lock().unwrap().remove(&old.claim.uid);
        self.carve.waits.remove(&old.claim.uid);
        self.carve.to_release.push(old.claim.clone());
        let choices: Vec<(u32, bool, u32)> = old
            .devices
            .iter()
            .enumerate()
            .map(|(k, _)| {
                let gpu = SLICED[(pick as usize + k) % SLICED.len()];
                (gpu, false, pick / 3 + k as u32)
            })
            .collect();
        self.api.delete(&old.claim);
        self.allocate_choices(slot, &choices);
        let Some(mut c) = self.slots[slot].clone() else {
            return;
        };
        let uid = old.claim.uid.clone();
        self.api
            .change(&c.claim, |rc| rc.metadata.uid = Some(uid.clone()));
        c.claim.uid = uid;
        self.api.reserve_for(&c.claim, &[]);
        self.wait_for_carve(&c);
        self.slots[slot] = Some(c);
    }

    /// [`Step::Carve`]: the watch releases what it was told to, then sees the slot's claim and
    /// carves it if it waits (`cancel`: in the background, `after` yields from now).
    pub(super) async fn carve_step(&mut self, slot: usize, cancel: bool, after: u32) {
        self.watch_releases().await;
        let Some(c) = self.slots[slot]
            .clone()
            .filter(|c| !self.bound(&c.claim.uid))
        else {
            return;
        };
        let Some(rc) = self.api.claim(&c.claim) else {
            return;
        };
        let record = self.p.record_of(&c.claim.uid);
        match carve::on_claim_seen(&rc, NODE, record.as_ref()) {
            OnClaimSeen::ReleaseCarved => {
                self.carve.to_release.push(c.claim.clone());
                self.watch_releases().await;
            }
            OnClaimSeen::Carve => {}
            // Carved, but its SliceReady lost (a restart between the carve and the write).
            OnClaimSeen::Announce => {
                self.p.announce_carved(&c.claim).await;
                return;
            }
            OnClaimSeen::Nothing => return,
        }
        let p = self.p.clone();
        let claim = c.claim.clone();
        let caller = Caller::Prepare(claim.uid.clone());
        let call = CALLER.scope(
            caller,
            CARVING.scope((), async move { p.carve_claim(&claim).await }),
        );
        if cancel {
            let task: JoinHandle<()> = tokio::spawn(async move {
                let _ = call.await;
            });
            for _ in 0..after {
                tokio::task::yield_now().await;
            }
            self.background.push(task);
            return;
        }
        match call.await {
            Ok(Carved::Ready) => self.stats.carve.carved += 1,
            Ok(Carved::Failed(_)) => self.stats.carve.failed += 1,
            _ => {}
        }
    }

    /// The watch's releases of claims no longer allocated as carved, with C3.
    async fn watch_releases(&mut self) {
        for claim in std::mem::take(&mut self.carve.to_release) {
            let reads_fail = self
                .api
                .failing_reads
                .load(std::sync::atomic::Ordering::SeqCst)
                > 0;
            let p = self.p.clone();
            let c = claim.clone();
            let r = CALLER
                .scope(Caller::Watch, async move { p.release_carved(&c).await })
                .await;
            if r.as_ref().is_ok_and(|r| *r) {
                self.stats.carve.released += 1;
            }
            let rc = self.api.claim(&claim);
            let stale = |r: &ClaimRecord| {
                r.state == PrepareState::Carved
                    && !plan::still_allocated(&claim, r, rc.as_ref(), NODE)
            };
            if !reads_fail && self.p.record_of(&claim.uid).as_ref().is_some_and(stale) {
                self.violation(format!(
                    "C3: {claim}'s carved record survives the watch's release ({r:?})"
                ));
            }
        }
    }

    /// [`Step::Deallocate`]: the scheduler deallocates a claim whose pod was never prepared
    /// (its binding timed out, or the pod was deleted): `anew` allocates it again, else it is
    /// deleted. `release`: the watch releases its carved record now.
    pub(super) async fn deallocate(&mut self, slot: usize, anew: bool, release: bool) {
        let quiet = self.background.iter().all(JoinHandle::is_finished);
        let Some(c) = self.slots[slot].clone() else {
            return;
        };
        let Some(&bound) = self.carve.waits.get(&c.claim.uid) else {
            return;
        };
        if c.terminating || c.held.is_some() || (bound && !quiet) {
            return;
        }
        let carved = self.p.record_of(&c.claim.uid);
        if bound && carved.is_none_or(|r| r.state != PrepareState::Carved) {
            return;
        }
        if anew {
            self.allocate_anew(slot, slot as u32 + self.next_uid as u32 * 7);
        } else {
            self.slots[slot] = None;
            self.carve.waits.remove(&c.claim.uid);
            self.api.delete(&c.claim);
            self.carve.to_release.push(c.claim);
        }
        if release {
            self.watch_releases().await;
        }
    }

    /// A force-deleted claim that waited: the watch releases its carved record.
    pub(super) fn carve_gone(&mut self, c: &Claim) {
        if self.carve.waits.remove(&c.claim.uid).is_some() {
            self.carve.to_release.push(c.claim.clone());
        }
    }

    /// Before a prepare of `c`: whether it is carved for its allocation and C2 applies (its
    /// instances untouched, its GPUs answering), and the prepare creates counted so far.
    pub(super) fn before_prepare(&self, c: &Claim) -> Option<usize> {
        let r = self.p.record_of(&c.claim.uid)?;
        let rc = self.api.claim(&c.claim);
        let clean = !self.tampered.contains(&c.claim.uid)
            && !r.devices.iter().any(|d| self.lost.contains(&d.gpu_index));
        (r.state == PrepareState::Carved
            && clean
            && plan::still_allocated(&c.claim, &r, rc.as_ref(), NODE))
        .then(|| self.creates_of(&c.claim.uid))
    }

    fn creates_of(&self, uid: &str) -> usize {
        let held = self.held.lock().unwrap();
        held.creates.get(uid).copied().unwrap_or(0)
    }

    /// C2, after a prepare of `c` that [`Self::before_prepare`] found carved.
    pub(super) fn after_prepare(&mut self, c: &Claim, before: Option<usize>) {
        let Some(n) = before else { return };
        self.stats.carve.prepared_carved += 1;
        let now = self.creates_of(&c.claim.uid);
        if now != n {
            self.violation(format!(
                "C2: the prepare of carved claim {} created {} instance(s)",
                c.claim,
                now - n
            ));
        }
    }

    /// Before a restart's reconciliation: the carved records the API server still allocates.
    pub(super) fn carved_kept(&self) -> BTreeSet<String> {
        let cp = self.p.checkpoint().read(Clone::clone);
        cp.claims
            .iter()
            .filter(|(_, r)| r.state == PrepareState::Carved)
            .filter(|(uid, r)| {
                let claim = ClaimRef {
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    uid: (*uid).clone(),
                };
                let rc = self.api.claim(&claim);
                plan::still_allocated(&claim, r, rc.as_ref(), NODE)
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// C4, after the restart's reconciliation.
    pub(super) fn check_kept(&mut self, kept: BTreeSet<String>) {
        for uid in kept {
            self.stats.carve.kept_at_restart += 1;
            let state = self.p.record_of(&uid).map(|r| r.state);
            if state != Some(PrepareState::Carved) {
                self.violation(format!(
                    "C4: the restart did not keep carved claim {uid}, still allocated ({state:?})"
                ));
            }
        }
    }

    /// C1 (no call in flight): a carved record's instances are live at its allocated
    /// placements.
    pub(super) fn check_carved(&self, live: &[crate::gpu::MigInstance]) {
        let cp = self.p.checkpoint().read(Clone::clone);
        for (uid, r) in cp
            .claims
            .iter()
            .filter(|(_, r)| r.state == PrepareState::Carved)
        {
            if self.tampered.contains(uid) {
                continue;
            }
            // A record the API server no longer allocates waits for the watch's release (C3).
            let model = self.slots.iter().flatten().find(|c| {
                &c.claim.uid == uid
                    && plan::still_allocated(&c.claim, r, self.api.claim(&c.claim).as_ref(), NODE)
            });
            for (k, d) in r.devices.iter().enumerate() {
                if self.lost.contains(&d.gpu_index) || d.is_whole_gpu() {
                    continue;
                }
                if !live.iter().any(|s| plan::is_instance(d, s)) {
                    self.violation(format!(
                        "C1: carved {uid} records {} but it is gone",
                        d.device
                    ));
                }
                let at = (d.gpu_index, d.profile.clone(), d.placement_start);
                let allocated =
                    model.is_none_or(|c| c.devices.len() != r.devices.len() || c.devices[k] == at);
                if !allocated {
                    self.violation(format!(
                        "C1: carved {uid} records {at:?}, allocated {:?}",
                        model.map(|c| &c.devices)
                    ));
                }
            }
        }
    }
}

/// The steps of carve before bind, `k` in 0..8.
pub(super) fn step(rng: &mut impl rand::Rng, slot: usize, k: u32) -> Step {
    if k < 6 {
        Step::Carve {
            slot,
            cancel: rng.random_bool(0.2),
            after: rng.random_range(1..12),
        }
    } else {
        Step::Deallocate {
            slot,
            anew: rng.random_bool(0.5),
            release: rng.random_bool(0.7),
        }
    }
}
