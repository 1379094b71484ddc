//! Which devices of a claim are served with MPS, and with what limits (pure; docs/design.md
//! §7, "MPS on a slice"): the claim's resolved configs (`das_api::device_config::resolve`)
//! turned into each planned device's [`MpsLimits`], with the rules a config alone cannot
//! check.

use std::collections::BTreeMap;

use das_api::device_config::MigDeviceConfig;

use crate::claims::PrepareError;
use crate::claims::error::MpsConfigRefusal;
use crate::claims::kinds::{Kinds, Planned};
use crate::mps::{MpsLimits, commands};

/// Fills in each planned device's MPS limits from `configs` (by request name; a request no
/// config names is exclusive).
///
/// # Errors
/// [`PrepareError::InvalidConfig`]: MPS on a device of a kind MPS does not serve
/// ([`crate::claims::kinds::Kind::serves_mps`]): an exclusive whole GPU (a GPU is shared through
/// MPS as the shareable device `gpu-<i>-shared`, whose shares the GPU's one daemon holds to
/// their memory; one claim's MPS on a GPU it holds alone would only mislead), or more than one
/// MPS device in the claim (a container has one `CUDA_MPS_PIPE_DIRECTORY`, so it could reach
/// one daemon only).
pub(crate) fn with_mps(
    mut planned: Vec<Planned>,
    configs: &BTreeMap<String, MigDeviceConfig>,
) -> Result<Vec<Planned>, PrepareError> {
    let invalid = |reason: String| PrepareError::InvalidConfig { reason };
    let kinds = Kinds::standard();
    for p in &mut planned {
        let Some(mps) = configs.get(&p.request).and_then(MigDeviceConfig::mps) else {
            continue;
        };
        if !kinds.of(&p.at).serves_mps() {
            return Err(invalid(
                MpsConfigRefusal::WholeGpu {
                    request: p.request.clone(),
                    device: p.device.clone(),
                }
                .to_string(),
            ));
        }
        p.mps = Some(MpsLimits::from_config(&mps).map_err(|e| invalid(e.to_string()))?);
    }
    let devices: Vec<String> = planned
        .iter()
        .filter(|p| p.mps.is_some())
        .map(|p| p.device.clone())
        .collect();
    if devices.len() > 1 {
        return Err(invalid(
            MpsConfigRefusal::SeveralDevices { devices }.to_string(),
        ));
    }
    Ok(planned)
}

/// Checks each MPS device's limits against what it serves, whose memory `memory_mib` gives (a MIG
/// instance's profile's, a whole GPU's; `None` when unknown: nothing to check).
///
/// # Errors
/// [`PrepareError::InvalidConfig`]: a pinned memory limit above the MIG instance's memory.
pub(crate) fn check_limits(
    planned: &[Planned],
    memory_mib: impl Fn(&Planned) -> Option<u64>,
) -> Result<(), PrepareError> {
    for p in planned {
        let (Some(limits), Some(mib)) = (&p.mps, memory_mib(p)) else {
            continue;
        };
        commands::check_against_instance(limits, &p.at.profile, mib).map_err(|e| {
            PrepareError::InvalidConfig {
                reason: format!("request {:?}, device {}: {e}", p.request, p.device),
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
