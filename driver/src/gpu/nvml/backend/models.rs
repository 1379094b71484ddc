//! Which [`GpuModel`] a real GPU gets at start-up: the data file of its PCI device ID (and
//! subsystem ID, or NVML name, where one device ID covers two products: A2 and A16), cross-checked
//! against NVML; else one built from what NVML reports: its MIG profile and placement tables
//! ([`model_from_nvml`]), or for a GPU without MIG its identity alone ([`model_without_mig`]).
//! NVML has the last word on whether a GPU has MIG: a data file that says otherwise is logged
//! and set aside.

use std::sync::Arc;

use super::is_absent_profile;
use crate::gpu::catalog::{complete_model, find_model_for_gpu, parse_model};
use crate::gpu::layout::Placement;
use crate::gpu::model::{CiProfile, GiProfile, GpuModel};
use crate::gpu::nvml::{
    ARCH_HOPPER, CI_ENUMS, DeviceIdentity, GI_ENUM_NAMES, GI_PROFILE_ENUM_COUNT, GiProfileInfo,
    NvmlApi, architecture_name, full_ci_enum,
};

/// The data file of the GPU `id` describes, if any ([`find_model_for_gpu`]); an invalid embedded
/// data set is logged (a build defect) and gives none.
fn data_file_model(dev: u32, id: &DeviceIdentity) -> Option<Arc<GpuModel>> {
    match find_model_for_gpu(id.pci_device_id, id.pci_subsystem_id, &id.name) {
        Ok(found) => found,
        Err(e) => {
            tracing::error!(gpu = dev, error = %e, "the embedded GPU model data is invalid; not used");
            None
        }
    }
}

/// The model of a GPU with MIG (`nvmlDeviceGetMigMode` answered): its data file (profile IDs
/// and placements cross-checked against NVML, mismatches logged), else one built from NVML's
/// tables; `None` (logged) when neither makes a usable model.
pub(super) fn resolve_model<A: NvmlApi>(
    api: &A,
    dev: u32,
    id: &DeviceIdentity,
) -> Option<Arc<GpuModel>> {
    let pci = format!("{:#010x}", id.pci_device_id);
    let sub = format!("{:#010x}", id.pci_subsystem_id);
    let reason = match data_file_model(dev, id) {
        Some(model) if model.mig => {
            cross_check(api, dev, &model);
            return Some(model);
        }
        Some(model) => {
            tracing::warn!(gpu = dev, name = %id.name, pci_device_id = %pci, file = %model.source_file,
                "the data file says this GPU has no MIG, but NVML reports a MIG mode; using the tables NVML reports");
            "the data file says the GPU has no MIG"
        }
        None => "no data file for this GPU",
    };
    match model_from_nvml(api, dev, id) {
        Ok(model) => {
            tracing::warn!(gpu = dev, name = %id.name, pci_device_id = %pci, pci_subsystem_id = %sub,
                "{reason}; using the profile and placement tables NVML reports");
            Some(Arc::new(model))
        }
        Err(problem) => {
            tracing::warn!(gpu = dev, name = %id.name, pci_device_id = %pci, pci_subsystem_id = %sub, %problem,
                "{reason} and NVML's tables do not make a usable model; skipped");
            None
        }
    }
}

/// The model of a GPU without MIG (`nvmlDeviceGetMigMode` answered `NOT_SUPPORTED`): its data
/// file (`mig = false`), else one from its NVML identity ([`model_without_mig`], logged); `None`
/// (logged) when NVML's identity does not make a valid model either.
pub(super) fn resolve_model_without_mig(dev: u32, id: &DeviceIdentity) -> Option<Arc<GpuModel>> {
    let reason = match data_file_model(dev, id) {
        Some(model) if !model.mig => return Some(model),
        Some(model) => format!(
            "its data file {} describes MIG tables, but NVML says the GPU has no MIG",
            model.source_file
        ),
        None => "no data file for this GPU".to_string(),
    };
    match model_without_mig(id) {
        Ok(model) => {
            tracing::warn!(gpu = dev, name = %id.name,
                pci_device_id = format_args!("{:#010x}", id.pci_device_id),
                pci_subsystem_id = format_args!("{:#010x}", id.pci_subsystem_id),
                "{reason}; served whole with what NVML reports (memory, architecture, compute capability; no multiprocessors)");
            Some(Arc::new(model))
        }
        Err(problem) => {
            tracing::warn!(gpu = dev, name = %id.name, %problem, "{reason}, and NVML's identity does not make a valid model; skipped");
            None
        }
    }
}

/// A [`GpuModel`] without MIG from NVML's identity of the GPU: its name, PCI IDs, total memory,
/// architecture (NVIDIA's DRA driver's name) and compute capability; no SM count (NVML tells it
/// only of MIG devices). Validated by the data files' rules.
///
/// # Errors
/// What the rules refuse, e.g. an empty name or no memory.
pub fn model_without_mig(id: &DeviceIdentity) -> Result<GpuModel, String> {
    let model = GpuModel {
        name: model_name(&id.name),
        aliases: Vec::new(),
        product_name: id.name.clone(),
        pci_device_ids: vec![id.pci_device_id],
        pci_subsystem_ids: Vec::new(),
        architecture: architecture_name(id.architecture).to_string(),
        cuda_compute_capability: format!(
            "{}.{}",
            id.cuda_compute_capability.0, id.cuda_compute_capability.1
        ),
        memory_mib: id.memory_mib,
        mig: false,
        multiprocessors: None,
        memory_slices: 0,
        compute_slices: 0,
        max_gpu_instances: 0,
        mig_mode_reset: None,
        profiles: Vec::new(),
        source_file: format!("nvml:{}", id.name),
        counter_totals: Default::default(),
        published_counters: Vec::new(),
    };
    complete_model(model).map_err(|e| e.problem)
}

/// A model name from NVML's product name: `NVIDIA L4` → `L4`, spaces as `-`.
fn model_name(product: &str) -> String {
    product
        .trim_start_matches("NVIDIA ")
        .replace(char::is_whitespace, "-")
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
        name: model_name(&id.name),
        aliases: Vec::new(),
        product_name: id.name.clone(),
        pci_device_ids: vec![id.pci_device_id],
        pci_subsystem_ids: Vec::new(),
        architecture: architecture_name(id.architecture).to_string(),
        cuda_compute_capability: format!(
            "{}.{}",
            id.cuda_compute_capability.0, id.cuda_compute_capability.1
        ),
        memory_mib: id.memory_mib,
        mig: true,
        multiprocessors: None,
        memory_slices,
        compute_slices: profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0),
        max_gpu_instances: profiles.iter().map(|p| p.max_instances).max().unwrap_or(0),
        mig_mode_reset: Some(id.architecture < ARCH_HOPPER),
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
