//! The rules a data file must keep (pure): names and identity for every model; for a MIG model
//! its geometry and every profile (placements inside the grid, unique IDs and names, memory
//! consistent with the grid); for a GPU without MIG (`mig = false`) no MIG field at all, and a
//! positive SM count where it gives one. Each rule's error names the field and what is valid.

use std::collections::HashSet;

use crate::gpu::model::{
    ARCHITECTURES, CI_PROFILE_ENUMS, GI_PROFILE_ENUMS, GiProfile, GpuModel, MAX_MEMORY_SLICES,
    enum_value, parse_compute_capability,
};

/// Checks `m` as read from its file (before anything is derived).
pub(super) fn validate_model(m: &GpuModel) -> Result<(), String> {
    validate_identity(m)?;
    if !m.mig {
        return validate_without_mig(m);
    }
    validate_geometry(m)?;
    if m.profiles.is_empty() {
        return Err("no [[profiles]] (a GPU without MIG says mig = false)".into());
    }
    let mut ids = HashSet::new();
    let mut labels = HashSet::new();
    for p in &m.profiles {
        validate_profile(m, p).map_err(|e| format!("profile {}: {e}", p.name))?;
        if !ids.insert(p.id) {
            return Err(format!("profile id {} appears twice", p.id));
        }
        if !labels.insert(p.dns_label()) {
            return Err(format!(
                "profile {} maps to the device-name label {} of another profile",
                p.name,
                p.dns_label()
            ));
        }
    }
    Ok(())
}

/// Whether models `a` and `b` could both claim one GPU: a shared PCI device ID, and subsystem
/// lists that do not tell them apart (either lists none, or they share one).
pub(super) fn pci_overlap(a: &GpuModel, b: &GpuModel) -> bool {
    let shared_device = a
        .pci_device_ids
        .iter()
        .any(|d| b.pci_device_ids.contains(d));
    let apart = !a.pci_subsystem_ids.is_empty()
        && !b.pci_subsystem_ids.is_empty()
        && !a
            .pci_subsystem_ids
            .iter()
            .any(|s| b.pci_subsystem_ids.contains(s));
    shared_device && !apart
}

/// Name, product name, PCI IDs, architecture, compute capability and memory: what every model has.
fn validate_identity(m: &GpuModel) -> Result<(), String> {
    if m.name.trim().is_empty() {
        return Err("empty name".into());
    }
    if m.product_name.trim().is_empty() {
        return Err("empty product_name".into());
    }
    if m.pci_device_ids.is_empty() {
        return Err("pci_device_ids is empty".into());
    }
    let nvidia = |id: &u32| id & 0xFFFF == 0x10DE;
    if let Some(id) = m.pci_device_ids.iter().find(|id| !nvidia(id)) {
        return Err(format!(
            "PCI device ID {id:#010x} is not 0xDDDD10DE (device ID, then NVIDIA's vendor ID 10DE)"
        ));
    }
    if !ARCHITECTURES.contains(&m.architecture.as_str()) {
        return Err(format!(
            "architecture {:?} is not one of {} (NVIDIA's DRA driver's spelling)",
            m.architecture,
            ARCHITECTURES.join(", ")
        ));
    }
    parse_compute_capability(&m.cuda_compute_capability).ok_or_else(|| {
        format!(
            "cuda_compute_capability {:?} is not <major>.<minor>",
            m.cuda_compute_capability
        )
    })?;
    if m.memory_mib == 0 {
        return Err("memory_mib is 0".into());
    }
    if m.multiprocessors == Some(0) {
        return Err("multiprocessors is 0 (leave it out where unknown)".into());
    }
    Ok(())
}

/// A GPU without MIG states none of the MIG fields.
fn validate_without_mig(m: &GpuModel) -> Result<(), String> {
    let stated: Vec<&str> = [
        ("memory_slices", m.memory_slices != 0),
        ("compute_slices", m.compute_slices != 0),
        ("max_gpu_instances", m.max_gpu_instances != 0),
        ("mig_mode_change_requires_reset", m.mig_mode_reset.is_some()),
        ("[[profiles]]", !m.profiles.is_empty()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect();
    if stated.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "mig = false, but the file gives {}: a GPU without MIG has no MIG geometry or profiles",
            stated.join(", ")
        ))
    }
}

fn validate_geometry(m: &GpuModel) -> Result<(), String> {
    if m.memory_slices == 0 || m.memory_slices > MAX_MEMORY_SLICES {
        return Err(format!(
            "memory_slices = {} (must be 1..={MAX_MEMORY_SLICES}: one counter per memory slice, 32 counters per set)",
            m.memory_slices
        ));
    }
    if m.compute_slices == 0 || m.max_gpu_instances == 0 {
        return Err("compute_slices and max_gpu_instances must be positive".into());
    }
    if m.mig_mode_reset.is_none() {
        return Err(
            "mig_mode_change_requires_reset is missing (true where a MIG mode change needs a GPU reset: Ampere)"
                .into(),
        );
    }
    if m.multiprocessors.is_some() {
        return Err(
            "multiprocessors is for GPUs without MIG (a MIG GPU's whole-GPU SMs come from its profiles)"
                .into(),
        );
    }
    Ok(())
}

fn validate_profile(m: &GpuModel, p: &GiProfile) -> Result<(), String> {
    if enum_value(GI_PROFILE_ENUMS, &p.nvml_enum).is_none() {
        return Err(format!("unknown GI profile enum {}", p.nvml_enum));
    }
    if enum_value(CI_PROFILE_ENUMS, &p.compute_instance.nvml_enum) != Some(p.compute_instance.id) {
        return Err(format!(
            "compute_instance id {} does not match enum {}",
            p.compute_instance.id, p.compute_instance.nvml_enum
        ));
    }
    if !p.name.starts_with(&format!("{}g.", p.compute_slices)) {
        return Err(format!(
            "name does not start with {}g. (compute_slices)",
            p.compute_slices
        ));
    }
    if p.compute_slices == 0 || p.compute_slices > m.compute_slices {
        return Err(format!(
            "compute_slices {} outside 1..={}",
            p.compute_slices, m.compute_slices
        ));
    }
    if p.media_extension != p.name.ends_with("+me") {
        return Err("media_extension must be true exactly for `+me` profiles".into());
    }
    if p.max_instances == 0 || p.max_instances > m.max_gpu_instances {
        return Err(format!(
            "max_instances {} outside 1..={}",
            p.max_instances, m.max_gpu_instances
        ));
    }
    validate_placements(m, p)?;
    validate_memory(m, p)
}

fn validate_placements(m: &GpuModel, p: &GiProfile) -> Result<(), String> {
    if p.placement_size == 0 || p.placement_size > m.memory_slices {
        return Err(format!(
            "placement_size {} outside 1..={} memory slices",
            p.placement_size, m.memory_slices
        ));
    }
    if p.placement_starts.is_empty() {
        return Err("placement_starts is empty".into());
    }
    if !p.placement_starts.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!(
            "placement_starts {:?} not strictly ascending",
            p.placement_starts
        ));
    }
    if let Some(s) = p
        .placement_starts
        .iter()
        .find(|&&s| s + p.placement_size > m.memory_slices)
    {
        return Err(format!(
            "placement start {s} + size {} exceeds the {} memory slices",
            p.placement_size, m.memory_slices
        ));
    }
    Ok(())
}

/// A profile's memory must not exceed its share of the GPU: `memory × slices ≤ total × size`.
fn validate_memory(m: &GpuModel, p: &GiProfile) -> Result<(), String> {
    if p.memory_mib == 0 {
        return Err("memory_mib is 0".into());
    }
    let share = m.memory_mib * u64::from(p.placement_size);
    if p.memory_mib * u64::from(m.memory_slices) > share {
        return Err(format!(
            "memory_mib {} exceeds {}/{} of the GPU's {} MiB",
            p.memory_mib, p.placement_size, m.memory_slices, m.memory_mib
        ));
    }
    Ok(())
}
