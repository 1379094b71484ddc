//! [`FakeNvml`]: an in-memory [`NvmlApi`] with NVML's return codes and placement rules, built
//! from the same GPU model data files as the emulated backend (the rules of docs/reference/mig.md).
//!
//! - Profile info by *enum*, placements and creation by *real ID* (docs/reference/mig.md, "Profile IDs").
//! - Overlap, the profile's instance count, the single `+me` and the GI count →
//!   `INSUFFICIENT_RESOURCES`; a start not in the list → `INVALID_ARGUMENT` (the rules of
//!   [`Occupancy::check_hardware`]).
//! - GI IDs come from the "driver" in the order seen on hardware (9, 7, 8, 11, …; docs/reference/mig.md, "Create and destroy"),
//!   never from the placement; every CI takes a MIG device slot and a fresh `MIG-` UUID.
//! - Destroying a GI that still has CIs, or a CI marked busy, → `IN_USE`; MIG mode off →
//!   `NOT_SUPPORTED` for instance calls; a GPU without MIG (a model with `mig = false`, or
//!   none) → `NOT_SUPPORTED` for `nvmlDeviceGetMigMode` and every MIG call; a lost GPU →
//!   `GPU_IS_LOST` for every call on it.
//! - `nvmlDeviceSetMigMode`: `IN_USE` while GIs exist; on Hopper and newer the mode changes at
//!   once; on Ampere (or a GPU marked [`FakeNvml::set_needs_reset`]) it goes pending and the
//!   call answers `RESET_REQUIRED` (the activation status, as `RealNvml` reports it).
//! - Every mutating call is logged ([`FakeNvml::calls`]) and a fault can be injected for the
//!   next call of a given name ([`FakeNvml::fail_next`]).
//! - Every NVML library call is counted by function name ([`FakeNvml::call_counts`]), as
//!   `RealNvml` makes them for each [`NvmlApi`] method (e.g. `gpu_instances` =
//!   `nvmlDeviceGetGpuInstances` + one `nvmlGpuInstanceGetInfo` per GI; a failed method counts
//!   only the function its error names). What an administrator does behind DAS's back
//!   ([`FakeNvml::admin_create`], [`FakeNvml::admin_destroy`]) is not counted.
//!
//! Files: this one holds the fake's state and its test controls; `fake/gpu.rs` one GPU's
//! hardware state and rules; `fake/api.rs` the [`NvmlApi`] calls.

mod api;
mod gpu;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{MigModeState, NvmlApi, NvmlCallError, NvmlResult, RawEvent, code};
use crate::gpu::layout::{Occupancy, Placement};
use crate::gpu::model::{ARCHITECTURES, GpuModel};
use gpu::FakeGpu;

/// One fake GPU.
#[derive(Debug, Clone)]
pub struct FakeGpuSpec {
    /// The model (profiles, placements); a model without MIG ([`GpuModel::mig`] false: a T4,
    /// an L4) or `None` (a GPU without MIG no data file knows) makes a GPU without MIG:
    /// `nvmlDeviceGetMigMode` and every MIG call answer `NOT_SUPPORTED`.
    pub model: Option<Arc<GpuModel>>,
    /// Product name (`nvmlDeviceGetName`; the model's by default).
    pub name: String,
    /// MIG mode at start.
    pub mig_enabled: bool,
    /// `NVML_DEVICE_ARCH_*`.
    pub architecture: u32,
    /// PCI device ID reported (the model's first by default).
    pub pci_device_id: u32,
    /// PCI subsystem ID reported (the model's first by default, else 0x00000000: unknown).
    pub pci_subsystem_id: u32,
    /// Total memory reported (MiB; the model's by default).
    pub memory_mib: u64,
    /// CUDA compute capability reported (the model's by default).
    pub cuda_compute_capability: (u32, u32),
    /// `nvmlBrandType_t` reported ([`BRAND_NVIDIA`] by default, as data-center GPUs report).
    pub brand: u32,
    /// `nvmlGpuVirtualizationMode_t` reported (0, `NONE`, by default; 2, `VGPU`, for a vGPU
    /// guest; [`crate::gpu::nvml::virtualization`]).
    pub virtualization_mode: u32,
}

/// `NVML_BRAND_NVIDIA`: the brand the fake GPUs report unless their spec says otherwise.
pub(crate) const BRAND_NVIDIA: u32 = 14;

/// What the fake's `nvmlSystemGetCudaDriverVersion_v2` reports: CUDA 13.0, the version of the
/// driver `580.95.05` its `nvmlSystemGetDriverVersion` reports.
pub const CUDA_DRIVER_VERSION: i32 = 13000;

impl FakeGpuSpec {
    /// A MIG-capable GPU of `model` with MIG mode `mig_enabled`.
    pub fn mig(model: Arc<GpuModel>, mig_enabled: bool) -> Self {
        Self {
            mig_enabled,
            ..Self::of_model(model)
        }
    }

    /// A GPU of `model`, a model without MIG (T4, L4, …: its data file says `mig = false`).
    pub fn without_mig(model: Arc<GpuModel>) -> Self {
        Self::of_model(model)
    }

    /// A GPU of `model` as NVML reports it: name, first PCI device and subsystem ID, memory,
    /// architecture and compute capability from the model; MIG mode off.
    fn of_model(model: Arc<GpuModel>) -> Self {
        let architecture = ARCHITECTURES
            .iter()
            .position(|a| *a == model.architecture)
            .map_or(10, |i| i as u32 + 2);
        let cc = crate::gpu::model::parse_compute_capability(&model.cuda_compute_capability)
            .unwrap_or((8, 0));
        Self {
            name: model.product_name.clone(),
            pci_device_id: model.pci_device_ids[0],
            pci_subsystem_id: model.pci_subsystem_ids.first().copied().unwrap_or(0),
            memory_mib: model.memory_mib,
            cuda_compute_capability: cc,
            model: Some(model),
            mig_enabled: false,
            architecture,
            brand: BRAND_NVIDIA,
            virtualization_mode: 0,
        }
    }

    /// A GPU without MIG that no data file describes (a Volta `Tesla V100-PCIE-16GB`, PCI
    /// device ID `0x1DB410DE`, 16160 MiB, compute capability 7.0), named `name`.
    pub fn non_mig(name: &str) -> Self {
        Self {
            model: None,
            name: name.to_string(),
            mig_enabled: false,
            architecture: 5,
            pci_device_id: 0x1DB4_10DE,
            pci_subsystem_id: 0x1214_10DE,
            memory_mib: 16160,
            cuda_compute_capability: (7, 0),
            brand: BRAND_NVIDIA,
            virtualization_mode: 0,
        }
    }
}

#[derive(Debug, Default)]
struct FakeState {
    gpus: Vec<FakeGpu>,
    faults: Vec<(&'static str, u32)>,
    calls: Vec<String>,
    serial: u32,
    /// Event types registered per GPU.
    registered: std::collections::BTreeMap<u32, u64>,
    /// Events `wait_event` returns, in order.
    events: std::collections::VecDeque<RawEvent>,
    /// NVML library calls by function name.
    counts: BTreeMap<&'static str, u64>,
    /// The event set exists (`nvmlEventSetCreate` is called once).
    event_set: bool,
}

/// The fake NVML (see the module docs).
#[derive(Debug, Default)]
pub struct FakeNvml {
    state: Mutex<FakeState>,
}

impl FakeNvml {
    /// GPUs 0.. from `specs`; GPU `i` has minor `i`.
    pub fn new(specs: Vec<FakeGpuSpec>) -> Self {
        let gpus = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| FakeGpu {
                minor: i as u32,
                mig: MigModeState {
                    current: spec.mig_enabled,
                    pending: spec.mig_enabled,
                },
                lost: false,
                needs_reset: false,
                occupancy: spec
                    .model
                    .as_deref()
                    .filter(|m| m.mig)
                    .map(Occupancy::empty),
                gis: BTreeMap::new(),
                spec,
            })
            .collect();
        Self {
            state: Mutex::new(FakeState {
                gpus,
                ..FakeState::default()
            }),
        }
    }

    /// The next call named `call` (e.g. `nvmlGpuInstanceDestroy`) fails with `code`.
    pub fn fail_next(&self, call: &'static str, code: u32) {
        self.lock().faults.push((call, code));
    }

    /// GPU `dev` falls off the bus: every call on it returns `GPU_IS_LOST`.
    pub fn lose_gpu(&self, dev: u32) {
        self.lock().gpus[dev as usize].lost = true;
    }

    /// Makes GPU `dev` need a reset for a MIG mode change even on Hopper and newer (a GPU in a
    /// VM that cannot reset it): `set_mig_mode` then leaves the change pending and returns
    /// `RESET_REQUIRED`, as on Ampere.
    pub fn set_needs_reset(&self, dev: u32, needs_reset: bool) {
        self.lock().gpus[dev as usize].needs_reset = needs_reset;
    }

    /// GPU `dev` answers with minor `minor` from now on (a re-bind, as enabling MIG mode may
    /// cause).
    pub fn set_minor(&self, dev: u32, minor: u32) {
        self.lock().gpus[dev as usize].minor = minor;
    }

    /// Marks CI `ci` of GI `gi` as used by a process (its destroy returns `IN_USE`).
    pub fn set_ci_busy(&self, dev: u32, gi: u32, ci: u32, busy: bool) {
        if let Some(c) = self.lock().gpus[dev as usize]
            .gis
            .get_mut(&gi)
            .and_then(|g| g.cis.get_mut(&ci))
        {
            c.busy = busy;
        }
    }

    /// Mutating calls so far, e.g. `destroy_ci 0/9/0`, in order.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// NVML library calls so far by function name (see the module docs).
    pub fn call_counts(&self) -> BTreeMap<&'static str, u64> {
        self.lock().counts.clone()
    }

    /// All NVML library calls so far.
    pub fn call_total(&self) -> u64 {
        self.lock().counts.values().sum()
    }

    /// An administrator's `nvidia-smi mig -cgi <profile_id> -C` at `placement` on GPU `dev`,
    /// behind DAS's back: the GI and its full-size CI; neither counted nor logged. Returns the
    /// GI ID.
    ///
    /// # Panics
    /// NVML refuses the GI or the CI (a test set-up error).
    pub fn admin_create(&self, dev: u32, profile_id: u32, placement: Placement) -> u32 {
        self.uncounted(|f| {
            let gi = f.create_gi(dev, profile_id, placement).expect("admin GI");
            let slices = f.lock().gpus[dev as usize]
                .spec
                .model
                .as_ref()
                .and_then(|m| m.profiles.iter().find(|p| p.id == profile_id))
                .map(|p| p.compute_slices)
                .expect("the GPU has the profile");
            let ci = super::full_ci_enum(slices).expect("a full-size CI profile");
            f.create_ci(dev, gi.id, ci).expect("admin CI");
            gi.id
        })
    }

    /// An administrator's `nvidia-smi mig -dci -gi <gi_id>` and `-dgi -gi <gi_id>` on GPU `dev`,
    /// behind DAS's back; neither counted nor logged. `cis_only` keeps the GI (only its compute
    /// instances go).
    ///
    /// # Panics
    /// No such GI.
    pub fn admin_destroy(&self, dev: u32, gi_id: u32, cis_only: bool) {
        self.uncounted(|f| {
            let cis: Vec<u32> = f.lock().gpus[dev as usize].gis[&gi_id]
                .cis
                .keys()
                .copied()
                .collect();
            for ci in cis {
                f.destroy_ci(dev, gi_id, ci).expect("admin CI destroy");
            }
            if !cis_only {
                f.destroy_gi(dev, gi_id).expect("admin GI destroy");
            }
        });
    }

    /// Runs `f` leaving the call counts and the call log as they were.
    fn uncounted<T>(&self, f: impl FnOnce(&Self) -> T) -> T {
        let (counts, calls) = {
            let s = self.lock();
            (s.counts.clone(), s.calls.clone())
        };
        let r = f(self);
        let mut s = self.lock();
        s.counts = counts;
        s.calls = calls;
        r
    }

    /// Counts the library calls of one method: `ok`'s on success, the failing function on error.
    fn count<T>(
        &self,
        r: NvmlResult<T>,
        ok: impl FnOnce(&T) -> Vec<(&'static str, u64)>,
    ) -> NvmlResult<T> {
        let calls = match &r {
            Ok(v) => ok(v),
            Err(e) => vec![(e.call, 1)],
        };
        let mut s = self.lock();
        for (call, n) in calls {
            *s.counts.entry(call).or_default() += n;
        }
        r
    }

    /// Current MIG mode of GPU `dev`.
    pub fn mig_mode_of(&self, dev: u32) -> MigModeState {
        self.lock().gpus[dev as usize].mig
    }

    /// Queues `event` for `wait_event` (delivered only when its GPU registered its type).
    pub fn push_event(&self, event: RawEvent) {
        self.lock().events.push_back(event);
    }

    /// Event types registered for GPU `dev`.
    pub fn registered_events(&self, dev: u32) -> u64 {
        self.lock().registered.get(&dev).copied().unwrap_or(0)
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fault injection for a call on no GPU (`nvmlSystem…`): `value`, or the injected error.
    fn system_call<T>(&self, call: &'static str, value: T) -> NvmlResult<T> {
        let mut state = self.lock();
        match state.faults.iter().position(|(c, _)| *c == call) {
            Some(i) => Err(NvmlCallError::new(call, state.faults.remove(i).1)),
            None => Ok(value),
        }
    }

    /// Fault injection, the GPU lookup and the lost check shared by every call on a GPU.
    fn with_gpu<T>(
        &self,
        call: &'static str,
        dev: u32,
        f: impl FnOnce(&mut FakeGpu, &mut u32) -> Result<T, u32>,
    ) -> NvmlResult<T> {
        let mut state = self.lock();
        let err = |c| NvmlCallError::new(call, c);
        if let Some(i) = state.faults.iter().position(|(c, _)| *c == call) {
            let (_, c) = state.faults.remove(i);
            return Err(err(c));
        }
        let FakeState { gpus, serial, .. } = &mut *state;
        let gpu = gpus
            .get_mut(dev as usize)
            .ok_or(err(code::INVALID_ARGUMENT))?;
        if gpu.lost {
            return Err(err(code::GPU_IS_LOST));
        }
        f(gpu, serial).map_err(err)
    }

    fn log(&self, entry: String) {
        self.lock().calls.push(entry);
    }
}
