//! MIG mode follows demand in the model (docs/design.md §7, "MIG mode follows demand"): what the
//! scheduler may allocate on the switchable GPU, the invariants M1–M4 (see [`super`]), and the
//! switches a run made.
//!
//! The switchable GPU ([`SWITCHABLE`]) is published whole and as every MIG instance while DAS may
//! switch it; after a failed switch (an injected `InUse` or `ResetRequired`) only what its mode
//! serves, until the plugin restarts. The scheduler allocates from what is published and from the
//! counters of the claims the API server has, so a whole GPU and a MIG instance of it are allocated at
//! once only through a force delete (the old claim is still prepared) or an allocation made
//! before the GPU stopped switching (a stale one): the prepare must then fail without switching
//! under the other claim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::{CALLER, Caller, Checked, SWITCHABLE, Stats, World};
use crate::claims::checkpoint::{Checkpoint, PrepareState};
use crate::claims::plan::DeviceKind;
use crate::claims::{PrepareError, Preparer};
use crate::gpu::on_off;
use crate::gpu::{BackendError, GpuBackend, MigInstance, MigSwitch};

/// What M3 and M4 read and what the run counts, shared by every [`Checked`] of a run (a restart
/// builds a new one).
#[derive(Default)]
pub(super) struct ModeWatch {
    /// The preparer now, whose checkpoint tells who holds what.
    preparer: Mutex<Weak<Preparer>>,
    on: AtomicUsize,
    off: AtomicUsize,
    failed: AtomicUsize,
}

impl ModeWatch {
    /// Reads `p`'s checkpoint from now on.
    pub(super) fn watch(&self, p: &Arc<Preparer>) {
        *self.preparer.lock().unwrap() = Arc::downgrade(p);
    }

    /// Whether the preparer now may switch GPU `gpu`.
    fn switch_of(&self, gpu: u32) -> Option<MigSwitch> {
        let p = self.preparer.lock().unwrap().upgrade()?;
        Some(p.modes.switch_of(gpu))
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        let p = self.preparer.lock().unwrap().upgrade()?;
        Some(p.checkpoint().read(Clone::clone))
    }

    /// `stats` with the switches counted.
    pub(super) fn add_counts(&self, mut stats: Stats) -> Stats {
        stats.switches_on = self.on.load(Ordering::SeqCst);
        stats.switches_off = self.off.load(Ordering::SeqCst);
        stats.failed_switches = self.failed.load(Ordering::SeqCst);
        stats
    }
}

/// The kinds of device the node publishes for a GPU now.
pub(super) struct Serves {
    pub(super) whole: bool,
    pub(super) mig: bool,
}

/// Who holds GPU `gpu` in `cp`, other than `except`: claims whose completed record holds it
/// whole, and claims whose record holds a created MIG instance of it.
fn holders(cp: &Checkpoint, gpu: u32, except: Option<&str>) -> (Vec<String>, Vec<String>) {
    let (mut whole, mut slices) = (Vec::new(), Vec::new());
    for (uid, r) in cp.claims.iter().filter(|(u, _)| Some(u.as_str()) != except) {
        for d in r.devices.iter().filter(|d| d.gpu_index == gpu) {
            if d.is_whole_gpu() && r.state == PrepareState::PrepareCompleted {
                whole.push(uid.clone());
            } else if !d.is_whole_gpu() && d.instance.is_some() {
                slices.push(format!("{uid} ({})", d.device));
            }
        }
    }
    whole.dedup();
    (whole, slices)
}

impl Checked {
    /// `set_mig_mode`, checking M3 first when it would change the mode now (not a no-op nor the
    /// setting back of a pending change), and counting what it did.
    pub(super) fn checked_set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError> {
        let switching = self.inner.mig_mode(gpu).is_ok_and(|m| m.current != enabled);
        if !switching {
            return self.inner.set_mig_mode(gpu, enabled);
        }
        let to = on_off(enabled);
        self.check_switch_nodes(gpu);
        let caller = CALLER.try_with(Clone::clone).ok();
        let mut v = Vec::new();
        let uid = match &caller {
            Some(Caller::Prepare(uid)) => Some(uid.as_str()),
            _ => {
                v.push(format!(
                    "M3: {caller:?} switched GPU {gpu} {to}: only a prepare switches"
                ));
                None
            }
        };
        if !enabled {
            let n = self.inner.instances_on(gpu).map_or(0, |l| l.len());
            if n > 0 {
                v.push(format!(
                    "M3: {caller:?} switched GPU {gpu} off while {n} MIG instance(s) exist on it"
                ));
            }
        }
        if let Some(MigSwitch::Refused(why)) = self.modes.switch_of(gpu) {
            v.push(format!(
                "M3: {caller:?} switched GPU {gpu} {to}, which DAS no longer switches ({why})"
            ));
        }
        if let Some(cp) = self.modes.checkpoint() {
            let (whole, slices) = holders(&cp, gpu, uid);
            if !whole.is_empty() || !slices.is_empty() {
                v.push(format!(
                    "M3: {caller:?} switched GPU {gpu} {to} while other claims hold it: whole by {whole:?}, slices {slices:?}"
                ));
            }
        }
        self.violations.lock().unwrap().extend(v);
        let r = self.inner.set_mig_mode(gpu, enabled);
        let counter = match (&r, enabled) {
            (Err(_), _) => &self.modes.failed,
            (Ok(()), true) => &self.modes.on,
            (Ok(()), false) => &self.modes.off,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// M4, before a create of `profile` at `start` on GPU `gpu`.
    pub(super) fn check_create(&self, gpu: u32, profile: &str, start: u32) {
        let mut v = Vec::new();
        if self.inner.mig_mode(gpu).is_ok_and(|m| !m.current) {
            v.push(format!(
                "M4: a create of {profile} at {start} on GPU {gpu}, whose MIG mode is off"
            ));
        }
        if let Some(cp) = self.modes.checkpoint() {
            let (whole, _) = holders(&cp, gpu, None);
            if !whole.is_empty() {
                v.push(format!(
                    "M4: a create of {profile} at {start} on GPU {gpu}, held whole by {whole:?}"
                ));
            }
        }
        self.violations.lock().unwrap().extend(v);
    }
}

impl World {
    /// What the node publishes for GPU `gpu` now: what it published at start-up, less what the
    /// publisher withdrew after a failed switch ([`Preparer::serves_only`]).
    pub(super) fn serves(&self, gpu: u32) -> Serves {
        let only = self.p.serves_only().get(&gpu).copied();
        let published = |kind: DeviceKind| {
            only.is_none_or(|k| k == kind)
                && self
                    .p
                    .node
                    .devices
                    .values()
                    .any(|d| d.gpu_index == gpu && d.kind == kind)
        };
        Serves {
            whole: published(DeviceKind::WholeGpu),
            mig: published(DeviceKind::Mig),
        }
    }

    /// [`Step::Race`](super::Step::Race).
    pub(super) async fn race(&mut self, slot: usize, after: u32, pick: u32) {
        let Some(old) = self.slots[slot]
            .clone()
            .filter(|c| !c.terminating && c.held.is_none())
        else {
            return;
        };
        let Some(was_whole) = old
            .devices
            .iter()
            .find(|d| d.0 == SWITCHABLE)
            .map(super::is_whole)
        else {
            return;
        };
        self.stats.races += 1;
        self.prepare(slot, true, false, after).await;
        self.force_delete(slot);
        self.allocate_choices(slot, &[(SWITCHABLE, !was_whole, pick)]);
        self.prepare(slot, false, false, 0).await;
    }

    /// M1 and M2 on every GPU that answers, at any time (a switch and the creates after it run
    /// under the GPU's lock, and a create is recorded before the lock is let go). A claim the
    /// kubelet holds as prepared counts as holding its whole GPUs, as its completed record does.
    pub(super) fn check_mig_modes(&self, live: &[MigInstance]) {
        let cp = self.p.checkpoint().read(Clone::clone);
        for gpu in self.emu.gpu_indices() {
            if self.lost.contains(&gpu) {
                continue;
            }
            let (mut whole, slices) = holders(&cp, gpu, None);
            whole.extend(
                self.slots
                    .iter()
                    .flatten()
                    .chain(&self.zombies)
                    .filter(|c| c.held.is_some())
                    .filter(|c| c.devices.iter().any(|d| d.0 == gpu && super::is_whole(d)))
                    .map(|c| format!("{} (held by the kubelet)", c.claim.uid)),
            );
            let here: Vec<&MigInstance> = live.iter().filter(|s| s.gpu_index == gpu).collect();
            if let (Some(uid), Some(s)) = (whole.first(), here.first()) {
                self.violation(format!(
                    "M1: {} ({} at {}) exists on GPU {gpu}, which claim {uid} holds whole",
                    s.mig_uuid, s.profile, s.placement.start
                ));
            }
            let Ok(mode) = self.emu.mig_mode(gpu) else {
                continue;
            };
            if !mode.current && (!here.is_empty() || !slices.is_empty()) {
                self.violation(format!(
                    "M2: GPU {gpu} has MIG mode off with {} instance(s) on it and slices recorded {slices:?}",
                    here.len()
                ));
            }
            if mode.current && !whole.is_empty() {
                self.violation(format!(
                    "M2: GPU {gpu} has MIG mode on while {whole:?} hold it whole"
                ));
            }
        }
    }
}

impl World {
    /// M5 on every GPU never lost, at any time: the time slice is set after the record is
    /// `PrepareStarted` and before it is completed, and put back before a released record goes.
    pub(super) fn check_time_slices(&self) {
        let cp = self.p.checkpoint().read(Clone::clone);
        for gpu in self.emu.gpu_indices() {
            if self.ever_lost.contains(&gpu) {
                continue;
            }
            let level = self.emu.time_slice_level(gpu);
            let whole: Vec<(&String, PrepareState, u32)> = cp
                .claims
                .iter()
                .flat_map(|(uid, r)| {
                    r.devices
                        .iter()
                        .filter(move |d| d.gpu_index == gpu && d.is_whole_gpu())
                        .map(move |d| (uid, r.state, d.time_slice.map_or(0, |t| t.level())))
                })
                .collect();
            for (uid, state, want) in &whole {
                if *state == PrepareState::PrepareCompleted && level != *want {
                    self.violation(format!(
                        "M5: GPU {gpu} has time slice {level}, but {uid}'s completed record holds it whole with {want}"
                    ));
                }
            }
            if whole.is_empty() && level != 0 {
                self.violation(format!(
                    "M5: GPU {gpu} has time slice {level}, and no record holds it whole"
                ));
            }
        }
    }
}

/// Whether `e` is a prepare failing on GPU `gpu`'s MIG mode: a switch that failed or was refused,
/// or its whole GPU refused for its mode.
pub(super) fn refused_on(e: &PrepareError, gpu: u32) -> bool {
    match e {
        PrepareError::MigModeSwitch { gpu: g, .. } => *g == gpu,
        PrepareError::WholeGpuUnavailable { device, .. } => {
            *device == das_api::whole_gpu_device_name(gpu)
        }
        _ => false,
    }
}

/// The streams reach MIG mode switches both ways, failed ones, and prepares of the switchable GPU
/// whole and sliced (a generator change that starves them fails here).
pub(super) fn assert_exercised(total: &Stats) {
    assert!(
        total.switches_on > 25 && total.switches_off > 25,
        "MIG mode is switched both ways: {total:?}"
    );
    assert!(total.failed_switches > 3, "switches fail: {total:?}");
    assert!(
        total.switchable_whole_prepared > 100 && total.switchable_slices_prepared > 100,
        "the switchable GPU is prepared whole and sliced: {total:?}"
    );
    assert!(
        total.refused_on_switchable > 0,
        "prepares meet a GPU that no longer switches: {total:?}"
    );
}

mod tests {
    use super::super::{Checked, World, paused_runtime};
    use super::{CALLER, Caller, SWITCHABLE};
    use crate::claims::checkpoint::{DeviceKind, InstanceId, RecordedDevice};
    use crate::claims::testing::NODE;
    use crate::gpu::{GpuBackend, MigInstance};

    fn whole(w: &World) -> RecordedDevice {
        RecordedDevice {
            time_slice: None,
            acquired: false,
            kind: DeviceKind::WholeGpu,
            request: "gpu".into(),
            pool: NODE.into(),
            device: das_api::whole_gpu_device_name(SWITCHABLE),
            gpu_index: SWITCHABLE,
            gpu_uuid: w.inventory[SWITCHABLE as usize].uuid.clone(),
            profile: das_api::WHOLE_GPU_PROFILE.into(),
            placement_start: 0,
            placement_size: 8,
            instance: None,
            mps: None,
            share: None,
        }
    }

    fn slice(w: &World, s: &MigInstance) -> RecordedDevice {
        RecordedDevice {
            kind: DeviceKind::Mig,
            profile: s.profile.clone(),
            device: das_api::device_name(SWITCHABLE, &s.profile, s.placement.start),
            placement_start: s.placement.start,
            placement_size: s.placement.size,
            instance: Some(InstanceId {
                gi_id: s.gi_id,
                ci_id: 0,
                mig_uuid: s.mig_uuid.clone(),
            }),
            ..whole(w)
        }
    }

    fn violations(w: &World) -> Vec<String> {
        std::mem::take(&mut *w.violations.lock().unwrap())
    }

    /// The model's own checks can fail: a MIG instance made under a whole GPU's completed record breaks
    /// M1 and M2, and a create there breaks M4.
    #[test]
    fn the_invariant_checks_catch_a_slice_on_a_gpu_held_whole() {
        paused_runtime().block_on(async {
            let w = World::new();
            w.p.checkpoint().change(|cp| {
                let ids = std::collections::BTreeMap::new();
                cp.set_completed("u1", "ns", "u1", vec![whole(&w)], ids);
            });
            w.check(true);
            assert_eq!(violations(&w), Vec::<String>::new());
            w.emu.set_mig_mode(SWITCHABLE, true).unwrap();
            w.check(true);
            let v = violations(&w);
            assert!(v.iter().any(|v| v.starts_with("M2")), "{v:?}");
            let backend = Checked {
                inner: w.emu.clone(),
                held: w.held.clone(),
                violations: w.violations.clone(),
                modes: w.modes.clone(),
            };
            backend.create_instance(SWITCHABLE, "1g.10gb", 0).unwrap();
            let v = violations(&w);
            assert!(v.iter().any(|v| v.contains("held whole")), "{v:?}");
            w.check(true);
            let v = violations(&w);
            assert!(v.iter().any(|v| v.starts_with("M1")), "{v:?}");
        });
    }

    /// The model's own checks can fail: a switch off under another claim's MIG instance, or by anything
    /// but a prepare, breaks M3; a MIG instance recorded on a GPU with MIG mode off breaks M2.
    #[test]
    fn the_switch_checks_catch_a_switch_under_another_claim() {
        paused_runtime().block_on(async {
            let w = World::new();
            let backend = Checked {
                inner: w.emu.clone(),
                held: w.held.clone(),
                violations: w.violations.clone(),
                modes: w.modes.clone(),
            };
            CALLER
                .scope(Caller::Startup, async {
                    backend.set_mig_mode(SWITCHABLE, true).unwrap();
                })
                .await;
            let v = violations(&w);
            assert!(v.iter().any(|v| v.contains("only a prepare")), "{v:?}");
            let s = w.emu.create_instance(SWITCHABLE, "1g.10gb", 0).unwrap();
            w.p.checkpoint().change(|cp| {
                let ids = std::collections::BTreeMap::new();
                cp.set_completed("u1", "ns", "u1", vec![slice(&w, &s)], ids);
            });
            CALLER
                .scope(Caller::Prepare("u2".into()), async {
                    // The emulated GPU refuses (IN_USE); the check fires before.
                    assert!(backend.set_mig_mode(SWITCHABLE, false).is_err());
                })
                .await;
            let v = violations(&w);
            assert!(
                v.iter().any(|v| v.contains("while 1 MIG instance"))
                    && v.iter().any(|v| v.contains("slices [\"u1")),
                "{v:?}"
            );
            // The same record with the MIG instance gone and MIG mode off.
            w.emu.destroy_instance(SWITCHABLE, s.gi_id).unwrap();
            w.emu.set_mig_mode(SWITCHABLE, false).unwrap();
            w.check(true);
            let v = violations(&w);
            assert!(v.iter().any(|v| v.starts_with("M2")), "{v:?}");
        });
    }
}
