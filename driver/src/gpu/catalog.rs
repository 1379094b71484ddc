//! The built-in GPU models: the TOML data files in `driver/data/gpus/`, embedded with
//! `include_str!` so the plugin binary is self-contained, parsed and validated on first use (a
//! wrong table fails loudly with the file name and the problem, never silently), and looked up
//! by name, alias or PCI device ID. A new GPU model is a new data file plus a line in
//! [`BUILTIN_MODEL_FILES`] (CONTRIBUTING.md).

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, OnceLock};

use super::layout;
use super::model::{
    CI_PROFILE_ENUMS, GI_PROFILE_ENUMS, GiProfile, GpuModel, MAX_MEMORY_SLICES, enum_value,
    parse_compute_capability,
};

/// The embedded data files: `(file name, contents)`.
pub const BUILTIN_MODEL_FILES: &[(&str, &str)] = &[
    (
        "a100-sxm4-40gb.toml",
        include_str!("../../data/gpus/a100-sxm4-40gb.toml"),
    ),
    (
        "a100-sxm4-80gb.toml",
        include_str!("../../data/gpus/a100-sxm4-80gb.toml"),
    ),
    (
        "a30-24gb.toml",
        include_str!("../../data/gpus/a30-24gb.toml"),
    ),
    (
        "h100-sxm5-80gb.toml",
        include_str!("../../data/gpus/h100-sxm5-80gb.toml"),
    ),
    (
        "h100-pcie-80gb.toml",
        include_str!("../../data/gpus/h100-pcie-80gb.toml"),
    ),
    (
        "h100-nvl-94gb.toml",
        include_str!("../../data/gpus/h100-nvl-94gb.toml"),
    ),
    (
        "gh200-96gb.toml",
        include_str!("../../data/gpus/gh200-96gb.toml"),
    ),
    (
        "h200-141gb.toml",
        include_str!("../../data/gpus/h200-141gb.toml"),
    ),
    (
        "b200-180gb.toml",
        include_str!("../../data/gpus/b200-180gb.toml"),
    ),
    (
        "rtx-pro-6000-blackwell.toml",
        include_str!("../../data/gpus/rtx-pro-6000-blackwell.toml"),
    ),
];

/// A data file that does not parse or does not describe a consistent GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU model file {file}: {problem}")]
pub struct ModelError {
    /// The file name, e.g. `a100-sxm4-40gb.toml`.
    pub file: String,
    /// What is wrong, naming the profile and field where it applies.
    pub problem: String,
}

/// Parses and validates one model file. `file` names it in errors.
pub fn parse_model(file: &str, text: &str) -> Result<GpuModel, ModelError> {
    let err = |problem: String| ModelError {
        file: file.to_string(),
        problem,
    };
    let mut model: GpuModel =
        toml::from_str(text).map_err(|e| err(format!("invalid TOML: {e}")))?;
    model.source_file = file.to_string();
    validate_model(&model).map_err(err)?;
    model.counter_totals = layout::max_consumption(&model).ok_or_else(|| {
        err(format!(
            "more than {} valid layouts; the table is too large to derive counters from",
            layout::LAYOUT_BUDGET
        ))
    })?;
    // Past the budget every resource counter stays (empty list): more counters, same layouts.
    model.published_counters = layout::needed_counters(&model).unwrap_or_default();
    Ok(model)
}

fn validate_model(m: &GpuModel) -> Result<(), String> {
    validate_geometry(m)?;
    if m.profiles.is_empty() {
        return Err("no [[profiles]]".into());
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

fn validate_geometry(m: &GpuModel) -> Result<(), String> {
    if m.name.trim().is_empty() {
        return Err("empty name".into());
    }
    if m.memory_slices == 0 || m.memory_slices > MAX_MEMORY_SLICES {
        return Err(format!(
            "memory_slices = {} (must be 1..={MAX_MEMORY_SLICES}: one counter per memory slice, 32 counters per set)",
            m.memory_slices
        ));
    }
    if m.compute_slices == 0 || m.max_gpu_instances == 0 {
        return Err("compute_slices and max_gpu_instances must be positive".into());
    }
    if m.pci_device_ids.is_empty() {
        return Err("pci_device_ids is empty".into());
    }
    parse_compute_capability(&m.cuda_compute_capability).ok_or_else(|| {
        format!(
            "cuda_compute_capability {:?} is not <major>.<minor>",
            m.cuda_compute_capability
        )
    })?;
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

/// Parses and validates every embedded data file. Names and aliases must be unique across files.
pub fn load_builtin_models() -> Result<Vec<Arc<GpuModel>>, ModelError> {
    let mut models = Vec::new();
    let mut names = BTreeSet::new();
    for (file, text) in BUILTIN_MODEL_FILES {
        let model = parse_model(file, text)?;
        for n in std::iter::once(&model.name).chain(&model.aliases) {
            if !names.insert(n.to_ascii_uppercase()) {
                return Err(ModelError {
                    file: file.to_string(),
                    problem: format!("name or alias {n} is used by another model"),
                });
            }
        }
        models.push(Arc::new(model));
    }
    Ok(models)
}

/// The embedded GPU models, loaded and validated once.
pub fn builtin_models() -> Result<&'static [Arc<GpuModel>], ModelError> {
    static MODELS: OnceLock<Result<Vec<Arc<GpuModel>>, ModelError>> = OnceLock::new();
    MODELS
        .get_or_init(load_builtin_models)
        .as_ref()
        .map(Vec::as_slice)
        .map_err(Clone::clone)
}

/// The embedded model called `name` (or with that alias), ASCII case-insensitive.
pub fn find_model(name: &str) -> Result<Option<Arc<GpuModel>>, ModelError> {
    Ok(builtin_models()?
        .iter()
        .find(|m| m.answers_to(name))
        .cloned())
}

/// The embedded model for PCI device ID `pci_device_id` (`0xDDDDVVVV`).
pub fn find_model_by_pci_id(pci_device_id: u32) -> Result<Option<Arc<GpuModel>>, ModelError> {
    Ok(builtin_models()?
        .iter()
        .find(|m| m.pci_device_ids.contains(&pci_device_id))
        .cloned())
}

/// One line per embedded model, `NAME (aliases: …): profiles …`, for docs and error messages.
pub fn model_list() -> Result<Vec<String>, ModelError> {
    Ok(builtin_models()?
        .iter()
        .map(|m| {
            let aliases = if m.aliases.is_empty() {
                String::new()
            } else {
                format!(" (aliases: {})", m.aliases.join(", "))
            };
            format!("{}{aliases}: {}", m.name, m.profile_names())
        })
        .collect())
}

/// The embedded model names, comma-separated.
pub fn model_names() -> Result<String, ModelError> {
    Ok(builtin_models()?
        .iter()
        .map(|m| m.name.as_str())
        .collect::<Vec<_>>()
        .join(", "))
}

#[cfg(test)]
mod tests;
