//! [`RealNvml`]: the [`NvmlApi`] over the NVIDIA driver's `libnvidia-ml.so.1`.
//!
//! nvml-wrapper 0.13 loads the library with libloading at [`RealNvml::init`] (so the plugin binary
//! starts without it in emulated mode) and covers identity, MIG mode and the MIG device walk; every
//! GPU/compute-instance call goes through its raw `nvml-wrapper-sys` 0.10 bindings (`nvml.lib()`
//! with the cached `nvmlDevice_t` handles), because the wrapper cannot create or destroy instances
//! and its `possible_placements` always returns an empty list (docs/reference/mig.md, "nvml-wrapper coverage").
//!
//! NVML is initialised once; device handles are looked up once and cached (uncached lookups take
//! up to O(10 s) under load, docs/reference/mig.md, "Timing").

use std::ffi::CStr;
use std::mem;
use std::ptr;

use nvml_wrapper::Nvml;
use nvml_wrapper::device::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t, nvmlReturn_t,
};

use super::{
    CiInfo, CiProfileInfo, DeviceIdentity, GiInfo, GiProfileInfo, MigDeviceInfo, MigModeState,
    NvmlApi, NvmlCallError, NvmlResult, RawEvent, code,
};
use crate::gpu::layout::Placement;

/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED` (`nvml.h`).
const ENGINE_PROFILE_SHARED: u32 = 0;

/// Room for every instance of one profile (at most 7 GIs / 8 CIs per GI exist).
const INSTANCE_BUFFER: usize = 32;

/// A cached `nvmlDevice_t`. NVML handles are process-global and NVML is thread-safe
/// (`nvml.h`: "NVML is thread-safe"), so sharing them between threads is sound.
#[derive(Clone, Copy)]
struct RawDevice(nvmlDevice_t);

// SAFETY: see `RawDevice`; the handle is an opaque token owned by the NVML library.
unsafe impl Send for RawDevice {}
// SAFETY: as above.
unsafe impl Sync for RawDevice {}

/// The health monitor's `nvmlEventSet_t`, created on the first registration. Like device
/// handles it is an opaque token; NVML allows waiting on a set from one thread while another
/// registers (`nvml.h`, thread safety), and the monitor waits from one thread only.
#[derive(Clone, Copy)]
struct RawEventSet(nvmlEventSet_t);

// SAFETY: see `RawEventSet`.
unsafe impl Send for RawEventSet {}
// SAFETY: as above.
unsafe impl Sync for RawEventSet {}

/// `gpuInstanceId` / `computeInstanceId` of an event that names no instance (`nvml.h`).
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// The NVML function table over the real library.
pub struct RealNvml {
    nvml: Nvml,
    devices: Vec<NvmlResult<RawDevice>>,
    events: std::sync::Mutex<Option<RawEventSet>>,
}

impl RealNvml {
    /// Loads `libnvidia-ml.so.1`, initialises NVML and caches every GPU's handle.
    pub fn init() -> Result<Self, NvmlError> {
        let nvml = Nvml::init()?;
        let count = nvml.device_count()?;
        let devices = (0..count)
            .map(|i| {
                nvml.device_by_index(i)
                    // SAFETY: the handle stays valid while `nvml` is initialised (owned by self).
                    .map(|d| RawDevice(unsafe { d.handle() }))
                    .map_err(|e| wrapper_error("nvmlDeviceGetHandleByIndex_v2", e))
            })
            .collect();
        Ok(Self {
            nvml,
            devices,
            events: std::sync::Mutex::new(None),
        })
    }

    /// The event set, created on first use.
    fn event_set(&self) -> NvmlResult<nvmlEventSet_t> {
        let mut set = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = *set {
            return Ok(s.0);
        }
        let mut raw: nvmlEventSet_t = ptr::null_mut();
        // SAFETY: valid out-pointer; the set lives until NVML shuts down with `self`.
        check("nvmlEventSetCreate", unsafe {
            self.lib().nvmlEventSetCreate(&mut raw)
        })?;
        *set = Some(RawEventSet(raw));
        Ok(raw)
    }

    fn lib(&self) -> &NvmlLib {
        self.nvml.lib()
    }

    fn raw(&self, dev: u32) -> NvmlResult<nvmlDevice_t> {
        match self.devices.get(dev as usize) {
            Some(Ok(d)) => Ok(d.0),
            Some(Err(e)) => Err(e.clone()),
            None => Err(NvmlCallError::new(
                "nvmlDeviceGetHandleByIndex_v2",
                code::INVALID_ARGUMENT,
            )),
        }
    }

    fn device(&self, dev: u32) -> NvmlResult<Device<'_>> {
        let raw = self.raw(dev)?;
        // SAFETY: `raw` came from `device_by_index` on this `Nvml`, which outlives the borrow.
        Ok(unsafe { Device::new(raw, &self.nvml) })
    }

    fn gi_handle(&self, dev: u32, gi_id: u32) -> NvmlResult<nvmlGpuInstance_t> {
        let d = self.raw(dev)?;
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle and out-pointer.
        check("nvmlDeviceGetGpuInstanceById", unsafe {
            self.lib().nvmlDeviceGetGpuInstanceById(d, gi_id, &mut gi)
        })?;
        Ok(gi)
    }

    fn ci_handle(&self, dev: u32, gi_id: u32, ci_id: u32) -> NvmlResult<nvmlComputeInstance_t> {
        let gi = self.gi_handle(dev, gi_id)?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: valid GI handle and out-pointer.
        check("nvmlGpuInstanceGetComputeInstanceById", unsafe {
            self.lib()
                .nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &mut ci)
        })?;
        Ok(ci)
    }

    fn gi_info_of(&self, gi: nvmlGpuInstance_t) -> NvmlResult<GiInfo> {
        // SAFETY: plain C struct; all-zero is a valid value.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
        // SAFETY: valid GI handle and out-pointer.
        check("nvmlGpuInstanceGetInfo", unsafe {
            self.lib().nvmlGpuInstanceGetInfo(gi, &mut info)
        })?;
        Ok(GiInfo {
            id: info.id,
            profile_id: info.profileId,
            placement: Placement {
                start: info.placement.start,
                size: info.placement.size,
            },
        })
    }

    fn ci_info_of(&self, ci: nvmlComputeInstance_t) -> NvmlResult<CiInfo> {
        // SAFETY: plain C struct; all-zero is a valid value.
        let mut info: nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
        // SAFETY: valid CI handle and out-pointer.
        check("nvmlComputeInstanceGetInfo_v2", unsafe {
            self.lib().nvmlComputeInstanceGetInfo_v2(ci, &mut info)
        })?;
        Ok(CiInfo {
            id: info.id,
            profile_id: info.profileId,
        })
    }

    fn architecture(&self, d: nvmlDevice_t) -> NvmlResult<u32> {
        let mut arch = 0;
        // SAFETY: valid device handle and out-pointer.
        check("nvmlDeviceGetArchitecture", unsafe {
            self.lib().nvmlDeviceGetArchitecture(d, &mut arch)
        })?;
        Ok(arch)
    }
}

/// `NVML_SUCCESS` or the error of `call`.
fn check(call: &'static str, ret: nvmlReturn_t) -> NvmlResult<()> {
    if ret == code::SUCCESS {
        Ok(())
    } else {
        Err(NvmlCallError::new(call, ret))
    }
}

/// A wrapper error as the NVML code it came from (non-NVML failures become `UNKNOWN`).
fn wrapper_error(call: &'static str, e: NvmlError) -> NvmlCallError {
    NvmlCallError::new(call, nvmlReturn_t::from(e))
}

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`: `sizeof | 2 << 24` (`nvml.h`).
fn gi_profile_info_v2_version() -> u32 {
    mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24)
}

fn c_name(name: &[std::os::raw::c_char]) -> String {
    // SAFETY: NVML NUL-terminates the name within the array; the slice bounds the read anyway.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(name.as_ptr().cast(), name.len()) };
    CStr::from_bytes_until_nul(bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl NvmlApi for RealNvml {
    fn device_count(&self) -> NvmlResult<u32> {
        Ok(self.devices.len() as u32)
    }

    fn driver_version(&self) -> NvmlResult<String> {
        self.nvml
            .sys_driver_version()
            .map_err(|e| wrapper_error("nvmlSystemGetDriverVersion", e))
    }

    fn cuda_driver_version(&self) -> NvmlResult<i32> {
        self.nvml
            .sys_cuda_driver_version()
            .map_err(|e| wrapper_error("nvmlSystemGetCudaDriverVersion_v2", e))
    }

    fn brand(&self, dev: u32) -> NvmlResult<u32> {
        self.device(dev)?
            .brand()
            .map(|b| b.as_c())
            .map_err(|e| wrapper_error("nvmlDeviceGetBrand", e))
    }

    fn device_identity(&self, dev: u32) -> NvmlResult<DeviceIdentity> {
        let d = self.device(dev)?;
        let pci = d
            .pci_info()
            .map_err(|e| wrapper_error("nvmlDeviceGetPciInfo_v3", e))?;
        let cc = d
            .cuda_compute_capability()
            .map_err(|e| wrapper_error("nvmlDeviceGetCudaComputeCapability", e))?;
        Ok(DeviceIdentity {
            name: d
                .name()
                .map_err(|e| wrapper_error("nvmlDeviceGetName", e))?,
            uuid: d
                .uuid()
                .map_err(|e| wrapper_error("nvmlDeviceGetUUID", e))?,
            minor: d
                .minor_number()
                .map_err(|e| wrapper_error("nvmlDeviceGetMinorNumber", e))?,
            pci_device_id: pci.pci_device_id,
            pci_subsystem_id: pci.pci_sub_system_id.unwrap_or(0),
            pci_bus_id: pci.bus_id,
            memory_mib: d
                .memory_info()
                .map_err(|e| wrapper_error("nvmlDeviceGetMemoryInfo", e))?
                .total
                / (1024 * 1024),
            architecture: self.architecture(self.raw(dev)?)?,
            cuda_compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
        })
    }

    fn mig_mode(&self, dev: u32) -> NvmlResult<MigModeState> {
        let m = self
            .device(dev)?
            .mig_mode()
            .map_err(|e| wrapper_error("nvmlDeviceGetMigMode", e))?;
        Ok(MigModeState {
            current: m.current == 1,
            pending: m.pending == 1,
        })
    }

    fn set_mig_mode(&self, dev: u32, enable: bool) -> NvmlResult<()> {
        const CALL: &str = "nvmlDeviceSetMigMode";
        let status = self
            .device(dev)?
            .set_mig_mode(enable)
            .map_err(|e| wrapper_error(CALL, e))?;
        // The activation status: NVML_SUCCESS once the mode is active, else why it is pending.
        check(CALL, status)
    }

    fn virtualization_mode(&self, dev: u32) -> NvmlResult<u32> {
        let d = self.raw(dev)?;
        let mut mode = 0;
        // SAFETY: valid device handle and out-pointer (`nvmlGpuVirtualizationMode_t` is a C
        // enum, a `c_uint`).
        check("nvmlDeviceGetVirtualizationMode", unsafe {
            self.lib().nvmlDeviceGetVirtualizationMode(d, &mut mode)
        })?;
        Ok(mode)
    }

    fn gi_profile_info(&self, dev: u32, profile_enum: u32) -> NvmlResult<GiProfileInfo> {
        let d = self.raw(dev)?;
        // SAFETY: plain C struct; all-zero is a valid value.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = gi_profile_info_v2_version();
        // SAFETY: valid device handle; `info` carries its version as NVML requires.
        check("nvmlDeviceGetGpuInstanceProfileInfoV", unsafe {
            self.lib()
                .nvmlDeviceGetGpuInstanceProfileInfoV(d, profile_enum, &mut info)
        })?;
        Ok(GiProfileInfo {
            id: info.id,
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            multiprocessors: info.multiprocessorCount,
            copy_engines: info.copyEngineCount,
            decoders: info.decoderCount,
            encoders: info.encoderCount,
            jpeg_engines: info.jpegCount,
            ofa_engines: info.ofaCount,
            memory_mib: info.memorySizeMB,
            name: c_name(&info.name),
        })
    }

    fn gi_possible_placements(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<Placement>> {
        const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let d = self.raw(dev)?;
        let mut count = 0;
        // SAFETY: a NULL buffer asks for the count only (`nvml.h`).
        check(CALL, unsafe {
            self.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                d,
                profile_id,
                ptr::null_mut(),
                &mut count,
            )
        })?;
        let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        // SAFETY: `buf` holds `count` placements.
        check(CALL, unsafe {
            self.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                d,
                profile_id,
                buf.as_mut_ptr(),
                &mut count,
            )
        })?;
        buf.truncate(count as usize);
        Ok(buf
            .into_iter()
            .map(|p| Placement {
                start: p.start,
                size: p.size,
            })
            .collect())
    }

    fn create_gi(&self, dev: u32, profile_id: u32, placement: Placement) -> NvmlResult<GiInfo> {
        let d = self.raw(dev)?;
        let pl = nvmlGpuInstancePlacement_t {
            start: placement.start,
            size: placement.size,
        };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle, placement and out-pointer.
        check("nvmlDeviceCreateGpuInstanceWithPlacement", unsafe {
            self.lib()
                .nvmlDeviceCreateGpuInstanceWithPlacement(d, profile_id, &pl, &mut gi)
        })?;
        self.gi_info_of(gi)
    }

    fn gpu_instances(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<GiInfo>> {
        let d = self.raw(dev)?;
        let mut buf: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); INSTANCE_BUFFER];
        let mut count = INSTANCE_BUFFER as u32;
        // SAFETY: `buf` has room for more instances than any profile allows.
        check("nvmlDeviceGetGpuInstances", unsafe {
            self.lib()
                .nvmlDeviceGetGpuInstances(d, profile_id, buf.as_mut_ptr(), &mut count)
        })?;
        buf.truncate(count as usize);
        buf.into_iter().map(|gi| self.gi_info_of(gi)).collect()
    }

    fn destroy_gi(&self, dev: u32, gi_id: u32) -> NvmlResult<()> {
        let gi = self.gi_handle(dev, gi_id)?;
        // SAFETY: valid GI handle, not used after this call.
        check("nvmlGpuInstanceDestroy", unsafe {
            self.lib().nvmlGpuInstanceDestroy(gi)
        })
    }

    fn ci_profile_info(
        &self,
        dev: u32,
        gi_id: u32,
        profile_enum: u32,
    ) -> NvmlResult<CiProfileInfo> {
        let gi = self.gi_handle(dev, gi_id)?;
        // SAFETY: plain C struct; all-zero is a valid value.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: valid GI handle and out-pointer.
        check("nvmlGpuInstanceGetComputeInstanceProfileInfo", unsafe {
            self.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                profile_enum,
                ENGINE_PROFILE_SHARED,
                &mut info,
            )
        })?;
        Ok(CiProfileInfo {
            id: info.id,
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            multiprocessors: info.multiprocessorCount,
        })
    }

    fn create_ci(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<CiInfo> {
        let gi = self.gi_handle(dev, gi_id)?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: valid GI handle and out-pointer.
        check("nvmlGpuInstanceCreateComputeInstance", unsafe {
            self.lib()
                .nvmlGpuInstanceCreateComputeInstance(gi, profile_id, &mut ci)
        })?;
        self.ci_info_of(ci)
    }

    fn compute_instances(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<Vec<CiInfo>> {
        let gi = self.gi_handle(dev, gi_id)?;
        let mut buf: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); INSTANCE_BUFFER];
        let mut count = INSTANCE_BUFFER as u32;
        // SAFETY: `buf` has room for more CIs than a GI can hold.
        check("nvmlGpuInstanceGetComputeInstances", unsafe {
            self.lib().nvmlGpuInstanceGetComputeInstances(
                gi,
                profile_id,
                buf.as_mut_ptr(),
                &mut count,
            )
        })?;
        buf.truncate(count as usize);
        buf.into_iter().map(|ci| self.ci_info_of(ci)).collect()
    }

    fn destroy_ci(&self, dev: u32, gi_id: u32, ci_id: u32) -> NvmlResult<()> {
        let ci = self.ci_handle(dev, gi_id, ci_id)?;
        // SAFETY: valid CI handle, not used after this call.
        check("nvmlComputeInstanceDestroy", unsafe {
            self.lib().nvmlComputeInstanceDestroy(ci)
        })
    }

    fn max_mig_device_count(&self, dev: u32) -> NvmlResult<u32> {
        self.device(dev)?
            .mig_device_count()
            .map_err(|e| wrapper_error("nvmlDeviceGetMaxMigDeviceCount", e))
    }

    fn mig_device(&self, dev: u32, index: u32) -> NvmlResult<MigDeviceInfo> {
        let mig = self
            .device(dev)?
            .mig_device_by_index(index)
            .map_err(|e| wrapper_error("nvmlDeviceGetMigDeviceHandleByIndex", e))?;
        // SAFETY: the MIG handle is valid while NVML is initialised.
        let h = unsafe { mig.handle() };
        let (mut gi_id, mut ci_id) = (0, 0);
        // SAFETY: valid MIG device handle and out-pointers.
        check("nvmlDeviceGetGpuInstanceId", unsafe {
            self.lib().nvmlDeviceGetGpuInstanceId(h, &mut gi_id)
        })?;
        // SAFETY: as above.
        check("nvmlDeviceGetComputeInstanceId", unsafe {
            self.lib().nvmlDeviceGetComputeInstanceId(h, &mut ci_id)
        })?;
        Ok(MigDeviceInfo {
            gi_id,
            ci_id,
            uuid: mig
                .uuid()
                .map_err(|e| wrapper_error("nvmlDeviceGetUUID", e))?,
        })
    }

    fn register_events(&self, dev: u32, mask: u64) -> NvmlResult<()> {
        let set = self.event_set()?;
        let d = self.raw(dev)?;
        // SAFETY: valid device handle and event set.
        check("nvmlDeviceRegisterEvents", unsafe {
            self.lib().nvmlDeviceRegisterEvents(d, mask, set)
        })
    }

    fn wait_event(&self, timeout_ms: u32) -> NvmlResult<RawEvent> {
        let set = self.event_set()?;
        // SAFETY: an all-zero `nvmlEventData_t` is valid (a null handle and zeros).
        let mut data: nvmlEventData_t = unsafe { mem::zeroed() };
        // SAFETY: valid event set and out-pointer.
        check("nvmlEventSetWait_v2", unsafe {
            self.lib().nvmlEventSetWait_v2(set, &mut data, timeout_ms)
        })?;
        let dev = self
            .devices
            .iter()
            .position(|d| matches!(d, Ok(h) if h.0 == data.device))
            .map(|i| i as u32);
        Ok(RawEvent {
            dev,
            event_type: data.eventType,
            data: data.eventData,
            gpu_instance: Some(data.gpuInstanceId).filter(|&id| id != NO_INSTANCE),
        })
    }
}
