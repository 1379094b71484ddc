//! GPUs: the backend trait that creates, lists and destroys MIG instances ([`GpuBackend`], this
//! module, with [`GpuInfo`], [`MigInstance`] and [`BackendError`]), and
//!
//! - [`model`]: the types of a GPU model's MIG profile and placement tables;
//! - [`catalog`]: the built-in models, loaded from `driver/data/gpus/*.toml`;
//! - [`layout`]: what occupies one GPU and whether another placement fits (hardware and counter
//!   rules);
//! - [`emulated`]: the emulated backend (GPUs from the data files, state on disk, faults from a
//!   control file);
//! - [`nvml`]: the NVML backend for real GPUs;
//! - [`pci`]: a GPU's standard PCI bus ID and its PCIe root complex (from sysfs);
//! - [`calls`]: [`GpuCalls`], the backend with where its blocking calls run and a lock per GPU;
//! - [`memory_limits`]: whether the kernel (cgroup v2 `dmem`) can cap a GPU's memory per
//!   container ([`memory_limits::gpu_memory_enforcement`]);
//! - [`time_slice`]: [`TimeSlicer`], which sets a whole GPU's compute time slice (NVIDIA's
//!   `nvidia-smi compute-policy`, or the emulated backend).
//!
//! Facts come from docs/reference/mig.md; the contract from docs/design.md §3 and §7.

pub(crate) mod calls;
pub mod catalog;
pub mod emulated;
pub(crate) mod layout;
pub mod memory_limits;
pub(crate) mod model;
pub mod nvml;
pub mod pci;
pub mod time_slice;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use calls::GpuCalls;
pub use catalog::{
    ModelError, builtin_models, find_model, find_model_for_gpu, model_list, model_names,
};
pub use emulated::{
    EmulatedBackend, EmulatedError, EmulatedGpuSpec, FaultKind, Latency, parse_emulated_spec,
};
pub use layout::{Conflict, Occupancy, Placement};
pub use model::{CiProfile, GiProfile, GpuModel, ResourceAmounts};
pub use nvml::{INSTANCE_REFRESH, NvmlApi, NvmlBackend, NvmlOptions, RealNvml};
pub use time_slice::TimeSlicer;

/// One physical GPU as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Index on the node (`nvidia-smi -i`), used in device and counter-set names.
    pub index: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// The model's profile and placement tables (none for a GPU without MIG,
    /// [`GpuModel::mig`]).
    pub model: Arc<GpuModel>,
    /// Product name as NVML reports it (published as `productName`).
    pub product_name: String,
    /// Device minor number: `/dev/nvidia<minor>`, and `N` in the capability minors formula.
    pub minor: u32,
    /// PCI bus ID in the standard form (`0000:3b:00.0`, [`pci::standard_bus_id`]) where known;
    /// published as `resource.kubernetes.io/pciBusID`.
    pub pci_bus_id: Option<String>,
    /// PCIe root complex (`pci0000:3a`, [`pci::pcie_root`]) where known; published as
    /// `resource.kubernetes.io/pcieRoot`.
    pub pcie_root: Option<String>,
    /// NUMA node of the GPU's PCI device (sysfs `numa_node`, [`pci::numa_node`]) where sysfs
    /// tells one (not -1); published as `resource.kubernetes.io/numaNode`.
    pub numa_node: Option<u32>,
    /// Total memory (MiB): NVML's (`nvmlDeviceGetMemoryInfo`) on real GPUs, where ECC may
    /// reserve part of the board's memory; the model's on emulated GPUs. A GPU without MIG
    /// publishes it as its whole GPU's `memory` (a MIG-capable one publishes the model's).
    pub memory_mib: u64,
    /// Brand as NVIDIA's DRA driver names it (`Nvidia`, `Tesla`, …, [`nvml::brand_name`]) where
    /// known; published as `brand`.
    pub brand: Option<String>,
    /// NVIDIA driver version as NVML reports it, e.g. `580.95.05`.
    pub driver_version: String,
    /// Newest CUDA version the driver supports, `<major>.<minor>` (`13.0`,
    /// [`nvml::cuda_version`]) where known; published as `cudaDriverVersion`.
    pub cuda_driver_version: Option<String>,
    /// Whether MIG mode is on now (as read when the inventory was taken; at start-up after
    /// `--enable-mig-mode` switched it on where it could). A GPU with MIG mode off is in the
    /// inventory only with `--whole-gpus` ([`Self::served`]).
    pub mig_enabled: bool,
    /// Whether DAS may switch this GPU's MIG mode to follow demand ([`MigSwitch`]).
    pub mig_switch: MigSwitch,
}

/// Whether DAS may switch a GPU's MIG mode to follow demand (docs/design.md §7, "MIG mode
/// follows demand"): on before the GPU's first MIG slice, off for a whole-GPU claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigSwitch {
    /// `--mig-mode-switching` is on and the GPU switches without a reset: Hopper or newer
    /// (NVIDIA's DRA driver's `supportsMIGModeToggle`), its model not known to need a reset, not
    /// a vGPU guest (`nvmlDeviceGetVirtualizationMode`), and no mode change pending a reset
    /// (`nvmlDeviceGetMigMode`'s pending equals its current mode).
    Allowed,
    /// The GPU keeps the mode it has; why, for logs and errors (e.g. "Ampere: a MIG mode change
    /// needs a GPU reset", "--mig-mode-switching is off").
    Refused(String),
}

impl MigSwitch {
    /// Refused because `--mig-mode-switching` is off (the default).
    pub fn off() -> Self {
        MigSwitch::Refused(
            "MIG mode switching is off (--mig-mode-switching, chart wholeGpus.switchMigMode)"
                .into(),
        )
    }

    /// Refused because the GPU has no MIG (a T4, an L4: [`GpuModel::mig`] is false).
    pub(crate) fn no_mig() -> Self {
        MigSwitch::Refused("the GPU has no MIG".into())
    }

    /// What a GPU of `model` reports while switching is off: [`Self::off`], or
    /// [`Self::no_mig`] for a model without MIG.
    pub fn base(model: &GpuModel) -> Self {
        if model.mig {
            Self::off()
        } else {
            Self::no_mig()
        }
    }

    /// Whether switching is allowed.
    pub fn allowed(&self) -> bool {
        matches!(self, MigSwitch::Allowed)
    }
}

/// `on` or `off`: a MIG mode as messages, logs and metric labels say it.
pub(crate) fn on_off(mig_enabled: bool) -> &'static str {
    if mig_enabled { "on" } else { "off" }
}

/// A GPU's MIG mode (`nvmlDeviceGetMigMode`): now and after the next GPU reset. They differ when
/// a change waits for a reset (Ampere, a GPU in a VM that cannot be reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigModeState {
    /// MIG mode is on now.
    pub current: bool,
    /// MIG mode after the next GPU reset.
    pub pending: bool,
}

impl GpuInfo {
    /// A GPU of built-in `model` at `index` for unit tests: UUID
    /// `GPU-0000000<index>-0000-0000-0000-000000000000`, minor `index`, MIG mode on (off for a
    /// model without MIG), the model's memory, driver `580.95.05`, no PCI facts. Tests change
    /// fields with struct update syntax.
    #[cfg(test)]
    pub(crate) fn for_tests(index: u32, model: &str) -> Self {
        let model = catalog::find_model(model).unwrap().unwrap();
        GpuInfo {
            index,
            uuid: format!("GPU-0000000{index}-0000-0000-0000-000000000000"),
            product_name: model.product_name.clone(),
            memory_mib: model.memory_mib,
            mig_enabled: model.mig,
            mig_switch: MigSwitch::base(&model),
            model,
            minor: index,
            pci_bus_id: None,
            pcie_root: None,
            numa_node: None,
            brand: None,
            driver_version: "580.95.05".into(),
            cuda_driver_version: None,
        }
    }

    /// Whether DAS offers MIG instances on this GPU: MIG mode is on, or DAS may switch it on
    /// ([`MigSwitch::Allowed`], docs/design.md §7, "MIG mode follows demand").
    pub(crate) fn offers_mig(&self) -> bool {
        self.mig_enabled || self.mig_switch.allowed()
    }

    /// Whether DAS offers this GPU whole (one device `gpu-<index>`, docs/design.md §7, "Whole
    /// GPUs"): MIG mode is off (always for a GPU without MIG), or DAS may switch it off. Such a
    /// GPU is in the inventory only with `--whole-gpus`.
    pub(crate) fn offers_whole_gpu(&self) -> bool {
        !self.mig_enabled || self.mig_switch.allowed()
    }

    /// Whether DAS offers this GPU whole and nothing else (no MIG, or MIG mode off and not
    /// switchable): the placement policy lists such GPUs first (docs/design.md §5).
    pub fn only_whole(&self) -> bool {
        self.offers_whole_gpu() && !self.offers_mig()
    }

    /// The whole GPU's memory (bytes): NVML's total for a GPU without MIG
    /// ([`Self::memory_mib`]), the model's for a MIG-capable one.
    pub(crate) fn whole_gpu_memory_bytes(&self) -> u64 {
        if self.model.mig {
            self.model.memory_bytes()
        } else {
            self.memory_mib * model::MIB
        }
    }

    /// Whether a backend keeps this GPU in its inventory: MIG mode on, or off with `whole_gpus`
    /// (`--whole-gpus`); a GPU with MIG mode off, or without MIG, is skipped without it.
    pub fn served(&self, whole_gpus: bool) -> bool {
        self.mig_enabled || whole_gpus
    }
}

/// A MIG instance: a GPU instance at a placement with one full-size compute instance inside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// Index of the parent GPU on the node.
    pub gpu_index: u32,
    /// UUID of the parent GPU.
    pub gpu_uuid: String,
    /// Minor number of the parent GPU (`/dev/nvidia<minor>`).
    pub gpu_minor: u32,
    /// GI profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// Real GI profile ID, e.g. 19.
    pub profile_id: u32,
    /// Memory instances the GI occupies.
    pub placement: Placement,
    /// GPU-instance ID, assigned by the driver (not derived from the placement).
    pub gi_id: u32,
    /// Compute-instance ID inside the GI.
    pub ci_id: u32,
    /// `MIG-xxxxxxxx-…`; changes on every re-creation.
    pub mig_uuid: String,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<N>` for the GI ([`gi_cap_minor`]).
    pub gi_cap_minor: u32,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<N>` for the CI ([`ci_cap_minor`]).
    pub ci_cap_minor: u32,
    /// Whether DAS created the instance: `Some(true)`/`Some(false)` where the backend can tell (the
    /// emulated one), `None` where it cannot (NVML keeps no owner).
    pub created_by_das: Option<bool>,
}

/// A health event of one GPU, as NVML's event set reports it (`nvmlEventSetWait_v2`, NVML API
/// reference, "Event Handling Methods").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthEvent {
    /// `nvmlEventTypeXidCriticalError`: the driver logged XID `xid` on GPU `gpu`, attributed to
    /// GPU instance `gpu_instance` when the driver names one (MIG). Whether it is fatal is the
    /// health policy's call (`crate::health::xid`).
    Xid {
        /// GPU index.
        gpu: u32,
        /// The XID number.
        xid: u32,
        /// GPU-instance ID (`nvmlEventData_t.gpuInstanceId`) when the event names one; `None`
        /// for an event about the whole GPU (NVML's invalid id `0xFFFFFFFF`).
        gpu_instance: Option<u32>,
    },
    /// `nvmlEventTypeDoubleBitEccError`: an uncorrectable ECC error on GPU `gpu`.
    UncorrectableEcc {
        /// GPU index.
        gpu: u32,
    },
}

impl HealthEvent {
    /// The GPU the event is about.
    pub fn gpu(&self) -> u32 {
        match self {
            HealthEvent::Xid { gpu, .. } | HealthEvent::UncorrectableEcc { gpu } => *gpu,
        }
    }

    /// The GPU instance the event names, if any (only XIDs name one).
    pub fn gpu_instance(&self) -> Option<u32> {
        match self {
            HealthEvent::Xid { gpu_instance, .. } => *gpu_instance,
            HealthEvent::UncorrectableEcc { .. } => None,
        }
    }
}

/// Capability device minor of GI `gi` on the GPU with minor `gpu_minor`:
/// `3 + 135·N + 9·G` (docs/reference/mig.md, "Device nodes and capabilities", checked against the User Guide's `mig-minors` listing).
pub(crate) fn gi_cap_minor(gpu_minor: u32, gi: u32) -> u32 {
    3 + 135 * gpu_minor + 9 * gi
}

/// Capability device minor of CI `ci` in GI `gi`: `3 + 135·N + 9·G + 1 + C` (docs/reference/mig.md, "Device nodes and capabilities").
pub(crate) fn ci_cap_minor(gpu_minor: u32, gi: u32, ci: u32) -> u32 {
    gi_cap_minor(gpu_minor, gi) + 1 + ci
}

/// What a backend call was about, for error messages: GPU, and profile, placement and GI where
/// known.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Target {
    /// GPU index.
    pub gpu: u32,
    /// GI profile name.
    pub profile: Option<String>,
    /// Placement (start and size in memory slices); the size is 0 when the profile is unknown.
    pub placement: Option<Placement>,
    /// GPU-instance ID.
    pub gi_id: Option<u32>,
}

impl Target {
    /// A target naming only the GPU.
    pub fn gpu(gpu: u32) -> Self {
        Self {
            gpu,
            ..Self::default()
        }
    }

    /// A target naming GPU, profile and placement.
    pub fn at(gpu: u32, profile: &str, placement: Placement) -> Self {
        Self {
            gpu,
            profile: Some(profile.to_string()),
            placement: Some(placement),
            gi_id: None,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPU {}", self.gpu)?;
        if let Some(p) = &self.profile {
            write!(f, ", profile {p}")?;
        }
        match self.placement {
            Some(Placement { start, size: 0 }) => write!(f, ", placement start {start}")?,
            Some(p) => write!(f, ", placement {p}")?,
            None => {}
        }
        if let Some(gi) = self.gi_id {
            write!(f, ", GI {gi}")?;
        }
        Ok(())
    }
}

/// A backend failure, mirroring the NVML return codes that matter for MIG (docs/reference/mig.md, "Create and destroy",
/// §6 "Errors"). Every message names the GPU and, where known, profile, placement and GI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`: overlapping memory slices, the profile's maximum count,
    /// a second `+me`, or no free GI.
    #[error("{target}: insufficient resources: {reason}")]
    InsufficientResources {
        /// What was asked for.
        target: Target,
        /// Why it does not fit.
        reason: String,
    },
    /// `NVML_ERROR_INVALID_ARGUMENT`: unknown profile or a start outside the profile's list.
    #[error("{target}: invalid argument: {reason}")]
    InvalidArgument {
        /// What was asked for.
        target: Target,
        /// What is wrong.
        reason: String,
    },
    /// `NVML_ERROR_NOT_SUPPORTED`, e.g. MIG mode is off.
    #[error("{target}: not supported: {reason}")]
    NotSupported {
        /// What was asked for.
        target: Target,
        /// Why.
        reason: String,
    },
    /// `NVML_ERROR_NOT_FOUND`: no such GPU or GI.
    #[error("{target}: not found: {reason}")]
    NotFound {
        /// What was looked for.
        target: Target,
        /// What is missing.
        reason: String,
    },
    /// `NVML_ERROR_IN_USE`: processes or compute instances still use it.
    #[error("{target}: in use: {reason}")]
    InUse {
        /// What was asked for.
        target: Target,
        /// Who uses it.
        reason: String,
    },
    /// A MIG mode change that takes effect only after a GPU reset (`nvmlDeviceSetMigMode`'s
    /// activation status `NVML_ERROR_RESET_REQUIRED`: Ampere, or a VM that cannot reset its GPU):
    /// the mode now is unchanged and the change is pending.
    #[error("{target}: reset required: {reason}")]
    ResetRequired {
        /// What was asked for.
        target: Target,
        /// What NVML said.
        reason: String,
    },
    /// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus or needs a reset. Only calls on that
    /// GPU fail; its instances are unusable until it is back (a reset destroys them).
    #[error("{target}: GPU is lost: {reason}")]
    GpuLost {
        /// What was asked for.
        target: Target,
        /// What NVML said.
        reason: String,
    },
    /// Anything else (driver errors, I/O of the emulated state).
    #[error("{target}: {reason}")]
    Other {
        /// What was asked for.
        target: Target,
        /// What happened.
        reason: String,
    },
}

impl BackendError {
    /// The target the error is about.
    pub fn target(&self) -> &Target {
        match self {
            BackendError::InsufficientResources { target, .. }
            | BackendError::InvalidArgument { target, .. }
            | BackendError::NotSupported { target, .. }
            | BackendError::NotFound { target, .. }
            | BackendError::InUse { target, .. }
            | BackendError::ResetRequired { target, .. }
            | BackendError::GpuLost { target, .. }
            | BackendError::Other { target, .. } => target,
        }
    }

    /// A short, stable name of the kind of failure, for metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::InsufficientResources { .. } => "insufficient_resources",
            BackendError::InvalidArgument { .. } => "invalid_argument",
            BackendError::NotSupported { .. } => "not_supported",
            BackendError::NotFound { .. } => "not_found",
            BackendError::InUse { .. } => "in_use",
            BackendError::ResetRequired { .. } => "reset_required",
            BackendError::GpuLost { .. } => "gpu_lost",
            BackendError::Other { .. } => "other",
        }
    }
}

/// Creates, destroys and lists MIG instances on the node's GPUs. Implementations: the emulated
/// backend ([`EmulatedBackend`]) and the NVML backend ([`NvmlBackend`], raw `nvml-wrapper-sys`
/// calls, docs/reference/mig.md, "Create and destroy").
///
/// The methods block (NVML calls take up to seconds, docs/reference/mig.md, "Timing"): call them from
/// `tokio::task::spawn_blocking`. Implementations must allow concurrent calls on different GPUs.
///
/// Faults stay per GPU: a GPU that is lost answers [`BackendError::GpuLost`] for calls on it,
/// while every other GPU keeps working.
pub trait GpuBackend: Send + Sync {
    /// The node's GPUs that answer now, in index order: read again on every call (a GPU that
    /// fell off the bus is missing), so callers can judge health from it.
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError>;

    /// Indices of the GPUs the backend manages (fixed at start, whether they answer or not).
    fn gpu_indices(&self) -> Vec<u32>;

    /// Creates a GPU instance of `profile` at exactly memory slice `start` on GPU `gpu_index`
    /// (`nvmlDeviceCreateGpuInstanceWithPlacement`), then the full-size compute instance inside
    /// it ([`GiProfile::compute_instance`]). On failure nothing is left behind.
    fn create_instance(
        &self,
        gpu_index: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigInstance, BackendError>;

    /// Destroys GI `gi_id` on GPU `gpu_index`: its compute instances first, then the GI
    /// (docs/reference/mig.md, "Create and destroy"). `NotFound` when the GI does not exist.
    fn destroy_instance(&self, gpu_index: u32, gi_id: u32) -> Result<(), BackendError>;

    /// Every MIG instance on GPU `gpu_index`, whoever created it, by placement start, read from
    /// the GPU now. What the request path and start-up reconciliation match records against.
    fn instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError>;

    /// GPU `gpu_index`'s MIG mode now and after a reset (`nvmlDeviceGetMigMode`), read from the
    /// GPU.
    fn mig_mode(&self, gpu_index: u32) -> Result<MigModeState, BackendError>;

    /// Switches GPU `gpu_index`'s MIG mode (`nvmlDeviceSetMigMode`) and returns once the new mode
    /// is active. Callers switch only a GPU with no MIG instance, and only where
    /// [`GpuInfo::mig_switch`] allows it; processes using the GPU are NVML's to find (`IN_USE`).
    ///
    /// # Errors
    /// [`BackendError::ResetRequired`]: the change waits for a GPU reset (the mode now is
    /// unchanged, the pending mode is `enabled`: the caller sets it back);
    /// [`BackendError::InUse`]: the GPU is busy (`NVML_ERROR_IN_USE`; nothing changed);
    /// [`BackendError::NotSupported`]: the GPU has no MIG.
    fn set_mig_mode(&self, gpu_index: u32, enabled: bool) -> Result<(), BackendError>;

    /// [`Self::instances_on`] as the backend last knew it, for periodic checks that can wait
    /// (the health monitor's unclaimed-instance check). Equal to what the GPU has whenever only
    /// this backend's creates and destroys changed it; a change made outside DAS (an
    /// administrator's `nvidia-smi`) may show only after a backend-defined period (the NVML
    /// backend's `INSTANCE_REFRESH`, 60 s). The default reads the GPU every time (the emulated
    /// backend's listing is cheap).
    fn cached_instances_on(&self, gpu_index: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.instances_on(gpu_index)
    }

    /// Health events of the node's GPUs (XID errors, uncorrectable ECC errors), waiting at most
    /// `timeout` for the first; empty when none came. Blocks: run it on a thread of its own.
    /// The default reports nothing (after sleeping `timeout`, so a caller's loop does not spin).
    ///
    /// # Errors
    /// The backend cannot wait for events (NVML's event set failed).
    fn wait_health_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, BackendError> {
        std::thread::sleep(timeout);
        Ok(Vec::new())
    }

    /// Sets GPU `gpu_index`'s compute time slice to `interval` (docs/design.md §7,
    /// "Time-slicing"). Only the emulated backend answers: on real GPUs NVIDIA sets it with
    /// `nvidia-smi compute-policy` (no NVML call does), which [`TimeSlicer`] runs. The default
    /// answers [`BackendError::NotSupported`].
    ///
    /// # Errors
    /// [`BackendError::NotSupported`] (this backend cannot), a lost GPU, or a write that failed.
    fn set_time_slice(
        &self,
        gpu_index: u32,
        interval: das_api::device_config::TimeSliceInterval,
    ) -> Result<(), BackendError> {
        Err(BackendError::NotSupported {
            target: Target::gpu(gpu_index),
            reason: format!(
                "this GPU backend cannot set a time slice ({})",
                interval.level()
            ),
        })
    }

    /// Every MIG instance on the node, by GPU index and placement start; fails when any GPU does
    /// (prefer [`Self::instances_on`] where one GPU's failure must not stop the others).
    fn all_instances(&self) -> Result<Vec<MigInstance>, BackendError> {
        let mut out = Vec::new();
        for gpu in self.gpu_indices() {
            out.extend(self.instances_on(gpu)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
