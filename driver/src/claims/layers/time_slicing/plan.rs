//! Which devices of a claim are time-sliced, and how (pure; docs/design.md §7, "Time-slicing"):
//! the claim's resolved configs (`das_api::device_config::resolve`) turned into each planned
//! device's time slice, with the rule a config alone cannot check (whole GPUs only).

use std::collections::BTreeMap;

use das_api::device_config::MigDeviceConfig;

use crate::claims::PrepareError;
use crate::claims::error::TimeSliceRefusal;
use crate::claims::kinds::{KindId, Kinds, Planned};

/// Fills in each planned device's time slice from `configs` (by request name; a request no
/// config names, or one with another strategy, gets none).
///
/// # Errors
/// [`PrepareError::InvalidConfig`]: time-slicing on a device that is not a whole GPU (a MIG
/// instance's compute is its own: NVIDIA's driver never time-slices MIG devices either).
pub(crate) fn with_time_slice(
    mut planned: Vec<Planned>,
    configs: &BTreeMap<String, MigDeviceConfig>,
) -> Result<Vec<Planned>, PrepareError> {
    let kinds = Kinds::standard();
    for p in &mut planned {
        let Some(interval) = configs
            .get(&p.request)
            .and_then(MigDeviceConfig::time_slice)
        else {
            continue;
        };
        if kinds.of(&p.at).id() != KindId::WholeGpu {
            return Err(PrepareError::InvalidConfig {
                reason: TimeSliceRefusal::NotWholeGpu {
                    request: p.request.clone(),
                    device: p.device.clone(),
                }
                .to_string(),
            });
        }
        p.time_slice = Some(interval);
    }
    Ok(planned)
}

#[cfg(test)]
mod tests;
