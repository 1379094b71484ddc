//! MIG instances on one GPU through NVML: create (GI at the exact placement, the full-size CI,
//! the MIG UUID by walking the MIG device handles, the capability minors from procfs; rolled
//! back on failure), destroy (every CI, then the GI), and list (every GI of the model's
//! profiles with its first CI).

use std::path::PathBuf;

use super::{NvmlBackend, is_absent_profile, map_error, with_ci};
use crate::gpu::layout::Placement;
use crate::gpu::model::GiProfile;
use crate::gpu::nvml::procfs::{self, ci_access_path, gi_access_path};
use crate::gpu::nvml::{
    CI_PROFILE_ENUM_COUNT, CiInfo, GiInfo, MigDeviceInfo, NvmlApi, NvmlCallError, NvmlResult, code,
};
use crate::gpu::{BackendError, GpuInfo, MigInstance, Target, ci_cap_minor, gi_cap_minor};

impl<A: NvmlApi> NvmlBackend<A> {
    /// GI then CI; on a CI failure the GI is destroyed again.
    pub(super) fn create_instances(
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
    pub(super) fn rollback(&self, dev: u32, gi_id: u32, ci_id: Option<u32>) {
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

    pub(super) fn mig_devices(&self, dev: u32) -> NvmlResult<Vec<MigDeviceInfo>> {
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
    pub(crate) fn cap_minors(&self, gpu_minor: u32, gi: u32, ci: u32) -> (u32, u32) {
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
    pub(super) fn compute_instances_of(&self, dev: u32, gi_id: u32) -> NvmlResult<Vec<CiInfo>> {
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

    pub(super) fn slice(
        &self,
        gpu: &GpuInfo,
        gi: GiInfo,
        ci: CiInfo,
        mig_uuid: String,
    ) -> MigInstance {
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
    /// so orphan reconciliation can destroy it. A GPU served whole (MIG mode off at start-up) has
    /// none while its MIG mode is still off (one `nvmlDeviceGetMigMode`); should someone switch
    /// it on behind DAS's back, its instances are listed as on any GPU. A GPU without MIG has
    /// none, without an NVML call.
    pub(super) fn instances_of(&self, gpu: &GpuInfo) -> Result<Vec<MigInstance>, BackendError> {
        let fail = |e: NvmlCallError| map_error(Target::gpu(gpu.index), &e);
        if !gpu.model.mig {
            return Ok(Vec::new());
        }
        if !gpu.mig_enabled && !self.api.mig_mode(gpu.index).map_err(fail)?.current {
            return Ok(Vec::new());
        }
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

    /// GI, CI, MIG UUID and capability minors of a create whose arguments are checked.
    pub(super) fn create_at(
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
    pub(super) fn destroy_gi_and_cis(
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
