//! [`NvmlBackend`]: [`GpuBackend`] over an [`NvmlApi`] (docs/reference/mig.md, "Create and destroy").
//!
//! - Inventory discovered once at construction: MIG-capable GPUs with MIG mode on; non-MIG GPUs,
//!   Ampere with MIG off and (by default) Hopper+ with MIG off are logged and skipped. Every
//!   later [`GpuBackend::inventory`] asks NVML again whether each of those GPUs still answers
//!   with the same UUID, so a GPU that fell off the bus drops out (and its devices turn
//!   unhealthy) instead of being served from a start-up copy. `--enable-mig-mode`
//!   lets Hopper+ GPUs be switched on (no reset needed, docs/reference/mig.md, "MIG mode"); Ampere never is.
//! - Models come from the data files by PCI device ID, cross-checked against NVML; an unknown
//!   GPU gets a model built from NVML's own profile and placement tables ([`model_from_nvml`]).
//! - Create: GI at the exact placement, then the full-size CI, then the MIG UUID by walking the
//!   MIG device handles, then the capability minors from procfs. On failure nothing is left.
//! - Destroy: every CI of the GI, then the GI (docs/reference/mig.md, "Create and destroy").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::procfs::{self, ci_access_path, gi_access_path};
use super::{
    CI_PROFILE_ENUM_COUNT, CiInfo, DeviceIdentity, GI_ENUM_NAMES, GI_PROFILE_ENUM_COUNT, GiInfo,
    GiProfileInfo, MigModeState, NvmlApi, NvmlCallError, NvmlResult, RawEvent, code, event,
    full_ci_enum,
};
use crate::gpu::catalog::{find_model_by_pci_id, parse_model};
use crate::gpu::layout::Placement;
use crate::gpu::model::{CiProfile, GiProfile, GpuModel};
use crate::gpu::{
    BackendError, GpuBackend, GpuInfo, HealthEvent, MigInstance, Target, ci_cap_minor, gi_cap_minor,
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
}

impl Default for NvmlOptions {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from(procfs::PROC_ROOT),
            enable_mig_mode: false,
        }
    }
}

/// The NVML backend for real GPUs.
pub struct NvmlBackend<A: NvmlApi> {
    api: A,
    options: NvmlOptions,
    gpus: Vec<GpuInfo>,
}

impl<A: NvmlApi> NvmlBackend<A> {
    /// Reads the inventory (and, with [`NvmlOptions::enable_mig_mode`], switches MIG mode on for
    /// idle Hopper+ GPUs). Fails only when NVML cannot count the GPUs or read the driver version.
    pub fn new(api: A, options: NvmlOptions) -> Result<Self, BackendError> {
        let whole = |e: NvmlCallError| other(Target::gpu(0), &e, "cannot read the GPUs");
        let count = api.device_count().map_err(whole)?;
        let driver_version = api.driver_version().map_err(whole)?;
        let gpus: Vec<GpuInfo> = (0..count)
            .filter_map(|dev| discover(&api, &options, dev, &driver_version))
            .collect();
        for g in &gpus {
            register_health_events(&api, g.index);
        }
        Ok(Self { api, options, gpus })
    }

    /// The function table.
    pub fn api(&self) -> &A {
        &self.api
    }

    fn gpu(&self, target: &Target) -> Result<&GpuInfo, BackendError> {
        self.gpus
            .iter()
            .find(|g| g.index == target.gpu)
            .ok_or_else(|| BackendError::NotFound {
                target: target.clone(),
                reason: "no such GPU with MIG mode on in this node's inventory".into(),
            })
    }

    /// GI then CI; on a CI failure the GI is destroyed again.
    fn create_instances(
        &self,
        gpu: &GpuInfo,
        profile: &GiProfile,
        target: &Target,
    ) -> Result<(GiInfo, CiInfo), BackendError> {
        let placement = Placement {
            start: target.placement.map_or(0, |p| p.start),
            size: profile.placement_size,
        };
        let gi = self
            .api
            .create_gi(gpu.index, profile.id, placement)
            .map_err(|e| map_error(target.clone(), &e))?;
        let ci_target = Target {
            gi_id: Some(gi.id),
            ..target.clone()
        };
        match self
            .api
            .create_ci(gpu.index, gi.id, profile.compute_instance.id)
        {
            Ok(ci) => Ok((gi, ci)),
            Err(e) => {
                self.rollback(gpu.index, gi.id, None);
                Err(map_error(ci_target, &e))
            }
        }
    }

    /// Best-effort teardown after a failed create: the CI (if any), then the GI.
    fn rollback(&self, dev: u32, gi_id: u32, ci_id: Option<u32>) {
        if let Some(ci) = ci_id
            && let Err(e) = self.api.destroy_ci(dev, gi_id, ci)
        {
            tracing::warn!(gpu = dev, gi = gi_id, ci, error = %e, "rollback: destroying the compute instance failed");
        }
        if let Err(e) = self.api.destroy_gi(dev, gi_id) {
            tracing::warn!(gpu = dev, gi = gi_id, error = %e, "rollback: destroying the GPU instance failed");
        }
    }

    /// The MIG UUID of (GI, CI): walk `nvmlDeviceGetMigDeviceHandleByIndex(i)` for
    /// `i < nvmlDeviceGetMaxMigDeviceCount` and match the GI and CI IDs (docs/reference/mig.md, "Create and destroy";
    /// `ComputeInstanceInfo.device` is the *parent*, so there is no shortcut).
    pub fn mig_uuid(&self, dev: u32, gi_id: u32, ci_id: u32) -> NvmlResult<Option<String>> {
        Ok(self
            .mig_devices(dev)?
            .into_iter()
            .find(|m| m.gi_id == gi_id && m.ci_id == ci_id)
            .map(|m| m.uuid))
    }

    fn mig_devices(&self, dev: u32) -> NvmlResult<Vec<super::MigDeviceInfo>> {
        let max = self.api.max_mig_device_count(dev)?;
        let mut out = Vec::new();
        for i in 0..max {
            match self.api.mig_device(dev, i) {
                Ok(m) => out.push(m),
                Err(e) if e.code == code::NOT_FOUND => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Capability minors of GI `gi` / CI `ci` from procfs; the deterministic formula
    /// (docs/reference/mig.md, "Device nodes and capabilities") with a warning when the files
    /// cannot be read.
    pub fn cap_minors(&self, gpu_minor: u32, gi: u32, ci: u32) -> (u32, u32) {
        let root = &self.options.proc_root;
        let read = |path: PathBuf, fallback: u32| {
            procfs::read_cap_minor(&path).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, fallback, "cannot read the MIG capability minor; using the mig-minors formula");
                fallback
            })
        };
        (
            read(
                gi_access_path(root, gpu_minor, gi),
                gi_cap_minor(gpu_minor, gi),
            ),
            read(
                ci_access_path(root, gpu_minor, gi, ci),
                ci_cap_minor(gpu_minor, gi, ci),
            ),
        )
    }

    /// Every CI of GI `gi_id` over all CI profiles (profiles the GI lacks are skipped).
    fn compute_instances_of(&self, dev: u32, gi_id: u32) -> NvmlResult<Vec<CiInfo>> {
        let mut out = Vec::new();
        for profile in 0..CI_PROFILE_ENUM_COUNT {
            match self.api.compute_instances(dev, gi_id, profile) {
                Ok(cis) => out.extend(cis),
                Err(e) if is_absent_profile(&e) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by_key(|c| c.id);
        out.dedup_by_key(|c| c.id);
        Ok(out)
    }

    fn slice(&self, gpu: &GpuInfo, gi: GiInfo, ci: CiInfo, mig_uuid: String) -> MigInstance {
        let (gi_cap, ci_cap) = self.cap_minors(gpu.minor, gi.id, ci.id);
        let profile = gpu
            .model
            .profiles
            .iter()
            .find(|p| p.id == gi.profile_id)
            .map_or_else(|| format!("profile-{}", gi.profile_id), |p| p.name.clone());
        MigInstance {
            gpu_index: gpu.index,
            gpu_uuid: gpu.uuid.clone(),
            gpu_minor: gpu.minor,
            profile,
            profile_id: gi.profile_id,
            placement: gi.placement,
            gi_id: gi.id,
            ci_id: ci.id,
            mig_uuid,
            gi_cap_minor: gi_cap,
            ci_cap_minor: ci_cap,
            created_by_das: None,
        }
    }

    /// The instances of one GPU: every GI of the model's profiles with its first CI. A GI without a
    /// CI (a create interrupted between the two steps) is listed with CI 0 and an empty MIG UUID
    /// so orphan reconciliation can destroy it.
    fn instances_of(&self, gpu: &GpuInfo) -> Result<Vec<MigInstance>, BackendError> {
        let fail = |e: NvmlCallError| map_error(Target::gpu(gpu.index), &e);
        let migs = self.mig_devices(gpu.index).map_err(fail)?;
        let mut out = Vec::new();
        for profile in &gpu.model.profiles {
            let gis = match self.api.gpu_instances(gpu.index, profile.id) {
                Err(e) if is_absent_profile(&e) => continue,
                r => r.map_err(fail)?,
            };
            for gi in gis {
                let cis = self.compute_instances_of(gpu.index, gi.id).map_err(fail)?;
                let ci = cis.first().copied().unwrap_or(CiInfo {
                    id: 0,
                    profile_id: profile.compute_instance.id,
                });
                let uuid = migs
                    .iter()
                    .find(|m| m.gi_id == gi.id && m.ci_id == ci.id && !cis.is_empty())
                    .map(|m| m.uuid.clone())
                    .unwrap_or_default();
                out.push(self.slice(gpu, gi, ci, uuid));
            }
        }
        Ok(out)
    }
}

impl<A: NvmlApi> GpuBackend for NvmlBackend<A> {
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(self
            .gpus
            .iter()
            .filter(|g| match self.api.device_identity(g.index) {
                Ok(id) if id.uuid == g.uuid => true,
                Ok(id) => {
                    tracing::warn!(gpu = g.index, expected = %g.uuid, found = %id.uuid,
                        "GPU index now answers with another UUID; treating the GPU as gone");
                    false
                }
                Err(e) => {
                    tracing::debug!(gpu = g.index, error = %e, "GPU does not answer");
                    false
                }
            })
            .cloned()
            .collect())
    }

    /// `nvmlEventSetWait_v2` for the first event (at most `timeout`), then whatever else is
    /// already queued, up to [`EVENT_BATCH`].
    fn wait_health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, BackendError> {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let mut events = Vec::new();
        let mut wait = ms;
        while events.len() < EVENT_BATCH {
            match self.api.wait_event(wait) {
                Ok(e) => events.extend(health_event(e)),
                Err(e) if e.code == code::TIMEOUT => break,
                Err(e) if events.is_empty() => {
                    return Err(other(Target::gpu(0), &e, "waiting for GPU health events"));
                }
                Err(_) => break,
            }
            wait = 0;
        }
        Ok(events)
    }

    fn gpu_indices(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.index).collect()
    }

    fn create_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let target = Target::at(gpu_index, profile, Placement { start, size: 0 });
        let gpu = self.gpu(&target)?;
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
        let (gi, ci) = self.create_instances(gpu, p, &target)?;
        let uuid_target = Target {
            gi_id: Some(gi.id),
            ..target
        };
        let uuid = match self.mig_uuid(gpu_index, gi.id, ci.id) {
            Ok(Some(uuid)) => uuid,
            Ok(None) => {
                self.rollback(gpu_index, gi.id, Some(ci.id));
                return Err(BackendError::Other {
                    target: uuid_target,
                    reason: format!(
                        "no MIG device handle for GI {} CI {} after creating them; destroyed again",
                        gi.id, ci.id
                    ),
                });
            }
            Err(e) => {
                self.rollback(gpu_index, gi.id, Some(ci.id));
                return Err(map_error(uuid_target, &e));
            }
        };
        tracing::info!(gpu = gpu_index, profile, start, gi = gi.id, ci = ci.id, mig_uuid = %uuid, "MIG instance created");
        Ok(self.slice(gpu, gi, ci, uuid))
    }

    fn destroy_instance(&self, gpu_index: u32, gi_id: u32) -> Result<(), BackendError> {
        let target = Target {
            gi_id: Some(gi_id),
            ..Target::gpu(gpu_index)
        };
        let gpu = self.gpu(&target)?;
        let fail = |e: NvmlCallError| map_error(target.clone(), &e);
        let cis = self
            .compute_instances_of(gpu.index, gi_id)
            .map_err(|e| match e.code {
                code::NOT_FOUND | code::INVALID_ARGUMENT => BackendError::NotFound {
                    target: target.clone(),
                    reason: format!("no such GPU instance ({e})"),
                },
                _ => fail(e),
            })?;
        for ci in cis {
            self.api
                .destroy_ci(gpu.index, gi_id, ci.id)
                .map_err(|e| with_ci(fail(e), ci.id))?;
        }
        self.api.destroy_gi(gpu.index, gi_id).map_err(fail)?;
        tracing::info!(gpu = gpu_index, gi = gi_id, "MIG instance destroyed");
        Ok(())
    }

    fn instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        let gpu = self.gpu(&Target::gpu(gpu_index))?;
        let mut out = self.instances_of(gpu)?;
        out.sort_by_key(|s| s.placement.start);
        Ok(out)
    }
}

/// Profiles a GPU or GI does not have answer `NOT_SUPPORTED` or `INVALID_ARGUMENT`.
fn is_absent_profile(e: &NvmlCallError) -> bool {
    matches!(e.code, code::NOT_SUPPORTED | code::INVALID_ARGUMENT)
}

fn with_ci(e: BackendError, ci: u32) -> BackendError {
    match e {
        BackendError::InUse { target, reason } => BackendError::InUse {
            target,
            reason: format!("compute instance {ci}: {reason}"),
        },
        e => e,
    }
}

/// An NVML error as a [`BackendError`] that says what it means for a MIG instance.
pub fn map_error(target: Target, e: &NvmlCallError) -> BackendError {
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

fn other(target: Target, e: &NvmlCallError, what: &str) -> BackendError {
    BackendError::Other {
        target,
        reason: format!("{what} ({e})"),
    }
}

/// Registers GPU `dev` for the events the health monitor watches, each type on its own so a
/// GPU that lacks one (`NOT_SUPPORTED`, e.g. ECC off) still reports the others. A failure is
/// logged: the GPU then reports its health through the inventory only.
fn register_health_events<A: NvmlApi>(api: &A, dev: u32) {
    for (mask, what) in [
        (event::XID_CRITICAL_ERROR, "XID errors"),
        (event::DOUBLE_BIT_ECC_ERROR, "uncorrectable ECC errors"),
    ] {
        if let Err(e) = api.register_events(dev, mask) {
            tracing::warn!(gpu = dev, error = %e, "cannot watch the GPU for {what}");
        }
    }
}

/// The health event of a raw NVML event; `None` for events about no GPU of ours or of types
/// the monitor does not watch.
fn health_event(e: RawEvent) -> Option<HealthEvent> {
    let gpu = e.dev?;
    if e.event_type & event::XID_CRITICAL_ERROR != 0 {
        return Some(HealthEvent::Xid {
            gpu,
            // `eventData` holds the XID (999 when NVML does not know it).
            xid: u32::try_from(e.data).unwrap_or(u32::MAX),
            gpu_instance: e.gpu_instance,
        });
    }
    (e.event_type & event::DOUBLE_BIT_ECC_ERROR != 0)
        .then_some(HealthEvent::UncorrectableEcc { gpu })
}

/// Most events taken in one call after the first (the rest wait for the next call).
const EVENT_BATCH: usize = 64;

/// One GPU of the inventory, or `None` (logged) when DAS cannot offer MIG instances on it.
fn discover<A: NvmlApi>(
    api: &A,
    options: &NvmlOptions,
    dev: u32,
    driver_version: &str,
) -> Option<GpuInfo> {
    let id = match api.device_identity(dev) {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(gpu = dev, error = %e, "cannot read the GPU; skipped");
            return None;
        }
    };
    let mode = match api.mig_mode(dev) {
        Ok(m) => m,
        Err(e) if e.code == code::NOT_SUPPORTED => {
            tracing::info!(gpu = dev, name = %id.name, "GPU is not MIG-capable; skipped");
            return None;
        }
        Err(e) => {
            tracing::warn!(gpu = dev, name = %id.name, error = %e, "cannot read the MIG mode; skipped");
            return None;
        }
    };
    let model = resolve_model(api, dev, &id)?;
    let id = ensure_mig_mode(api, options, dev, id, mode, &model)?;
    Some(GpuInfo {
        index: dev,
        uuid: id.uuid,
        model,
        product_name: id.name,
        minor: id.minor,
        pci_bus_id: Some(id.pci_bus_id),
        driver_version: driver_version.to_string(),
        mig_enabled: true,
    })
}

/// Returns the (re-read) identity when MIG mode is on, switching it on for Hopper+ only with
/// [`NvmlOptions::enable_mig_mode`]; `None` (logged) otherwise.
fn ensure_mig_mode<A: NvmlApi>(
    api: &A,
    options: &NvmlOptions,
    dev: u32,
    id: DeviceIdentity,
    mode: MigModeState,
    model: &GpuModel,
) -> Option<DeviceIdentity> {
    if mode.current {
        return Some(id);
    }
    if model.mig_mode_change_requires_reset || id.architecture < super::ARCH_HOPPER {
        tracing::warn!(gpu = dev, name = %id.name, pending = mode.pending,
            "MIG mode is off on this {} GPU; DAS never toggles it there (it needs a GPU reset): run `nvidia-smi -i {dev} -mig 1` and reset the GPU; skipped",
            model.architecture);
        return None;
    }
    if !options.enable_mig_mode {
        tracing::warn!(gpu = dev, name = %id.name,
            "MIG mode is off; pass --enable-mig-mode to let DAS switch it on (Hopper and newer, GPU must be idle) or run `nvidia-smi -i {dev} -mig 1`; skipped");
        return None;
    }
    if let Err(e) = api.set_mig_mode(dev, true) {
        tracing::warn!(gpu = dev, name = %id.name, error = %e, "switching MIG mode on failed (GPU busy?); skipped");
        return None;
    }
    tracing::info!(gpu = dev, name = %id.name, "MIG mode switched on");
    // Enabling MIG mode may re-bind the GPU and change its minor number (docs/reference/mig.md, "MIG mode").
    match (api.device_identity(dev), api.mig_mode(dev)) {
        (Ok(id), Ok(m)) if m.current => Some(id),
        (id, m) => {
            tracing::warn!(gpu = dev, identity = ?id.err(), mode = ?m, "MIG mode not on after switching it on; skipped");
            None
        }
    }
}

/// The data-file model for the GPU's PCI device ID (profile IDs and placements cross-checked
/// against NVML, mismatches logged), else a model built from NVML's tables.
fn resolve_model<A: NvmlApi>(api: &A, dev: u32, id: &DeviceIdentity) -> Option<Arc<GpuModel>> {
    match find_model_by_pci_id(id.pci_device_id) {
        Ok(Some(model)) => {
            cross_check(api, dev, &model);
            Some(model)
        }
        Ok(None) => match model_from_nvml(api, dev, id) {
            Ok(model) => {
                tracing::warn!(gpu = dev, name = %id.name, pci_device_id = format_args!("{:#010x}", id.pci_device_id),
                    "no data file for this GPU; using the profile and placement tables NVML reports");
                Some(Arc::new(model))
            }
            Err(reason) => {
                tracing::warn!(gpu = dev, name = %id.name, pci_device_id = format_args!("{:#010x}", id.pci_device_id), %reason,
                    "no data file for this GPU and NVML's tables do not make a usable model; skipped");
                None
            }
        },
        Err(e) => {
            tracing::error!(error = %e, "the embedded GPU model data is invalid; GPU skipped");
            None
        }
    }
}

/// Logs every data-file profile whose real ID or placements differ from what NVML reports.
fn cross_check<A: NvmlApi>(api: &A, dev: u32, model: &GpuModel) {
    for p in &model.profiles {
        let checked = api
            .gi_profile_info(dev, p.nvml_enum_value())
            .and_then(|info| {
                let placements = api.gi_possible_placements(dev, info.id)?;
                Ok((info, placements))
            });
        match checked {
            Ok((info, placements)) => {
                let starts: Vec<u32> = placements.iter().map(|pl| pl.start).collect();
                let sizes_ok = placements.iter().all(|pl| pl.size == p.placement_size);
                if info.id != p.id || starts != p.placement_starts || !sizes_ok {
                    tracing::warn!(gpu = dev, profile = %p.name, file = %model.source_file, data_id = p.id, nvml_id = info.id,
                        data_starts = ?p.placement_starts, nvml_placements = ?placements,
                        "the GPU model data file disagrees with NVML");
                }
            }
            Err(e) => {
                tracing::warn!(gpu = dev, profile = %p.name, file = %model.source_file, error = %e,
                    "NVML does not report a profile of the GPU model data file")
            }
        }
    }
}

/// A [`GpuModel`] from NVML's own tables: every GI profile enum the GPU supports
/// (`…GetGpuInstanceProfileInfoV`, enum → real ID), its possible placements, and the full-size CI
/// by instance count; validated by the same rules as the data files.
pub fn model_from_nvml<A: NvmlApi>(
    api: &A,
    dev: u32,
    id: &DeviceIdentity,
) -> Result<GpuModel, String> {
    let mut profiles = Vec::new();
    for e in 0..GI_PROFILE_ENUM_COUNT {
        let info = match api.gi_profile_info(dev, e) {
            Ok(info) => info,
            Err(err) if is_absent_profile(&err) => continue,
            Err(err) => return Err(err.to_string()),
        };
        let placements = api
            .gi_possible_placements(dev, info.id)
            .map_err(|err| err.to_string())?;
        profiles.push(profile_from_nvml(e, &info, &placements)?);
    }
    let memory_slices = profiles
        .iter()
        .flat_map(|p| p.placement_starts.iter().map(|s| s + p.placement_size))
        .max()
        .ok_or("NVML reports no GPU instance profiles")?;
    let model = GpuModel {
        name: id
            .name
            .trim_start_matches("NVIDIA ")
            .replace(char::is_whitespace, "-"),
        aliases: Vec::new(),
        product_name: id.name.clone(),
        pci_device_ids: vec![id.pci_device_id],
        architecture: architecture_name(id.architecture).to_string(),
        cuda_compute_capability: format!(
            "{}.{}",
            id.cuda_compute_capability.0, id.cuda_compute_capability.1
        ),
        memory_mib: id.memory_mib,
        memory_slices,
        compute_slices: profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0),
        max_gpu_instances: profiles.iter().map(|p| p.max_instances).max().unwrap_or(0),
        mig_mode_change_requires_reset: id.architecture < super::ARCH_HOPPER,
        profiles,
        source_file: String::new(),
        counter_totals: Default::default(),
        published_counters: Vec::new(),
    };
    let text = toml::to_string(&model).map_err(|e| e.to_string())?;
    parse_model(&format!("nvml:{}", id.name), &text).map_err(|e| e.problem)
}

fn profile_from_nvml(
    e: u32,
    info: &GiProfileInfo,
    placements: &[Placement],
) -> Result<GiProfile, String> {
    let name = info.short_name().to_string();
    let size = placements
        .first()
        .map(|p| p.size)
        .ok_or_else(|| format!("profile {name}: NVML reports no placements"))?;
    let mut starts: Vec<u32> = placements.iter().map(|p| p.start).collect();
    starts.sort_unstable();
    let ci = full_ci_enum(info.slice_count).ok_or_else(|| {
        format!(
            "profile {name}: no CI profile with {} slices",
            info.slice_count
        )
    })?;
    Ok(GiProfile {
        id: info.id,
        nvml_enum: GI_ENUM_NAMES[e as usize].to_string(),
        media_extension: name.ends_with("+me"),
        name,
        compute_slices: info.slice_count,
        memory_mib: info.memory_mib,
        multiprocessors: info.multiprocessors,
        copy_engines: info.copy_engines,
        decoders: info.decoders,
        encoders: info.encoders,
        jpeg_engines: info.jpeg_engines,
        ofa_engines: info.ofa_engines,
        max_instances: info.instance_count,
        placement_size: size,
        placement_starts: starts,
        compute_instance: CiProfile {
            id: ci,
            nvml_enum: super::CI_ENUMS[ci as usize].0.to_string(),
        },
    })
}

/// `NVML_DEVICE_ARCH_*` as a name.
pub(crate) fn architecture_name(arch: u32) -> &'static str {
    match arch {
        7 => "Ampere",
        8 => "Ada",
        9 => "Hopper",
        10 => "Blackwell",
        a if a > 10 => "Newer",
        _ => "Older",
    }
}
