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
//! - Instance lists: [`GpuBackend::instances_on`] always reads NVML (15 NVML calls plus 23 per
//!   instance on an H100, docs/benchmarks.md); [`GpuBackend::cached_instances_on`] serves each
//!   GPU's list as DAS's own creates and destroys left it, and reads NVML again only every
//!   [`INSTANCE_REFRESH`] or after something that may have made the list stale (see "Instance
//!   cache" below).
//!
//! # Instance cache
//!
//! Every full read of a GPU's instances (either method) is kept with its time. A successful
//! [`GpuBackend::create_instance`] adds the instance it made (the same [`MigInstance`] a listing
//! gives: same profile, placement, GI, CI, MIG UUID and capability minors), a successful
//! [`GpuBackend::destroy_instance`] removes the GI it destroyed. Marked stale, so that the next
//! cached read goes to NVML:
//! - a GPU a health event names ([`GpuBackend::wait_health_events`]: XID, uncorrectable ECC),
//!   and a GPU that does not answer [`GpuBackend::inventory`] (lost: the next read fails, as
//!   without the cache);
//! - a failed destroy, `NOT_FOUND` included (the GI was already gone, or only its compute
//!   instances went), and a failed create that reached NVML (`INSUFFICIENT_RESOURCES`: someone
//!   holds the placement; or a roll-back that left a GI behind).
//!
//! Why the cached list equals NVML's whenever only DAS changes instances: DAS changes a GPU's
//! instances only through this backend (one active plugin per node, docs/design.md §7); each
//! successful change is applied to the list after NVML made it, replacing whatever the list had
//! for that GI; a change that failed leaves no list. A read runs outside the request path's
//! per-GPU lock (the health monitor's), so a change may land while NVML is being walked: the
//! read is then not kept (a generation count, bumped by every change and invalidation), and the
//! list as the change left it stays, with its older read time, so the next cached read after
//! the period reads again. A read kept is one no change overlapped, and every later change was
//! applied to it. Changes made behind DAS's back (`nvidia-smi mig -cgi` / `-dgi`) show in the
//! cached list only at the next re-read: within [`INSTANCE_REFRESH`] instead of at once. The
//! request path and start-up reconciliation call [`GpuBackend::instances_on`], which always
//! reads NVML (and refreshes the kept list for free).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// How long [`GpuBackend::cached_instances_on`] serves a GPU's MIG instance list of the NVML
/// backend without reading NVML again, when nothing marked it stale (module docs, "Instance
/// cache"). It bounds how late the health monitor's unclaimed-instance check (docs/design.md §7)
/// sees an instance made or destroyed behind DAS's back (an administrator's `nvidia-smi`): that
/// check runs every 5 s and withdraws an instance's devices once it sees it twice, so such an
/// instance is acted on within about this period plus 5 s. Twelve of the monitor's checks share
/// one NVML read (107 calls for an H100 with four instances, docs/benchmarks.md).
pub const INSTANCE_REFRESH: Duration = Duration::from_secs(60);

/// Where the backend reads the time (the instance cache's ages); a simulated clock in tests and
/// benchmarks.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// One GPU's instance list as the backend knows it.
#[derive(Debug, Default)]
struct KnownInstances {
    /// By placement start; `None` when never read or marked stale.
    list: Option<Vec<MigInstance>>,
    /// When NVML was last read in full for the list.
    read_at: Option<Instant>,
    /// Bumped by every change and invalidation: a read that started before one is not kept.
    generation: u64,
}

/// The NVML backend for real GPUs.
pub struct NvmlBackend<A: NvmlApi> {
    api: A,
    options: NvmlOptions,
    gpus: Vec<GpuInfo>,
    /// Per GPU index (module docs, "Instance cache"); locked only between NVML calls.
    known: Mutex<BTreeMap<u32, KnownInstances>>,
    /// [`INSTANCE_REFRESH`] unless set otherwise ([`Self::with_instance_refresh`]).
    refresh: Duration,
    clock: Clock,
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
        Ok(Self {
            api,
            options,
            gpus,
            known: Mutex::default(),
            refresh: INSTANCE_REFRESH,
            clock: Arc::new(Instant::now),
        })
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

    fn known(&self) -> MutexGuard<'_, BTreeMap<u32, KnownInstances>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads GPU `gpu`'s instances from NVML and keeps them, unless a change or an invalidation
    /// landed while reading (then the list as that left it stays).
    fn read_instances(&self, gpu: &GpuInfo) -> Result<Vec<MigInstance>, BackendError> {
        let generation = self.known().entry(gpu.index).or_default().generation;
        let mut out = self.instances_of(gpu)?;
        out.sort_by_key(|s| s.placement.start);
        let mut known = self.known();
        let k = known.entry(gpu.index).or_default();
        if k.generation == generation {
            k.list = Some(out.clone());
            k.read_at = Some((self.clock)());
        }
        Ok(out)
    }

    /// The kept list of GPU `gpu` when it is younger than the refresh period.
    fn fresh_known(&self, gpu: u32) -> Option<Vec<MigInstance>> {
        let now = (self.clock)();
        let known = self.known();
        let k = known.get(&gpu)?;
        let age = now.saturating_duration_since(k.read_at?);
        (age < self.refresh).then(|| k.list.clone()).flatten()
    }

    /// Applies DAS's own change to GPU `gpu`'s kept list: `gi_id` removed, then `added` (if any)
    /// put in by placement. Any entry with that GI (a read that overlapped the change) is
    /// replaced.
    fn note_change(&self, gpu: u32, gi_id: u32, added: Option<&MigInstance>) {
        let mut known = self.known();
        let k = known.entry(gpu).or_default();
        k.generation += 1;
        if let Some(list) = &mut k.list {
            list.retain(|s| s.gi_id != gi_id);
            if let Some(s) = added {
                let at = list.partition_point(|x| x.placement.start <= s.placement.start);
                list.insert(at, s.clone());
            }
        }
    }

    /// Marks GPU `gpu`'s kept list stale: the next cached read goes to NVML.
    fn invalidate(&self, gpu: u32, why: &dyn std::fmt::Display) {
        tracing::debug!(gpu, reason = %why, "MIG instance list marked stale");
        let mut known = self.known();
        let k = known.entry(gpu).or_default();
        k.generation += 1;
        k.list = None;
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
                Ok(e) => {
                    let event = health_event(e);
                    if let Some(ev) = &event {
                        // The GPU's instances may have changed outside DAS (a reset, a GI
                        // torn down): its cached list is read again.
                        self.invalidate(ev.gpu(), &format_args!("health event {ev:?}"));
                    }
                    events.extend(event);
                }
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
        match self.destroy_gi_and_cis(gpu, gi_id, target) {
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
        self.read_instances(gpu)
    }

    fn cached_instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        let gpu = self.gpu(&Target::gpu(gpu_index))?;
        match self.fresh_known(gpu_index) {
            Some(list) => Ok(list),
            None => self.read_instances(gpu),
        }
    }
}

impl<A: NvmlApi> NvmlBackend<A> {
    /// GI, CI, MIG UUID and capability minors of a create whose arguments are checked.
    fn create_at(
        &self,
        gpu: &GpuInfo,
        p: &GiProfile,
        target: Target,
    ) -> Result<MigInstance, BackendError> {
        let gpu_index = gpu.index;
        let (profile, start) = (p.name.as_str(), target.placement.map_or(0, |pl| pl.start));
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

    /// Every CI of GI `gi_id`, then the GI.
    fn destroy_gi_and_cis(
        &self,
        gpu: &GpuInfo,
        gi_id: u32,
        target: Target,
    ) -> Result<(), BackendError> {
        let gpu_index = gpu.index;
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
