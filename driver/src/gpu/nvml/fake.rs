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
//!   `NOT_SUPPORTED` for instance calls; a lost GPU → `GPU_IS_LOST` for every call on it.
//! - Every mutating call is logged ([`FakeNvml::calls`]) and a fault can be injected for the
//!   next call of a given name ([`FakeNvml::fail_next`]).
//! - Every NVML library call is counted by function name ([`FakeNvml::call_counts`]), as
//!   `RealNvml` makes them for each [`NvmlApi`] method (e.g. `gpu_instances` =
//!   `nvmlDeviceGetGpuInstances` + one `nvmlGpuInstanceGetInfo` per GI; a failed method counts
//!   only the function its error names). What an administrator does behind DAS's back
//!   ([`FakeNvml::admin_create`], [`FakeNvml::admin_destroy`]) is not counted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    CI_ENUMS, CI_PROFILE_ENUM_COUNT, CiInfo, CiProfileInfo, DeviceIdentity, GI_PROFILE_ENUM_COUNT,
    GiInfo, GiProfileInfo, MigDeviceInfo, MigModeState, NvmlApi, NvmlCallError, NvmlResult,
    RawEvent, code,
};
use crate::gpu::layout::{Conflict, Occupancy, Placement};
use crate::gpu::model::GpuModel;

/// GI IDs in the order the driver hands them out (observed on A100 and H100, docs/reference/mig.md, "Create and destroy").
const GI_ID_ORDER: [u32; 15] = [9, 7, 8, 11, 12, 13, 14, 1, 2, 3, 4, 5, 6, 10, 0];

/// One fake GPU.
#[derive(Debug, Clone)]
pub struct FakeGpuSpec {
    /// The model (profiles, placements); `None` for a GPU without MIG (e.g. a T4).
    pub model: Option<Arc<GpuModel>>,
    /// Product name when there is no model.
    pub name: String,
    /// MIG mode at start.
    pub mig_enabled: bool,
    /// `NVML_DEVICE_ARCH_*`.
    pub architecture: u32,
    /// PCI device ID reported (the model's first by default).
    pub pci_device_id: u32,
}

impl FakeGpuSpec {
    /// A MIG-capable GPU of `model` with MIG mode `mig_enabled`.
    pub fn mig(model: Arc<GpuModel>, mig_enabled: bool) -> Self {
        let architecture = match model.architecture.as_str() {
            "Ampere" => 7,
            "Hopper" => 9,
            _ => 10,
        };
        Self {
            name: model.product_name.clone(),
            pci_device_id: model.pci_device_ids[0],
            model: Some(model),
            mig_enabled,
            architecture,
        }
    }

    /// A GPU without MIG support.
    pub fn non_mig(name: &str) -> Self {
        Self {
            model: None,
            name: name.to_string(),
            mig_enabled: false,
            architecture: 6,
            pci_device_id: 0x1EB8_10DE,
        }
    }
}

#[derive(Debug)]
struct FakeCi {
    profile_id: u32,
    slices: u32,
    slot: u32,
    uuid: String,
    busy: bool,
}

#[derive(Debug)]
struct FakeGi {
    profile: usize,
    start: u32,
    cis: BTreeMap<u32, FakeCi>,
}

#[derive(Debug)]
struct FakeGpu {
    spec: FakeGpuSpec,
    minor: u32,
    mig: MigModeState,
    lost: bool,
    occupancy: Option<Occupancy>,
    gis: BTreeMap<u32, FakeGi>,
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
                occupancy: spec.model.as_deref().map(Occupancy::empty),
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

impl FakeGpu {
    fn model(&self) -> Result<&Arc<GpuModel>, u32> {
        self.spec.model.as_ref().ok_or(code::NOT_SUPPORTED)
    }

    /// Model and MIG mode on: what every instance call needs.
    fn mig_model(&self) -> Result<Arc<GpuModel>, u32> {
        let model = self.model()?.clone();
        if !self.mig.current {
            return Err(code::NOT_SUPPORTED);
        }
        Ok(model)
    }

    fn profile_by_id(&self, profile_id: u32) -> Result<(Arc<GpuModel>, usize), u32> {
        let model = self.model()?.clone();
        let i = model
            .profiles
            .iter()
            .position(|p| p.id == profile_id)
            .ok_or(code::INVALID_ARGUMENT)?;
        Ok((model, i))
    }

    fn gi(&mut self, gi_id: u32) -> Result<&mut FakeGi, u32> {
        self.mig_model()?;
        self.gis.get_mut(&gi_id).ok_or(code::NOT_FOUND)
    }

    fn gi_info(&self, id: u32, gi: &FakeGi) -> GiInfo {
        let p = &self
            .spec
            .model
            .as_ref()
            .expect("GIs exist only with a model")
            .profiles[gi.profile];
        GiInfo {
            id,
            profile_id: p.id,
            placement: Placement {
                start: gi.start,
                size: p.placement_size,
            },
        }
    }

    fn gi_slices(&self, gi: &FakeGi) -> u32 {
        self.spec
            .model
            .as_ref()
            .map_or(0, |m| m.profiles[gi.profile].compute_slices)
    }

    fn free_slot(&self) -> Option<u32> {
        let max = self.spec.model.as_ref()?.max_gpu_instances;
        (0..max).find(|s| {
            !self
                .gis
                .values()
                .flat_map(|g| g.cis.values())
                .any(|c| c.slot == *s)
        })
    }
}

fn conflict_code(c: &Conflict) -> u32 {
    match c {
        Conflict::StartNotAllowed { .. } => code::INVALID_ARGUMENT,
        _ => code::INSUFFICIENT_RESOURCES,
    }
}

impl NvmlApi for FakeNvml {
    fn device_count(&self) -> NvmlResult<u32> {
        Ok(self.lock().gpus.len() as u32)
    }

    fn driver_version(&self) -> NvmlResult<String> {
        self.count(Ok("580.95.05".into()), |_| {
            vec![("nvmlSystemGetDriverVersion", 1)]
        })
    }

    fn device_identity(&self, dev: u32) -> NvmlResult<DeviceIdentity> {
        let r = self.with_gpu("nvmlDeviceGetUUID", dev, |g, _| {
            let memory_mib = g.spec.model.as_ref().map_or(16384, |m| m.memory_mib);
            Ok(DeviceIdentity {
                name: g.spec.name.clone(),
                uuid: format!("GPU-{:08x}-0000-4000-8000-000000000000", dev + 1),
                minor: g.minor,
                pci_device_id: g.spec.pci_device_id,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + dev),
                memory_mib,
                architecture: g.spec.architecture,
                cuda_compute_capability: (8, 0),
            })
        });
        self.count(r, |_| {
            [
                "nvmlDeviceGetPciInfo_v3",
                "nvmlDeviceGetCudaComputeCapability",
                "nvmlDeviceGetName",
                "nvmlDeviceGetUUID",
                "nvmlDeviceGetMinorNumber",
                "nvmlDeviceGetMemoryInfo",
                "nvmlDeviceGetArchitecture",
            ]
            .map(|c| (c, 1))
            .to_vec()
        })
    }

    fn mig_mode(&self, dev: u32) -> NvmlResult<MigModeState> {
        let r = self.with_gpu("nvmlDeviceGetMigMode", dev, |g, _| {
            g.model()?;
            Ok(g.mig)
        });
        self.count(r, |_| vec![("nvmlDeviceGetMigMode", 1)])
    }

    fn set_mig_mode(&self, dev: u32, enable: bool) -> NvmlResult<()> {
        self.log(format!("set_mig_mode {dev} {enable}"));
        let r = self.with_gpu("nvmlDeviceSetMigMode", dev, |g, _| {
            g.model()?;
            if !g.gis.is_empty() {
                return Err(code::IN_USE);
            }
            g.mig.pending = enable;
            if g.spec.architecture >= super::ARCH_HOPPER {
                g.mig.current = enable;
            }
            Ok(())
        });
        self.count(r, |_| vec![("nvmlDeviceSetMigMode", 1)])
    }

    fn gi_profile_info(&self, dev: u32, profile_enum: u32) -> NvmlResult<GiProfileInfo> {
        let r = self.with_gpu("nvmlDeviceGetGpuInstanceProfileInfoV", dev, |g, _| {
            if profile_enum >= GI_PROFILE_ENUM_COUNT {
                return Err(code::INVALID_ARGUMENT);
            }
            let p = g
                .model()?
                .profiles
                .iter()
                .find(|p| p.nvml_enum_value() == profile_enum)
                .ok_or(code::NOT_SUPPORTED)?;
            Ok(GiProfileInfo {
                id: p.id,
                slice_count: p.compute_slices,
                instance_count: p.max_instances,
                multiprocessors: p.multiprocessors,
                copy_engines: p.copy_engines,
                decoders: p.decoders,
                encoders: p.encoders,
                jpeg_engines: p.jpeg_engines,
                ofa_engines: p.ofa_engines,
                memory_mib: p.memory_mib,
                name: format!("MIG {}", p.name),
            })
        });
        self.count(r, |_| vec![("nvmlDeviceGetGpuInstanceProfileInfoV", 1)])
    }

    fn gi_possible_placements(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<Placement>> {
        let r = self.with_gpu(
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            dev,
            |g, _| {
                let (model, i) = g.profile_by_id(profile_id)?;
                let p = &model.profiles[i];
                Ok(p.placement_starts
                    .iter()
                    .map(|&start| Placement {
                        start,
                        size: p.placement_size,
                    })
                    .collect())
            },
        );
        // Once for the count, once for the list.
        self.count(r, |_| {
            vec![("nvmlDeviceGetGpuInstancePossiblePlacements_v2", 2)]
        })
    }

    fn create_gi(&self, dev: u32, profile_id: u32, placement: Placement) -> NvmlResult<GiInfo> {
        self.log(format!("create_gi {dev} {profile_id} {placement}"));
        let r = self.with_gpu("nvmlDeviceCreateGpuInstanceWithPlacement", dev, |g, _| {
            g.mig_model()?;
            let (model, i) = g.profile_by_id(profile_id)?;
            if placement.size != model.profiles[i].placement_size {
                return Err(code::INVALID_ARGUMENT);
            }
            let occ = g.occupancy.as_mut().ok_or(code::NOT_SUPPORTED)?;
            occ.check_hardware(&model, i, placement.start)
                .map_err(|c| conflict_code(&c))?;
            let id = *GI_ID_ORDER
                .iter()
                .find(|id| !g.gis.contains_key(id))
                .ok_or(code::INSUFFICIENT_RESOURCES)?;
            occ.add(&model, i, placement.start);
            let gi = FakeGi {
                profile: i,
                start: placement.start,
                cis: BTreeMap::new(),
            };
            let info = g.gi_info(id, &gi);
            g.gis.insert(id, gi);
            Ok(info)
        });
        self.count(r, |_| {
            vec![
                ("nvmlDeviceCreateGpuInstanceWithPlacement", 1),
                ("nvmlGpuInstanceGetInfo", 1),
            ]
        })
    }

    fn gpu_instances(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<GiInfo>> {
        let r = self.with_gpu("nvmlDeviceGetGpuInstances", dev, |g, _| {
            g.mig_model()?;
            let (_, i) = g.profile_by_id(profile_id)?;
            Ok(g.gis
                .iter()
                .filter(|(_, gi)| gi.profile == i)
                .map(|(id, gi)| g.gi_info(*id, gi))
                .collect())
        });
        self.count(r, |gis: &Vec<GiInfo>| {
            vec![
                ("nvmlDeviceGetGpuInstances", 1),
                ("nvmlGpuInstanceGetInfo", gis.len() as u64),
            ]
        })
    }

    fn destroy_gi(&self, dev: u32, gi_id: u32) -> NvmlResult<()> {
        self.log(format!("destroy_gi {dev}/{gi_id}"));
        let r = self.with_gpu("nvmlGpuInstanceDestroy", dev, |g, _| {
            let model = g.mig_model()?;
            let gi = g.gi(gi_id)?;
            if !gi.cis.is_empty() {
                return Err(code::IN_USE);
            }
            let (profile, start) = (gi.profile, gi.start);
            g.gis.remove(&gi_id);
            if let Some(occ) = g.occupancy.as_mut() {
                occ.remove(&model, profile, start);
            }
            Ok(())
        });
        self.count(r, |_| {
            vec![
                ("nvmlDeviceGetGpuInstanceById", 1),
                ("nvmlGpuInstanceDestroy", 1),
            ]
        })
    }

    fn ci_profile_info(
        &self,
        dev: u32,
        gi_id: u32,
        profile_enum: u32,
    ) -> NvmlResult<CiProfileInfo> {
        let r = self.with_gpu(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            dev,
            |g, _| {
                let gi = g.gi(gi_id)?;
                let profile = gi.profile;
                let slices = ci_slices(profile_enum)?;
                let model = g.mig_model()?;
                let p = &model.profiles[profile];
                if slices > p.compute_slices {
                    return Err(code::NOT_SUPPORTED);
                }
                Ok(CiProfileInfo {
                    id: profile_enum,
                    slice_count: slices,
                    instance_count: p.compute_slices / slices,
                    multiprocessors: p.multiprocessors * slices / p.compute_slices,
                })
            },
        );
        self.count(r, |_| {
            vec![
                ("nvmlDeviceGetGpuInstanceById", 1),
                ("nvmlGpuInstanceGetComputeInstanceProfileInfo", 1),
            ]
        })
    }

    fn create_ci(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<CiInfo> {
        self.log(format!("create_ci {dev}/{gi_id} {profile_id}"));
        let r = self.with_gpu("nvmlGpuInstanceCreateComputeInstance", dev, |g, serial| {
            let slices = ci_slices(profile_id)?;
            let gi = g.gi(gi_id)?;
            let used: u32 = gi.cis.values().map(|c| c.slices).sum();
            let gi_slices = g.gi_slices(&g.gis[&gi_id]);
            if slices > gi_slices {
                return Err(code::NOT_SUPPORTED);
            }
            if used + slices > gi_slices {
                return Err(code::INSUFFICIENT_RESOURCES);
            }
            let slot = g.free_slot().ok_or(code::INSUFFICIENT_RESOURCES)?;
            *serial += 1;
            let gi = g.gis.get_mut(&gi_id).ok_or(code::NOT_FOUND)?;
            let id = (0..8)
                .find(|i| !gi.cis.contains_key(i))
                .ok_or(code::INSUFFICIENT_RESOURCES)?;
            gi.cis.insert(
                id,
                FakeCi {
                    profile_id,
                    slices,
                    slot,
                    uuid: format!(
                        "MIG-{:08x}-{dev:04x}-4000-8000-{gi_id:04x}{id:08x}",
                        *serial
                    ),
                    busy: false,
                },
            );
            Ok(CiInfo { id, profile_id })
        });
        self.count(r, |_| {
            vec![
                ("nvmlDeviceGetGpuInstanceById", 1),
                ("nvmlGpuInstanceCreateComputeInstance", 1),
                ("nvmlComputeInstanceGetInfo_v2", 1),
            ]
        })
    }

    fn compute_instances(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<Vec<CiInfo>> {
        let r = self.with_gpu("nvmlGpuInstanceGetComputeInstances", dev, |g, _| {
            ci_slices(profile_id)?;
            let gi = g.gi(gi_id)?;
            Ok(gi
                .cis
                .iter()
                .filter(|(_, c)| c.profile_id == profile_id)
                .map(|(id, c)| CiInfo {
                    id: *id,
                    profile_id: c.profile_id,
                })
                .collect())
        });
        self.count(r, |cis: &Vec<CiInfo>| {
            vec![
                ("nvmlDeviceGetGpuInstanceById", 1),
                ("nvmlGpuInstanceGetComputeInstances", 1),
                ("nvmlComputeInstanceGetInfo_v2", cis.len() as u64),
            ]
        })
    }

    fn destroy_ci(&self, dev: u32, gi_id: u32, ci_id: u32) -> NvmlResult<()> {
        self.log(format!("destroy_ci {dev}/{gi_id}/{ci_id}"));
        let r = self.with_gpu("nvmlComputeInstanceDestroy", dev, |g, _| {
            let gi = g.gi(gi_id)?;
            match gi.cis.get(&ci_id) {
                None => Err(code::NOT_FOUND),
                Some(c) if c.busy => Err(code::IN_USE),
                Some(_) => {
                    gi.cis.remove(&ci_id);
                    Ok(())
                }
            }
        });
        self.count(r, |_| {
            vec![
                ("nvmlDeviceGetGpuInstanceById", 1),
                ("nvmlGpuInstanceGetComputeInstanceById", 1),
                ("nvmlComputeInstanceDestroy", 1),
            ]
        })
    }

    fn max_mig_device_count(&self, dev: u32) -> NvmlResult<u32> {
        let r = self.with_gpu("nvmlDeviceGetMaxMigDeviceCount", dev, |g, _| {
            Ok(g.model()?.max_gpu_instances)
        });
        self.count(r, |_| vec![("nvmlDeviceGetMaxMigDeviceCount", 1)])
    }

    fn mig_device(&self, dev: u32, index: u32) -> NvmlResult<MigDeviceInfo> {
        let r = self.with_gpu("nvmlDeviceGetMigDeviceHandleByIndex", dev, |g, _| {
            g.mig_model()?;
            g.gis
                .iter()
                .flat_map(|(gi, v)| v.cis.iter().map(move |(ci, c)| (*gi, *ci, c)))
                .find(|(_, _, c)| c.slot == index)
                .map(|(gi_id, ci_id, c)| MigDeviceInfo {
                    gi_id,
                    ci_id,
                    uuid: c.uuid.clone(),
                })
                .ok_or(code::NOT_FOUND)
        });
        self.count(r, |_| {
            [
                "nvmlDeviceGetMigDeviceHandleByIndex",
                "nvmlDeviceGetGpuInstanceId",
                "nvmlDeviceGetComputeInstanceId",
                "nvmlDeviceGetUUID",
            ]
            .map(|c| (c, 1))
            .to_vec()
        })
    }

    fn register_events(&self, dev: u32, mask: u64) -> NvmlResult<()> {
        let first = !std::mem::replace(&mut self.lock().event_set, true);
        let r = self.with_gpu("nvmlDeviceRegisterEvents", dev, |_, _| Ok(()));
        let r = self.count(r, |_| {
            let mut calls = vec![("nvmlDeviceRegisterEvents", 1)];
            if first {
                calls.push(("nvmlEventSetCreate", 1));
            }
            calls
        });
        r?;
        *self.lock().registered.entry(dev).or_default() |= mask;
        Ok(())
    }

    /// The next queued event whose type its GPU registered; `TIMEOUT` at once when none is
    /// queued (tests do not wait).
    fn wait_event(&self, _timeout_ms: u32) -> NvmlResult<RawEvent> {
        let mut state = self.lock();
        *state.counts.entry("nvmlEventSetWait_v2").or_default() += 1;
        while let Some(e) = state.events.pop_front() {
            let mask = e
                .dev
                .and_then(|d| state.registered.get(&d).copied())
                .unwrap_or(0);
            if mask & e.event_type != 0 {
                return Ok(e);
            }
        }
        Err(NvmlCallError::new("nvmlEventSetWait_v2", code::TIMEOUT))
    }
}

/// Compute slices of CI profile enum `e`; `INVALID_ARGUMENT` past the last enum.
fn ci_slices(e: u32) -> Result<u32, u32> {
    if e >= CI_PROFILE_ENUM_COUNT {
        return Err(code::INVALID_ARGUMENT);
    }
    Ok(CI_ENUMS[e as usize].1)
}
