//! The built-in GPU models: the TOML data files in `driver/data/gpus/`, embedded with
//! `include_str!` so the plugin binary is self-contained, parsed and validated on first use (a
//! wrong table fails loudly with the file name and the problem, never silently; the rules are in
//! `catalog/validate.rs`), and looked up by name, alias, or PCI device and subsystem ID. A new
//! GPU model is a new data file plus a line in [`BUILTIN_MODEL_FILES`] (CONTRIBUTING.md).
//!
//! Models of GPUs without MIG (`mig = false`: T4, L4, …) have no profile table: on load they get
//! one memory slice (the whole GPU) and counter totals of their memory and multiprocessors.

mod validate;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use super::layout;
use super::model::{GpuModel, ResourceAmounts};
use das_api::counters;

/// The embedded data files: `(file name, contents)`.
pub(crate) const BUILTIN_MODEL_FILES: &[(&str, &str)] = &[
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
    // GPUs without MIG (`mig = false`), served whole.
    ("t4.toml", include_str!("../../data/gpus/t4.toml")),
    ("a2.toml", include_str!("../../data/gpus/a2.toml")),
    ("a10.toml", include_str!("../../data/gpus/a10.toml")),
    ("a10g.toml", include_str!("../../data/gpus/a10g.toml")),
    ("a16.toml", include_str!("../../data/gpus/a16.toml")),
    ("a40.toml", include_str!("../../data/gpus/a40.toml")),
    ("l4.toml", include_str!("../../data/gpus/l4.toml")),
    ("l40.toml", include_str!("../../data/gpus/l40.toml")),
    ("l40s.toml", include_str!("../../data/gpus/l40s.toml")),
    (
        "rtx-6000-ada.toml",
        include_str!("../../data/gpus/rtx-6000-ada.toml"),
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
pub(crate) fn parse_model(file: &str, text: &str) -> Result<GpuModel, ModelError> {
    let err = |problem: String| ModelError {
        file: file.to_string(),
        problem,
    };
    let mut model: GpuModel =
        toml::from_str(text).map_err(|e| err(format!("invalid TOML: {e}")))?;
    model.source_file = file.to_string();
    if !model.mig && model.multiprocessors.is_none() {
        return Err(err(
            "a GPU without MIG (mig = false) needs multiprocessors (its SM count)".into(),
        ));
    }
    complete_model(model)
}

/// Validates `model` (its [`GpuModel::source_file`] names it in errors) and fills in what is
/// derived on load: for a MIG model its counter totals and published counters from its layouts;
/// for a GPU without MIG one memory slice (the whole GPU), counter totals of its memory and
/// multiprocessors, and `memory` as the one resource counter.
pub(crate) fn complete_model(mut model: GpuModel) -> Result<GpuModel, ModelError> {
    let err = |problem: String| ModelError {
        file: model.source_file.clone(),
        problem,
    };
    validate::validate_model(&model).map_err(err)?;
    if !model.mig {
        model.memory_slices = 1;
        model.counter_totals = ResourceAmounts {
            memory_mib: model.memory_mib,
            multiprocessors: model.multiprocessors.map_or(0, u64::from),
            ..ResourceAmounts::default()
        };
        model.published_counters = vec![counters::MEMORY];
        return Ok(model);
    }
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

/// Parses and validates every embedded data file. Names and aliases must be unique across files.
pub(crate) fn load_builtin_models() -> Result<Vec<Arc<GpuModel>>, ModelError> {
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
        if let Some(other) = models
            .iter()
            .find(|m: &&Arc<GpuModel>| validate::pci_overlap(m, &model))
        {
            return Err(ModelError {
                file: file.to_string(),
                problem: format!(
                    "a PCI device ID of {} is also {}'s ({}), and their pci_subsystem_ids do not tell them apart",
                    model.name, other.name, other.source_file
                ),
            });
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

/// The embedded model for PCI device ID `pci_device_id` (`0xDDDDVVVV`) with subsystem ID
/// `pci_subsystem_id` (`0xSSSSVVVV`, NVML's `pciSubSystemId`; 0 when unknown) and NVML name
/// `name` (`nvmlDeviceGetName`): the file that lists both IDs, else one of that device ID whose
/// `product_name` is `name` (a subsystem a shared device ID's files do not list, e.g. an OEM
/// board of an A2 or A16, is told apart by name), else `None`.
pub fn find_model_for_gpu(
    pci_device_id: u32,
    pci_subsystem_id: u32,
    name: &str,
) -> Result<Option<Arc<GpuModel>>, ModelError> {
    let models = builtin_models()?;
    let by_id = models
        .iter()
        .find(|m| m.matches_pci(pci_device_id, pci_subsystem_id));
    let by_name = || {
        models.iter().find(|m| {
            m.pci_device_ids.contains(&pci_device_id) && m.product_name.eq_ignore_ascii_case(name)
        })
    };
    Ok(by_id.or_else(by_name).cloned())
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
