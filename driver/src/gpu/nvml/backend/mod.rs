//! [`NvmlBackend`]: [`GpuBackend`] over an [`NvmlApi`] (docs/reference/mig.md, "Create and destroy").
//!
//! - Inventory discovered once at construction: MIG-capable GPUs with MIG mode on; GPUs without
//!   MIG, Ampere with MIG off and (by default) Hopper+ with MIG off are logged and skipped,
//!   unless `--whole-gpus` ([`NvmlBackend::with_whole_gpus`]) keeps those with MIG mode off and
//!   those without MIG as whole GPUs (`GpuInfo::mig_enabled` false: no instance can be created
//!   there, NVML answers `NOT_SUPPORTED`, and their instance lists are empty while MIG mode
//!   stays off; a GPU without MIG reads as MIG mode off, never switched). Every
//!   later [`GpuBackend::inventory`] asks NVML again whether each of those GPUs still answers
//!   with the same UUID, so a GPU that fell off the bus drops out (and its devices turn
//!   unhealthy) instead of being served from a start-up copy. `--enable-mig-mode`
//!   lets Hopper+ GPUs be switched on (no reset needed, docs/reference/mig.md, "MIG mode"); Ampere never is.
//! - With `--mig-mode-switching` ([`NvmlOptions::mig_mode_switching`]) DAS switches a Hopper+
//!   GPU's MIG mode to follow demand ([`GpuBackend::set_mig_mode`], `backend/mig_mode.rs`); the
//!   backend's copy of each GPU follows the mode it switched.
//! - Each GPU's published facts are read once with the inventory: brand
//!   (`nvmlDeviceGetBrand`), CUDA driver version (`nvmlSystemGetCudaDriverVersion_v2`), total
//!   memory, the PCI bus ID in its standard form, and, with [`NvmlBackend::with_sys_root`], the
//!   PCIe root complex and NUMA node from sysfs; one that cannot be read is left out, never fatal.
//! - Models come from the data files by PCI device ID (and subsystem ID or name where one device
//!   ID covers two products), cross-checked against NVML; an unknown GPU gets a model built from
//!   NVML's own profile and placement tables ([`model_from_nvml`]), or, without MIG, from its
//!   NVML identity ([`model_without_mig`]; `backend/models.rs`).
//! - Create: GI at the exact placement, then the full-size CI, then the MIG UUID by walking the
//!   MIG device handles, then the capability minors from procfs. On failure nothing is left.
//! - Destroy: every CI of the GI, then the GI (docs/reference/mig.md, "Create and destroy").
//! - Instance lists: [`GpuBackend::instances_on`] always reads NVML (15 NVML calls plus 23 per
//!   instance on an H100, docs/benchmarks.md); [`GpuBackend::cached_instances_on`] serves each
//!   GPU's list as DAS's own creates and destroys left it, and reads NVML again only every
//!   [`INSTANCE_REFRESH`] or after something that may have made the list stale (the rules, and
//!   why the cached list equals NVML's, are in `backend/cache.rs`).
//!
//! Files: this one holds the backend and its [`GpuBackend`] face, with the NVML error mapping;
//! `backend/discover.rs` the inventory and models read at start-up; `backend/instances.rs`
//! create, destroy and list on one GPU; `backend/cache.rs` the instance cache;
//! `backend/events.rs` the health events; `backend/mig_mode.rs` MIG mode switches.

mod cache;
mod discover;
mod events;
mod instances;
mod mig_mode;
mod models;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use cache::KnownInstances;
pub use cache::{Clock, INSTANCE_REFRESH};
use discover::{System, discover, numa_node, pcie_root};
use events::register_health_events;
pub(in crate::gpu::nvml) use mig_mode::{switch_base, with_pending};
pub use models::{model_from_nvml, model_without_mig};

use super::procfs;
use super::{NvmlApi, NvmlCallError, code};
use crate::gpu::layout::Placement;
use crate::gpu::{
    BackendError, GpuBackend, GpuInfo, HealthEvent, MigInstance, MigModeState, MigSwitch, Target,
};

/// How the NVML backend treats the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlOptions {
    /// procfs root for the capability minors (normally `/proc`).
    pub proc_root: PathBuf,
    /// Switch MIG mode on for Hopper and newer GPUs that have it off (`--enable-mig-mode`).
    /// Off by default: DAS then never changes MIG mode. Ampere is never switched (it needs a GPU
    /// reset, docs/reference/mig.md, "MIG mode").
    pub enable_mig_mode: bool,
    /// Let DAS switch MIG mode to follow demand (`--mig-mode-switching`, docs/design.md §7,
    /// "MIG mode follows demand"): each GPU's [`GpuInfo::mig_switch`] is
    /// [`MigSwitch::Allowed`] where it switches without a reset (`backend/mig_mode.rs`). Off by
    /// default: every GPU reports [`MigSwitch::off`].
    pub mig_mode_switching: bool,
}

impl Default for NvmlOptions {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from(procfs::PROC_ROOT),
            enable_mig_mode: false,
            mig_mode_switching: false,
        }
    }
}

/// One GPU the backend serves.
#[derive(Debug, Clone)]
struct ServedGpu {
    /// As the inventory reports it; its MIG mode and switch decision follow DAS's switches.
    info: GpuInfo,
    /// Whether DAS may switch its MIG mode, pending changes aside (`mig_mode::switch_base`,
    /// read at discovery).
    switch: MigSwitch,
    /// Why the GPU may no longer be addressed: it re-bound with another minor number after a
    /// MIG mode switch (`backend/mig_mode.rs`), so the device nodes published and written into
    /// CDI specs are wrong. Such a GPU is treated as lost (left out of the inventory, every call
    /// on it [`BackendError::GpuLost`]) until the plugin restarts and reads it again.
    rebound: Option<String>,
}

/// The NVML backend for real GPUs.
pub struct NvmlBackend<A: NvmlApi> {
    api: A,
    options: NvmlOptions,
    /// Read at discovery; written only by MIG mode switches and [`Self::with_sys_root`].
    gpus: RwLock<Vec<ServedGpu>>,
    /// Per GPU index (the instance cache, `backend/cache.rs`); locked only between NVML calls.
    known: Mutex<BTreeMap<u32, KnownInstances>>,
    /// [`INSTANCE_REFRESH`] unless set otherwise ([`Self::with_instance_refresh`]).
    refresh: Duration,
    clock: Clock,
}

impl<A: NvmlApi> NvmlBackend<A> {
    /// Reads the inventory (and, with [`NvmlOptions::enable_mig_mode`], switches MIG mode on for
    /// idle Hopper+ GPUs); GPUs whose MIG mode is off are skipped. Fails only when NVML cannot
    /// count the GPUs or read the driver version.
    pub fn new(api: A, options: NvmlOptions) -> Result<Self, BackendError> {
        Self::with_whole_gpus(api, options, false)
    }

    /// [`Self::new`], except that with `whole_gpus` (`--whole-gpus`, docs/design.md §7, "Whole
    /// GPUs") a GPU whose MIG mode is still off after [`NvmlOptions::enable_mig_mode`] had its
    /// say is kept, with `GpuInfo::mig_enabled` false, to be served whole.
    pub fn with_whole_gpus(
        api: A,
        options: NvmlOptions,
        whole_gpus: bool,
    ) -> Result<Self, BackendError> {
        let whole = |e: NvmlCallError| other(Target::gpu(0), &e, "cannot read the GPUs");
        let count = api.device_count().map_err(whole)?;
        let system = System::read(&api, api.driver_version().map_err(whole)?);
        let gpus: Vec<ServedGpu> = (0..count)
            .filter_map(|dev| discover(&api, &options, whole_gpus, dev, &system))
            .map(|(info, switch)| ServedGpu {
                info,
                switch,
                rebound: None,
            })
            .collect();
        for g in &gpus {
            register_health_events(&api, g.info.index);
        }
        Ok(Self {
            api,
            options,
            gpus: RwLock::new(gpus),
            known: Mutex::default(),
            refresh: INSTANCE_REFRESH,
            clock: Arc::new(Instant::now),
        })
    }

    /// Reads each GPU's PCIe root complex (`GpuInfo::pcie_root`, published as
    /// `resource.kubernetes.io/pcieRoot`) and NUMA node (`GpuInfo::numa_node`,
    /// `resource.kubernetes.io/numaNode`) from the sysfs mounted at `sys_root` (`--sys-root`,
    /// normally [`pci::SYS_ROOT`](crate::gpu::pci::SYS_ROOT)); a GPU sysfs does not place keeps
    /// none (logged). Without this call no GPU has either (the unit tests' fake GPUs are not in
    /// the test machine's sysfs).
    pub fn with_sys_root(mut self, sys_root: &Path) -> Self {
        for g in self.gpus.get_mut().unwrap_or_else(|p| p.into_inner()) {
            g.info.pcie_root = pcie_root(sys_root, &g.info);
            g.info.numa_node = numa_node(sys_root, &g.info);
        }
        self
    }

    /// Serves cached instance lists for at most `period` ([`INSTANCE_REFRESH`] by default);
    /// `Duration::ZERO` reads NVML on every call, as before the cache (the benchmark's baseline).
    pub fn with_instance_refresh(mut self, period: Duration) -> Self {
        self.refresh = period;
        self
    }

    /// Reads the time from `clock` instead of [`Instant::now`] (simulated time in tests and
    /// benchmarks).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The function table.
    pub fn api(&self) -> &A {
        &self.api
    }

    /// GPU `target.gpu` as the backend knows it now (its MIG mode as DAS last switched it).
    /// [`BackendError::GpuLost`] for a GPU that re-bound with another minor number.
    fn gpu(&self, target: &Target) -> Result<GpuInfo, BackendError> {
        let gpus = read(&self.gpus);
        let g = gpus
            .iter()
            .find(|g| g.info.index == target.gpu)
            .ok_or_else(|| BackendError::NotFound {
                target: target.clone(),
                reason: "no such GPU in this node's inventory".into(),
            })?;
        match &g.rebound {
            Some(why) => Err(BackendError::GpuLost {
                target: target.clone(),
                reason: why.clone(),
            }),
            None => Ok(g.info.clone()),
        }
    }
}

impl<A: NvmlApi> GpuBackend for NvmlBackend<A> {
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let gpus: Vec<GpuInfo> = read(&self.gpus)
            .iter()
            .filter(|g| g.rebound.is_none())
            .map(|g| g.info.clone())
            .collect();
        Ok(gpus
            .into_iter()
            .filter(|g| match self.api.device_identity(g.index) {
                Ok(id) if id.uuid == g.uuid => true,
                Ok(id) => {
                    tracing::warn!(gpu = g.index, expected = %g.uuid, found = %id.uuid,
                        "GPU index now answers with another UUID; treating the GPU as gone");
                    self.invalidate(g.index, &"the GPU answers with another UUID");
                    false
                }
                Err(e) => {
                    tracing::debug!(gpu = g.index, error = %e, "GPU does not answer");
                    // Its instance list is read again (and fails) rather than served while lost.
                    self.invalidate(g.index, &e);
                    false
                }
            })
            .collect())
    }

    /// `nvmlEventSetWait_v2` for the first event (at most `timeout`), then whatever else is
    /// already queued (`backend/events.rs`).
    fn wait_health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, BackendError> {
        self.wait_events(timeout)
    }

    fn gpu_indices(&self) -> Vec<u32> {
        read(&self.gpus).iter().map(|g| g.info.index).collect()
    }

    fn create_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let target = Target::at(gpu_index, profile, Placement { start, size: 0 });
        let gpu = self.gpu(&target)?;
        let gpu = &gpu;
        if !gpu.model.mig {
            return Err(BackendError::NotSupported {
                target,
                reason: format!("{} has no MIG (it is served whole)", gpu.model.name),
            });
        }
        let (_, p) = gpu
            .model
            .profile(profile)
            .ok_or_else(|| BackendError::InvalidArgument {
                target: target.clone(),
                reason: format!(
                    "{} has no MIG profile {profile:?} (profiles: {})",
                    gpu.model.name,
                    gpu.model.profile_names()
                ),
            })?;
        let target = Target::at(
            gpu_index,
            profile,
            Placement {
                start,
                size: p.placement_size,
            },
        );
        if !p.allows_start(start) {
            return Err(BackendError::InvalidArgument {
                target,
                reason: format!(
                    "placement start not in the profile's list {:?}",
                    p.placement_starts
                ),
            });
        }
        match self.create_at(gpu, p, target) {
            Ok(s) => {
                self.note_change(gpu_index, s.gi_id, Some(&s));
                Ok(s)
            }
            Err(e) => {
                // INSUFFICIENT_RESOURCES: someone holds the placement DAS thought free; other
                // failures may have left a GI behind (a failed roll-back).
                self.invalidate(gpu_index, &e);
                Err(e)
            }
        }
    }

    fn destroy_instance(&self, gpu_index: u32, gi_id: u32) -> Result<(), BackendError> {
        let target = Target {
            gi_id: Some(gi_id),
            ..Target::gpu(gpu_index)
        };
        let gpu = self.gpu(&target)?;
        match self.destroy_gi_and_cis(&gpu, gi_id, target) {
            Ok(()) => {
                self.note_change(gpu_index, gi_id, None);
                Ok(())
            }
            Err(e) => {
                // NOT_FOUND: the list had a GI NVML no longer has; any other failure may have
                // destroyed some of its compute instances.
                self.invalidate(gpu_index, &e);
                Err(e)
            }
        }
    }

    fn instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        let gpu = self.gpu(&Target::gpu(gpu_index))?;
        self.read_instances(&gpu)
    }

    fn mig_mode(&self, gpu_index: u32) -> Result<MigModeState, BackendError> {
        self.read_mig_mode(gpu_index)
    }

    /// `nvmlDeviceSetMigMode`, then the mode read back (`backend/mig_mode.rs`).
    fn set_mig_mode(&self, gpu_index: u32, enabled: bool) -> Result<(), BackendError> {
        self.switch_mig_mode(gpu_index, enabled)
    }

    fn cached_instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        let gpu = self.gpu(&Target::gpu(gpu_index))?;
        match self.fresh_known(gpu_index) {
            Some(list) => Ok(list),
            None => self.read_instances(&gpu),
        }
    }
}

/// Read access to the GPUs (a panic while writing leaves whole values behind).
fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// Write access to the GPUs.
fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// Profiles a GPU or GI does not have answer `NOT_SUPPORTED` or `INVALID_ARGUMENT`.
pub(super) fn is_absent_profile(e: &NvmlCallError) -> bool {
    matches!(e.code, code::NOT_SUPPORTED | code::INVALID_ARGUMENT)
}

pub(super) fn with_ci(e: BackendError, ci: u32) -> BackendError {
    match e {
        BackendError::InUse { target, reason } => BackendError::InUse {
            target,
            reason: format!("compute instance {ci}: {reason}"),
        },
        e => e,
    }
}

/// An NVML error as a [`BackendError`] that says what it means for a MIG instance.
pub(crate) fn map_error(target: Target, e: &NvmlCallError) -> BackendError {
    match e.code {
        code::INSUFFICIENT_RESOURCES => BackendError::InsufficientResources {
            target,
            reason: format!(
                "placement taken (memory slices occupied), or the profile's instance limit or the single `+me` reached ({e})"
            ),
        },
        code::IN_USE => BackendError::InUse {
            target,
            reason: format!("processes or compute instances still use it; retry later ({e})"),
        },
        code::NOT_SUPPORTED => BackendError::NotSupported {
            target,
            reason: format!("MIG mode is off or the GPU does not support this ({e})"),
        },
        code::NOT_FOUND => BackendError::NotFound {
            target,
            reason: e.to_string(),
        },
        code::INVALID_ARGUMENT => BackendError::InvalidArgument {
            target,
            reason: format!("profile or placement not valid on this GPU ({e})"),
        },
        code::GPU_IS_LOST => BackendError::GpuLost {
            target,
            reason: format!(
                "the GPU fell off the bus or needs a reset; its slices are unusable until it is repaired ({e})"
            ),
        },
        code::NO_PERMISSION => other(
            target,
            e,
            "no permission: MIG management needs root or CAP_SYS_ADMIN",
        ),
        _ => other(target, e, "NVML call failed"),
    }
}

pub(super) fn other(target: Target, e: &NvmlCallError, what: &str) -> BackendError {
    BackendError::Other {
        target,
        reason: format!("{what} ({e})"),
    }
}
