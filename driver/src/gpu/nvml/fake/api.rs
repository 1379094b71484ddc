//! [`NvmlApi`] on the fake GPUs: every call with NVML's return codes, logged when it changes
//! something and counted by the NVML library functions `RealNvml` makes for it.

use std::collections::BTreeMap;

use super::FakeNvml;
use super::gpu::{FakeCi, FakeGi, GI_ID_ORDER, ci_slices, conflict_code};
use crate::gpu::layout::Placement;
use crate::gpu::nvml::{
    ARCH_HOPPER, CiInfo, CiProfileInfo, DeviceIdentity, GI_PROFILE_ENUM_COUNT, GiInfo,
    GiProfileInfo, MigDeviceInfo, MigModeState, NvmlApi, NvmlCallError, NvmlResult, RawEvent, code,
};

impl NvmlApi for FakeNvml {
    fn device_count(&self) -> NvmlResult<u32> {
        Ok(self.lock().gpus.len() as u32)
    }

    fn driver_version(&self) -> NvmlResult<String> {
        self.count(Ok("580.95.05".into()), |_| {
            vec![("nvmlSystemGetDriverVersion", 1)]
        })
    }

    fn cuda_driver_version(&self) -> NvmlResult<i32> {
        const CALL: &str = "nvmlSystemGetCudaDriverVersion_v2";
        let r = self.system_call(CALL, super::CUDA_DRIVER_VERSION);
        self.count(r, |_| vec![(CALL, 1)])
    }

    fn brand(&self, dev: u32) -> NvmlResult<u32> {
        let r = self.with_gpu("nvmlDeviceGetBrand", dev, |g, _| Ok(g.spec.brand));
        self.count(r, |_| vec![("nvmlDeviceGetBrand", 1)])
    }

    fn device_identity(&self, dev: u32) -> NvmlResult<DeviceIdentity> {
        let r = self.with_gpu("nvmlDeviceGetUUID", dev, |g, _| {
            Ok(DeviceIdentity {
                name: g.spec.name.clone(),
                uuid: format!("GPU-{:08x}-0000-4000-8000-000000000000", dev + 1),
                minor: g.minor,
                pci_device_id: g.spec.pci_device_id,
                pci_subsystem_id: g.spec.pci_subsystem_id,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + dev),
                memory_mib: g.spec.memory_mib,
                architecture: g.spec.architecture,
                cuda_compute_capability: g.spec.cuda_compute_capability,
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
            if g.mig.current == enable {
                // Nothing to activate (a pending change, if any, is dropped).
                return Ok(());
            }
            if g.spec.architecture < ARCH_HOPPER || g.needs_reset {
                // Pending until a reset: the activation status `RealNvml` reports as the error.
                return Err(code::RESET_REQUIRED);
            }
            g.mig.current = enable;
            Ok(())
        });
        self.count(r, |_| vec![("nvmlDeviceSetMigMode", 1)])
    }

    fn virtualization_mode(&self, dev: u32) -> NvmlResult<u32> {
        const CALL: &str = "nvmlDeviceGetVirtualizationMode";
        let r = self.with_gpu(CALL, dev, |g, _| Ok(g.spec.virtualization_mode));
        self.count(r, |_| vec![(CALL, 1)])
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
