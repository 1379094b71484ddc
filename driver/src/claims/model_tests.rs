//! A model-based interleaving test of the request path: a seeded random "kubelet, scheduler and
//! operator" drives the real [`Preparer`] over the emulated backend with prepares, unprepares,
//! prepares the kubelet gave up on (still running in the background), two prepares of one
//! claim at once, force-deleted claims whose containers outlive them, a kubelet that loses its
//! state and never unprepares, plugin crashes and restarts, backend faults (IN_USE, create
//! failures, a lost GPU, API errors) and reaper and orphan-rule passes, and checks the lifecycle
//! invariants after every step. Containers are part of the model: a claim's pod has containers
//! from its prepare until the kubelet unprepares it (or, for a kubelet that lost its state,
//! until they stop on their own), and the container runtime the orphan rule asks reports them.
//!
//! Every backend and checkpoint call runs inline on the calling task behind a seeded number of
//! yields ([`BlockingCalls::Inline`]), on a single-threaded runtime with paused time, so a run
//! is a function of its step list: a failure prints the seed, the failing step and a shrunk
//! step list that still fails.
//!
//! Invariants (issue 11, "How it is tested"):
//! - I1 no live instance without a record (checked when no call is in flight);
//! - I2 no record whose instances are gone once the reaper has run with nothing failing, and no
//!   half-done record when no call is in flight;
//! - I3 no two live instances overlap;
//! - I4 no destroy of an instance an administrator created; no destroy of an instance the kubelet
//!   holds for a claim, except by that claim's unprepare, whatever the API server says of the
//!   claim (issue 30: no release after a grace, none at start-up, none for another claim); and no
//!   destroy of an instance while a container of its claim's pod exists, except by that same
//!   claim's prepare repairing it (the orphan rule needs the runtime's word that none is left);
//! - I5 every claim the kubelet holds as prepared has its instances live at its allocated
//!   placements, and its CDI spec names exactly them (and the UUID of each whole GPU it holds);
//! - I6 (whole GPUs, docs/design.md §7, "Whole GPUs") nothing is created on a GPU served whole,
//!   and no two claims' records hold overlapping placements of one GPU when no call is in flight
//!   (a whole GPU's placement is every memory slice of its GPU, so no MIG instance is ever recorded on a
//!   GPU held whole, nor a whole GPU beside a MIG instance).
//!
//! MIG mode follows demand (docs/design.md §7, [`mig_modes`]): a fourth GPU, an H100 that
//! switches MIG mode, is allocated whole and as MIG instances; switches to it fail now and then; and
//! - M1 no MIG instance exists on a GPU while a claim's completed record holds it whole;
//! - M2 a GPU's MIG mode matches what is prepared on it: on while an instance exists on it or a
//!   record holds a created MIG instance of it, off while a completed record holds it whole;
//! - M3 only a prepare switches a GPU's MIG mode, only one DAS still switches (none whose switch
//!   failed since start-up), never off while an instance exists on it, nor while another
//!   claim's record holds a created MIG instance or the completed whole GPU;
//! - M4 nothing is created on a GPU with MIG mode off or held whole by a completed record.
//!
//! Containers hold device nodes (issue 41, [`containers`]): a second pod may join a prepared
//! claim without the plugin hearing of it, and a repair may fail while a pod runs; and
//! - N1 no instance is created at a placement whose capability nodes a live container of
//!   another claim still holds;
//! - N2 no GPU's MIG mode is switched while a live container of another claim holds its nodes.
//!
//! Time-slicing (docs/design.md §7, "Time-slicing"): claims of whole GPUs only ask for one of the
//! four intervals, or none; and
//! - M5 a GPU held whole by a completed record has that record's time slice, and one no record
//!   holds whole has the default (a GPU that was ever lost is left out: the emulation keeps its
//!   slice across the loss, a real GPU that comes back was reset).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::Preparer;
use super::handler::ClaimRef;
use super::orphans::OrphanPolicy;
use super::testing::{MemoryApi, MemoryRuntime, NODE, pod_of, preparer_with};
use crate::blocking::BlockingCalls;
use crate::claims::cdi;
use crate::claims::checkpoint::PrepareState;
use crate::gpu::{
    BackendError, EmulatedBackend, FaultKind, GpuBackend, GpuInfo, MigInstance, MigModeState,
    Occupancy,
};

mod carve;
mod containers;
mod mig_modes;

/// The emulated GPUs: two models, so profiles and placements differ per GPU, a third GPU with
/// MIG mode off, served whole (`--whole-gpus`) as `gpu-2`, and a fourth that switches MIG mode
/// (`--mig-mode-switching`, an H100 starting with MIG mode off), served whole as `gpu-3` and as
/// every MIG instance. (GPU 1, an H100, is switchable too, but only its MIG instances are ever allocated.)
const GPUS: &str = "A100-SXM4-40GB:1,H100-80GB:1,A100-SXM4-40GB:1:mig-off,H100-80GB:1:mig-off";
/// The GPU served whole only (an Ampere GPU is never switched).
const WHOLE: u32 = 2;
/// The GPU served whole and as MIG instances, switched as demand asks.
const SWITCHABLE: u32 = 3;
/// The GPUs whose MIG instances the scheduler allocates.
const SLICED: [u32; 3] = [0, 1, SWITCHABLE];
/// Claims that can exist at once (pods on the node).
const SLOTS: usize = 5;
/// Seeds and steps per seed: 8 × 3,200 = 25,600 steps in `make test` (one in 13.5 a step of
/// carve before bind).
const SEEDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
const STEPS: usize = 3_200;
/// The orphan rule's delay in the model (Reap steps advance time by up to 90 s).
const ORPHAN_DELAY: Duration = Duration::from_secs(30);

/// One step of the model. Parameters are picks, resolved against the model's state when the
/// step runs (a pick that does not apply makes the step a no-op), so any sub-list of steps is
/// again a valid run: that is what shrinking needs.
#[derive(Clone, Debug)]
enum Step {
    /// The scheduler allocates a new claim in an empty slot: 1–3 devices at free placements.
    Allocate { slot: usize, picks: Vec<u32> },
    /// The kubelet prepares a slot's claim. `cancel`: it gives up after `after` yields and the
    /// call runs on in the background. `twice`: two prepares at once (a shared claim).
    Prepare {
        slot: usize,
        cancel: bool,
        twice: bool,
        after: u32,
    },
    /// The pod is gone: the kubelet unprepares the slot's claim (or a force-deleted one's).
    /// `cancel`: it gives up after `after` yields; the call runs on in the background (a crash
    /// can then stop it half-way).
    Unprepare {
        slot: usize,
        zombie: bool,
        cancel: bool,
        after: u32,
    },
    /// The claim is deleted from the API server while the kubelet still holds it (a force
    /// delete): its placements are free for the scheduler before the kubelet unprepares.
    /// `broken`: a claim whose instance someone destroyed is picked first (users delete the pods
    /// whose GPU broke).
    ForceDelete { slot: usize, broken: bool },
    /// The force-delete race on the switchable GPU: the kubelet starts preparing the slot's claim
    /// (if it has a device there and is not prepared) and gives up after `after` yields, the
    /// claim is force-deleted, the scheduler allocates the GPU to a new claim in the other mode
    /// (a MIG instance, `pick`: which, or the whole GPU) and the kubelet prepares it while the old
    /// prepare runs on ([`mig_modes`]).
    Race { slot: usize, after: u32, pick: u32 },
    /// A backend or API fault.
    Fault(Fault),
    /// Time passes by `secs` and the reaper runs.
    Reap { secs: u64 },
    /// The kubelet loses its state (its checkpoint): a force-deleted claim it still held is never
    /// unprepared. `linger`: its pod's containers go on running for now; otherwise they are gone.
    KubeletForgets { pick: usize, linger: bool },
    /// The containers of a forgotten claim's pod stop.
    LingerEnds { pick: usize },
    /// Someone else destroys live instance `pick` (an administrator's `nvidia-smi`), or deletes a
    /// claim's CDI spec (`spec`): the plugin must notice on the claim's next prepare.
    Tamper { pick: usize, spec: bool },
    /// An administrator creates a MIG instance of their own at a free placement (`pick`): DAS must
    /// never destroy it, nor switch its GPU's MIG mode off under it. On the switchable GPU only
    /// while no call is in flight (M3 cannot tell an administrator's create racing a switch from
    /// a switch that ignored the instance) and only while its MIG mode is on.
    Foreign { pick: u32 },
    /// The plugin crashes (calls in flight stop where they are) and restarts.
    Restart,
    /// Every call in flight finishes.
    Settle,
    /// The plugin's watch: it releases the carved records of claims no longer allocated as
    /// carved, then sees the slot's claim and carves it if it waits for its carve (`cancel`: the
    /// carve runs on in the background after `after` yields) ([`carve`]).
    Carve {
        slot: usize,
        cancel: bool,
        after: u32,
    },
    /// A second pod reserves the slot's prepared claim and starts; the kubelet does not prepare
    /// the claim again, so the plugin is not told ([`containers`]).
    JoinPod { slot: usize },
    /// A failed repair of the slot's claim, then a force delete and a new claim at its placement
    /// or its GPU whole (`pick`) ([`containers`]).
    RepairRace { slot: usize, pick: u32 },
    /// A second pod joins the slot's claim and outlives the first after a force delete the
    /// kubelet forgets; then a new claim at its placements ([`containers`]).
    JoinRace { slot: usize },
    /// The scheduler deallocates the slot's claim that waits for its carve and was never
    /// prepared (its binding timed out, its pod was deleted): `anew` allocates it again (same
    /// UID), else it is deleted; `release`: the watch releases its carved record at once.
    Deallocate {
        slot: usize,
        anew: bool,
        release: bool,
    },
}

#[derive(Clone, Debug)]
enum Fault {
    Create {
        gpu: u32,
        kind: FaultKind,
    },
    Destroy {
        gpu: u32,
        count: usize,
        kind: FaultKind,
    },
    Lost {
        gpu: u32,
        lost: bool,
    },
    /// The GPU is reset: every MIG instance on it is gone (someone else's doing, as Tamper).
    Reset {
        gpu: u32,
    },
    ApiReads(usize),
    StatusWrites(usize),
    /// The next MIG mode switch of the switchable GPU fails (`InUse`: the GPU is busy;
    /// `ResetRequired`: the change stays pending a reset the GPU cannot get).
    MigMode {
        kind: FaultKind,
    },
}

/// Who is calling the backend, for I4.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Caller {
    Prepare(String),
    Unprepare(String),
    Reaper,
    /// The orphan rule's checks.
    Orphans,
    Startup,
    /// The carve watch's release of a carved claim no longer allocated.
    Watch,
}

tokio::task_local! {
    static CALLER: Caller;
}

/// What the kubelet holds as prepared: MIG UUID → claim UID, and whether the API server
/// still has the claim; and the live containers, with the MIG UUIDs they can use and the device
/// nodes they hold.
#[derive(Default)]
struct Held {
    by_mig: HashMap<String, (String, bool)>,
    containers: Vec<containers::ModelContainer>,
    /// Creates by a prepare (not a carve), per claim UID (C2).
    creates: HashMap<String, usize>,
}

/// The emulated backend with I4 checked on every destroy, M3 on every switch and I6 and M4 on
/// every create.
struct Checked {
    inner: Arc<EmulatedBackend>,
    held: Arc<Mutex<Held>>,
    violations: Arc<Mutex<Vec<String>>>,
    modes: Arc<mig_modes::ModeWatch>,
}

impl GpuBackend for Checked {
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.inner.inventory()
    }
    fn mig_mode(&self, gpu: u32) -> Result<MigModeState, BackendError> {
        self.inner.mig_mode(gpu)
    }
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<(), BackendError> {
        self.checked_set_mig_mode(gpu, enabled)
    }
    fn set_time_slice(
        &self,
        gpu: u32,
        interval: das_api::device_config::TimeSliceInterval,
    ) -> Result<(), BackendError> {
        self.inner.set_time_slice(gpu, interval)
    }
    fn gpu_indices(&self) -> Vec<u32> {
        self.inner.gpu_indices()
    }
    fn create_instance(
        &self,
        gpu: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        if gpu == WHOLE {
            self.violations.lock().unwrap().push(format!(
                "I6: a create of {profile} at {start} on GPU {gpu}, which is served whole"
            ));
        }
        self.check_create(gpu, profile, start);
        self.check_held_nodes(gpu, profile, start);
        self.count_create();
        self.inner.create_instance(gpu, profile, start)
    }
    fn destroy_instance(&self, gpu: u32, gi_id: u32) -> Result<(), BackendError> {
        if let Ok(live) = self.inner.instances_on(gpu)
            && let Some(s) = live.iter().find(|s| s.gi_id == gi_id)
            && s.created_by_das == Some(false)
        {
            self.violations.lock().unwrap().push(format!(
                "I4: destroyed {} ({} at {} on GPU {gpu}), which an administrator created",
                s.mig_uuid, s.profile, s.placement.start
            ));
        }
        if let Ok(live) = self.inner.instances_on(gpu)
            && let Some(s) = live.iter().find(|s| s.gi_id == gi_id)
            && let Some((owner, in_api)) = self.held.lock().unwrap().by_mig.get(&s.mig_uuid)
        {
            let caller = CALLER.try_with(Clone::clone).ok();
            // Only the kubelet's unprepare of the claim releases what the kubelet holds, even
            // when the API server no longer has the claim (a force delete).
            if caller != Some(Caller::Unprepare(owner.clone())) {
                self.violations.lock().unwrap().push(format!(
                    "I4: {caller:?} destroyed {} ({} at {} on GPU {gpu}), held by claim {owner} (in the API: {in_api})",
                    s.mig_uuid, s.profile, s.placement.start
                ));
            }
        }
        if let Ok(live) = self.inner.instances_on(gpu)
            && let Some(s) = live.iter().find(|s| s.gi_id == gi_id)
            && let Some(owner) = self.held.lock().unwrap().running_owner(&s.mig_uuid)
        {
            let caller = CALLER.try_with(Clone::clone).ok();
            // The claim's own prepare may repair it (a MIG instance of it was destroyed behind the
            // plugin's back: it releases the rest and creates them again), and the reaper may
            // finish that release; nothing else touches a MIG instance a container can use.
            let allowed = matches!(&caller, Some(Caller::Prepare(uid)) if *uid == owner)
                || caller == Some(Caller::Reaper);
            if !allowed {
                self.violations.lock().unwrap().push(format!(
                    "I4: {caller:?} destroyed {} ({} at {} on GPU {gpu}) while a container of claim {owner}'s pod exists",
                    s.mig_uuid, s.profile, s.placement.start
                ));
            }
        }
        self.inner.destroy_instance(gpu, gi_id)
    }
    fn instances_on(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.inner.instances_on(gpu)
    }
}

/// A claim the model knows.
#[derive(Clone, Debug)]
struct Claim {
    claim: ClaimRef,
    /// (GPU, profile, start) per device, in allocation order; a whole GPU is
    /// (its index, `gpu`, 0) ([`is_whole`]).
    devices: Vec<(u32, String, u32)>,
    /// MIG UUIDs, when the kubelet holds it as prepared.
    held: Option<Vec<String>>,
    /// Its pod is being deleted: the kubelet only unprepares it from now on.
    terminating: bool,
}

/// What a run did, to show that the steps exercise the paths they are meant to.
#[derive(Debug, Default, Clone)]
struct Stats {
    prepared: usize,
    prepare_errors: BTreeMap<&'static str, usize>,
    unprepared: usize,
    unprepare_errors: usize,
    cancelled: usize,
    twice: usize,
    force_deleted: usize,
    restarts: usize,
    reaped: usize,
    faults: usize,
    tampered: usize,
    foreign: usize,
    forgotten: usize,
    orphans_released: usize,
    orphans_kept: usize,
    /// Prepares that answered for a claim holding a whole GPU.
    whole_prepared: usize,
    /// Prepares that answered for a claim holding the switchable GPU whole, or MIG instances of it.
    switchable_whole_prepared: usize,
    switchable_slices_prepared: usize,
    /// MIG mode switches of any GPU that took effect, to on and to off, and that failed.
    switches_on: usize,
    switches_off: usize,
    failed_switches: usize,
    /// Prepares that found the switchable GPU refused or failed switching it (`mig_mode_switch`
    /// and `whole_gpu_unavailable` on that GPU).
    refused_on_switchable: usize,
    /// [`Step::Race`]s that ran.
    races: usize,
    carve: carve::CarveStats,
    containers: containers::ContainerStats,
}

/// Whether a model device is a whole GPU.
fn is_whole(d: &(u32, String, u32)) -> bool {
    d.1 == das_api::WHOLE_GPU_PROFILE
}

struct World {
    stats: Stats,
    dir: tempfile::TempDir,
    emu: Arc<EmulatedBackend>,
    api: Arc<MemoryApi>,
    p: Arc<Preparer>,
    held: Arc<Mutex<Held>>,
    violations: Arc<Mutex<Vec<String>>>,
    rng: Arc<Mutex<StdRng>>,
    slots: Vec<Option<Claim>>,
    zombies: Vec<Claim>,
    /// Claims the kubelet forgot whose pod's containers still run.
    lingering: Vec<Claim>,
    runtime: Arc<MemoryRuntime>,
    background: Vec<JoinHandle<()>>,
    lost: BTreeSet<u32>,
    /// GPUs lost at some point of the run (M5 leaves them out).
    ever_lost: BTreeSet<u32>,
    /// Claims whose instance or CDI spec someone else removed.
    tampered: BTreeSet<String>,
    inventory: Vec<GpuInfo>,
    next_uid: u64,
    /// What M3 reads (the preparer now) and counts (the switches).
    modes: Arc<mig_modes::ModeWatch>,
    carve: carve::CarveModel,
}

/// The emulated GPUs whose state is under `dir`, with the GPU whose MIG mode is off served
/// whole and the H100s switchable.
fn open_gpus(dir: &std::path::Path) -> EmulatedBackend {
    EmulatedBackend::open(GPUS, NODE, &dir.join("emu"))
        .unwrap()
        .with_whole_gpus(true)
        .with_mig_mode_switching(true)
}

fn tmp_root() -> PathBuf {
    // A tmpfs where there is one: thousands of small writes per seed.
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir_in(tmp_root()).unwrap();
        let emu = Arc::new(open_gpus(dir.path()));
        let inventory = emu.inventory().unwrap();
        let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(0)));
        let held = Arc::new(Mutex::new(Held::default()));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let api = Arc::new(MemoryApi::default());
        let runtime = Arc::new(MemoryRuntime::default());
        let modes = Arc::new(mig_modes::ModeWatch::default());
        let checked = Checked {
            inner: emu.clone(),
            held: held.clone(),
            violations: violations.clone(),
            modes: modes.clone(),
        };
        let p = Self::build(&dir, checked, &api, &runtime, &rng);
        World {
            stats: Stats::default(),
            dir,
            emu,
            api,
            p,
            held,
            violations,
            rng,
            slots: vec![None; SLOTS],
            zombies: Vec::new(),
            lingering: Vec::new(),
            runtime,
            background: Vec::new(),
            lost: BTreeSet::new(),
            ever_lost: BTreeSet::new(),
            tampered: BTreeSet::new(),
            inventory,
            next_uid: 0,
            modes,
            carve: carve::CarveModel::default(),
        }
    }

    /// A preparer over `backend` with its state under `dir`; M3 reads its checkpoint.
    fn build(
        dir: &tempfile::TempDir,
        backend: Checked,
        api: &Arc<MemoryApi>,
        runtime: &Arc<MemoryRuntime>,
        rng: &Arc<Mutex<StdRng>>,
    ) -> Arc<Preparer> {
        let r = rng.clone();
        let blocking =
            BlockingCalls::Inline(Arc::new(move || r.lock().unwrap().random_range(0..3)));
        let modes = backend.modes.clone();
        let orphans = OrphanPolicy {
            delay: ORPHAN_DELAY,
            runtime: Some(runtime.clone()),
        };
        let p = Arc::new(preparer_with(
            dir.path(),
            Arc::new(backend),
            api.clone(),
            blocking,
            orphans,
        ));
        modes.watch(&p);
        p
    }

    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    async fn run(&mut self, step: &Step) {
        self.schedule();
        match step.clone() {
            Step::Allocate { slot, picks } => {
                let before = self.next_uid;
                self.allocate(slot, &picks);
                self.maybe_wait_for_carve(slot, &picks, before);
            }
            Step::Carve {
                slot,
                cancel,
                after,
            } => self.carve_step(slot, cancel, after).await,
            Step::Deallocate {
                slot,
                anew,
                release,
            } => self.deallocate(slot, anew, release).await,
            Step::Prepare {
                slot,
                cancel,
                twice,
                after,
            } => self.prepare(slot, cancel, twice, after).await,
            Step::Unprepare {
                slot,
                zombie,
                cancel,
                after,
            } => self.unprepare(slot, zombie, cancel, after).await,
            Step::ForceDelete { slot, broken } => {
                let slot = self
                    .slots
                    .iter()
                    .position(|c| {
                        broken
                            && c.as_ref()
                                .is_some_and(|c| self.tampered.contains(&c.claim.uid))
                    })
                    .unwrap_or(slot);
                self.force_delete(slot);
            }
            Step::Race { slot, after, pick } => self.race(slot, after, pick).await,
            Step::Fault(f) => {
                self.stats.faults += 1;
                self.fault(f)
            }
            Step::Reap { secs } => self.reap(secs).await,
            Step::JoinPod { slot } => {
                self.join_pod(slot);
            }
            Step::RepairRace { slot, pick } => self.repair_race(slot, pick).await,
            Step::JoinRace { slot } => self.join_race(slot).await,
            Step::KubeletForgets { pick, linger } => self.forget(pick, linger),
            Step::LingerEnds { pick } => {
                if !self.lingering.is_empty() {
                    let c = self.lingering.remove(pick % self.lingering.len());
                    self.stop_containers(&c);
                }
            }
            Step::Restart => {
                self.stats.restarts += 1;
                self.restart().await
            }
            Step::Tamper { pick, spec } => self.tamper(pick, spec),
            Step::Foreign { pick } => self.foreign(pick),
            Step::Settle => self.settle().await,
        }
    }

    /// Time passes by `secs` and the reaper and the orphan rule run.
    async fn reap(&mut self, secs: u64) {
        tokio::time::advance(Duration::from_secs(secs)).await;
        let r = CALLER.scope(Caller::Reaper, self.p.reap_due()).await;
        let o = CALLER.scope(Caller::Orphans, self.p.check_orphans()).await;
        self.stats.reaped += r.finished.len();
        self.stats.orphans_released += o.released.len();
        self.stats.orphans_kept += o.kept.len();
    }

    /// Placements taken, per GPU, by the claims the API server has allocated.
    fn taken(&self) -> BTreeMap<u32, Occupancy> {
        let mut occ: BTreeMap<u32, Occupancy> = BTreeMap::new();
        for c in self.slots.iter().flatten() {
            for (gpu, profile, start) in c.devices.iter().filter(|d| !is_whole(d)) {
                let model = &self.inventory[*gpu as usize].model;
                let (i, _) = model.profile(profile).unwrap();
                occ.entry(*gpu)
                    .or_insert_with(|| Occupancy::empty(model))
                    .add(model, i, *start);
            }
        }
        occ
    }

    /// [`Step::Allocate`]: what the scheduler would allocate, from the devices this node
    /// publishes and the counters of the claims the API server has (a whole GPU consumes every
    /// memory slice of its GPU, so never a whole GPU and a MIG instance of one GPU at once).
    fn allocate(&mut self, slot: usize, picks: &[u32]) {
        let choices: Vec<(u32, bool, u32)> = picks
            .iter()
            .map(|pick| {
                // 1 in 7 the GPU served whole only; of the rest, half the switchable GPU (whole
                // 2 in 3 times), else a MIG instance of GPU 0 or 1.
                let (gpu, whole) = if pick % 7 == 6 {
                    (WHOLE, true)
                } else if (pick / 7) % 2 == 0 {
                    (SWITCHABLE, (pick / 21) % 3 != 0)
                } else {
                    (pick % 2, false)
                };
                (gpu, whole, *pick / 2)
            })
            .collect();
        self.allocate_choices(slot, &choices);
    }

    /// Allocates a claim in `slot` for the devices of `choices` that are free: (GPU, whole,
    /// which of the free MIG instances); see [`Self::allocate`].
    fn allocate_choices(&mut self, slot: usize, choices: &[(u32, bool, u32)]) {
        if self.slots[slot].is_some() {
            return;
        }
        let mut occ = self.taken();
        // The GPUs a claim the API server has holds whole.
        let mut whole_taken: BTreeSet<u32> = self
            .slots
            .iter()
            .flatten()
            .flat_map(|c| c.devices.iter().filter(|d| is_whole(d)).map(|d| d.0))
            .collect();
        let serves = self.serves(SWITCHABLE);
        let mut devices = Vec::new();
        for &(gpu, whole, pick) in choices {
            if whole {
                let sliced = occ.get(&gpu).is_some_and(|o| o.instances() > 0);
                let published = gpu == WHOLE || serves.whole;
                if published && !sliced && whole_taken.insert(gpu) {
                    devices.push((gpu, das_api::WHOLE_GPU_PROFILE.to_string(), 0));
                }
                continue;
            }
            if whole_taken.contains(&gpu) || (gpu == SWITCHABLE && !serves.mig) {
                continue;
            }
            let model = self.inventory[gpu as usize].model.clone();
            let o = occ.entry(gpu).or_insert_with(|| Occupancy::empty(&model));
            // The profiles that still fit somewhere, and their free starts.
            let mut options = Vec::new();
            for (i, p) in model.profiles.iter().enumerate() {
                for &start in &p.placement_starts {
                    if o.check_hardware(&model, i, start).is_ok() {
                        options.push((i, p.name.clone(), start));
                    }
                }
            }
            if options.is_empty() {
                continue;
            }
            let (i, name, start) = options[pick as usize % options.len()].clone();
            o.add(&model, i, start);
            devices.push((gpu, name, start));
        }
        self.allocate_devices(slot, devices);
    }

    /// Allocates exactly `wanted` ((GPU, profile, start); a whole GPU as in [`Claim::devices`])
    /// to a new claim in the empty `slot`, when the scheduler could: every placement free, no
    /// GPU held whole by an allocated claim, a whole GPU only with none of its MIG instances allocated
    /// and while it is published whole. Returns whether it did.
    fn allocate_exact(&mut self, slot: usize, wanted: &[(u32, String, u32)]) -> bool {
        if self.slots[slot].is_some() || wanted.is_empty() {
            return false;
        }
        let mut occ = self.taken();
        let whole_taken: BTreeSet<u32> = self
            .slots
            .iter()
            .flatten()
            .flat_map(|c| c.devices.iter().filter(|d| is_whole(d)).map(|d| d.0))
            .collect();
        for d in wanted {
            let (gpu, profile, start) = d;
            if whole_taken.contains(gpu) {
                return false;
            }
            if is_whole(d) {
                let published = *gpu == WHOLE || self.serves(*gpu).whole;
                if !published || occ.get(gpu).is_some_and(|o| o.instances() > 0) {
                    return false;
                }
                continue;
            }
            let model = self.inventory[*gpu as usize].model.clone();
            let Some((i, _)) = model.profile(profile) else {
                return false;
            };
            let o = occ.entry(*gpu).or_insert_with(|| Occupancy::empty(&model));
            if o.check_hardware(&model, i, *start).is_err() {
                return false;
            }
            o.add(&model, i, *start);
        }
        self.allocate_devices(slot, wanted.to_vec());
        self.slots[slot].is_some()
    }

    /// A new claim in `slot` for `devices` (nothing when empty).
    fn allocate_devices(&mut self, slot: usize, devices: Vec<(u32, String, u32)>) {
        if devices.is_empty() {
            return;
        }
        self.next_uid += 1;
        let uid = format!("{:08x}-0000-4000-8000-{:012x}", slot, self.next_uid);
        let results: Vec<(String, String)> = devices
            .iter()
            .enumerate()
            .map(|(k, (gpu, profile, start))| {
                let request = if k % 2 == 0 { "gpu" } else { "extra" };
                let device = if profile == das_api::WHOLE_GPU_PROFILE {
                    das_api::whole_gpu_device_name(*gpu)
                } else {
                    das_api::device_name(*gpu, profile, *start)
                };
                (request.to_string(), device)
            })
            .collect();
        let pairs: Vec<(&str, &str)> = results
            .iter()
            .map(|(r, d)| (r.as_str(), d.as_str()))
            .collect();
        let claim = self.api.allocate("ns", &format!("c{slot}"), &uid, &pairs);
        let interval = ["Default", "Short", "Medium", "Long"].get((self.next_uid % 5) as usize);
        if let Some(interval) = interval.filter(|_| devices.iter().all(is_whole)) {
            self.api.configure(
                &claim,
                serde_json::json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}}),
            );
        }
        self.slots[slot] = Some(Claim {
            claim,
            devices,
            held: None,
            terminating: false,
        });
    }

    /// [`Step::ForceDelete`] of the claim in `slot`.
    fn force_delete(&mut self, slot: usize) {
        if let Some(c) = self.slots[slot].take() {
            self.stats.force_deleted += 1;
            self.api.delete(&c.claim);
            self.hold(&c, c.held.clone(), false);
            self.carve_gone(&c);
            self.zombies.push(c);
        }
    }

    /// Records what the kubelet holds for `c` (None: nothing).
    fn hold(&self, c: &Claim, migs: Option<Vec<String>>, in_api: bool) {
        let mut held = self.held.lock().unwrap();
        held.by_mig.retain(|_, (uid, _)| *uid != c.claim.uid);
        for m in migs.into_iter().flatten() {
            held.by_mig.insert(m, (c.claim.uid.clone(), in_api));
        }
    }

    /// The MIG UUIDs of the claim's CDI spec, from its `DAS_MIG_UUID_*` variables.
    fn spec_migs(&self, uid: &str) -> Option<Vec<String>> {
        self.spec_values(uid, cdi::MIG_UUID_ENV_PREFIX)
    }

    /// The values of the claim's CDI spec's variables whose name starts with `prefix`.
    fn spec_values(&self, uid: &str, prefix: &str) -> Option<Vec<String>> {
        let path = cdi::spec_path(&self.dir.path().join("cdi"), uid);
        let spec = cdi::read_spec(&path).ok()?;
        Some(
            spec.devices
                .iter()
                .flat_map(|d| d.container_edits.env.iter())
                .filter_map(|e| e.strip_prefix(prefix))
                .filter_map(|e| e.split_once('=').map(|(_, v)| v.to_string()))
                .collect(),
        )
    }

    async fn prepare(&mut self, slot: usize, cancel: bool, twice: bool, after: u32) {
        let Some(c) = self.slots[slot]
            .clone()
            .filter(|c| !c.terminating && self.bound(&c.claim.uid))
        else {
            return;
        };
        let call = |p: Arc<Preparer>, claim: ClaimRef| {
            let caller = Caller::Prepare(claim.uid.clone());
            CALLER.scope(caller, async move { p.prepare_claim(&claim).await })
        };
        if cancel {
            self.stats.cancelled += 1;
            // The call reaches the plugin (at least one yield), then the kubelet gives up; the
            // call runs on (the plugin runs it in a task of its own).
            // The call itself is the background task, so a crash (abort) stops it.
            let call = call(self.p.clone(), c.claim.clone());
            let task = tokio::spawn(async move {
                let _ = call.await;
            });
            for _ in 0..after {
                tokio::task::yield_now().await;
            }
            self.background.push(task);
            return;
        }
        let carved = self.before_prepare(&c);
        let results = if twice {
            self.stats.twice += 1;
            let (a, b) = tokio::join!(
                call(self.p.clone(), c.claim.clone()),
                call(self.p.clone(), c.claim.clone())
            );
            if let (Ok(a), Ok(b)) = (&a, &b)
                && a != b
            {
                self.violation(format!("two prepares of {} answered differently", c.claim));
            }
            vec![a, b]
        } else {
            vec![call(self.p.clone(), c.claim.clone()).await]
        };
        self.after_prepare(&c, carved);
        for r in &results {
            match r {
                Ok(_) => {
                    self.stats.prepared += 1;
                    let on = |whole: bool| {
                        c.devices
                            .iter()
                            .any(|d| d.0 == SWITCHABLE && is_whole(d) == whole)
                    };
                    if c.devices.iter().any(is_whole) {
                        self.stats.whole_prepared += 1;
                    }
                    if on(true) {
                        self.stats.switchable_whole_prepared += 1;
                    }
                    if on(false) {
                        self.stats.switchable_slices_prepared += 1;
                    }
                }
                Err(e) => {
                    *self
                        .stats
                        .prepare_errors
                        .entry(e.metric_label())
                        .or_default() += 1;
                    if mig_modes::refused_on(e, SWITCHABLE) {
                        self.stats.refused_on_switchable += 1;
                    }
                }
            }
        }
        if results.iter().any(Result::is_ok) && c.held.is_none() {
            let migs = self.spec_migs(&c.claim.uid).unwrap_or_default();
            self.hold(&c, Some(migs.clone()), true);
            self.start_containers(&c, &migs);
            if let Some(s) = self.slots[slot].as_mut() {
                s.held = Some(migs);
            }
        }
    }

    async fn unprepare(&mut self, slot: usize, zombie: bool, cancel: bool, after: u32) {
        let c = if zombie {
            if self.zombies.is_empty() {
                return;
            }
            self.zombies[slot % self.zombies.len()].clone()
        } else {
            match &self.slots[slot] {
                // The kubelet knows no pod the scheduler has not bound.
                Some(c) if self.bound(&c.claim.uid) => c.clone(),
                _ => return,
            }
        };
        // The kubelet unprepares only after the pod's containers have stopped; from here on it
        // no longer counts on the instances.
        self.stop_containers(&c);
        self.hold(&c, None, false);
        if let Some(s) = self.slots[slot].as_mut().filter(|_| !zombie) {
            s.held = None;
            s.terminating = true;
        }
        for z in self
            .zombies
            .iter_mut()
            .filter(|z| z.claim.uid == c.claim.uid)
        {
            z.held = None;
        }
        let caller = Caller::Unprepare(c.claim.uid.clone());
        let p = self.p.clone();
        let claim = c.claim.clone();
        let call = CALLER.scope(caller, async move { p.unprepare_claim(&claim).await });
        if cancel {
            // The kubelet gives up and retries later; the call runs on.
            self.stats.cancelled += 1;
            let task = tokio::spawn(async move {
                let _ = call.await;
            });
            for _ in 0..after {
                tokio::task::yield_now().await;
            }
            self.background.push(task);
            return;
        }
        let r = call.await;
        if r.is_ok() {
            self.stats.unprepared += 1;
            // The pod is gone; the claim is deallocated and deleted.
            self.api.delete(&c.claim);
            if zombie {
                self.zombies.retain(|z| z.claim.uid != c.claim.uid);
            } else {
                self.slots[slot] = None;
            }
        } else {
            self.stats.unprepare_errors += 1;
        }
    }

    /// The pod's containers start: they can use `migs` and the runtime reports the pod.
    fn start_containers(&self, c: &Claim, migs: &[String]) {
        self.start_container(c, migs, &pod_of(&c.claim.uid));
    }

    /// The containers of every pod of the claim are gone: the runtime no longer reports them.
    fn stop_containers(&self, c: &Claim) {
        self.stop_containers_where(c, |_| true);
    }

    /// [`Step::KubeletForgets`]: a zombie (force-deleted, still held) is never unprepared.
    fn forget(&mut self, pick: usize, linger: bool) {
        if self.zombies.is_empty() {
            return;
        }
        let c = self.zombies.remove(pick % self.zombies.len());
        self.stats.forgotten += 1;
        self.hold(&c, None, false);
        if linger {
            self.lingering.push(c);
        } else {
            self.stop_containers(&c);
        }
    }

    fn tamper(&mut self, pick: usize, spec: bool) {
        let victim = if spec {
            let specs = cdi::list_specs(&self.dir.path().join("cdi")).unwrap();
            if specs.is_empty() {
                return;
            }
            let f = &specs[pick % specs.len()];
            std::fs::remove_file(&f.path).unwrap();
            f.claim_uid.clone()
        } else {
            let live = self.live();
            if live.is_empty() {
                return;
            }
            let s = &live[pick % live.len()];
            if self.emu.destroy_instance(s.gpu_index, s.gi_id).is_err() {
                return; // an injected fault took it
            }
            let cp = self.p.checkpoint().read(Clone::clone);
            let owner = cp
                .claims
                .iter()
                .find(|(_, r)| r.devices.iter().any(|d| super::plan::is_instance(d, s)));
            // An instance a prepare has created but not yet recorded belongs to the claim
            // allocated that placement.
            let allocated = self
                .slots
                .iter()
                .flatten()
                .chain(&self.zombies)
                .find(|c| {
                    c.devices.iter().any(|(g, p, st)| {
                        (*g, p, *st) == (s.gpu_index, &s.profile, s.placement.start)
                    })
                })
                .map(|c| c.claim.uid.clone());
            match owner {
                Some((uid, _)) => uid.clone(),
                None => match allocated {
                    Some(uid) => uid,
                    None => return,
                },
            }
        };
        self.stats.tampered += 1;
        self.tampered.insert(victim.clone());
        // The kubelet's container lost its instance; the claim's next prepare must repair it.
        for c in self.slots.iter_mut().flatten() {
            if c.claim.uid == victim {
                c.held = None;
            }
        }
        let mut held = self.held.lock().unwrap();
        held.by_mig.retain(|_, (uid, _)| *uid != victim);
    }

    fn foreign(&mut self, pick: u32) {
        let gpu = if pick % 5 == 4 { SWITCHABLE } else { pick % 2 };
        let quiet = self.background.iter().all(JoinHandle::is_finished);
        if self.lost.contains(&gpu) || (gpu == SWITCHABLE && !quiet) {
            return;
        }
        let model = self.inventory[gpu as usize].model.clone();
        let mut occ = Occupancy::empty(&model);
        for s in self.emu.instances_on(gpu).unwrap() {
            let (i, _) = model.profile(&s.profile).unwrap();
            occ.add(&model, i, s.placement.start);
        }
        let options: Vec<(String, u32)> = model
            .profiles
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.placement_starts
                    .iter()
                    .map(move |&st| (i, p.name.clone(), st))
            })
            .filter(|(i, _, st)| occ.check_hardware(&model, *i, *st).is_ok())
            .map(|(_, name, st)| (name, st))
            .collect();
        if options.is_empty() {
            return;
        }
        let (profile, start) = &options[(pick as usize / 2) % options.len()];
        if self
            .emu
            .create_foreign_instance(gpu, profile, *start)
            .is_ok()
        {
            self.stats.foreign += 1;
        }
    }

    fn fault(&mut self, f: Fault) {
        match f {
            Fault::Create { gpu, kind } => self.emu.inject_create_faults(gpu, 1, kind),
            Fault::Destroy { gpu, count, kind } => self.emu.inject_destroy_faults(gpu, count, kind),
            Fault::Lost { gpu, lost } => {
                self.emu.set_gpu_lost(gpu, lost);
                if lost {
                    self.lost.insert(gpu);
                    self.ever_lost.insert(gpu);
                } else {
                    self.lost.remove(&gpu);
                }
            }
            Fault::Reset { gpu } => {
                if self.lost.contains(&gpu) {
                    return;
                }
                // Destroys go one by one through Tamper's bookkeeping.
                let live = self.emu.instances_on(gpu).unwrap();
                for s in live {
                    let pick = self.live().iter().position(|l| l.mig_uuid == s.mig_uuid);
                    if let Some(pick) = pick {
                        self.tamper(pick, false);
                    }
                }
            }
            Fault::ApiReads(n) => self
                .api
                .failing_reads
                .store(n, std::sync::atomic::Ordering::SeqCst),
            Fault::MigMode { kind } => self.emu.inject_set_mig_mode_faults(SWITCHABLE, 1, kind),
            Fault::StatusWrites(n) => self
                .api
                .failing_status_writes
                .store(n, std::sync::atomic::Ordering::SeqCst),
        }
    }

    async fn settle(&mut self) {
        for t in self.background.drain(..) {
            let _ = t.await;
        }
    }

    /// A crash: calls in flight stop at their next yield; then a new instance starts from the
    /// checkpoint and the emulated GPUs' state on disk, and reconciles.
    async fn restart(&mut self) {
        for t in self.background.drain(..) {
            t.abort();
            let _ = t.await;
        }
        self.emu.clear_faults();
        // The GPUs' state as a new process reads it from disk.
        self.emu = Arc::new(open_gpus(self.dir.path()));
        let checked = Checked {
            inner: self.emu.clone(),
            held: self.held.clone(),
            violations: self.violations.clone(),
            modes: self.modes.clone(),
        };
        self.p = Self::build(&self.dir, checked, &self.api, &self.runtime, &self.rng);
        for gpu in &self.lost {
            self.emu.set_gpu_lost(*gpu, true);
        }
        self.api
            .failing_reads
            .store(0, std::sync::atomic::Ordering::SeqCst);
        // What the new instance read from disk (a crash may have stopped a commit half-way).
        let kept = self.carved_kept();
        let r = CALLER
            .scope(Caller::Startup, self.p.reconcile_at_startup(false, false))
            .await;
        if let Err(e) = r {
            self.violation(format!("start-up reconciliation failed: {e:#}"));
        }
        self.check_kept(kept);
    }

    /// The invariants; `quiet`: no call is in flight.
    /// The live instances of the GPUs that answer.
    fn live(&self) -> Vec<MigInstance> {
        self.emu
            .gpu_indices()
            .into_iter()
            .filter(|g| !self.lost.contains(g))
            .flat_map(|g| self.emu.instances_on(g).unwrap())
            .collect()
    }

    fn check(&self, quiet: bool) {
        let live = self.live();
        self.check_mig_modes(&live);
        self.check_time_slices();
        // I3.
        for gpu in self.emu.gpu_indices() {
            let model = &self.inventory[gpu as usize].model;
            let mut occ = Occupancy::empty(model);
            for s in live.iter().filter(|s| s.gpu_index == gpu) {
                let (i, _) = model.profile(&s.profile).unwrap();
                if occ.check_hardware(model, i, s.placement.start).is_err() {
                    self.violation(format!("I3: {} overlaps on GPU {gpu}", s.mig_uuid));
                }
                occ.add(model, i, s.placement.start);
            }
        }
        // I5.
        let live_migs: BTreeSet<&str> = live.iter().map(|s| s.mig_uuid.as_str()).collect();
        for c in self.slots.iter().flatten() {
            let Some(migs) = &c.held else { continue };
            if c.devices.iter().any(|(g, _, _)| self.lost.contains(g)) {
                continue;
            }
            let mut gpus = self
                .spec_values(&c.claim.uid, cdi::GPU_UUID_ENV_PREFIX)
                .unwrap_or_default();
            let mut whole: Vec<String> = c
                .devices
                .iter()
                .filter(|d| is_whole(d))
                .map(|d| self.inventory[d.0 as usize].uuid.clone())
                .collect();
            gpus.sort();
            whole.sort();
            if gpus != whole {
                self.violation(format!(
                    "I5: the CDI spec of {} gives GPUs {gpus:?}, not the whole GPUs {whole:?}",
                    c.claim
                ));
            }
            for (gpu, profile, start) in &c.devices {
                if profile == das_api::WHOLE_GPU_PROFILE {
                    continue;
                }
                let at = live.iter().find(|s| {
                    s.gpu_index == *gpu && &s.profile == profile && s.placement.start == *start
                });
                if !at.is_some_and(|s| migs.contains(&s.mig_uuid)) {
                    self.violation(format!(
                        "I5: {} holds no live slice at {profile} {start} on GPU {gpu} (held {migs:?})",
                        c.claim
                    ));
                }
            }
            if migs.iter().any(|m| !live_migs.contains(m.as_str())) {
                self.violation(format!("I5: {} holds a dead MIG UUID: {migs:?}", c.claim));
            }
            let mut spec = self.spec_migs(&c.claim.uid).unwrap_or_default();
            let mut held = migs.clone();
            spec.sort();
            held.sort();
            if spec != held {
                self.violation(format!(
                    "I5: the CDI spec of {} names {spec:?}, the kubelet holds {held:?}",
                    c.claim
                ));
            }
        }
        if !quiet {
            return;
        }
        self.check_carved(&live);
        let cp = self.p.checkpoint().read(Clone::clone);
        // I1 (instances someone else created are not DAS's to record).
        for s in live.iter().filter(|s| s.created_by_das != Some(false)) {
            let recorded = cp
                .claims
                .values()
                .any(|r| r.devices.iter().any(|d| super::plan::is_instance(d, s)));
            if !recorded {
                self.violation(format!(
                    "I1: live slice {} ({} at {} on GPU {}) has no record",
                    s.mig_uuid, s.profile, s.placement.start, s.gpu_index
                ));
            }
        }
        // I2: nothing half-done; completed records hold live instances.
        for (uid, r) in &cp.claims {
            match r.state {
                PrepareState::PrepareStarted => {
                    self.violation(format!("I2: {uid} is half-done with no call in flight"))
                }
                PrepareState::PrepareCompleted if !self.tampered.contains(uid) => {
                    for d in &r.devices {
                        if self.lost.contains(&d.gpu_index) || d.is_whole_gpu() {
                            continue;
                        }
                        if !live.iter().any(|s| super::plan::is_instance(d, s)) {
                            self.violation(format!(
                                "I2: {uid} records {} but it is gone",
                                d.device
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        // I6: no two claims' records hold overlapping placements of one GPU.
        let recorded: Vec<(&String, &crate::claims::checkpoint::RecordedDevice)> = cp
            .claims
            .iter()
            .flat_map(|(uid, r)| r.devices.iter().map(move |d| (uid, d)))
            .collect();
        for (i, (a, da)) in recorded.iter().enumerate() {
            for (b, db) in &recorded[i + 1..] {
                let overlap = da.gpu_uuid == db.gpu_uuid
                    && da.placement_start < db.placement_start + db.placement_size
                    && db.placement_start < da.placement_start + da.placement_size;
                if a != b && overlap {
                    self.violation(format!(
                        "I6: {a} records {} and {b} records {}, which overlap",
                        da.device, db.device
                    ));
                }
            }
        }
        // CDI specs only for recorded claims.
        let cdi_dir = self.dir.path().join("cdi");
        for f in cdi::list_specs(&cdi_dir).unwrap() {
            if !cp.claims.contains_key(&f.claim_uid) {
                self.violation(format!("CDI spec of unrecorded claim {}", f.claim_uid));
            }
        }
    }

    /// After a reaper pass with nothing failing: no record of instances that are gone.
    fn check_reaped(&self) {
        let cp = self.p.checkpoint().read(Clone::clone);
        for (uid, r) in &cp.claims {
            if r.state == PrepareState::Releasing {
                self.violation(format!(
                    "I2: {uid} is still releasing after the reaper ran with no faults"
                ));
            }
        }
    }
}

/// Generates `n` steps from `seed`.
fn steps(seed: u64, n: usize) -> Vec<(Step, u64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let slot = rng.random_range(0..SLOTS);
            let step = match rng.random_range(0..112) {
                0..20 => Step::Allocate {
                    slot,
                    picks: (0..rng.random_range(1..=3)).map(|_| rng.random()).collect(),
                },
                20..50 => Step::Prepare {
                    slot,
                    cancel: rng.random_bool(0.15),
                    twice: rng.random_bool(0.15),
                    after: rng.random_range(1..12),
                },
                50..52 => Step::Race {
                    slot,
                    after: rng.random_range(0..12),
                    pick: rng.random(),
                },
                52..72 => Step::Unprepare {
                    slot,
                    zombie: rng.random_bool(0.2),
                    cancel: rng.random_bool(0.15),
                    after: rng.random_range(1..12),
                },
                72..75 => Step::ForceDelete {
                    slot,
                    broken: rng.random_bool(0.5),
                },
                75..84 => Step::Fault(match rng.random_range(0..8) {
                    0 => Fault::Create {
                        gpu: SLICED[rng.random_range(0..3)],
                        kind: FaultKind::Other,
                    },
                    1 => Fault::Destroy {
                        gpu: SLICED[rng.random_range(0..3)],
                        count: rng.random_range(1..7),
                        kind: FaultKind::InUse,
                    },
                    2 => Fault::Destroy {
                        gpu: SLICED[rng.random_range(0..3)],
                        count: 1,
                        kind: FaultKind::Other,
                    },
                    3 => Fault::Lost {
                        // The switchable GPU less often: lost, it is neither switched nor served.
                        gpu: if rng.random_bool(0.1) {
                            SWITCHABLE
                        } else {
                            rng.random_range(0..3)
                        },
                        lost: rng.random_bool(0.3),
                    },
                    4 => Fault::ApiReads(rng.random_range(1..3)),
                    5 => Fault::Reset {
                        gpu: SLICED[rng.random_range(0..3)],
                    },
                    // Rarer than a switch: a GPU whose switch failed is not switched again
                    // until the plugin restarts.
                    6 if rng.random_bool(0.5) => Fault::MigMode {
                        kind: if rng.random_bool(0.5) {
                            FaultKind::InUse
                        } else {
                            FaultKind::ResetRequired
                        },
                    },
                    _ => Fault::StatusWrites(rng.random_range(1..4)),
                }),
                84..91 => Step::Reap {
                    secs: rng.random_range(1..90),
                },
                91..94 => Step::Restart,
                94..96 => Step::Tamper {
                    pick: rng.random_range(0..64),
                    spec: rng.random_bool(0.3),
                },
                96..97 => Step::Foreign { pick: rng.random() },
                97..98 => Step::KubeletForgets {
                    pick: rng.random_range(0..8),
                    linger: rng.random_bool(0.5),
                },
                98..99 => Step::LingerEnds {
                    pick: rng.random_range(0..8),
                },
                99 => Step::Settle,
                k @ 100..108 => carve::step(&mut rng, slot, k - 100),
                k => containers::step(&mut rng, slot, k - 108),
            };
            (step, rng.random())
        })
        .collect()
}

/// A failed run: the index of the step after which an invariant broke, and what broke.
#[derive(Debug)]
struct Failure {
    at: usize,
    violations: Vec<String>,
}

/// A single-threaded runtime with paused time: the same interleaving on every run.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Runs `steps` from a fresh world and checks the invariants after each; returns what the run
/// did.
fn run(steps: &[(Step, u64)]) -> Result<Stats, Failure> {
    let rt = paused_runtime();
    rt.block_on(async {
        let mut w = World::new();
        for (i, (step, yield_seed)) in steps.iter().enumerate() {
            *w.rng.lock().unwrap() = StdRng::seed_from_u64(*yield_seed);
            w.run(step).await;
            let quiet = w.background.iter().all(JoinHandle::is_finished);
            if quiet {
                w.settle().await;
            }
            w.check(quiet);
            if quiet
                && matches!(step, Step::Reap { .. })
                && w.lost.is_empty()
                && w.emu.pending_faults() == 0
            {
                // Every release is due after the longest backoff; with nothing failing, the
                // reaper must finish them all.
                tokio::time::advance(super::reaper::MAX_DELAY).await;
                CALLER.scope(Caller::Reaper, w.p.reap_due()).await;
                w.check_reaped();
            }
            let v = std::mem::take(&mut *w.violations.lock().unwrap());
            if !v.is_empty() {
                return Err(Failure {
                    at: i,
                    violations: v,
                });
            }
        }
        Ok(w.modes.add_counts(w.stats))
    })
}

/// Shrinks a failing step list: drops chunks of steps (halves, then smaller) while the run
/// still fails, within a bounded number of runs.
fn shrink(mut steps: Vec<(Step, u64)>) -> Vec<(Step, u64)> {
    let mut chunk = steps.len() / 2;
    let mut budget = 400;
    while chunk > 0 && budget > 0 {
        let mut i = 0;
        while i < steps.len() && budget > 0 {
            let mut candidate = steps.clone();
            candidate.drain(i..(i + chunk).min(candidate.len()));
            budget -= 1;
            if run(&candidate).is_err() {
                steps = candidate;
            } else {
                i += chunk;
            }
        }
        chunk /= 2;
    }
    steps
}

/// Replays one seed's first steps with the request path's logs on stderr, to read a failure:
/// `DAS_MODEL_REPLAY=<seed>:<steps> cargo test -p das-driver --lib replay -- --nocapture`.
#[test]
fn replay() {
    let Ok(spec) = std::env::var("DAS_MODEL_REPLAY") else {
        return;
    };
    let (seed, n) = spec.split_once(':').expect("<seed>:<steps>");
    let _ = tracing_subscriber::fmt()
        .with_env_filter("das_driver=debug")
        .with_test_writer()
        .try_init();
    let all = steps(seed.parse().unwrap(), n.parse().unwrap());
    for (i, (s, _)) in all.iter().enumerate() {
        eprintln!("step {i}: {s:?}");
    }
    if let Err(f) = run(&all) {
        panic!("broken after step {}: {:#?}", f.at, f.violations);
    }
}

#[test]
fn the_request_path_keeps_its_invariants_under_random_interleavings() {
    let t0 = std::time::Instant::now();
    let mut total = Stats::default();
    for seed in SEEDS {
        let all = steps(seed, STEPS);
        let outcome = run(&all);
        if let Ok(s) = &outcome {
            total.prepared += s.prepared;
            total.unprepared += s.unprepared;
            total.unprepare_errors += s.unprepare_errors;
            total.cancelled += s.cancelled;
            total.twice += s.twice;
            total.force_deleted += s.force_deleted;
            total.restarts += s.restarts;
            total.reaped += s.reaped;
            total.faults += s.faults;
            total.tampered += s.tampered;
            total.foreign += s.foreign;
            total.forgotten += s.forgotten;
            total.orphans_released += s.orphans_released;
            total.orphans_kept += s.orphans_kept;
            total.whole_prepared += s.whole_prepared;
            total.switchable_whole_prepared += s.switchable_whole_prepared;
            total.switchable_slices_prepared += s.switchable_slices_prepared;
            total.switches_on += s.switches_on;
            total.switches_off += s.switches_off;
            total.failed_switches += s.failed_switches;
            total.refused_on_switchable += s.refused_on_switchable;
            total.races += s.races;
            total.carve.add(&s.carve);
            total.containers.add(&s.containers);
            for (k, v) in &s.prepare_errors {
                *total.prepare_errors.entry(k).or_default() += v;
            }
        }
        if let Err(f) = outcome {
            let minimal = shrink(all[..=f.at].to_vec());
            let last = run(&minimal).err();
            let listing: Vec<String> = minimal
                .iter()
                .enumerate()
                .map(|(i, (s, y))| format!("  {i:4}: {s:?} (yields seed {y})"))
                .collect();
            panic!(
                "seed {seed}: invariants broken after step {}: {:#?}\nminimal reproduction ({} steps), breaking {:#?}:\n{}",
                f.at,
                f.violations,
                minimal.len(),
                last.map(|l| l.violations),
                listing.join("\n")
            );
        }
    }
    eprintln!(
        "{} seeds × {STEPS} steps in {:.1}s: {total:?}",
        SEEDS.len(),
        t0.elapsed().as_secs_f64()
    );
    // The steps reach the paths they are meant to (a generator change that starves one of them
    // fails here instead of passing vacuously).
    assert!(
        total.prepared > 1_000 && total.unprepared > 1_000,
        "{total:?}"
    );
    assert!(
        total.cancelled > 100 && total.twice > 100 && total.restarts > 100,
        "{total:?}"
    );
    assert!(total.reaped > 0 && total.unprepare_errors > 0, "{total:?}");
    assert!(
        total.whole_prepared > 100,
        "whole GPUs are prepared: {total:?}"
    );
    mig_modes::assert_exercised(&total);
    carve::assert_exercised(&total);
    containers::assert_exercised(&total);
    assert!(
        total.forgotten > 0 && total.orphans_released > 0 && total.orphans_kept > 0,
        "the orphan rule is exercised both ways: {total:?}"
    );
    for cause in [
        "create",
        "destroy",
        "gpu_unavailable",
        "api_read",
        "placement_held",
    ] {
        assert!(
            total.prepare_errors.contains_key(cause),
            "no {cause}: {total:?}"
        );
    }
}

/// The model's own checks can fail: an instance created behind the plugin's back breaks I1.
#[test]
fn the_invariant_checks_catch_an_unrecorded_slice() {
    let rt = paused_runtime();
    rt.block_on(async {
        let w = World::new();
        w.emu.create_instance(0, "1g.5gb", 0).unwrap();
        w.check(true);
        let v = w.violations.lock().unwrap().clone();
        assert!(v.iter().any(|v| v.starts_with("I1")), "{v:?}");
    });
}

/// The model's own checks can fail: two claims recorded on the whole GPU break I6, and a create
/// on the GPU served whole is caught.
#[test]
fn the_invariant_checks_catch_a_gpu_held_twice() {
    let rt = paused_runtime();
    rt.block_on(async {
        let w = World::new();
        let device = || crate::claims::checkpoint::RecordedDevice {
            time_slice: None,
            acquired: false,
            kind: crate::claims::checkpoint::DeviceKind::WholeGpu,
            request: "gpu".into(),
            pool: NODE.into(),
            device: das_api::whole_gpu_device_name(WHOLE),
            gpu_index: WHOLE,
            gpu_uuid: w.inventory[WHOLE as usize].uuid.clone(),
            profile: das_api::WHOLE_GPU_PROFILE.into(),
            placement_start: 0,
            placement_size: 8,
            instance: None,
            mps: None,
            share: None,
        };
        w.p.checkpoint().change(|cp| {
            for uid in ["u1", "u2"] {
                let ids = std::collections::BTreeMap::new();
                cp.set_completed(uid, "ns", uid, vec![device()], ids);
            }
        });
        w.check(true);
        let v = w.violations.lock().unwrap().clone();
        assert!(v.iter().any(|v| v.starts_with("I6: u1")), "{v:?}");
        let backend = Checked {
            inner: w.emu.clone(),
            held: w.held.clone(),
            violations: w.violations.clone(),
            modes: w.modes.clone(),
        };
        assert!(backend.create_instance(WHOLE, "1g.5gb", 0).is_err());
        let v = w.violations.lock().unwrap().clone();
        assert!(v.iter().any(|v| v.contains("served whole")), "{v:?}");
    });
}
