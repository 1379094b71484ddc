//! The NVML backend for real GPUs: carves MIG instances at exact placements, finds their
//! MIG UUIDs and capability device minors, destroys them compute instance first, and lists what
//! exists.
//!
//! Layers:
//! - [`NvmlApi`]: a thin function table with exactly the NVML calls the backend needs. The real
//!   implementation is [`RealNvml`] (nvml-wrapper 0.13 where it covers the call, its raw
//!   `nvml-wrapper-sys` bindings where it does not, docs/reference/mig.md, "nvml-wrapper coverage"); the unit tests drive the
//!   backend with `FakeNvml` (compiled for tests and the `testing` feature, which the
//!   `nvml_inventory` benchmark uses), which reproduces NVML's return codes and placement rules from the
//!   same data files as the emulated backend.
//! - [`NvmlBackend`]: [`GpuBackend`](super::GpuBackend) with NVML semantics (docs/reference/mig.md, "Create and destroy"),
//!   in `backend/`: the backend and its error mapping (`mod.rs`), the start-up inventory and
//!   models (`discover.rs`), instance create, destroy and list (`instances.rs`), the instance
//!   cache (`cache.rs`) and health events (`events.rs`).
//! - `FakeNvml` in `fake/`: its state and test controls (`mod.rs`), one GPU's hardware state and
//!   rules (`gpu.rs`), and the [`NvmlApi`] calls (`api.rs`).
//! - [`procfs`]: the `nvidia-caps` major and the GI/CI capability minors (docs/reference/mig.md, "Device nodes and capabilities").
//! - [`inventory_report`]: the read-only `das-kubelet-plugin --print-inventory` text.
//!
//! Objects are addressed by IDs (GPU index, GI ID, CI ID) rather than NVML handles, so the fake
//! needs no pointers; the real implementation looks handles up by ID (`…GetGpuInstanceById`,
//! `…GetComputeInstanceById`), which NVML answers from the driver without a scan.

mod backend;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod fake;
pub mod procfs;
mod real;
mod report;

#[cfg(test)]
mod switch_tests;
#[cfg(test)]
mod tests;

use std::fmt;

pub use backend::{
    Clock, INSTANCE_REFRESH, NvmlBackend, NvmlOptions, model_from_nvml, model_without_mig,
};
#[cfg(any(test, feature = "testing"))]
pub use fake::{FakeGpuSpec, FakeNvml};
pub use real::RealNvml;
pub use report::inventory_report;

use super::layout::Placement;

/// NVML return codes the backend distinguishes (`nvmlReturn_t`, `nvml.h` 13.3).
pub mod code {
    /// `NVML_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `NVML_ERROR_UNINITIALIZED`.
    pub(crate) const UNINITIALIZED: u32 = 1;
    /// `NVML_ERROR_INVALID_ARGUMENT`: bad profile, placement not in the list, enum ≥ COUNT.
    pub(crate) const INVALID_ARGUMENT: u32 = 2;
    /// `NVML_ERROR_NOT_SUPPORTED`: not MIG-capable, MIG mode off, profile not on this GPU.
    pub(crate) const NOT_SUPPORTED: u32 = 3;
    /// `NVML_ERROR_NO_PERMISSION`: MIG management needs root / `CAP_SYS_ADMIN`.
    pub(crate) const NO_PERMISSION: u32 = 4;
    /// `NVML_ERROR_NOT_FOUND`: no such GI / CI; an empty MIG device slot.
    pub const NOT_FOUND: u32 = 6;
    /// `NVML_ERROR_INSUFFICIENT_SIZE`.
    pub(crate) const INSUFFICIENT_SIZE: u32 = 7;
    /// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus or needs a reset.
    pub(crate) const GPU_IS_LOST: u32 = 15;
    /// `NVML_ERROR_TIMEOUT`: `nvmlEventSetWait_v2` saw no event in time.
    pub const TIMEOUT: u32 = 10;
    /// `NVML_ERROR_RESET_REQUIRED`: MIG mode change pending until a GPU reset (Ampere).
    pub const RESET_REQUIRED: u32 = 16;
    /// `NVML_ERROR_IN_USE`: processes or compute instances still use the instance.
    pub const IN_USE: u32 = 19;
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`: placement occupied, profile count or `+me` limit.
    pub(crate) const INSUFFICIENT_RESOURCES: u32 = 23;
    /// `NVML_ERROR_UNKNOWN`.
    pub const UNKNOWN: u32 = 999;

    /// The `NVML_*` name of a return code, for messages.
    pub fn name(code: u32) -> &'static str {
        match code {
            SUCCESS => "NVML_SUCCESS",
            UNINITIALIZED => "NVML_ERROR_UNINITIALIZED",
            INVALID_ARGUMENT => "NVML_ERROR_INVALID_ARGUMENT",
            NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED",
            NO_PERMISSION => "NVML_ERROR_NO_PERMISSION",
            NOT_FOUND => "NVML_ERROR_NOT_FOUND",
            INSUFFICIENT_SIZE => "NVML_ERROR_INSUFFICIENT_SIZE",
            GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
            RESET_REQUIRED => "NVML_ERROR_RESET_REQUIRED",
            IN_USE => "NVML_ERROR_IN_USE",
            INSUFFICIENT_RESOURCES => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            _ => "NVML_ERROR_UNKNOWN",
        }
    }
}

/// A failed NVML call: the return code and the function that returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlCallError {
    /// `nvmlReturn_t` value (see [`code`]).
    pub code: u32,
    /// The NVML function, e.g. `nvmlDeviceCreateGpuInstanceWithPlacement`.
    pub call: &'static str,
}

impl NvmlCallError {
    /// An error `code` from `call`.
    pub fn new(call: &'static str, code: u32) -> Self {
        Self { code, call }
    }
}

impl fmt::Display for NvmlCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            code::name(self.code),
            self.code
        )
    }
}

impl std::error::Error for NvmlCallError {}

/// Result of one NVML call.
pub(crate) type NvmlResult<T> = Result<T, NvmlCallError>;

/// `NVML_DEVICE_ARCH_HOPPER` (`nvml.h`): Hopper and newer switch MIG mode without a GPU reset.
pub(crate) const ARCH_HOPPER: u32 = 9;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in nvml-wrapper-sys 0.10 (17; 0x12 in NVML 13.3, whose
/// extra enum `3_SLICE_GFX` no data-center GPU supports; docs/reference/mig.md, "Profile IDs").
pub(crate) const GI_PROFILE_ENUM_COUNT: u32 = 17;

/// CI profile enums `0..CI_PROFILE_ENUM_COUNT` (`1_SLICE` … `7_SLICE_NVL`, docs/reference/mig.md, "Compute instances").
pub(crate) const CI_PROFILE_ENUM_COUNT: u32 = 9;

/// The name NVIDIA's DRA driver publishes as `brand` for an `nvmlBrandType_t` value (go-nvlib
/// `GetBrandAsString`, whose names are the `NVML_BRAND_*` enum's in camel case; `nvml.h` 13.3
/// values); `None` for a value it has no name for.
pub(crate) fn brand_name(brand: u32) -> Option<&'static str> {
    const NAMES: [&str; 17] = [
        "Unknown",           // NVML_BRAND_UNKNOWN
        "Quadro",            // NVML_BRAND_QUADRO
        "Tesla",             // NVML_BRAND_TESLA
        "NVS",               // NVML_BRAND_NVS
        "Grid",              // NVML_BRAND_GRID
        "GeForce",           // NVML_BRAND_GEFORCE
        "Titan",             // NVML_BRAND_TITAN
        "NvidiaVApps",       // NVML_BRAND_NVIDIA_VAPPS
        "NvidiaVPC",         // NVML_BRAND_NVIDIA_VPC
        "NvidiaVCS",         // NVML_BRAND_NVIDIA_VCS
        "NvidiaVWS",         // NVML_BRAND_NVIDIA_VWS
        "NvidiaCloudGaming", // NVML_BRAND_NVIDIA_CLOUD_GAMING (= the old VGAMING)
        "QuadroRTX",         // NVML_BRAND_QUADRO_RTX
        "NvidiaRTX",         // NVML_BRAND_NVIDIA_RTX
        "Nvidia",            // NVML_BRAND_NVIDIA: what data-center GPUs report
        "GeForceRTX",        // NVML_BRAND_GEFORCE_RTX
        "TitanRTX",          // NVML_BRAND_TITAN_RTX
    ];
    NAMES.get(brand as usize).copied()
}

/// `nvmlSystemGetCudaDriverVersion_v2`'s number as NVIDIA's DRA driver writes it before making
/// it a semantic version: `<major>.<minor>` (`12090` → `12.9`, `13000` → `13.0`).
pub(crate) fn cuda_version(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// What identifies a GPU: `nvmlDeviceGetName`, `…GetUUID`, `…GetMinorNumber`, `…GetPciInfo`,
/// `…GetMemoryInfo`, `…GetArchitecture`, `…GetCudaComputeCapability`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIdentity {
    /// Product name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub name: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `pciDeviceId`: `0xDDDDVVVV` (device ID, vendor ID).
    pub pci_device_id: u32,
    /// `pciSubSystemId`: `0xSSSSVVVV` (subsystem device ID, subsystem vendor ID); 0 when NVML
    /// does not fill it. Tells apart products that share a device ID (A2 and A16).
    pub pci_subsystem_id: u32,
    /// PCI bus ID, e.g. `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Total memory (MiB).
    pub memory_mib: u64,
    /// `NVML_DEVICE_ARCH_*` (6 Turing, 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell;
    /// [`architecture_name`]).
    pub architecture: u32,
    /// CUDA compute capability `(major, minor)`.
    pub cuda_compute_capability: (u32, u32),
}

/// `nvmlDeviceGetMigMode`'s answer: current and pending mode.
pub use crate::gpu::MigModeState;

/// `nvmlGpuInstanceProfileInfo_v2_t` (from `nvmlDeviceGetGpuInstanceProfileInfoV`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiProfileInfo {
    /// The *real* profile ID (19, 20, 15, … on 8-instance GPUs), not the enum (docs/reference/mig.md, "Profile IDs").
    pub id: u32,
    /// Compute (SM) instances.
    pub slice_count: u32,
    /// Most instances of the profile.
    pub instance_count: u32,
    /// SMs.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// NVDEC.
    pub decoders: u32,
    /// NVENC.
    pub encoders: u32,
    /// NVJPG.
    pub jpeg_engines: u32,
    /// OFA.
    pub ofa_engines: u32,
    /// `memorySizeMB` (MiB).
    pub memory_mib: u64,
    /// The driver's name, e.g. `MIG 1g.10gb` (see [`GiProfileInfo::short_name`]).
    pub name: String,
}

impl GiProfileInfo {
    /// The name without NVML's `MIG ` prefix, as nvidia-smi prints it (`1g.10gb+me`).
    pub(crate) fn short_name(&self) -> &str {
        self.name.strip_prefix("MIG ").unwrap_or(&self.name)
    }
}

/// `nvmlGpuInstanceInfo_t` (from `nvmlGpuInstanceGetInfo`), without the device handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiInfo {
    /// GI ID, assigned by the driver (0–14).
    pub id: u32,
    /// Real GI profile ID.
    pub profile_id: u32,
    /// Memory instances occupied.
    pub placement: Placement,
}

/// `nvmlComputeInstanceProfileInfo_t` (from `nvmlGpuInstanceGetComputeInstanceProfileInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiProfileInfo {
    /// CI profile ID (equals the enum, docs/reference/mig.md, "Compute instances").
    pub id: u32,
    /// Compute instances of the CI.
    pub slice_count: u32,
    /// Most CIs of this profile in the GI.
    pub instance_count: u32,
    /// SMs.
    pub multiprocessors: u32,
}

/// `nvmlComputeInstanceInfo_t` (from `nvmlComputeInstanceGetInfo_v2`), without the handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiInfo {
    /// CI ID inside its GI (0–7).
    pub id: u32,
    /// CI profile ID.
    pub profile_id: u32,
}

/// One MIG device handle's identity: `nvmlDeviceGetMigDeviceHandleByIndex` then
/// `nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId` and `nvmlDeviceGetUUID` on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDeviceInfo {
    /// GI ID.
    pub gi_id: u32,
    /// CI ID.
    pub ci_id: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
}

/// The NVML calls the backend makes (docs/reference/mig.md, "Create and destroy"), by GPU index, GI ID and CI ID.
///
/// Every method blocks; implementations must be callable from several threads (NVML is
/// thread-safe).
pub trait NvmlApi: Send + Sync {
    /// `nvmlDeviceGetCount_v2`.
    fn device_count(&self) -> NvmlResult<u32>;
    /// `nvmlSystemGetDriverVersion`.
    fn driver_version(&self) -> NvmlResult<String>;
    /// `nvmlSystemGetCudaDriverVersion_v2`: the newest CUDA version the driver supports as
    /// `1000 × major + 10 × minor` (`12090` for 12.9; [`cuda_version`]).
    fn cuda_driver_version(&self) -> NvmlResult<i32>;
    /// Name, UUID, minor, PCI info, memory, architecture and compute capability of GPU `dev`.
    fn device_identity(&self, dev: u32) -> NvmlResult<DeviceIdentity>;
    /// `nvmlDeviceGetBrand`: the `nvmlBrandType_t` value ([`brand_name`]).
    fn brand(&self, dev: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetMigMode`; `NOT_SUPPORTED` on GPUs without MIG.
    fn mig_mode(&self, dev: u32) -> NvmlResult<MigModeState>;
    /// `nvmlDeviceSetMigMode`: called behind `--enable-mig-mode` at start-up and
    /// `--mig-mode-switching` at prepare time, on Hopper and newer only. A call NVML accepts
    /// whose activation status is not `NVML_SUCCESS` (`RESET_REQUIRED`, or `IN_USE` when the
    /// driver could not reset the GPU) fails with that status as its code: the change is then
    /// pending (read [`Self::mig_mode`]).
    fn set_mig_mode(&self, dev: u32, enable: bool) -> NvmlResult<()>;
    /// `nvmlDeviceGetVirtualizationMode`: the `nvmlGpuVirtualizationMode_t` value
    /// ([`virtualization`]); DAS switches no MIG mode in a vGPU guest
    /// ([`virtualization::VGPU`]).
    fn virtualization_mode(&self, dev: u32) -> NvmlResult<u32>;
    /// `nvmlDeviceGetGpuInstanceProfileInfoV` (v2) for the enum `profile_enum`
    /// (`NVML_GPU_INSTANCE_PROFILE_*`); `NOT_SUPPORTED` for profiles the GPU lacks,
    /// `INVALID_ARGUMENT` past the last enum.
    fn gi_profile_info(&self, dev: u32, profile_enum: u32) -> NvmlResult<GiProfileInfo>;
    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for the real `profile_id` (raw: the
    /// wrapper's version always returns an empty list, docs/reference/mig.md, "nvml-wrapper coverage").
    fn gi_possible_placements(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<Placement>>;
    /// `nvmlDeviceCreateGpuInstanceWithPlacement`, then `nvmlGpuInstanceGetInfo` on the result.
    fn create_gi(&self, dev: u32, profile_id: u32, placement: Placement) -> NvmlResult<GiInfo>;
    /// `nvmlDeviceGetGpuInstances` for `profile_id`, then `nvmlGpuInstanceGetInfo` on each.
    fn gpu_instances(&self, dev: u32, profile_id: u32) -> NvmlResult<Vec<GiInfo>>;
    /// `nvmlDeviceGetGpuInstanceById` + `nvmlGpuInstanceDestroy`; `IN_USE` while it holds CIs or
    /// processes.
    fn destroy_gi(&self, dev: u32, gi_id: u32) -> NvmlResult<()>;
    /// `nvmlGpuInstanceGetComputeInstanceProfileInfo` (engine profile `SHARED`) for the CI enum.
    fn ci_profile_info(&self, dev: u32, gi_id: u32, profile_enum: u32)
    -> NvmlResult<CiProfileInfo>;
    /// `nvmlGpuInstanceCreateComputeInstance`, then `nvmlComputeInstanceGetInfo_v2`.
    fn create_ci(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<CiInfo>;
    /// `nvmlGpuInstanceGetComputeInstances` for `profile_id`, then `…GetInfo_v2` on each.
    fn compute_instances(&self, dev: u32, gi_id: u32, profile_id: u32) -> NvmlResult<Vec<CiInfo>>;
    /// `nvmlGpuInstanceGetComputeInstanceById` + `nvmlComputeInstanceDestroy`.
    fn destroy_ci(&self, dev: u32, gi_id: u32, ci_id: u32) -> NvmlResult<()>;
    /// `nvmlDeviceGetMaxMigDeviceCount` (the most MIG devices, not the current count).
    fn max_mig_device_count(&self, dev: u32) -> NvmlResult<u32>;
    /// The MIG device at slot `index`; `NOT_FOUND` for an empty slot.
    fn mig_device(&self, dev: u32, index: u32) -> NvmlResult<MigDeviceInfo>;
    /// `nvmlDeviceRegisterEvents` of the event types in `mask` ([`event`]) for GPU `dev` on the
    /// backend's one event set (created by `nvmlEventSetCreate` on first use);
    /// `NOT_SUPPORTED` when the GPU lacks a type.
    fn register_events(&self, dev: u32, mask: u64) -> NvmlResult<()>;
    /// `nvmlEventSetWait_v2` for at most `timeout_ms`; `TIMEOUT` when no event came.
    fn wait_event(&self, timeout_ms: u32) -> NvmlResult<RawEvent>;
}

/// `nvmlGpuVirtualizationMode_t` values (`nvml.h` 13.3), what
/// `nvmlDeviceGetVirtualizationMode` reports.
pub mod virtualization {
    /// `NVML_GPU_VIRTUALIZATION_MODE_NONE`: bare metal.
    pub const NONE: u32 = 0;
    /// `NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH`: a GPU passed through to a VM.
    pub const PASSTHROUGH: u32 = 1;
    /// `NVML_GPU_VIRTUALIZATION_MODE_VGPU`: a vGPU inside a VM (a guest); its MIG mode is the
    /// host's business (NVIDIA's DRA driver switches none there).
    pub(crate) const VGPU: u32 = 2;
    /// `NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU`: a vGPU host.
    pub const HOST_VGPU: u32 = 3;
    /// `NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA`: a vSGA host.
    pub const HOST_VSGA: u32 = 4;

    /// The `NVML_GPU_VIRTUALIZATION_MODE_*` name of a value, for messages.
    pub fn name(mode: u32) -> &'static str {
        match mode {
            NONE => "NONE",
            PASSTHROUGH => "PASSTHROUGH",
            VGPU => "VGPU",
            HOST_VGPU => "HOST_VGPU",
            HOST_VSGA => "HOST_VSGA",
            _ => "unknown",
        }
    }
}

/// NVML event types (`nvmlEventType*` in `nvml.h`) the health monitor registers.
pub mod event {
    /// `nvmlEventTypeDoubleBitEccError`: an uncorrectable ECC error.
    pub(crate) const DOUBLE_BIT_ECC_ERROR: u64 = 0x2;
    /// `nvmlEventTypeXidCriticalError`: an XID error; the event's data is the XID.
    pub const XID_CRITICAL_ERROR: u64 = 0x8;
}

/// One event from `nvmlEventSetWait_v2` (`nvmlEventData_t`), its device resolved to an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// Index of the GPU the event is about; `None` when the handle matches no GPU of ours.
    pub dev: Option<u32>,
    /// `eventType`: one of [`event`].
    pub event_type: u64,
    /// `eventData`: the XID for [`event::XID_CRITICAL_ERROR`] (999 when unknown).
    pub data: u64,
    /// `gpuInstanceId`, when the driver attributes the event to one GPU instance.
    pub gpu_instance: Option<u32>,
}

/// `NVML_GPU_INSTANCE_PROFILE_*` enum names by value (docs/reference/mig.md, "Profile IDs").
pub(crate) const GI_ENUM_NAMES: [&str; GI_PROFILE_ENUM_COUNT as usize] = [
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_8_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_6_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME",
];

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` enum names and their compute instances, by value (docs/reference/mig.md, "Compute instances").
pub(crate) const CI_ENUMS: [(&str, u32); CI_PROFILE_ENUM_COUNT as usize] = [
    ("NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE", 1),
    ("NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE", 2),
    ("NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE", 3),
    ("NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE", 4),
    ("NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE", 7),
    ("NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE", 8),
    ("NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE", 6),
    ("NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1", 1),
    ("NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL", 7),
];

/// The full-size CI enum for a GI of `instances` compute instances (`1_SLICE`…`8_SLICE`), by instance
/// count, never by the GI enum (docs/reference/mig.md, "Compute instances").
pub(crate) fn full_ci_enum(slices: u32) -> Option<u32> {
    CI_ENUMS
        .iter()
        .position(|(_, s)| *s == slices)
        .map(|i| i as u32)
}

/// `NVML_DEVICE_ARCH_*` (`nvml.h` 13.3: 2 Kepler … 10 Blackwell) as NVIDIA's DRA driver names
/// it in `architecture` (go-nvlib `GetArchitectureAsString`: `Ada Lovelace` for `ADA`); any
/// other value is `Unknown`, as `NVML_DEVICE_ARCH_UNKNOWN` is.
pub(crate) fn architecture_name(arch: u32) -> &'static str {
    match arch {
        2 => "Kepler",
        3 => "Maxwell",
        4 => "Pascal",
        5 => "Volta",
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada Lovelace",
        9 => "Hopper",
        10 => "Blackwell",
        _ => "Unknown",
    }
}
