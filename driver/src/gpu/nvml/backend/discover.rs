//! The inventory read at start-up: which GPUs DAS serves (MIG mode on, or switched on for Hopper+
//! with `--enable-mig-mode`; with `--whole-gpus` also those whose MIG mode is still off, and
//! those without MIG (`nvmlDeviceGetMigMode` answers `NOT_SUPPORTED`: T4, L4, …), served whole),
//! and each GPU's model (`backend/models.rs`). Its NUMA node and PCIe root are read later, from
//! sysfs ([`pcie_root`], [`numa_node`]).

use std::path::Path;

use super::NvmlOptions;
use super::mig_mode::{switch_base, with_pending};
use super::models::{resolve_model, resolve_model_without_mig};
use crate::gpu::model::GpuModel;
use crate::gpu::nvml::{
    ARCH_HOPPER, DeviceIdentity, MigModeState, NvmlApi, brand_name, code, cuda_version,
};
use crate::gpu::pci;
use crate::gpu::{GpuInfo, MigSwitch};

/// What NVML says of the whole node, read once at start-up.
pub(super) struct System {
    /// `nvmlSystemGetDriverVersion`.
    pub(super) driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2` as `<major>.<minor>`; `None` (logged) when it fails.
    pub(super) cuda_driver_version: Option<String>,
}

impl System {
    /// The CUDA driver version beside `driver_version`, which the caller has read.
    pub(super) fn read<A: NvmlApi>(api: &A, driver_version: String) -> Self {
        let cuda_driver_version = match api.cuda_driver_version() {
            Ok(v) => Some(cuda_version(v)),
            Err(e) => {
                tracing::debug!(error = %e, "no CUDA driver version: the cudaDriverVersion attribute is left out");
                None
            }
        };
        Self {
            driver_version,
            cuda_driver_version,
        }
    }
}

/// One GPU of the inventory, with whether DAS may switch its MIG mode but for a pending change
/// (`mig_mode::switch_base`), or `None` (logged) when DAS does not serve it: no usable model,
/// or MIG mode off (or no MIG) without `whole_gpus` (`--whole-gpus`).
pub(super) fn discover<A: NvmlApi>(
    api: &A,
    options: &NvmlOptions,
    whole_gpus: bool,
    dev: u32,
    system: &System,
) -> Option<(GpuInfo, MigSwitch)> {
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
            return discover_without_mig(api, whole_gpus, dev, id, system);
        }
        Err(e) => {
            tracing::warn!(gpu = dev, name = %id.name, error = %e, "cannot read the MIG mode; skipped");
            return None;
        }
    };
    let model = resolve_model(api, dev, &id)?;
    let (id, mig_enabled) = match ensure_mig_mode(api, options, dev, id, mode, &model)? {
        MigMode::On(id) => (id, true),
        MigMode::Off(id, why) if whole_gpus => {
            tracing::info!(gpu = dev, name = %id.name, reason = %why,
                "MIG mode is off: served as a whole GPU (--whole-gpus)");
            (id, false)
        }
        MigMode::Off(id, why) => {
            tracing::warn!(gpu = dev, name = %id.name,
                "MIG mode is off: {why}; or pass --whole-gpus to serve it as a whole GPU; skipped");
            return None;
        }
    };
    let switch = switch_base(api, options, dev, &id, &model);
    let mig_switch = if switch.allowed() {
        // Read again: `--enable-mig-mode` may have switched it since.
        match api.mig_mode(dev) {
            Ok(m) => with_pending(&switch, m),
            Err(e) => MigSwitch::Refused(format!("cannot read the MIG mode: {e}")),
        }
    } else {
        switch.clone()
    };
    if let MigSwitch::Refused(why) = &mig_switch
        && options.mig_mode_switching
    {
        tracing::info!(gpu = dev, name = %id.name, reason = %why, "DAS does not switch this GPU's MIG mode");
    }
    let info = gpu_info(api, dev, id, model, mig_enabled, mig_switch, system);
    Some((info, switch))
}

/// A GPU without MIG (`nvmlDeviceGetMigMode` answered `NOT_SUPPORTED`): served whole with
/// `whole_gpus`, with MIG mode off for good and never switched; skipped (logged, naming the
/// flag) without it.
fn discover_without_mig<A: NvmlApi>(
    api: &A,
    whole_gpus: bool,
    dev: u32,
    id: DeviceIdentity,
    system: &System,
) -> Option<(GpuInfo, MigSwitch)> {
    if !whole_gpus {
        tracing::warn!(gpu = dev, name = %id.name,
            "the GPU has no MIG: DAS serves it whole only with --whole-gpus (chart wholeGpus.enabled=true); skipped");
        return None;
    }
    let model = resolve_model_without_mig(dev, &id)?;
    tracing::info!(gpu = dev, name = %id.name, model = %model.name, "the GPU has no MIG: served as a whole GPU (--whole-gpus)");
    let info = gpu_info(api, dev, id, model, false, MigSwitch::no_mig(), system);
    Some((info, MigSwitch::no_mig()))
}

/// What the inventory reports of GPU `dev` (identity `id`), before sysfs is read.
fn gpu_info<A: NvmlApi>(
    api: &A,
    dev: u32,
    id: DeviceIdentity,
    model: std::sync::Arc<GpuModel>,
    mig_enabled: bool,
    mig_switch: MigSwitch,
    system: &System,
) -> GpuInfo {
    let pci_bus_id = pci::standard_bus_id(&id.pci_bus_id);
    if pci_bus_id.is_none() {
        tracing::debug!(gpu = dev, bus_id = %id.pci_bus_id,
            "PCI bus ID not of the form 0000:3b:00.0: the pciBusID, pcieRoot and numaNode attributes are left out");
    }
    GpuInfo {
        index: dev,
        uuid: id.uuid,
        model,
        product_name: id.name,
        minor: id.minor,
        pci_bus_id,
        pcie_root: None,
        numa_node: None,
        memory_mib: id.memory_mib,
        brand: brand(api, dev),
        driver_version: system.driver_version.clone(),
        cuda_driver_version: system.cuda_driver_version.clone(),
        mig_enabled,
        mig_switch,
    }
}

/// `nvmlDeviceGetBrand` by NVIDIA's DRA driver's name; `None` (logged) when NVML fails or
/// reports a value without a name.
fn brand<A: NvmlApi>(api: &A, dev: u32) -> Option<String> {
    let name = api.brand(dev).map_err(|e| e.to_string()).and_then(|b| {
        brand_name(b)
            .map(str::to_string)
            .ok_or_else(|| format!("nvmlDeviceGetBrand returned {b}, a brand without a name"))
    });
    name.map_err(
        |e| tracing::debug!(gpu = dev, error = %e, "no brand: the brand attribute is left out"),
    )
    .ok()
}

/// The PCIe root complex of `g` read under `sys_root` ([`pci::pcie_root`]); `None` (logged) when
/// its bus ID is unknown or sysfs does not tell.
pub(super) fn pcie_root(sys_root: &Path, g: &GpuInfo) -> Option<String> {
    let bus_id = g.pci_bus_id.as_deref()?;
    match pci::pcie_root(sys_root, bus_id) {
        Ok(root) => Some(root),
        Err(e) => {
            tracing::debug!(gpu = g.index, error = %e,
                "no PCIe root: the resource.kubernetes.io/pcieRoot attribute is left out");
            None
        }
    }
}

/// The NUMA node of `g` read under `sys_root` ([`pci::numa_node`]); `None` (logged) when its bus
/// ID is unknown, sysfs does not tell, or the kernel reports none (`-1`).
pub(super) fn numa_node(sys_root: &Path, g: &GpuInfo) -> Option<u32> {
    let bus_id = g.pci_bus_id.as_deref()?;
    match pci::numa_node(sys_root, bus_id) {
        Ok(Some(node)) => Some(node),
        Ok(None) => {
            tracing::debug!(
                gpu = g.index,
                "no NUMA node (numa_node is -1): the resource.kubernetes.io/numaNode attribute is left out"
            );
            None
        }
        Err(e) => {
            tracing::debug!(gpu = g.index, error = %e,
                "no NUMA node: the resource.kubernetes.io/numaNode attribute is left out");
            None
        }
    }
}

/// A GPU's MIG mode once start-up is done with it, with its (re-read) identity.
enum MigMode {
    /// On, as found or switched on.
    On(DeviceIdentity),
    /// Still off, with what would turn it on (for the log).
    Off(DeviceIdentity, String),
}

/// MIG mode as found, switching it on for Hopper+ only with [`NvmlOptions::enable_mig_mode`];
/// `None` (logged) when the GPU cannot be read after switching.
fn ensure_mig_mode<A: NvmlApi>(
    api: &A,
    options: &NvmlOptions,
    dev: u32,
    id: DeviceIdentity,
    mode: MigModeState,
    model: &GpuModel,
) -> Option<MigMode> {
    if mode.current {
        return Some(MigMode::On(id));
    }
    if model.mig_mode_change_requires_reset() || id.architecture < ARCH_HOPPER {
        let why = format!(
            "DAS never toggles it on this {} GPU (it needs a GPU reset; pending {}): run `nvidia-smi -i {dev} -mig 1` and reset the GPU",
            model.architecture, mode.pending
        );
        return Some(MigMode::Off(id, why));
    }
    if !options.enable_mig_mode {
        let why = format!(
            "pass --enable-mig-mode to let DAS switch it on (Hopper and newer, GPU must be idle) or run `nvidia-smi -i {dev} -mig 1`"
        );
        return Some(MigMode::Off(id, why));
    }
    if let Err(e) = api.set_mig_mode(dev, true) {
        let why = format!("switching MIG mode on failed (GPU busy?): {e}");
        return Some(MigMode::Off(id, why));
    }
    tracing::info!(gpu = dev, name = %id.name, "MIG mode switched on");
    // Enabling MIG mode may re-bind the GPU and change its minor number (docs/reference/mig.md, "MIG mode").
    match (api.device_identity(dev), api.mig_mode(dev)) {
        (Ok(id), Ok(m)) if m.current => Some(MigMode::On(id)),
        (Ok(id), Ok(m)) => {
            let why = format!("still off after switching it on (pending {})", m.pending);
            Some(MigMode::Off(id, why))
        }
        (id, m) => {
            tracing::warn!(gpu = dev, identity = ?id.err(), mode = ?m, "the GPU cannot be read after switching MIG mode on; skipped");
            None
        }
    }
}
