//! The `--emulated-gpus` spec: `<model>:<count>,…`, e.g. `A100-SXM4-40GB:2,H100-80GB:2`.

use std::sync::Arc;

use super::{EmulatedError, MAX_EMULATED_GPUS};
use crate::gpu::catalog::{ModelError, builtin_models, find_model, model_names};
use crate::gpu::model::GpuModel;

/// One entry of the spec: `count` GPUs of `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatedGpuSpec {
    /// The model.
    pub model: Arc<GpuModel>,
    /// How many GPUs of it.
    pub count: u32,
}

/// Parses `MODEL[:COUNT][,MODEL[:COUNT]...]` (count defaults to 1; model names and aliases are
/// case-insensitive). GPUs get indices in spec order.
pub fn parse_emulated_spec(spec: &str) -> Result<Vec<EmulatedGpuSpec>, EmulatedError> {
    let models = model_names()?;
    let bad = |problem: String| EmulatedError::Spec {
        spec: spec.to_string(),
        problem,
        models: models.clone(),
    };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(bad("empty entry".into()));
        }
        let (name, count) = match entry.split_once(':') {
            Some((n, c)) => (
                n.trim(),
                parse_count(c.trim()).map_err(|p| bad(format!("{entry}: {p}")))?,
            ),
            None => (entry, 1),
        };
        let model = find_model(name)?.ok_or_else(|| bad(format!("unknown GPU model {name}")))?;
        out.push(EmulatedGpuSpec { model, count });
    }
    let total: u32 = out.iter().map(|s| s.count).sum();
    if total > MAX_EMULATED_GPUS {
        return Err(bad(format!("{total} GPUs, at most {MAX_EMULATED_GPUS}")));
    }
    Ok(out)
}

fn parse_count(c: &str) -> Result<u32, String> {
    match c.parse::<u32>() {
        Ok(n) if (1..=MAX_EMULATED_GPUS).contains(&n) => Ok(n),
        _ => Err(format!(
            "count {c:?} is not an integer in 1..={MAX_EMULATED_GPUS}"
        )),
    }
}

/// The models an emulated spec may name, for `--help` texts.
pub fn emulated_model_help() -> Result<String, ModelError> {
    Ok(builtin_models()?
        .iter()
        .map(|m| {
            let mut names = vec![m.name.clone()];
            names.extend(m.aliases.iter().cloned());
            names.join("|")
        })
        .collect::<Vec<_>>()
        .join(", "))
}
