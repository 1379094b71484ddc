//! The `--emulated-gpus` spec: `<model>[:<count>[:<mode>]],…`, e.g.
//! `A100-SXM4-40GB:1:mig-off,H100-80GB:2` (mode `mig-on`, the default, or `mig-off`), or
//! `L4:1,H100-80GB:1`: a model without MIG (T4, L4, …) is always `mig-off` and takes no
//! `mig-on`.

use std::sync::Arc;

use super::{EmulatedError, MAX_EMULATED_GPUS};
use crate::gpu::catalog::{ModelError, builtin_models, find_model, model_names};
use crate::gpu::model::GpuModel;

/// The MIG mode word of a spec entry for GPUs with MIG mode on (the default).
pub const MODE_MIG_ON: &str = "mig-on";
/// The MIG mode word of a spec entry for GPUs with MIG mode off (served whole with
/// `--whole-gpus`, skipped without it; docs/design.md §7, "Whole GPUs").
pub const MODE_MIG_OFF: &str = "mig-off";

/// One entry of the spec: `count` GPUs of `model`, with MIG mode on or off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatedGpuSpec {
    /// The model.
    pub model: Arc<GpuModel>,
    /// How many GPUs of it.
    pub count: u32,
    /// Whether their MIG mode is on (`mig-on`, the default) or off (`mig-off`; always for a
    /// model without MIG): the mode of a fresh state.
    pub mig_enabled: bool,
}

/// Parses `MODEL[:COUNT[:MODE]][,MODEL[:COUNT[:MODE]]...]` (count defaults to 1, mode to
/// [`MODE_MIG_ON`], the other mode is [`MODE_MIG_OFF`]; a model without MIG is always
/// [`MODE_MIG_OFF`] and refuses [`MODE_MIG_ON`]; model names, aliases and modes are
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
        let mut fields = entry.split(':').map(str::trim);
        let name = fields.next().unwrap_or_default();
        let count = match fields.next() {
            Some(c) => parse_count(c).map_err(|p| bad(format!("{entry}: {p}")))?,
            None => 1,
        };
        let mode = match fields.next() {
            Some(m) => Some(parse_mode(m).map_err(|p| bad(format!("{entry}: {p}")))?),
            None => None,
        };
        if fields.next().is_some() {
            return Err(bad(format!(
                "{entry}: too many fields, an entry is MODEL[:COUNT[:{MODE_MIG_ON}|{MODE_MIG_OFF}]]"
            )));
        }
        let model = find_model(name)?.ok_or_else(|| bad(format!("unknown GPU model {name}")))?;
        if !model.mig && mode == Some(true) {
            return Err(bad(format!(
                "{entry}: {} has no MIG, so its MIG mode is always off (leave out :{MODE_MIG_ON})",
                model.name
            )));
        }
        let mig_enabled = mode.unwrap_or(model.mig);
        out.push(EmulatedGpuSpec {
            model,
            count,
            mig_enabled,
        });
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

fn parse_mode(m: &str) -> Result<bool, String> {
    if m.eq_ignore_ascii_case(MODE_MIG_ON) {
        Ok(true)
    } else if m.eq_ignore_ascii_case(MODE_MIG_OFF) {
        Ok(false)
    } else {
        Err(format!(
            "MIG mode {m:?} is not {MODE_MIG_ON} or {MODE_MIG_OFF} (an entry is MODEL[:COUNT[:{MODE_MIG_ON}|{MODE_MIG_OFF}]])"
        ))
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
