//! The inventory read at start-up: which GPUs DAS serves (MIG mode on, or switched on for Hopper+
//! with `--enable-mig-mode`; with `--whole-gpus` also those whose MIG mode is still off, served
//! whole), and each GPU's model: the data file for its PCI device ID, cross-checked against
//! NVML, or one built from NVML's own tables (a GPU with MIG mode off still needs one: DAS reads
//! a GPU's shape, its memory slices and counters, from its MIG tables).

use std::path::Path;
use std::sync::Arc;

use super::NvmlOptions;
use super::is_absent_profile;
use super::mig_mode::{switch_base, with_pending};
use crate::gpu::catalog::{find_model_by_pci_id, parse_model};
use crate::gpu::layout::Placement;
use crate::gpu::model::{CiProfile, GiProfile, GpuModel};
use crate::gpu::nvml::{
    ARCH_HOPPER, CI_ENUMS, DeviceIdentity, GI_ENUM_NAMES, GI_PROFILE_ENUM_COUNT, GiProfileInfo,
    MigModeState, NvmlApi, architecture_name, brand_name, code, cuda_version, full_ci_enum,
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
/// (`mig_mode::switch_base`), or `None` (logged) when DAS does not serve it: not MIG-capable, no
/// usable model, or MIG mode off without `whole_gpus` (`--whole-gpus`). Its PCIe root is read
/// later, from sysfs ([`pcie_root`]).
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
            tracing::info!(gpu = dev, name = %id.name, "GPU is not MIG-capable; skipped");
            return None;
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
    let pci_bus_id = pci::standard_bus_id(&id.pci_bus_id);
    if pci_bus_id.is_none() {
        tracing::debug!(gpu = dev, bus_id = %id.pci_bus_id,
            "PCI bus ID not of the form 0000:3b:00.0: the pciBusID and pcieRoot attributes are left out");
    }
    let info = GpuInfo {
        index: dev,
        uuid: id.uuid,
        model,
        product_name: id.name,
        minor: id.minor,
        pci_bus_id,
        pcie_root: None,
        brand: brand(api, dev),
        driver_version: system.driver_version.clone(),
        cuda_driver_version: system.cuda_driver_version.clone(),
        mig_enabled,
        mig_switch,
    };
    Some((info, switch))
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
    if model.mig_mode_change_requires_reset || id.architecture < ARCH_HOPPER {
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
        mig_mode_change_requires_reset: id.architecture < ARCH_HOPPER,
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
            nvml_enum: CI_ENUMS[ci as usize].0.to_string(),
        },
    })
}
